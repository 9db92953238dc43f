"""Remote input files staged to node-local scratch just ahead of their use in an epoch's order.

`StagedFiles` runs in the stream's main side (the sampler, in the main process or the prefetch thread
of the stream): for each epoch it opens a `Stager` over the files in the order their first row group is read,
from the epoch's start position, plus the first `ahead` files of the next epoch (so an epoch boundary does
not stall). Before a work item goes to a DataLoader worker, the files of its chunk are staged (`Stager.get`,
which blocks only if the file is not there yet); when the item's result comes back and no later chunk of the
epoch needs a file, it is released (deleted with delete_after_use, within max_bytes). Every local rank computes
the same list, so local rank 0 downloads and the others wait for the files.

The files' index (samples per unit, which the epoch's order needs before any file is read) is the workload's:
it knows the file formats (for muons: workloads/muons/events/remote_index.py reads Parquet footers remotely).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.config.schema import DataConfigBase
from hpctrain.data.staging import BadFileError, Stager
from hpctrain.data.stream.epoch_plan import EpochPlan
from hpctrain.runtime.env import ClusterEnv


@dataclass
class StagingSpec:
    """How this rank reaches remote inputs: data.staging, data.pelican and its place on the node."""

    staging: StagingConfig = field(default_factory=StagingConfig)
    pelican: PelicanConfig | None = None
    local_rank: int = 0
    local_world_size: int = 1
    job_id: str | None = None
    storage_options: dict[str, Any] | None = None
    index_threads: int = 8  # remote metadata read in parallel when the index is built

    @classmethod
    def from_config(cls, data: DataConfigBase, env: ClusterEnv) -> StagingSpec:
        """This rank's access to remote inputs: data.staging, data.pelican and its place on the node."""
        return cls(
            staging=data.staging,
            pelican=data.pelican,
            local_rank=env.local_rank,
            local_world_size=env.local_world_size,
            job_id=env.job_id,
        )


# ---- staging along the epoch's order -----------------------------------------------------------------------


class StagedFiles:
    """Stages the files of each work item before it is handed to a worker; releases them after use.

    Lives on the stream's main side (one thread). `wait_seconds` is the time spent blocked on staging.
    """

    def __init__(self, uris: Sequence[str], spec: StagingSpec) -> None:
        self.uris = list(uris)
        self.spec = spec
        self.bad: dict[int, str] = {}  # file -> reason; not asked for again in later epochs
        self.stats: dict[str, int] = {}
        self._wait_closed = 0.0
        self._stager: Stager | None = None
        self._epoch: int | None = None
        self._seq: dict[int, int] = {}
        self._paths: dict[int, str] = {}
        self._last_chunk: dict[int, int] = {}

    @property
    def wait_seconds(self) -> float:
        return self._wait_closed + (self._stager.wait_seconds if self._stager is not None else 0.0)

    def begin(self, plan: EpochPlan, start_chunk: int, after: list[int]) -> None:
        """Open the epoch's stager: files in first-use order from `start_chunk`, then `after` (the next
        epoch's first files, prefetched within `ahead`). Identical on every local rank."""
        self.close()
        order = plan.files_from(start_chunk)
        self._last_chunk = {}
        for c in range(start_chunk, len(plan.chunks)):
            for unit in plan.chunks[c]:
                self._last_chunk[unit.file] = c
        tail = [f for f in after if f not in self.bad][: self.spec.staging.ahead]
        self._seq = {f: i for i, f in enumerate(order)}
        self._epoch = plan.epoch
        s = self.spec
        self._stager = Stager(
            [self.uris[f] for f in order + tail],
            s.staging,
            local_rank=s.local_rank,
            local_world_size=s.local_world_size,
            job_id=s.job_id,
            pelican=s.pelican,
            storage_options=s.storage_options,
        )

    def paths(self, epoch: int, files: Sequence[int]) -> tuple[dict[int, str], list[tuple[int, str]]]:
        """Local paths of `files` (staged now if needed) and the files newly found bad, (file, reason)."""
        assert self._stager is not None and epoch == self._epoch, "begin() the epoch first"
        out: dict[int, str] = {}
        newly_bad: list[tuple[int, str]] = []
        for f in files:
            if f in self.bad:
                continue
            if f not in self._paths:
                try:
                    self._paths[f] = str(self._stager.get(self._seq[f]))
                except BadFileError as err:
                    self.bad[f] = err.reason
                    newly_bad.append((f, err.reason))
                    continue
            out[f] = self._paths[f]
        return out, newly_bad

    def done(self, epoch: int, chunk: int) -> None:
        """The result of `chunk` was consumed: release files no later chunk of this epoch reads."""
        if self._stager is None or epoch != self._epoch:
            return
        for f in [f for f in self._paths if self._last_chunk.get(f, -1) <= chunk]:
            self._stager.release(self._seq[f])
            del self._paths[f]

    def end_epoch(self) -> None:
        """Release everything and close the epoch's stager (waits for the other local ranks to finish it)."""
        if self._stager is not None:
            for f in list(self._paths):
                self._stager.release(self._seq[f])
        self.close()

    def close(self) -> None:
        if self._stager is None:
            return
        stager, self._stager = self._stager, None
        self._paths = {}
        try:
            stager.close()
        finally:
            self._wait_closed += stager.wait_seconds
            for key, value in stager.stats.items():
                self.stats[key] = self.stats.get(key, 0) + value
