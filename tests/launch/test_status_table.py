"""`hpctrain status FOLDER`: a table of the run folders under FOLDER, each row from what is on disk (and one
squeue call), without torch; and on real trainings, live while one runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.errors import EXIT_RESUMABLE
from tests.conftest import clean_env, hpctrain, read_jsonl
from tests.launch.test_submit_status import _bin, _dead_pid, _hop


def _run(folder: Path, hops: list[dict], summary: dict | None, metrics: list[dict], **files: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "train:\n  total_updates: 100\ncheckpoint:\n  best_metric: val_loss\n  best_mode: min\n"
    )
    if hops:
        (folder / "chain.json").write_text(json.dumps(hops))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if metrics:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for name, content in files.items():
        (folder / name.replace("_", ".")).write_text(json.dumps(content))
    return folder


def _summary(status: str, step: int, **extra: object) -> dict:
    return {"status": status, "reason": status, "step": step, "total_updates": 100, "hops": 1, **extra}


def _logs(tmp_path: Path) -> Path:
    """A folder of runs in every state, one of them two levels down, one three (not found)."""
    logs, now = tmp_path / "logs", time.time()
    loss = [{"step": s, "loss_mean": 1 / s, "time": now - 500 + s, "hop": 0} for s in range(10, 101, 10)]
    vals = [{"step": s, "val_loss": v, "hop": 0} for s, v in ((40, 0.3), (80, 0.2), (100, 0.25))]
    hop = _hop(0, now - 600, now - 400, 0, 100, "finished")  # 10 s of training in 200 s: goodput 0.05
    _run(logs / "done", [hop], _summary("finished", 100, best=0.2), loss + vals)
    hop = _hop(0, now - 900, now - 800, 0, 40, "time_budget")
    _run(logs / "sweep" / "lr1", [hop], _summary("stopped", 40, best=0.5), [{"step": 40, "val_loss": 0.5}])
    # Running on another node: its last checkpoint is at 40, its records (no evaluation yet) at 73.
    live = [{"step": s, "loss_mean": 0.1 + abs(s - 50) / 100, "time": now - 80 + s} for s in range(41, 74)]
    lock = {"pid": 12345, "host": "another-node", "job_id": "41", "started": now - 200, "heartbeat": now - 5}
    _run(logs / "sweep" / "lr2", [_hop(0, now - 200, None, 0, 40, None)], None, live, run_lock=lock)
    stale = {"pid": _dead_pid(), "host": socket.gethostname(), "started": now - 300, "heartbeat": now - 250}
    _run(logs / "crashed", [_hop(0, now - 300, None, 0, 20, None)], None, [], run_lock=stale)
    _run(logs / "fresh", [], None, [])
    hop = _hop(0, now - 300, now - 200, 0, 30, "nonfinite")
    _run(logs / "failed", [hop], _summary("failed", 30, nonfinite_update=33), [])
    hop = {**_hop(0, now - 900, now - 800, 0, 50, "time_budget"), "job_id": "77"}
    _run(logs / "queued", [hop], _summary("stopped", 50), [])
    hop = {**_hop(0, now - 100, None, 0, 10, None), "job_id": "9_1"}  # an array element, by its array id
    _run(logs / "array", [hop], None, [])
    _run(logs / "a" / "b" / "deep", [], None, [])
    return logs


SQUEUE = 'echo "77|77|PENDING"; echo "90|9_1|RUNNING"; echo "91|9_2|PENDING"'


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`hpctrain status ARGS` asserting that torch was never imported (a login node's verb)."""
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['status', *sys.argv[1:]]); "
        "assert 'torch' not in sys.modules, 'status imported torch'; sys.exit(rc)"
    )
    env = clean_env(PATH=_bin(tmp_path, squeue=SQUEUE))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)


def test_a_folder_of_runs_is_one_row_per_run_in_every_state(tmp_path: Path) -> None:
    made = time.time()
    logs = _logs(tmp_path)
    done = _status(tmp_path, str(logs), "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert list(rows) == ["array", "crashed", "done", "failed", "fresh", "queued", "sweep/lr1", "sweep/lr2"]
    assert {name: row["state"] for name, row in rows.items()} == {
        "array": "running",
        "crashed": "crashed",
        "done": "finished",
        "failed": "failed",
        "fresh": "not started",
        "queued": "stopped",
        "sweep/lr1": "stopped",
        "sweep/lr2": "running",
    }
    assert rows["queued"]["queue"] == "PENDING" and rows["array"]["evidence"] == "squeue: job 9_1 RUNNING"
    finished = rows["done"]
    assert (finished["update"], finished["total_updates"], finished["hops"]) == (100, 100, 1)
    assert (finished["metric"], finished["last"], finished["best"], finished["best_of"]) == (
        "val_loss", 0.25, 0.2, "run"
    )  # fmt: skip
    assert abs(finished["goodput"] - 0.05) < 1e-9
    live = rows["sweep/lr2"]
    assert live["update"] == 73  # from metrics.jsonl: ahead of the checkpoint at 40
    assert live["metric"] == "loss_mean" and live["last"] == 0.33 and live["best"] == 0.1  # no evaluation yet
    assert live["last_activity"] >= made - 5  # the heartbeat, 5 s before the folder was made
    assert rows["sweep/lr1"]["best"] == 0.5 and rows["fresh"]["metric"] is None

    text = _status(tmp_path, str(logs))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["run", "state", "update", "metric", "last", "best", "hops", "goodput", "last",
                                "activity"]  # fmt: skip
    by_name = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert by_name["done"][:8] == ["done", "finished", "100/100", "val_loss", "0.25", "0.2", "1", "0.05"]
    assert by_name["sweep/lr1"][1] == "stopped-resumable" and by_name["queued"][1:3] == ["stopped-resumable",
                                                                                        "(PENDING)"]  # fmt: skip
    assert by_name["sweep/lr2"][1:4] == ["running", "73/100", "loss_mean"] and "a/b/deep" not in by_name
    assert (
        lines[-1] == "8 runs: 1 crashed, 1 failed, 1 finished, 1 not-started, 2 running, 2 stopped-resumable"
    )


def test_the_table_sorts_and_bad_input_is_one_line(tmp_path: Path) -> None:
    logs = _logs(tmp_path)

    def names(*args: str) -> list[str]:
        done = _status(tmp_path, str(logs), "--json", *args)
        assert done.returncode == 0, done.stderr
        return [row["name"] for row in json.loads(done.stdout)]

    # rows without a value come last (in name order) whichever the direction
    assert names("--sort", "best") == ["sweep/lr2", "done", "sweep/lr1", "array", "crashed", "failed", "fresh",
                                       "queued"]  # fmt: skip
    assert names("--sort", "best", "--reverse")[:3] == ["sweep/lr1", "done", "sweep/lr2"]
    assert names("--sort", "update", "--reverse")[:3] == ["done", "sweep/lr2", "queued"]
    assert names("--sort", "goodput")[-1] == "fresh"
    for args, message in [
        (["--sort", "speed"], "error: hpctrain status: --sort 'speed': choose from name, state, update"),
        ([], "holds none 2 levels down"),
    ]:
        folder = logs if args else tmp_path / "empty"
        folder.mkdir(exist_ok=True)
        done = _status(tmp_path, str(folder), *args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and message in done.stderr, (
            done.stderr
        )
    one = _status(tmp_path, str(logs / "done"), "--sort", "best")
    assert one.returncode == 2 and one.stderr.startswith("error: --sort and --reverse order a table of runs")
    assert "run " + str(logs / "done") + ": finished" in _status(tmp_path, str(logs / "done")).stdout


def test_the_table_of_real_runs_follows_a_running_one_live(tmp_path: Path) -> None:
    short = ["train.threads=1", "run.out_dir=logs"]
    assert hpctrain("train", *short, "train.total_updates=20", "run.name=fin", cwd=tmp_path).code == 0
    live = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "train",
            *short,
            "train.total_updates=10000000",
            "run.name=live",
            "checkpoint.every=0",
            "train.eval_every=0",
        ],  # no save before the stop: the live rows are ahead
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "live.err").open("w"),  # a file: a pipe nobody reads would fill and stop it
    )
    try:
        metrics, deadline = tmp_path / "logs" / "live" / "metrics.jsonl", time.time() + 120
        while not (metrics.exists() and len(read_jsonl(metrics)) >= 3) and time.time() < deadline:
            assert live.poll() is None, (tmp_path / "live.err").read_text()
            time.sleep(0.2)
        done = hpctrain("status", "logs", "--json", cwd=tmp_path)
        assert done.code == 0, done.err
        rows = {row["name"]: row for row in json.loads(done.out)}
        chain = json.loads((tmp_path / "logs" / "live" / "chain.json").read_text())
        assert rows["live"]["state"] == "running" and f"live process {live.pid}" in rows["live"]["evidence"]
        assert rows["live"]["update"] >= read_jsonl(metrics)[2]["step"] > chain[0]["last_update"]
        assert rows["live"]["total_updates"] == 10000000 and rows["live"]["hops"] == 1
        assert rows["fin"]["state"] == "finished" and rows["fin"]["update"] == 20
        assert rows["fin"]["metric"] == "val_loss" and rows["fin"]["best_of"] == "run"
    finally:
        os.kill(live.pid, signal.SIGINT)  # the trainer saves and stops (exit 75)
        assert live.wait(timeout=120) == EXIT_RESUMABLE
    done = hpctrain("status", "logs", "--sort", "update", cwd=tmp_path)
    lines = done.out.splitlines()
    assert lines[1].split()[:2] == ["fin", "finished"] and lines[2].split()[:2] == [
        "live",
        "stopped-resumable",
    ]
    summary = json.loads((tmp_path / "logs" / "live" / "summary.json").read_text())
    assert lines[2].split()[2] == f"{summary['step']}/10000000"
    records = read_jsonl(metrics)
    hop = json.loads((tmp_path / "logs" / "live" / "chain.json").read_text())[0]
    assert all(r["hop"] == 0 and hop["start"] <= r["time"] <= hop["end"] for r in records)


def test_the_best_is_the_runs_only_where_the_records_read_reach_back_far_enough() -> None:
    from hpctrain.commands.status_table import metric_figures
    from hpctrain.track.runs import Tail

    cfg = {"checkpoint": {"best_metric": "val_r2", "best_mode": "max"}}
    records = [{"step": s, "val_r2": v, "time": 100.0 + s} for s, v in ((10, 0.5), (20, 0.7), (30, 0.6))]
    summary = {"best": 0.65}  # of the hops before the running one, which began at t=115
    both = metric_figures(Tail(records, False, False), cfg, summary, since=115.0)
    assert (both["last"], both["best"], both["best_of"]) == (0.6, 0.7, "run")
    late = metric_figures(Tail(records, False, False), cfg, summary, since=105.0)  # start not reached
    assert late["best"] == 0.7 and late["best_of"] == "last 3 records"
    closed = metric_figures(Tail(records[1:], False, False), {**cfg}, {"best": 0.9})  # no hop running
    assert (closed["best"], closed["best_of"], closed["last_update"]) == (0.9, "run", 30)
    no_eval = metric_figures(Tail([{"step": 5, "loss_mean": 2.0}], False, True), cfg, {})
    assert (no_eval["metric"], no_eval["mode"], no_eval["best_of"]) == ("loss_mean", "min", "last 1 records")


def test_unreadable_files_make_a_row_not_a_traceback(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    _run(logs / "odd", [], None, [{"step": 3, "loss_mean": 1.5}])
    (logs / "odd" / "chain.json").write_text('[{"hop": 0}, "x"]')  # hops without a start
    (logs / "odd" / "summary.json").write_text("[1, 2]")
    (logs / "odd" / "config.yaml").write_text(": not yaml :")
    with (logs / "odd" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "loss_m')  # a line cut by a kill
    _run(logs / "ok", [], None, [])
    done = _status(tmp_path, str(logs), "--json")
    assert done.returncode == 0, done.stderr
    odd = json.loads(done.stdout)[0]
    assert (odd["name"], odd["state"], odd["update"], odd["metric"], odd["total_updates"]) == (
        "odd", "not started", 3, "loss_mean", None
    )  # fmt: skip


def test_a_sweep_of_generators_shows_and_sorts_by_physics(tmp_path: Path) -> None:
    """Issue 43: the periodic judge's classifier AUC (val_auc, lower is better) and the features meeting the goal
    in the last `hpctrain evaluate` (eval_features_goal_met of eval_features_total): shown, and sorted by."""
    sweep, now = tmp_path / "sweep", time.time()
    hop = _hop(0, now - 600, now - 400, 0, 100, "finished")
    figures = {"a": (0.61, 4), "b": (0.53, 7), "c": (0.55, None), "d": (0.58, 7)}
    for name, (auc, met) in figures.items():
        records = [{"step": 50, "val_auc": auc + 0.05}, {"step": 100, "val_auc": auc, "val_loss": 1.0}]
        records += [{"step": 100, "eval_features_goal_met": met, "eval_features_total": 10}] if met else []
        _run(sweep / name, [hop], _summary("finished", 100, best=1.0), records)
    done = _status(tmp_path, str(sweep), "--json", "--sort", "auc")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == ["b", "c", "d", "a"]
    assert [(r["auc"], r["auc_update"], r["goal_met"], r["goal_features"]) for r in rows[:2]] == [
        (0.53, 100, 7, 10), (0.55, 100, None, None)
    ]  # fmt: skip
    # the most features met first, the lower AUC between equals; runs never evaluated last
    goal = _status(tmp_path, str(sweep), "--json", "--sort", "goal")
    assert [r["name"] for r in json.loads(goal.stdout)] == ["b", "d", "a", "c"]
    text = _status(tmp_path, str(sweep), "--sort", "goal").stdout.splitlines()
    assert text[0].split()[:8] == ["run", "state", "update", "metric", "last", "best", "AUC", "goal"]
    assert text[1].split()[:8] == ["b", "finished", "100/100", "val_loss", "1", "1", "0.53", "7/10"]
    assert text[4].split()[6:8] == ["0.55", "-"]
    assert any(line.startswith("AUC: the last classifier AUC") for line in text)
    # a table of runs without such figures has no such columns
    plain = _status(tmp_path, str(_logs(tmp_path))).stdout.splitlines()
    assert "AUC" not in plain[0].split() and not any(line.startswith("AUC:") for line in plain)
