"""The progress display: a bar that redraws a few times a second at most, one rate, an ETA within the time
budget, closed before the run's last line; plain lines in a log file."""

from __future__ import annotations

import io
import time
from pathlib import Path

from hpctrain.track.base import FLUSH_SECONDS
from hpctrain.track.console import REDRAW_SECONDS, Console
from hpctrain.track.metrics_file import MetricsFile, read_metrics


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_redraws_at_most_a_few_times_a_second() -> None:
    term = Terminal()
    console = Console(total=3000, start=0, stream=term)
    started = time.monotonic()
    for step in range(1, 3001):
        console.tick(step)
        if step % 100 == 0:
            console.update(step, {"loss": 0.5, "updates_per_s": 1234.0, "lr": 1e-3})
    elapsed = time.monotonic() - started
    console.close()
    redraws = term.getvalue().count("\r")
    # One draw at creation, at most one per REDRAW_SECONDS, the last one (step == total), the close.
    assert redraws <= 4 + elapsed / REDRAW_SECONDS, (redraws, elapsed)
    last = term.getvalue().rsplit("\r", 1)[-1]
    assert "3000/3000" in last and last.endswith("\n")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_rate_and_an_eta_bounded_by_the_budget() -> None:
    term, clock = Terminal(), Clock()
    console = Console(total=1000, start=100, stream=term, time_left=lambda: 75.0, clock=clock)
    console.update(300, {"loss": 0.25, "updates_per_s": 3.0, "samples_per_s": 96.0})
    clock.now += 10  # 100 updates in 10 s since the first log step
    console.update(400, {"loss": 0.25, "updates_per_s": 10.0, "samples_per_s": 320.0})
    console.close()
    line = term.getvalue().strip().rsplit("\r", 1)[-1]
    assert "eta 01:00 | deadline in 01:15" in line  # 600 updates at 10/s; 75 s of budget left
    assert "updates/s 10" in line and "upd/s" not in line and "it/s" not in line  # our rate only
    assert "400/1000" in line


def test_the_first_eta_leaves_out_the_hop_start() -> None:
    """The first log step's window holds the hop's start (a slow first update): no ETA from it; then the
    progress since that step, not the window's rate."""
    log, clock = io.StringIO(), Clock()
    console = Console(total=300, start=0, stream=log, clock=clock)
    clock.now += 5.0  # the start: 10 updates in 5 s
    console.update(10, {"loss": 1.0, "updates_per_s": 2.0})
    clock.now += 0.5
    console.update(20, {"loss": 1.0, "updates_per_s": 20.0})
    console.close()
    first, second = log.getvalue().splitlines()
    assert first.endswith("| elapsed 00:05") and "eta" not in first
    assert second.endswith("| elapsed 00:05 | eta 00:14")  # 280 updates at 20/s, not at 2/s (02:20)


def test_log_file_gets_plain_lines_and_messages_do_not_tear_the_bar() -> None:
    log, clock = io.StringIO(), Clock()
    console = Console(total=10, start=0, stream=log, clock=clock)
    console.tick(1)
    console.update(3, {"loss": 0.25, "updates_per_s": 2.0, "data_share": 0.25})
    clock.now += 1
    console.update(5, {"loss": 0.125, "updates_per_s": 2.0, "data_share": 0.25})
    console.message("eval at update 5 | val_loss 0.1")
    console.close()
    console.close()  # twice is harmless (closed before the final line, then again at exit)
    assert (
        log.getvalue() == "update 3/10 | loss 0.25 | updates/s 2 | data 25% | elapsed 00:00\n"
        "update 5/10 | loss 0.125 | updates/s 2 | data 25% | elapsed 00:01 | eta 00:02\n"
        "eval at update 5 | val_loss 0.1\n"
    )


def test_progress_lines_reach_their_files_within_a_second_messages_at_once(tmp_path: Path) -> None:
    """A log line every few updates is flushed about once a second (a write call per line costs the update
    loop), a message and close() flush at once; metrics.jsonl the same, and all of it at its flush()."""
    out, log = open(tmp_path / "out.txt", "w"), open(tmp_path / "training.log", "w")  # noqa: SIM115
    console = Console(100, 0, "plain", stream=out, log_file=log)
    metrics = MetricsFile(tmp_path / "metrics.jsonl", None)
    shown = lambda: [(tmp_path / n).read_text().count("/100 |") for n in ("out.txt", "training.log")]  # noqa: E731
    records = lambda: len(read_metrics(tmp_path / "metrics.jsonl"))  # noqa: E731
    for step in (1, 2, 3):
        console.update(step, {"loss": 1.0})
        metrics.log_scalars(step, {"loss": 1.0})
    assert shown() == [0, 0] and records() == 0  # buffered: no write call per line
    time.sleep(FLUSH_SECONDS + 0.05)
    console.update(4, {"loss": 1.0})
    metrics.log_scalars(4, {"loss": 1.0})
    assert shown() == [4, 4] and records() == 4  # the first line after a second takes the others along
    console.update(5, {"loss": 1.0})
    metrics.log_scalars(5, {"loss": 1.0})
    console.message("eval at update 5")
    assert shown() == [5, 5] and "eval at update 5" in (tmp_path / "out.txt").read_text()
    metrics.show()  # before an evaluation (and flush() at a checkpoint commit)
    assert records() == 5
    console.update(6, {"loss": 1.0})
    console.close()
    assert shown() == [6, 6]
    metrics.close()
    out.close()
    log.close()


def test_plain_lines_carry_elapsed_eta_and_deadline_like_the_bar() -> None:
    """A SLURM log (no terminal) gets the bar's times on every progress line (issue 31 item 2)."""
    log, clock = io.StringIO(), Clock()
    console = Console(total=1000, start=0, stream=log, time_left=lambda: 3725.0, clock=clock)
    console.update(200, {"loss": 0.5, "updates_per_s": 4.0})
    clock.now += 50
    console.update(400, {"loss": 0.5, "updates_per_s": 4.0})
    console.close()
    line = log.getvalue().strip().splitlines()[-1]
    assert line.startswith("update 400/1000 | loss 0.5 | updates/s 4 | elapsed 00:50")
    assert line.endswith("| eta 02:30 | deadline in 1:02:05")  # 600 updates at 4/s; the budget's 3725 s
