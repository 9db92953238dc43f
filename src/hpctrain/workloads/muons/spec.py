"""Config of the muon workload (pydantic only: importable on login nodes without torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpctrain.config.schema import DataConfigBase
from hpctrain.workloads.registry import WorkloadSpec


class MuonData(DataConfigBase):
    """Muon-bundle events from Parquet/HDF5 files (layout detected per file; see docs/data.md)."""

    type: Literal["muons"] = "muons"
    paths: list[str] = Field(
        default_factory=list,
        description="Training files: local paths, globs or folders, or remote URIs (pelican://, osdf:///, "
        "https://), staged to scratch first.",
    )
    val_paths: list[str] = Field(
        default_factory=list, description="Validation files (empty = no validation)."
    )
    max_muons_per_batch: int = Field(
        0,
        ge=0,
        description="Cut a batch into micro-batches of whole events with at most this many muons each; their "
        "gradients add up to one update (0 = no cap).",
    )
    max_muons_per_event: int = Field(
        0,
        ge=0,
        description="Skip events with more muons (0 = use max_muons_per_batch; both 0 = keep all).",
    )
    outliers_dir: str | None = Field(
        None,
        description="Write the skipped huge events here (Parquet, current layout, plus source_file and "
        "source_row), under names that never overwrite earlier runs; first epoch only.",
    )
    drop_empty_events: bool = Field(False, description="Remove events without muons.")
    on_bad_file: Literal["fail", "skip"] = Field(
        "fail",
        description="A truncated or corrupt file stops the run (fail) or is skipped and listed in "
        "<run folder>/bad_files.txt (skip).",
    )
    on_bad_event: Literal["fail", "skip"] = Field(
        "fail",
        description="An event with a zero, negative or non-finite energy or mass (or a non-finite value) "
        "stops the run naming file and row (fail) or is skipped and counted in the log (skip).",
    )
    shuffle_window: int = Field(
        8192,
        ge=1,
        description="Events are shuffled within chunks of at least this many events (whole row "
        "groups); bigger mixes better and holds more in memory.",
    )
    prefetch_batches: int = Field(
        0, ge=0, description="Ready batches kept ahead by a background thread (0 = none)."
    )
    max_events: int = Field(0, ge=0, description="Use only the first N events of the files (0 = all).")
    hdf5_unit_events: int = Field(
        65536,
        ge=1,
        description="Events read at once from an HDF5 file (its 'row group' for order and memory).",
    )

    @model_validator(mode="after")
    def _caps(self) -> MuonData:
        if self.max_muons_per_batch and self.max_muons_per_event > self.max_muons_per_batch:
            raise ValueError(
                f"max_muons_per_event ({self.max_muons_per_event}) exceeds max_muons_per_batch "
                f"({self.max_muons_per_batch}): such an event could never fit a micro-batch"
            )
        return self

    @property
    def event_muon_cap(self) -> int:
        """The effective per-event limit (0 = none)."""
        return self.max_muons_per_event or self.max_muons_per_batch


WORKLOAD = WorkloadSpec(
    name="muons",
    # model.type -> (config, "module:TaskClass"); the muon models are registered here.
    models={},
    data=[MuonData],
    extras={
        "generate": "hpctrain.workloads.muons.tools:generate",
        "generate_args": "hpctrain.workloads.muons.tools:generate_args",
        "inspect": "hpctrain.workloads.muons.tools:inspect",
    },
)
