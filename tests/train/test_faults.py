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


# ---- known gaps (found by the campaign; strict: remove the mark once fixed) ---------------------------------

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


@pytest.fixture(scope="module")
def killed_after_final_commit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Killed while writing `best.pt` of the final save (after `latest` moved), then the same command again."""
    work = tmp_path_factory.mktemp("late")
    # best.pt is written at update 3 (the first evaluation) and, as the final evaluation improves, at update 6.
    killed = subprocess.run(
        [sys.executable, str(CHILD), "--point", "save:best", "--nth", "2", "--", *TINY],
        cwd=work,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    again = hpctrain(*TINY, cwd=work)
    assert again.code == 0, again.err
    return work / "out" / "t", again.out.strip().splitlines()[-1]


@pytest.mark.xfail(
    strict=True, reason="a run killed after its final commit only says 'already finished' later"
)
def test_a_run_killed_after_its_final_commit_still_reports_its_hash(killed_after_final_commit):
    run_dir, last_line = killed_after_final_commit
    assert "params_sha256=" in last_line
    assert json.loads((run_dir / "summary.json").read_text())["status"] in ("finished", "already_finished")


@pytest.mark.xfail(strict=True, reason="a kill between the `latest` move and best.json loses that best.pt")
def test_a_run_killed_while_writing_best_keeps_the_best_checkpoint(killed_after_final_commit):
    run_dir, _ = killed_after_final_commit
    evals = {r["step"]: r["val_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r}
    assert (
        evals[6] < evals[3]
    )  # the final evaluation improved (its best.pt write was killed): update 6 is best
    assert (run_dir / "checkpoints" / "best.json").is_file()
    assert json.loads((run_dir / "checkpoints" / "best.json").read_text())["step"] == 6
