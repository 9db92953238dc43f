"""Progress on the console: a bar on a terminal, a plain line every log_every updates otherwise."""

from __future__ import annotations

import sys
from typing import Any, TextIO


def _fmt(key: str, value: float) -> str:
    if key == "lr":
        return f"lr {value:.3e}"
    if key.endswith("_share"):
        return f"{key[:-6]} {100 * value:.0f}%"
    if abs(value) >= 1000:
        return f"{key} {value:.0f}"
    return f"{key} {value:.4g}"


# Keys shown on the progress line, in this order (the rest goes to metrics files and trackers only).
SHOWN = ("loss", "lr", "updates_per_s", "samples_per_s", "events_per_s", "muons_per_s", "data_share")


class Console:
    def __init__(self, total: int, start: int, mode: str = "auto", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        use_bar = mode == "bar" or (mode == "auto" and self.stream.isatty())
        self._bar: Any = None
        if use_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, file=self.stream, dynamic_ncols=True, unit="upd")

    def update(self, step: int, scalars: dict[str, float]) -> None:
        shown = [_fmt(k.replace("_per_s", "/s"), scalars[k]) for k in SHOWN if k in scalars]
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(" | ".join(shown[:5]), refresh=True)
        else:
            print(f"step {step}/{self.total} | " + " | ".join(shown), file=self.stream, flush=True)

    def tick(self, step: int) -> None:
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class NullConsole(Console):
    """The stand-in on ranks other than 0 (and before tracking starts): prints nothing, needs no `if`."""

    def __init__(self) -> None:
        self.stream = sys.stdout
        self.total = 0
        self._bar = None

    def update(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def tick(self, step: int) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass
