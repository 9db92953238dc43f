"""Nothing lost: runs SIGKILLed inside the checkpoint commit protocol and from outside, then started again with
the same command, end bit-exact with an uninterrupted run (bench/faults.py --quick; the full campaign is the
bench)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env, hpctrain, read_jsonl

BENCH = ROOT / "bench" / "faults.py"
CHILD = ROOT / "bench" / "helpers" / "fault_child.py"
sys.path.insert(0, str(BENCH.parent))
import faults  # noqa: E402 (bench/faults.py: its jobs and the check of a run folder)


def bench(*args: str, cwd: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(BENCH), *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("faults")
    return bench("--quick", "--workdir", str(work), cwd=work)


def test_killed_runs_resume_and_end_bit_exact(campaign: dict):
    assert campaign["failures"] == []
    assert campaign["kills"] >= 8 and campaign["jobs"] == ["regression", "muons"]
    points = campaign["kills_by_point"]
    exact = sum(n for p, n in points.items() if p.startswith(("save:", "start:")))
    timed = sum(n for p, n in points.items() if p.startswith("time:"))
    assert exact >= 5 and timed >= 2, points
    assert campaign["all_resumed"] and campaign["resumed_ok"] == campaign["kills"]
    assert campaign["all_params_equal"] and campaign["params_equal"] == campaign["runs"] >= 2
    assert campaign["steps_repeated_or_lost"] == 0
    assert campaign["evals_repeated_or_lost"] == 0
    assert campaign["loss_mismatches"] == 0


def check(run_dir: str | Path, reference: str) -> dict:
    job = faults.make_jobs(Path("unused"))["regression"]
    return faults.verify(job, Path(run_dir), None, faults.reference_from_dir(Path(reference)))


def test_the_check_catches_another_seed_and_a_broken_history(campaign: dict, tmp_path: Path):
    """The comparison can fail: a run of another seed differs, and so does a history with holes."""
    reference = campaign["reference_dirs"]["regression"]
    other = hpctrain(*campaign["commands"]["regression"][3:], "run.out_dir=out", "run.seed=1", cwd=tmp_path)
    assert other.code == 0, other.err
    verdict = check(tmp_path / "out" / "regression", reference)
    assert not verdict["params_equal"] and verdict["loss_mismatches"] > 0
    assert verdict["steps_repeated_or_lost"] == 0  # complete, just not the same run

    broken = tmp_path / "broken"
    shutil.copytree(campaign["run_dirs"][0], broken)
    lines = (broken / "metrics.jsonl").read_text().splitlines(keepends=True)
    steps = [json.loads(line).get("step") for line in lines]
    lines.insert(steps.index(30), lines[steps.index(10)])  # update 10 logged twice
    del lines[steps.index(20)]  # update 20 lost (its train record comes before its evaluation's)
    (broken / "metrics.jsonl").write_text("".join(lines))
    verdict = check(broken, reference)
    assert verdict["params_equal"] and verdict["steps_repeated_or_lost"] == 2


# ---- kills after the final commit, and inside the best save (once gaps found by the campaign) ---------------

TINY = [
    "train",
    "run.name=t",
    "run.out_dir=out",
    "train.total_updates=6",
    "train.eval_every=3",
    "checkpoint.every=3",
    "data.n_train=256",
    "data.n_val=256",
    "train.threads=1",
]


def killed_at(point: str, nth: int, cwd: Path) -> None:
    """TINY run under bench/helpers/fault_child.py: SIGKILLed at the `nth` call of `point`."""
    killed = subprocess.run(
        [sys.executable, str(CHILD), "--point", point, "--nth", str(nth), "--", *TINY],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def killed_while_writing_best(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Killed while writing `best.pt` of the final save, then the same command again."""
    work = tmp_path_factory.mktemp("best")
    # best.pt is written at update 3 (the first evaluation) and, as the final evaluation improves, at update 6.
    killed_at("save:best", 2, work)
    again = hpctrain(*TINY, cwd=work)
    assert again.code == 0, again.err
    return work / "out" / "t", last_line(again.out)


def test_a_run_killed_while_writing_best_keeps_the_best_checkpoint(killed_while_writing_best):
    """best.pt is written before `latest` moves: the kill left `latest` at update 3, so the resumed run
    evaluated at update 6 again and wrote best.pt and best.json whole."""
    run_dir, line = killed_while_writing_best
    evals = {r["step"]: r["val_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r}
    assert evals[6] < evals[3]  # the final evaluation improved (its best.pt write was killed): 6 is best
    best = run_dir / "checkpoints" / "best.pt"
    assert json.loads(best.with_suffix(".json").read_text())["step"] == 6
    assert faults.checkpoint_digest(best) == faults.HASH_LINE.search(line).group(1)  # the final weights
    assert not [p.name for p in run_dir.rglob("*") if "tmp" in p.name]


@pytest.fixture(scope="module")
def killed_after_final_commit(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Killed right after the final `latest` move; the next start killed while it writes summary.json; then
    the same command twice more."""
    work = tmp_path_factory.mktemp("late")
    run_dir = work / "out" / "t"
    killed_at("save:after_latest", 2, work)  # `latest` moves at updates 3 and 6
    hops = json.loads((run_dir / "chain.json").read_text())
    killed_at("exit:summary", 1, work)
    left = sorted(p.name for p in run_dir.iterdir() if ".tmp-" in p.name)
    repaired = hpctrain(*TINY, cwd=work)
    summary = json.loads((run_dir / "summary.json").read_text())
    stamp = (run_dir / "summary.json").stat().st_mtime_ns
    again = hpctrain(*TINY, cwd=work)
    status = hpctrain("status", str(run_dir), cwd=work)
    return {
        "run_dir": run_dir,
        "killed_hops": hops,
        "left": left,
        "repaired": repaired,
        "summary": summary,
        "again": again,
        "rewritten": (run_dir / "summary.json").stat().st_mtime_ns != stamp,
        "status": status,
    }


def test_a_run_killed_after_its_final_commit_reports_its_hash_and_is_completed(killed_after_final_commit):
    k = killed_after_final_commit
    run_dir, repaired = k["run_dir"], k["repaired"]
    assert k["killed_hops"][-1]["end"] is None  # what the kill left: an open hop
    assert k["left"] and k["left"][0].startswith(".summary.json.tmp-")  # and a cut summary write
    assert repaired.code == 0, repaired.err
    line = last_line(repaired.out)
    assert "already finished at update 6" in line and "params_sha256=" in line
    digest = faults.HASH_LINE.search(line).group(1)
    latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    assert digest == faults.checkpoint_digest(latest)  # computed from the weights it loaded
    summary = k["summary"]
    assert summary["status"] == "finished" and summary["step"] == 6 and summary["params_sha256"] == digest
    hops = json.loads((run_dir / "chain.json").read_text())
    assert len(hops) == 1  # closed, and no hop opened for a start that trained nothing
    assert hops[0]["end"] is not None and hops[0]["exit_reason"] == "finished"
    assert hops[0]["last_update"] == 6 and "killed after its final save" in hops[0]["note"]
    assert summary["hops"] == 1
    assert not [p.name for p in run_dir.rglob("*") if "tmp" in p.name]  # the dead writer's temporary went
    assert "killed after its final save" in repaired.err


def test_a_completed_finished_run_is_left_alone_and_reported_finished(killed_after_final_commit):
    k = killed_after_final_commit
    again = k["again"]
    assert again.code == 0, again.err
    assert faults.HASH_LINE.search(last_line(again.out)).group(1) == k["summary"]["params_sha256"]
    assert not k["rewritten"] and "killed after" not in again.err
    assert len(json.loads((k["run_dir"] / "chain.json").read_text())) == 1
    status = k["status"]
    assert status.code == 0, status.err
    assert status.out.splitlines()[0].startswith(f"run {k['run_dir']}: finished"), status.out
