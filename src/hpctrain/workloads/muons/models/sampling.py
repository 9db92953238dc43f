"""Using a trained muon model: load it from a run folder or a checkpoint, generate bundles in batches.

Generated events come back in physical units as `layouts.Events`, so they are written in the current Parquet
layout by the same writer as the data (and `hpctrain data inspect` reads them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from hpctrain.config.loading import validate
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_path
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import TRUTH_PRIMARIES, numpy_rng
from hpctrain.train.checkpoint import find_checkpoint, strip_prefixes
from hpctrain.workloads.muons import physics, truth
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.files import local_files
from hpctrain.workloads.muons.models.networks import Generator, MultiplicityHead, event_index
from hpctrain.workloads.muons.spec import SAMPLE_BATCH
from hpctrain.workloads.registry import Found, config_model, task_factory


@dataclass
class LoadedModel:
    cfg: Any
    modules: dict[str, nn.Module]
    step: int
    run_dir: Path | None
    checkpoint: Path
    device: torch.device

    @property
    def model_type(self) -> str:
        return str(self.cfg.model.type)


def load_model(
    path: str | Path, device: str | torch.device | None = None, found: Found | None = None
) -> LoadedModel:
    """The networks of a muon_wgan, muon_flow or muon_multiplicity checkpoint, in eval mode on `device` (default: CUDA
    when there is one). `found`: the checkpoint `path` names, when the caller has read it already."""
    state, file, run_dir = found if found is not None else find_checkpoint(path)
    cfg = validate(config_model(), state["config"])
    if cfg.model.type not in ("muon_wgan", "muon_flow", "muon_multiplicity"):
        raise UserError(f"{file}: model.type={cfg.model.type!r} is not a muon model")
    dev = (
        torch.device(device)
        if device is not None
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    task = task_factory(cfg.model.type)(cfg, ClusterEnv())
    modules = task.build_modules()
    for name, module in modules.items():
        module.load_state_dict(strip_prefixes(state["modules"][name]))
        module.to(dev).eval()
    step = int(state.get("counters", {}).get("step", 0))
    return LoadedModel(cfg, modules, step, run_dir, file, dev)


class Sampler:
    """Bundles from a trained muon model in memory (`hpctrain.load(run).sampler`): the events `hpctrain sample`
    writes, as `layouts.Events` in physical units. Each call seeds its own draws and leaves torch's global RNG
    as it was."""

    def __init__(self, trained: Any) -> None:
        self.model = LoadedModel(
            trained.config, trained.models, trained.step, trained.run_dir, trained.checkpoint, trained.device
        )

    def sample(self, n_events: int, seed: int = 0, batch_size: int = SAMPLE_BATCH) -> layouts.Events:
        """`n_events` bundles for primaries drawn from the synthetic truth: the same events as
        `hpctrain sample RUN --events n_events --seed seed` (with the same --batch-size)."""
        _check(n_events, seed, batch_size)
        with self._seeded(seed):
            parts = [
                chunk
                for primaries, ids in primary_chunks(n_events, None, seed, batch_size)
                for chunk in generate_chunks(self.model, primaries, ids, batch_size)
            ]
        return (
            layouts.concat_events(parts)
            if parts
            else generate_events(self.model, np.zeros((0, 4), np.float32))
        )

    def generate(
        self,
        primaries: np.ndarray,
        counts: np.ndarray | None = None,
        seed: int = 0,
        batch_size: int = SAMPLE_BATCH,
    ) -> layouts.Events:
        """Bundles for physical primaries (n, 4) (energy GeV, cos zenith, mass GeV, depth m); `counts` (n,) fixes
        the multiplicities instead of sampling them."""
        _check(len(primaries), seed, batch_size)
        with self._seeded(seed):
            return generate_events(self.model, np.asarray(primaries, np.float32), None, batch_size, counts)

    def counts(self, primaries: np.ndarray, seed: int = 0, batch_size: int = SAMPLE_BATCH) -> np.ndarray:
        """(n,) sampled multiplicities for physical primaries (n, 4)."""
        _check(len(primaries), seed, batch_size)
        with self._seeded(seed):
            return sample_counts(self.model, np.asarray(primaries, np.float32), batch_size)

    @contextlib.contextmanager
    def _seeded(self, seed: int) -> Iterator[None]:
        device = self.model.device
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield


def _check(n_events: int, seed: int, batch_size: int) -> None:
    if n_events < 0 or seed < 0 or batch_size < 1:
        raise UserError(
            f"n_events {n_events}, seed {seed}, batch_size {batch_size}: need n_events >= 0, seed >= 0 and "
            "batch_size >= 1"
        )


@torch.no_grad()
def sample_counts(model: LoadedModel, primaries: np.ndarray, batch_size: int = SAMPLE_BATCH) -> np.ndarray:
    """(n,) sampled multiplicities for physical primaries (n, 4) (torch's global RNG: seed it first)."""
    head: MultiplicityHead = (
        model.modules["generator"].multiplicity  # type: ignore[assignment]
        if "generator" in model.modules
        else model.modules["multiplicity"]
    )
    out = []
    for start in range(0, len(primaries), batch_size):
        prim = physics.normalize_primaries(
            torch.as_tensor(primaries[start : start + batch_size], dtype=torch.float32)
        )
        out.append(head.sample(prim.to(model.device)).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@torch.no_grad()
def generate_chunks(
    model: LoadedModel,
    primaries: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = SAMPLE_BATCH,
    counts: np.ndarray | None = None,
) -> Iterator[layouts.Events]:
    """Generated bundles for physical primaries (n, 4), one `layouts.Events` per batch of `batch_size` events
    (a caller that writes each chunk holds one batch at a time); `counts` (n,) fixes the multiplicities
    instead of sampling them. Uses torch's global RNG: seed it first."""
    if "generator" not in model.modules:
        raise UserError(
            f"{model.checkpoint}: a {model.model_type} model generates no muons (use muon_wgan or muon_flow)"
        )
    generator: Generator = model.modules["generator"]  # type: ignore[assignment]
    n = len(primaries)
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1) if ids is None else ids
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        prim = torch.as_tensor(primaries[start:stop], dtype=torch.float32)
        norm = physics.normalize_primaries(prim).to(model.device)
        if counts is None:
            c = generator.multiplicity.sample(norm)
        else:
            c = torch.as_tensor(counts[start:stop], dtype=torch.int64, device=model.device)
        total = int(c.sum())
        muons = generator(norm, c, event_index(c, total)).muons
        muons = generator.scaler.inverse(muons).float().cpu()  # (total, 3) normalised
        # finite, positive energies in the file (1e-4 GeV..1e12 GeV)
        muons[:, 0] = muons[:, 0].clamp(-10.0, 6.0)
        yield layouts.Events(
            np.asarray(primaries[start:stop], np.float32),
            physics.denormalize_muons(muons).numpy().astype(np.float32),
            c.cpu().numpy().astype(np.int64),
            np.asarray(ids[start:stop], np.int64),
        )


def generate_events(
    model: LoadedModel,
    primaries: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = SAMPLE_BATCH,
    counts: np.ndarray | None = None,
) -> layouts.Events:
    """All of `generate_chunks` in one `layouts.Events` (for evaluation-sized requests)."""
    parts = list(generate_chunks(model, primaries, ids, batch_size, counts))
    if not parts:
        return layouts.Events(
            np.zeros((0, 4), np.float32),
            np.zeros((0, 3), np.float32),
            np.zeros(0, np.int64),
            np.zeros((0, 2), np.int64),
        )
    return layouts.concat_events(parts)


def primary_chunks(
    n_events: int | None, path: str | None, seed: int, chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """(primaries (k, 4), ids (k, 2) or None) in chunks of at most `chunk` events: `n_events` drawn from the
    synthetic truth (one stream, seed), or every event of the muon files `path` names (any layout, one
    row group at a time, muons ignored). Memory: one chunk, whatever the request."""
    if path is None:
        assert n_events is not None
        rng = numpy_rng(seed, TRUTH_PRIMARIES)
        for start in range(0, n_events, chunk):
            yield truth.sample_primaries(min(chunk, n_events - start), rng), None
        return
    for file in local_files(path):
        try:
            reader = layouts.open_reader(file)
        except layouts.LayoutError as err:
            raise UserError(str(err)) from None
        try:
            for u in range(len(reader.unit_rows)):
                unit = reader.read_unit(u)
                for start in range(0, len(unit), chunk):
                    yield unit.primaries[start : start + chunk], unit.ids[start : start + chunk]
        finally:
            reader.close()


def write_stream(path: str, chunks: Iterable[layouts.Events]) -> tuple[int, int]:
    """Write events chunk by chunk to one Parquet file of the current layout (a row group per chunk,
    atomically: temporary name, then rename); returns (events, muons)."""
    events = muons = 0
    with atomic_path(Path(path)) as tmp:
        writer = None
        try:
            for part in chunks:
                table = layouts.events_table(part, "parquet")
                if writer is None:
                    writer = pq.ParquetWriter(str(tmp), table.schema)
                writer.write_table(table)
                events += len(part)
                muons += len(part.muons)
            if writer is None:  # nothing asked: an empty file of the layout
                empty = layouts.Events(
                    np.zeros((0, 4), np.float32),
                    np.zeros((0, 3), np.float32),
                    np.zeros(0, np.int64),
                    np.zeros((0, 2), np.int64),
                )
                pq.write_table(layouts.events_table(empty, "parquet"), str(tmp))
        finally:
            if writer is not None:
                writer.close()
    return events, muons
