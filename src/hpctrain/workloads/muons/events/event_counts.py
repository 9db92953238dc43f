"""Events the muon streams removed or skipped (outliers, bad events, empty ones, those of unreadable files): each
kind said once per split and hop, the first time it happens, and the hop's total per split at its end.

A line at every doubling of a count read as a growing problem (issue 31); a line per evaluation pass repeated
itself. One EventCounts is shared by a task's training stream and its validation passes; the training stream,
closed at the end of the hop, says the totals.
"""

from __future__ import annotations

import logging

from hpctrain.workloads.muons.spec import MuonData

log = logging.getLogger("hpctrain.muons")


def what_and_advice(key: str, data: MuonData) -> tuple[str, str]:
    """What a count of `key` means (with the limit that made it), and what to do about it."""
    return {
        "outliers": (
            f"events with more than data.max_muons_per_event={data.max_muons_per_event} muons removed",
            "raise the limit to keep them; data.outliers_dir=DIR writes them out for a look",
        ),
        "bad_events": (
            "events with a zero, negative or non-finite value skipped",
            "data.on_bad_event=skip; set it to fail to stop at the first one",
        ),
        "empty_dropped": ("events without muons dropped", "data.drop_empty_events=true"),
        "bad_file_events": (
            "events of unreadable files skipped",
            "data.on_bad_file=skip; see the files named above",
        ),
    }.get(key, (f"events counted as {key}", "see the data section of the config"))


class EventCounts:
    """This hop's counts per split and kind; `add` says a kind the first time a split meets it (`say_first`;
    off for a single pass, whose total follows at once)."""

    def __init__(self, data: MuonData, say_first: bool = True) -> None:
        self.data, self.say_first = data, say_first
        self.hop: dict[str, dict[str, int]] = {}  # split -> kind -> events this hop

    def add(self, split: str, stats: dict[str, int]) -> None:
        counts = self.hop.setdefault(split, {})
        for key, value in stats.items():
            if not value:
                continue
            first = key not in counts
            counts[key] = counts.get(key, 0) + value
            if first and self.say_first:
                what, advice = what_and_advice(key, self.data)
                log.warning(
                    "muon data, %s split: %d %s (%s); said once, the hop's total at its end",
                    split,
                    value,
                    what,
                    advice,
                )

    def say_totals(
        self, run_totals: dict[str, dict[str, int]] | None = None, scope: str = "this hop"
    ) -> None:
        """One line per split and kind counted this hop (`run_totals`: split -> kind -> events since the run
        began, from the checkpointed stream state, said beside it where it differs; `scope`: what the counts
        cover); the counts restart."""
        for split, counts in self.hop.items():
            for key, value in counts.items():
                since = (run_totals or {}).get(split, {}).get(key, value)
                more = f" ({since} since the run began)" if since != value else ""
                log.warning(
                    "muon data, %s split, %s in all: %d %s%s",
                    split,
                    scope,
                    value,
                    what_and_advice(key, self.data)[0],
                    more,
                )
        self.hop.clear()
