"""Extending is deliberate (issue 27): a finished run re-run with a larger total under a cosine schedule is
refused with the LR numbers and nothing in its folder changes; `checkpoint.accept_changes` takes it; a length that
leaves the LR of the updates so far alone goes on, and the run is the one the new length makes from the start; the
start-up line says the LR the next update uses."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import hpctrain, read_jsonl
from tests.train.test_resume import signal_at

COSINE = "schedule.stages=[{type: cosine, num_updates: -1, start_factor: 1.0, end_factor: 0.01}]"
# warmup, stable, decay over the last 10 updates: where the decay sits moves with the length
WSD = (
    "schedule.stages=[{type: linear, num_updates: 5, start_factor: 0.1, end_factor: 1.0}, "
    "{type: constant, num_updates: -1}, {type: linear, num_updates: 10, start_factor: 1.0, end_factor: 0.0}]"
)
QUIET = ["train.threads=1", "train.eval_every=0", "logging.log_every=5"]


def cosine_lr(update: int, total: int) -> float:
    """optim.lr 1e-3 under COSINE, written out."""
    return 1e-3 * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(update, total) / total)))


def hashes(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def test_a_finished_run_is_extended_only_when_asked(tmp_path: Path) -> None:
    assert (
        hpctrain("train", *QUIET, "run.name=debug", COSINE, "train.total_updates=20", cwd=tmp_path).code
        == EXIT_OK
    )
    run_dir = tmp_path / "logs" / "debug"
    before = hashes(run_dir)

    # The forgotten override: the same run asked for 50 updates.
    refused = hpctrain("train", *QUIET, "run.name=debug", COSINE, "train.total_updates=50", cwd=tmp_path)
    assert refused.code == 2 and "Traceback" not in refused.err
    restart = cosine_lr(20, 50)
    assert refused.err.splitlines()[-1] == (
        "error: logs/debug finished at update 20: train.total_updates 20 -> 50 would rewrite its LR schedule: the "
        f"cosine decay restarts at update 20 from lr 1.0e-05 to {restart:.1e} (the cosine stage spans updates 0-50 "
        "instead of 0-20); pass checkpoint.accept_changes=[train.total_updates] to extend it anyway, or keep "
        "train.total_updates at 20"
    )
    assert (
        hashes(run_dir) == before
    )  # not a byte: checkpoints, config.yaml, chain.json, metrics, training.log

    extended = hpctrain(
        "train",
        *QUIET,
        "run.name=debug",
        COSINE,
        "train.total_updates=50",
        "checkpoint.accept_changes=[train.total_updates]",
        cwd=tmp_path,
    )
    assert extended.code == EXIT_OK, extended.err
    assert (
        "extending the finished run from 20 to 50 updates (checkpoint.accept_changes): the cosine decay restarts "
        f"at update 20 from lr 1.0e-05 to {restart:.1e}"
    ) in extended.out
    # The start-up line: the LR of update 21 (the schedule's, over the new length), not optim.lr.
    assert (
        f"update 21 trains at lr main {restart:.3g} (schedule factor {restart / 1e-3:.3g} at update 20)"
        in (extended.out)
    )
    assert "finished at update 50/50" in extended.out
    hops = json.loads((run_dir / "chain.json").read_text())
    assert [h["accepted_changes"] for h in hops] == [{}, {"train.total_updates": [20, 50]}]
    records = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}
    assert sorted(records) == list(range(5, 51, 5))
    for step in (25, 50):  # the LR of update `step`: the factor of the `step - 1` updates before it
        assert records[step]["lr"] == pytest.approx(cosine_lr(step - 1, 50))


def make_cfg(out: Path, *overrides: str):
    request = ConfigRequest(
        None, None, ["run.name=r", f"run.out_dir={out}", *QUIET, "logging.log_every=1", *overrides], None
    )
    return load_config(request, config_model(), environ={}, prepare=fill_default_types)


def stopped_at(out: Path, monkeypatch: pytest.MonkeyPatch, update: int, *overrides: str) -> None:
    with monkeypatch.context() as patch:
        signal_at(patch, update)
        assert run(make_cfg(out, *overrides), ClusterEnv()) == EXIT_RESUMABLE


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_an_unfinished_run_changes_length_when_the_lr_so_far_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(make_cfg(tmp_path / "straight", WSD, "train.total_updates=40"), ClusterEnv()) == EXIT_OK
    capsys.readouterr()

    # Stopped in the stable phase of a run of 30, continued to 40: its decay moves, nothing trained did.
    stopped_at(tmp_path / "longer", monkeypatch, 12, WSD, "train.total_updates=30")
    assert run(make_cfg(tmp_path / "longer", WSD, "train.total_updates=40"), ClusterEnv()) == EXIT_OK
    out = capsys.readouterr().out
    assert (
        "the run's length changes from 30 to 40 updates: the LR stages that depend on the length start after "
        "update 12, so the updates so far are those the new length makes; update 13 trains at lr 1.0e-03\n"
    ) in out
    assert "update 13 trains at lr main 0.001\n" in out
    hops = json.loads((tmp_path / "longer" / "r" / "chain.json").read_text())
    assert hops[1]["allowed_changes"] == {"train.total_updates": [30, 40]} and not hops[1]["accepted_changes"]
    # ... and it is the run of 40 from the start, bit for bit.
    longer, straight = summary(tmp_path / "longer" / "r"), summary(tmp_path / "straight" / "r")
    assert longer["step"] == 40 and longer["params_sha256"] == straight["params_sha256"]


def test_an_unfinished_run_under_a_cosine_keeps_its_length_and_says_its_lr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped_at(tmp_path, monkeypatch, 12, COSINE, "train.total_updates=30")
    run_dir = tmp_path / "r"
    before = hashes(run_dir)
    with pytest.raises(UserError) as refused:
        run(make_cfg(tmp_path, COSINE, "train.total_updates=40"), ClusterEnv())
    now, stretched = cosine_lr(12, 30), cosine_lr(12, 40)
    assert str(refused.value).startswith(
        f"{run_dir} reached update 12 of 30: train.total_updates 30 -> 40 would rewrite its LR schedule: the LR "
        f"at update 12 rises from lr {now:.1e} to {stretched:.1e} (the cosine stage spans updates 0-40 instead of "
        "0-30); pass checkpoint.accept_changes=[train.total_updates] to extend it anyway"
    )
    assert hashes(run_dir) == before
    capsys.readouterr()

    # The same length: the start-up line gives the scheduled LR of update 13, not optim.lr.
    assert run(make_cfg(tmp_path, COSINE, "train.total_updates=30"), ClusterEnv()) == EXIT_OK
    out = capsys.readouterr().out
    assert f"resumed from {run_dir / 'checkpoints' / 'step_00000012.pt'} at update 12" in out
    assert (
        f"effective lr main 0.001 (optim.lr_scaling=none); update 13 trains at lr main {now:.3g} "
        f"(schedule factor {now / 1e-3:.3g} at update 12)\n"
    ) in out


def test_train_epochs_on_resume_says_the_length_that_runs(tmp_path: Path) -> None:
    """A run by train.total_updates resumed with train.epochs (issue 29: it said `train.total_updates 256 -> 200`
    and ran to 256): every line names the length the epochs make, and the run goes exactly there."""
    data = ["data.n_train=320", "data.n_val=64"]  # 10 updates per epoch at batch 32
    first = hpctrain("train", *QUIET, *data, "run.name=ep", "train.total_updates=4", cwd=tmp_path)
    assert first.code == EXIT_OK, first.err
    again = hpctrain("train", *QUIET, *data, "run.name=ep", "train.epochs=2", cwd=tmp_path)
    assert again.code == EXIT_OK, again.err
    text = again.out + again.err
    assert "train.epochs 4 updates -> 20 updates" in text and "train.total_updates" not in text, text
    assert "extending the finished run from 4 to 20 updates" in text
    assert "finished at update 20/20" in text
    steps = [row["step"] for row in read_jsonl(tmp_path / "logs" / "ep" / "metrics.jsonl") if "loss" in row]
    assert steps[-1] == 20
