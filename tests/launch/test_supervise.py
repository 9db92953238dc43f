"""Restarts without SLURM (launch/supervise.py, `hpctrain train --until-done`, `hpctrain supervise`): real
trainings stopped by their time budget or killed, supervised until done, end where an uninterrupted run ends;
crashes wait with capped, doubling pauses; attempts without progress stop it; signals reach the child once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpctrain.launch.chain import decide
from hpctrain.launch.supervise import Policy, Supervisor
from tests.conftest import clean_env, hpctrain, kill_once, save_pause

# The default job made slower per save in its first hop (a pause of 8 s before each checkpoint's rename): 10 saves
# take at least 80 s more than the updates, so a first hop with a 90 s budget (counted from its process start)
# cannot do them all; the next hop trains at full speed, and a start-up of 30-60 s (a loaded machine) leaves it
# time to train (pauses in every hop of 40 s left a loaded machine one update per hop).
RUN = ["train.total_updates=200", "checkpoint.every=20", "train.eval_every=50", "logging.progress=lines"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """params_sha256 of the run never interrupted."""
    root = tmp_path_factory.mktemp("reference")
    done = hpctrain("train", "run.name=ref", *RUN, cwd=root)
    assert done.code == 0, done.err
    return str(json.loads((root / "logs" / "ref" / "summary.json").read_text())["params_sha256"])


def _hops(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "chain.json").read_text())


def test_time_budget_stops_are_restarted_until_done_bit_exactly(reference: str, tmp_path: Path) -> None:
    done = hpctrain(
        "train", "run.name=s", *RUN, "budget.time_limit=1:30", "budget.margin_seconds=0.5",
        "--until-done", "--max-idle", "4",
        cwd=tmp_path, env=clean_env(**save_pause(8.0, hops=1)), timeout=900,
    )  # fmt: skip
    assert done.code == 0, done.err
    hops = _hops(tmp_path / "logs" / "s")
    assert len(hops) >= 2 and {h["exit_reason"] for h in hops[:-1]} == {"time_budget"}
    assert hops[-1]["exit_reason"] == "finished"
    summary = json.loads((tmp_path / "logs" / "s" / "summary.json").read_text())
    assert summary["params_sha256"] == reference
    lines = [line for line in done.err.splitlines() if line.startswith("hpctrain supervise:")]
    restarts = [line for line in lines if "starting it again at once" in line]
    assert len(restarts) == len(hops) - 1 and all("ended with exit code 75" in line for line in restarts)
    assert lines[-1] == f"hpctrain supervise: attempt {len(hops)} ended with exit code 0: the run finished"


def test_a_killed_training_is_restarted_after_a_pause_bit_exactly(reference: str, tmp_path: Path) -> None:
    env = clean_env(**kill_once(tmp_path / "killed"))
    done = hpctrain(
        "train", "run.name=k", *RUN, "--until-done", "--backoff", "0.5", cwd=tmp_path, env=env, timeout=400
    )
    assert done.code == 0, done.err
    assert (tmp_path / "killed").exists()
    assert "attempt 1 ended with killed by SIGKILL: crashed: starting it again in 0.5 s" in done.err
    assert "attempt 2 ended with exit code 0: the run finished" in done.err
    hops = _hops(tmp_path / "logs" / "k")
    assert [h["exit_reason"] for h in hops] == ["failure", "finished"] and hops[1]["first_update"] == 20
    summary = json.loads((tmp_path / "logs" / "k" / "summary.json").read_text())
    assert summary["params_sha256"] == reference


# ---- the supervisor's decisions, with small stand-in children ------------------------------------------------

CHILD = """
import json, os, sys
from pathlib import Path

run = Path(sys.argv[1])
run.mkdir(exist_ok=True)
attempt = len(list(run.glob("attempt-*"))) + 1
(run / f"attempt-{attempt}").touch()
codes = [int(c) for c in sys.argv[2].split(",")]
code = codes[min(attempt, len(codes)) - 1]
progress = sys.argv[3] == "progress"
hops = json.loads((run / "chain.json").read_text()) if (run / "chain.json").exists() else []
last = hops[-1]["last_update"] if hops else 0
hops.append({"hop": len(hops), "start": 0.0, "first_update": last, "last_update": last + (10 if progress else 0)})
(run / "chain.json").write_text(json.dumps(hops))
summary = sys.argv[4] if len(sys.argv) > 4 else ""
if summary:
    (run / "summary.json").write_text(json.dumps({"status": summary.split(",")[min(attempt, 2) - 1]}))
sys.exit(code)
"""


def supervise(tmp_path: Path, codes: str, progress: bool, *extra: str, policy: Policy | None = None):
    """Supervise the stand-in child; returns (exit code, pauses slept, lines said)."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    run_dir = tmp_path / "run"
    slept: list[float] = []
    said: list[str] = []
    command = [sys.executable, str(script), str(run_dir), codes, "progress" if progress else "idle", *extra]
    supervisor = Supervisor(
        command, run_dir, policy or Policy(backoff=1, backoff_max=4), [], said.append, slept.append
    )
    return supervisor.run(), slept, said


def _pauses(slept: list[float], said: list[str]) -> list[float]:
    """The pauses announced, checked against the time actually slept."""
    announced = [
        float(line.rsplit(" in ", 1)[1].split()[0]) for line in said if "starting it again in" in line
    ]
    assert sum(slept) == pytest.approx(sum(announced))
    return announced


def test_crashes_wait_doubling_pauses_up_to_the_cap(tmp_path: Path) -> None:
    code, slept, said = supervise(tmp_path, "1,1,1,1,75,1,0", progress=True)
    assert code == 0
    assert _pauses(slept, said) == [
        1,
        2,
        4,
        4,
        1,
    ]  # doubled, capped at 4; a clean stop starts the count again
    assert len(list((tmp_path / "run").glob("attempt-*"))) == 7
    assert said[-1] == "attempt 7 ended with exit code 0: the run finished"


def test_attempts_without_progress_stop_supervision(tmp_path: Path) -> None:
    code, slept, said = supervise(tmp_path, "75", progress=False)
    assert code == 75 and slept == []  # a resumable stop restarts at once, but not forever
    assert len(list((tmp_path / "run").glob("attempt-*"))) == 2
    assert said[-1] == (
        "attempt 2 ended with exit code 75: the last 2 attempts completed no update "
        "(max_hops_without_progress=2); look at their output"
    )


def test_a_crash_before_any_hop_counts_as_no_progress(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    said: list[str] = []
    slept: list[float] = []
    code = Supervisor(command, run_dir, Policy(max_idle=3, backoff=2), [], said.append, slept.append).run()
    assert code == 3 and _pauses(slept, said) == [2, 4]
    assert "attempt 3 ended with exit code 3: the last 3 attempts completed no update" in said[-1]


def test_exit_2_is_not_retried(tmp_path: Path) -> None:
    code, slept, said = supervise(tmp_path, "2", progress=False)
    assert code == 2 and slept == [] and len(list((tmp_path / "run").glob("attempt-*"))) == 1
    assert (
        said[-1]
        == "attempt 1 ended with exit code 2: bad input (exit 2, said above): running it again cannot help"
    )


def test_out_of_memory_is_not_retried_even_behind_torchruns_exit_1(tmp_path: Path) -> None:
    code, slept, said = supervise(tmp_path, "78", progress=True)
    assert code == 78 and slept == [] and len(list((tmp_path / "run").glob("attempt-*"))) == 1
    assert said[-1].startswith(
        "attempt 1 ended with exit code 78: out of device memory (exit 78, said above)"
    )
    # torchrun's 1 for a worker's 78: summary.json (written during the attempt) says it
    run_dir = tmp_path / "t" / "run"
    script = (
        "import json, pathlib, sys; run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True); "
        "(run / 'summary.json').write_text(json.dumps({'status': 'failed', 'exit_code': 78})); sys.exit(1)"
    )
    said.clear()
    code = Supervisor([sys.executable, "-c", script, str(run_dir)], run_dir, Policy(), [], said.append).run()
    assert code == 78 and said[-1].startswith(
        "attempt 1 ended with exit code 1 (summary.json: the run exited 78): out of device memory"
    )


def test_a_chain_stops_after_out_of_memory() -> None:
    verdict = decide([], "next", 78, max_resubmits=5, max_idle=2)
    assert verdict.action == "stop" and "ran out of device memory" in verdict.reason


def test_torchruns_exit_1_is_read_from_a_fresh_summary(tmp_path: Path) -> None:
    # torchrun exits 1 for a worker's 75 (and for its 0 only when another failed): summary.json says which
    code, slept, said = supervise(tmp_path, "1", True, "stopped,finished")
    assert code == 0 and slept == []
    assert said[1] == (
        "attempt 1 ended with exit code 1 (summary.json: the run exited 75): stopped early and resumable: "
        "starting it again at once"
    )


def test_a_summary_from_before_the_attempt_is_not_believed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "stopped"}))
    old = time.time() - 60
    os.utime(run_dir / "summary.json", (old, old))
    code, slept, said = supervise(tmp_path, "1,0", progress=True)
    assert code == 0 and _pauses(slept, said) == [1]
    assert said[1] == "attempt 1 ended with exit code 1: crashed: starting it again in 1 s"


def test_later_attempts_get_the_extra_arguments(tmp_path: Path) -> None:
    out = tmp_path / "argv.txt"
    script = f"import sys; open({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); sys.exit(int(sys.argv[1]))"
    said: list[str] = []
    command = [sys.executable, "-c", script]
    # exit 75 and no hop each time: three attempts, the second and third with the extra argument
    Supervisor([*command, "75"], tmp_path, Policy(max_idle=3), ["later"], said.append, lambda s: None).run()
    assert out.read_text().splitlines() == ["75", "75 later", "75 later"]


# ---- signals ---------------------------------------------------------------------------------------------------

SIGNALLED_CHILD = """
import signal, sys, time
from pathlib import Path

got = Path(sys.argv[1])
def handler(signum, frame):
    with got.open("a") as out:
        out.write(signal.Signals(signum).name + "\\n")
signal.signal(signal.SIGINT, handler)
signal.signal(signal.SIGTERM, handler)
Path(sys.argv[2]).touch()
deadline = time.time() + 60
while not got.exists() and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # a second signal (there should be none) would arrive here
sys.exit(75)
"""


@pytest.mark.parametrize(
    ("sig", "sent"),
    [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGTERM), (signal.SIGHUP, signal.SIGTERM)],
    ids=["ctrl_c", "sigterm", "hangup_as_sigterm"],
)
def test_a_signal_to_the_supervisor_reaches_the_child_once_and_ends_supervision(
    tmp_path: Path, sig: signal.Signals, sent: signal.Signals
) -> None:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(SIGNALLED_CHILD))
    got, ready = tmp_path / "got", tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "supervise", "--run-dir", str(tmp_path / "run"), "--",
         sys.executable, str(child), str(got), str(ready)],
        cwd=tmp_path, env=clean_env(), stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 300
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, sig)  # as a terminal's Ctrl-C: to the supervisor's whole process group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    # once, through the supervisor: not also from the terminal
    assert got.read_text().splitlines() == [sent.name]
    assert err.strip().splitlines()[-1] == (
        f"hpctrain supervise: stopped by {sig.name}; the child ended with exit code 75: supervision ends"
    )
    assert err.count("attempt ") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["supervise", "python", "x.py"], "give the command after `--`"),
        (["supervise", "--"], "no command after `--`"),
        (
            ["supervise", "--", "python", "x.py"],
            "runs no `hpctrain train`; name its run folder with --run-dir",
        ),
        (
            ["supervise", "--", "torchrun", "-m", "hpctrain", "train", "checkpoint.resume=never"],
            "checkpoint.resume=never under hpctrain supervise would start the run afresh at every restart",
        ),
        (["supervise", "--", "hpctrain", "train", "optim.lrr=1"], "optim.lrr=1: unknown key"),
        (
            ["supervise", "--backoff", "9", "--backoff-max", "1", "--run-dir", "r", "--", "x"],
            "need 0 <= backoff",
        ),
        (["train", "--until-done", "--max-idle", "0"], "--max-idle 0: must be at least 1"),
        (["supervise", "--run-dir", "r", "--", "./no-such-program"], "cannot start './no-such-program'"),
    ],
    ids=[
        "no_dashes",
        "no_command",
        "no_run_folder",
        "resume_never",
        "bad_key",
        "bad_backoff",
        "bad_idle",
        "no_program",
    ],
)
def test_supervision_mistakes_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = hpctrain(*args, cwd=tmp_path)
    assert done.code == 2 and message in done.err, done.err
    assert done.err.count("\n") == 1 and done.err.startswith("error: ")


def test_until_done_refuses_to_run_inside_every_rank(tmp_path: Path) -> None:
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    done = hpctrain("train", "--until-done", cwd=tmp_path, env=env)
    assert done.code == 2 and "hpctrain supervise -- torchrun" in done.err, done.err
    assert not (tmp_path / "logs").exists()
