"""data.report_first_batch: one line per file with a summary of the first non-empty unit (row group or HDF5
block) this process reads from it, proof that the data changes from file to file (a loader stuck on one file,
or files that are copies of each other, show the same figures). Each process (and DataLoader worker) reports a
file once; off by default.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from hpctrain.workloads.muons.events.decoded import Events

log = logging.getLogger(__name__)

_state: dict[str, object] = {"on": False, "seen": set()}


def configure(on: bool) -> None:
    _state["on"] = on


def note(path: str, events: Events) -> None:
    """Report `events` if they are the first non-empty ones read from `path` in this process."""
    seen: set[str] = _state["seen"]  # type: ignore[assignment]
    if not _state["on"] or path in seen or not len(events):
        return
    seen.add(path)
    log.info("first batch of %s", summary(path, events))


def summary(path: str, events: Events) -> str:
    """Events, muons, the primaries' mean log10 energy and zenith, the muons' mean log10 energy, first ids."""
    energy = np.log10(np.maximum(events.primaries[:, 0].astype(np.float64), 1e-30))
    muons = events.muons[:, 0].astype(np.float64)
    muon_energy = float(np.log10(np.maximum(muons, 1e-30)).mean()) if len(muons) else float("nan")
    first = events.ids[0].tolist()
    return (
        f"{path} (pid {os.getpid()}): {len(events)} events, {int(events.counts.sum())} muons "
        f"({events.counts.mean():.2f}/event), primary log10 E mean {energy.mean():.4f}, zenith mean "
        f"{float(events.primaries[:, 1].mean()):.4f}, muon log10 E mean {muon_energy:.4f}, "
        f"first event id {first}"
    )
