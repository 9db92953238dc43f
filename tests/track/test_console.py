"""The progress display: a bar that redraws a few times a second at most, one rate, an ETA within the time
budget, closed before the run's last line; plain lines in a log file."""

from __future__ import annotations

import io
import time

from hpctrain.track.console import REDRAW_SECONDS, Console


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


def test_one_rate_and_an_eta_bounded_by_the_budget() -> None:
    term = Terminal()
    console = Console(total=1000, start=100, stream=term, time_left=lambda: 75.0)
    console.update(400, {"loss": 0.25, "updates_per_s": 10.0, "samples_per_s": 320.0})
    console.close()
    line = term.getvalue().strip().rsplit("\r", 1)[-1]
    assert "eta 01:00 | budget 01:15" in line  # 600 updates at 10/s; 75 s of budget left
    assert "updates/s 10" in line and "upd/s" not in line and "it/s" not in line  # our rate only
    assert "400/1000" in line


def test_log_file_gets_plain_lines_and_messages_do_not_tear_the_bar() -> None:
    log = io.StringIO()
    console = Console(total=10, start=0, stream=log)
    console.tick(1)
    console.update(5, {"loss": 0.125, "updates_per_s": 2.0, "data_share": 0.25})
    console.message("eval at update 5 | val_loss 0.1")
    console.close()
    console.close()  # twice is harmless (closed before the final line, then again at exit)
    assert (
        log.getvalue()
        == "update 5/10 | loss 0.125 | updates/s 2 | data 25%\neval at update 5 | val_loss 0.1\n"
    )
