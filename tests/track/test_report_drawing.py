"""The report's figures drawn by forked processes (track/report/drawing.py) are the files one process draws,
with the same problems found; a drawing process that dies costs no figure; a bad worker count is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.track.report import drawing
from hpctrain.track.report.drawing import Drawing, draw_all
from hpctrain.track.report.panels import figure


def figures(out: Path, n: int = 7) -> list[Drawing]:
    made = []
    for i in range(n):
        fig, axes = figure(300, 200)
        ax = axes[0, 0]
        ax.plot(range(10), [(j * (i + 1)) % 7 for j in range(10)])
        # figure 3's title runs far past its edge: a problem text_problems reports
        ax.set_title("a title far too long to fit into a figure this narrow, cut" if i == 3 else f"panel {i}")
        made.append(Drawing(fig, out / f"f{i}.png", {"Title": f"f{i}"}))
    return made


class Ticks:
    """The progress callback: counts the figures said done."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_forked_drawing_writes_the_files_one_process_writes(tmp_path: Path, monkeypatch) -> None:
    done: dict[str, list[list[str]]] = {}
    for workers in ("1", "2"):
        out = tmp_path / workers
        out.mkdir()
        monkeypatch.setenv("HPCTRAIN_REPORT_WORKERS", workers)
        assert drawing.workers(7) == int(workers)
        ticks = Ticks()
        done[workers] = draw_all(figures(out), ticks)
        assert ticks.count == 7
    for i in range(7):
        assert (tmp_path / "1" / f"f{i}.png").read_bytes() == (tmp_path / "2" / f"f{i}.png").read_bytes()
    assert done["1"] == done["2"]
    assert [bool(p) for p in done["2"]] == [i == 3 for i in range(7)], done["2"]
    assert not list(tmp_path.rglob("*.tmp*")), "no temporary file left"


def test_a_drawing_process_that_dies_costs_no_figure(tmp_path: Path, monkeypatch) -> None:
    parent = os.getpid()
    real = drawing._draw

    def dies_in_a_child(one: Drawing) -> list[str]:
        if os.getpid() != parent and one.path.name == "f2.png":
            os._exit(9)  # as if killed: the pool breaks
        return real(one)

    # the forked processes inherit the patch (the pool pickles only _draw_one, by name)
    monkeypatch.setattr(drawing, "_draw", dies_in_a_child)
    monkeypatch.setenv("HPCTRAIN_REPORT_WORKERS", "2")
    ticks = Ticks()
    problems = draw_all(figures(tmp_path), ticks)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"f{i}.png" for i in range(7)]
    assert len(problems) == 7 and bool(problems[3]) and ticks.count == 7


def test_a_few_figures_or_one_core_draw_here(monkeypatch) -> None:
    monkeypatch.delenv("HPCTRAIN_REPORT_WORKERS", raising=False)
    assert drawing.workers(2) == 1  # fewer than MIN_PER_WORKER figures a process
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert drawing.workers(40) == 1


@pytest.mark.parametrize("given", ["0", "two", "-1"])
def test_a_bad_worker_count_is_one_line(tmp_path: Path, given: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
    env = {**os.environ, "HPCTRAIN_REPORT_WORKERS": given, "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "report", str(run)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and f"HPCTRAIN_REPORT_WORKERS: a whole number of processes >= 1, not {given!r}" in lines[0]
    )


SLOW_REPORT = """
import sys, time
from pathlib import Path
from hpctrain.track.report import drawing
from hpctrain.track.report.panels import figure

def slow(one):
    time.sleep(60)
    return []

drawing._draw = slow
made = []
for i in range(6):
    fig, axes = figure(200, 150)
    made.append(drawing.Drawing(fig, Path(sys.argv[1]) / f"{i}.png", {}))
drawing.draw_all(made)
"""


def test_drawing_processes_end_with_a_killed_command(tmp_path: Path) -> None:
    """A drawing process waits for work from the command: killed, the command leaves none of them behind."""
    import signal
    import time

    import psutil

    env = {**os.environ, "HPCTRAIN_REPORT_WORKERS": "2", "MPLBACKEND": "Agg"}
    command = subprocess.Popen([sys.executable, "-c", SLOW_REPORT, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(psutil.Process(command.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        children = psutil.Process(command.pid).children()
        assert len(children) == 2
        command.send_signal(signal.SIGKILL)
        command.wait()
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, alive
    finally:
        command.kill()
