"""Tiny muon files for the loader tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.stream.staged import StagingSpec
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import EventStream
from hpctrain.workloads.muons.spec import MuonData


def write_set(
    folder: Path,
    layout: str = "parquet",
    files: int = 3,
    events: int = 400,
    row_group: int = 100,
    seed: int = 5,
) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(files):
        data = synthetic_events(events, seed, i)
        path = folder / f"f{i}{'.h5' if layout == 'hdf5' else '.parquet'}"
        layouts.write_events(str(path), data, layout, row_group)
        out.append(str(path))
    return out


def event_stream(
    files: list[str],
    batch_size: int,
    seed: int,
    *,
    split: str = "train",
    rank: int = 0,
    world_size: int = 1,
    run_dir: Path | str | None = None,
    staging: StagingSpec | None = None,
    **data: object,
) -> EventStream:
    """The EventStream of `files` with a data section of these fields (pin_memory off: CPU tests)."""
    section = MuonData.model_validate({"batch_size": batch_size, "pin_memory": False, **data})
    return EventStream(
        files, section, seed, split=split, rank=rank, world_size=world_size, run_dir=run_dir, staging=staging
    )


def keys(ids: np.ndarray) -> np.ndarray:
    """One integer per event from its (major, minor) ids."""
    return ids[:, 0] * 1_000_000 + ids[:, 1]


@pytest.fixture
def muon_files(tmp_path: Path) -> list[str]:
    return write_set(tmp_path / "data")
