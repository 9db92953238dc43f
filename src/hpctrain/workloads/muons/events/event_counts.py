"""Events the muon streams removed or skipped (outliers above the muon cap, bad events, empty ones, those of
unreadable files), counted as DISTINCT events and said once per split and hop, with their share of the events
and of the muons read.

A worker reports each unit (row group or HDF5 block) it decoded with how many events and muons it holds and how
many of each it removed, and why (`UnitTally`); a unit decoded again (by the next item, the next epoch, the next
evaluation pass) is counted once. A split is said when every unit of it was read (exact shares of the split), at
the training stream's first epoch boundary of the hop, or at the end of the hop (or of a pass of its own), over
the units read so far. Counting again each epoch said 71, 694, then 1,032 "events removed" for 89 distinct ones
(issue 43). One EventCounts is shared by a task's training stream and its validation passes.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from hpctrain.workloads.muons.spec import MuonData

log = logging.getLogger("hpctrain.muons")

KINDS = ("outliers", "bad_events", "empty_dropped", "bad_file_events")


class UnitTally(NamedTuple):
    """One decoded unit of file `file`: its `events` and `muons`, and per kind removed (events, muons)."""

    file: int
    unit: int
    events: int
    muons: int
    removed: tuple[tuple[str, int, int], ...] = ()


def what_and_advice(key: str, data: MuonData) -> tuple[str, str]:
    """What a count of `key` means (with the limit that made it), and what to do about it."""
    return {
        "outliers": (
            f"have more than data.max_muons_per_event={data.max_muons_per_event} muons and are removed",
            "raise the limit to keep them; data.outliers_dir=DIR writes them out for a look",
        ),
        "bad_events": (
            "have a zero, negative or non-finite value and are skipped",
            "data.on_bad_event=skip; set it to fail to stop at the first one",
        ),
        "empty_dropped": ("have no muons and are dropped", "data.drop_empty_events=true"),
        "bad_file_events": (
            "are in unreadable files and skipped",
            "data.on_bad_file=skip; see the files named above",
        ),
    }.get(key, (f"are counted as {key}", "see the data section of the config"))


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f} %" if whole else "n/a"


class EventCounts:
    """This hop's distinct removed events per split (module docstring)."""

    def __init__(self, data: MuonData) -> None:
        self.data = data
        self.units: dict[str, dict[tuple[int, int], UnitTally]] = {}  # split -> (file, unit) -> first tally
        self.expected: dict[str, int] = {}  # split -> units it holds (the index's)
        self.said: set[str] = set()

    def expect(self, split: str, units: int) -> None:
        """The number of units split `split` holds (a split is complete once all were read)."""
        self.expected[split] = units

    def add(self, split: str, tallies: tuple[UnitTally, ...]) -> None:
        seen = self.units.setdefault(split, {})
        for tally in tallies:
            seen.setdefault((tally.file, tally.unit), tally)
        if split not in self.said and len(seen) >= self.expected.get(split, -1) > 0:
            self.say(split, complete=True)

    def removed(self, split: str) -> dict[str, tuple[int, int]]:
        """kind -> (distinct events, their muons) removed in split `split` so far this hop."""
        out: dict[str, tuple[int, int]] = {}
        for tally in self.units.get(split, {}).values():
            for kind, events, muons in tally.removed:
                had = out.get(kind, (0, 0))
                out[kind] = (had[0] + events, had[1] + muons)
        return out

    def read(self, split: str) -> tuple[int, int, int]:
        """(events, muons, units) of split `split` read so far this hop (each unit once)."""
        tallies = self.units.get(split, {}).values()
        return sum(t.events for t in tallies), sum(t.muons for t in tallies), len(tallies)

    def lines(self, split: str, complete: bool = False) -> list[str]:
        """One line per kind of removed events of `split`: how many distinct events, their share of the events
        and of the muons read, what made them, and what to do."""
        events, muons, units = self.read(split)
        expected = self.expected.get(split, 0)
        scope = (
            f"its {events:,} events"
            if complete or units >= expected > 0
            else f"the {events:,} events of the {units} of {expected or '?'} row groups read so far"
        )
        out = []
        for kind in sorted(self.removed(split), key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
            n, m = self.removed(split)[kind]
            if not n:
                continue
            what, advice = what_and_advice(kind, self.data)
            share = f"{_pct(n, events)} of them" + (
                f", with {_pct(m, muons)} of their {muons:,} muons" if m else ""
            )
            out.append(f"muon data, {split} split: {n:,} of {scope} ({share}) {what} ({advice}); said once")
        return out

    def say(self, split: str, complete: bool = False) -> None:
        """Say split `split` once this hop (nothing when nothing was removed)."""
        if split in self.said:
            return
        self.said.add(split)
        for line in self.lines(split, complete):
            log.warning("%s", line)

    def say_totals(self) -> None:
        """The end of the hop (or of a pass of its own): every split not said yet, over what was read; the counts
        restart."""
        for split in list(self.units):
            self.say(split)
        self.units.clear()
        self.said.clear()
