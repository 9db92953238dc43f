"""Real DDP: two processes on CPU with gloo, launched by torchrun."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import torch

from hpctrain.train.checkpoint import load_verified
from tests.conftest import clean_env, exit_marks, hpctrain, read_jsonl, torchrun_train

COMMON = [
    "run.name=d",
    "train.eval_every=25",
    "logging.log_every=1",
    "train.threads=1",
    "data.n_train=2048",
    "checkpoint.every=0",
]


def torchrun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return torchrun_train(*args, cwd=cwd, env=env)


def load_latest(run_dir: Path) -> dict:
    name = (run_dir / "checkpoints" / "latest").read_text().strip()
    return load_verified(run_dir / "checkpoints" / name)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_latest(run_dir)["modules"]["model"]


def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path: Path):
    marks = {"ddp": tmp_path / "ddp.marks", "one": tmp_path / "one.marks"}
    proc = torchrun(
        *COMMON,
        "run.out_dir=ddp",
        "data.batch_size=16",
        "train.total_updates=50",
        cwd=tmp_path,
        env=exit_marks(marks["ddp"]),
    )
    out, err = proc.communicate(timeout=480)
    assert proc.returncode == 0, err[-3000:]
    single = hpctrain(
        "train",
        *COMMON,
        "run.out_dir=one",
        "data.batch_size=32",
        "train.total_updates=50",
        cwd=tmp_path,
        env=clean_env(**exit_marks(marks["one"])),
    )
    assert single.code == 0, single.err
    # Each rank ran its exit handlers and ended without the interpreter's finalization, under which gloo's
    # threads (DDP keeps the group alive) made one rank in ~50 abort after a finished training (dist.end_process);
    # torchrun's own agent and a process without a group end as Python does.
    ddp_marks = marks["ddp"].read_text().splitlines()
    for rank in (0, 1):
        assert f"exit-handlers rank={rank}" in ddp_marks and f"finalized rank={rank}" not in ddp_marks, (
            ddp_marks
        )
    assert "finalized rank=None" in ddp_marks  # the agent
    assert marks["one"].read_text().splitlines() == ["exit-handlers rank=None", "finalized rank=None"]
    ddp, one = final_weights(tmp_path / "ddp" / "d"), final_weights(tmp_path / "one" / "d")
    for key in one:
        torch.testing.assert_close(ddp[key], one[key], rtol=1e-4, atol=1e-5)
    assert "global batch 32" in out
    # Only rank 0 writes: one metrics record per update.
    steps = [r["step"] for r in read_jsonl(tmp_path / "ddp" / "d" / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 51))


def test_ddp_signal_on_one_rank_stops_all_and_resumes_exactly(tmp_path: Path):
    args = [*COMMON, "data.batch_size=16", "train.total_updates=120", "model.hidden=[256,256]"]
    ref = torchrun(*args, "run.out_dir=ref", cwd=tmp_path)
    _, err = ref.communicate(timeout=480)
    assert ref.returncode == 0, err[-3000:]
    proc = torchrun(*args, "run.out_dir=cut", cwd=tmp_path)
    metrics = tmp_path / "cut" / "d" / "metrics.jsonl"
    deadline = time.time() + 300
    sent = False
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 30:
            # torchrun forwards SIGTERM to every rank; ranks agree and stop at one step boundary.
            proc.send_signal(signal.SIGTERM)
            sent = True
            break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    assert sent, "the run ended before it could be signalled"
    summary = json.loads((tmp_path / "cut" / "d" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["step"] < 120, err[-2000:]
    again = torchrun(*args, "run.out_dir=cut", cwd=tmp_path)
    _, err = again.communicate(timeout=480)
    assert again.returncode == 0, err[-3000:]
    done = json.loads((tmp_path / "cut" / "d" / "summary.json").read_text())
    reference = json.loads((tmp_path / "ref" / "d" / "summary.json").read_text())
    assert done["params_sha256"] == reference["params_sha256"]
    cut_losses = {r["step"]: r["loss"] for r in read_jsonl(metrics) if "loss" in r}
    ref_losses = {
        r["step"]: r["loss"] for r in read_jsonl(tmp_path / "ref" / "d" / "metrics.jsonl") if "loss" in r
    }
    assert cut_losses == ref_losses


def test_world_size_change_continues_the_data_position_exactly(tmp_path: Path):
    """1 process, then 2 ranks (an allowed change, logged): the second hop takes exactly the samples that one
    process with the new global batch takes from the same position (an accepted batch-size change)."""
    first = [*COMMON, "data.batch_size=16", "train.total_updates=20"]
    for out in ("grown", "ref"):
        assert hpctrain("train", *first, f"run.out_dir={out}", cwd=tmp_path).code == 0
    proc = torchrun(
        *COMMON, "data.batch_size=16", "train.total_updates=40", "run.out_dir=grown", cwd=tmp_path
    )
    out, err = proc.communicate(timeout=480)
    assert proc.returncode == 0, err[-3000:]
    assert "resumed from" in out and "at update 20" in out
    assert "world size 1 -> 2" in err and "train.total_updates 20 -> 40" in err
    assert "the data position stays exact" in err and "UserWarning" not in err
    ref = hpctrain(
        "train",
        *COMMON,
        "data.batch_size=32",
        "train.total_updates=40",
        "run.out_dir=ref",
        "checkpoint.accept_changes=[data.batch_size]",
        cwd=tmp_path,
    )
    assert ref.code == 0, ref.err
    grown, one = tmp_path / "grown" / "d", tmp_path / "ref" / "d"
    assert load_latest(grown)["data"] == load_latest(one)["data"]  # the same position: 320 + 20 x 32 samples
    for key, value in final_weights(one).items():
        torch.testing.assert_close(final_weights(grown)[key], value, rtol=1e-4, atol=1e-5)
    hops = json.loads((grown / "chain.json").read_text())
    assert [h["world_size"] for h in hops] == [1, 2]
    assert hops[1]["allowed_changes"] == {"train.total_updates": [20, 40], "world_size": [1, 2]}


def test_supervised_torchrun_restarts_its_exit_75_stops_until_done(tmp_path: Path):
    """torchrun exits 1 for a worker's 75 (FAILED, ChildFailedError): `hpctrain supervise` reads the run's
    summary.json, restarts at once, and the run ends where an unsupervised, uninterrupted one does."""
    import sys

    from tests.conftest import clean_env, save_pause

    args = [*COMMON, "data.batch_size=16", "train.total_updates=60", "checkpoint.every=5"]
    budget = ["budget.time_limit=1:30", "budget.margin_seconds=0.5"]  # from torchrun's start
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    # In the first hop 12 saves pausing 8 s each: more than its 90 s hold (counted from the process start),
    # whatever the machine's speed; the next hops train at full speed, and 90 s leave them a loaded machine's
    # torchrun start (30-60 s) and still time to train (40 s did not: a hop of one update each)
    done = hpctrain(
        "supervise", "--max-idle", "4", "--", *launcher, "-m", "hpctrain", "train", *args, *budget,
        cwd=tmp_path, env=clean_env(**save_pause(8.0, hops=1)), timeout=900,
    )  # fmt: skip
    assert done.code == 0, done.err[-3000:]
    hops = json.loads((tmp_path / "logs" / "d" / "chain.json").read_text())
    assert len(hops) >= 2 and {h["exit_reason"] for h in hops[:-1]} == {"time_budget"}
    assert "ChildFailedError" in done.err  # what torchrun says about a clean stop
    resolved = "ended with exit code 1 (summary.json: the run exited 75): stopped early and resumable"
    assert done.err.count(resolved) == len(hops) - 1
    ref = torchrun(*args, "run.out_dir=ref", cwd=tmp_path)
    _, err = ref.communicate(timeout=480)
    assert ref.returncode == 0, err[-3000:]
    ours = json.loads((tmp_path / "logs" / "d" / "summary.json").read_text())["params_sha256"]
    assert ours == json.loads((tmp_path / "ref" / "d" / "summary.json").read_text())["params_sha256"]


def test_a_short_hop_under_ddp_does_not_compile_cold(tmp_path: Path):
    """Under DDP every rank would block on its own cold compile, past the deadline of a short hop: an explicit
    train.compile leaves the networks eager for such a hop, and says so. A hop under 10 minutes is short; 5 leave
    a loaded machine's torchrun, imports and rendezvous time for the 4 updates (50 s did not, on CI)."""
    proc = torchrun(
        *COMMON, "run.out_dir=short", "train.compile=default", "budget.time_limit=5:00", "train.total_updates=4",
        cwd=tmp_path,
    )  # fmt: skip
    out, err = proc.communicate(timeout=480)
    assert proc.returncode == 0, err[-3000:]
    assert "model: not compiled in this hop (train.compile=default, " in out
    assert " s left and not in the kept cache" in out
    assert "a cold compile in every rank could outlast the deadline" in out
    summary = json.loads((tmp_path / "short" / "d" / "summary.json").read_text())
    assert summary["step"] == 4 and "compile" not in summary
