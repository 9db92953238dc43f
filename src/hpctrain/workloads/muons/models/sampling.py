"""Using a trained muon model: load it from a run folder, a checkpoint or an export, generate bundles in batches.

Units, everywhere here: primaries (energy GeV, zenith rad, mass GeV, depth m), given by named columns or checked
in that order (primaries.py); generated events come back in physical units as `layouts.Events`: `primaries`
(n, 4) as given, `muons` (M, 3) rows (energy GeV, x m, y m) in the shower plane, `counts` (n,) muons per event.
So they are written in the current Parquet layout by the same writer as the data (`hpctrain data inspect` reads
them). Sampled multiplicities are capped at the model's muon cap (spec.muon_cap): how many events hit it is said.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from hpctrain.config.loading import validate
from hpctrain.config.sections.base import SEED_MAX
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_path
from hpctrain.runtime.devices import usable_device
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import TRUTH_PRIMARIES, numpy_rng
from hpctrain.train.checkpoint import Located, locate
from hpctrain.train.exported import check_params
from hpctrain.train.parts import load_weights, params_sha256
from hpctrain.workloads.muons import physics
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.files import local_files
from hpctrain.workloads.muons.models import primaries as named
from hpctrain.workloads.muons.models.networks import Generator, MultiplicityHead, event_index
from hpctrain.workloads.muons.spec import SAMPLE_BATCH, muon_cap
from hpctrain.workloads.muons.truth import v1 as truth
from hpctrain.workloads.registry import config_model, task_factory

log = logging.getLogger("hpctrain.muons")
MUON_MODELS = ("muon_wgan", "muon_flow", "muon_multiplicity")


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

    @property
    def cap(self) -> int:
        """The most muons a sampled event gets (model.multiplicity.max_muons_per_event, else the data's cap)."""
        return muon_cap(self.cfg)


def load_model(
    path: str | Path, device: str | torch.device | None = None, found: Located | None = None
) -> LoadedModel:
    """The networks of a muon_wgan, muon_flow or muon_multiplicity checkpoint (or export), verified, in eval mode
    on `device` (default: CUDA when there is one). `found`: the checkpoint `path` names, when the caller has read
    it already."""
    found = found if found is not None else locate(path)
    state, file, run_dir = found.state, found.file, found.run_dir
    config = state.get("config")
    kind = (config.get("model") or {}).get("type") if isinstance(config, dict) else None
    if kind not in MUON_MODELS:
        raise UserError(f"{file}: model.type={kind!r} is not a muon model ({', '.join(MUON_MODELS)})")
    cfg = validate(config_model(), state["config"])
    dev = usable_device(device, f"--device {device}")
    if dev.type == "cpu":
        cfg.train.device = "cpu"  # what the networks are built for (as hpctrain.load builds them)
    task = task_factory(cfg.model.type)(cfg, ClusterEnv())
    with torch.random.fork_rng(devices=[]):  # building initialises weights: the caller's RNG stays as it was
        modules = task.build_modules()
    load_weights(modules, state["modules"], file)
    for module in modules.values():
        module.to(dev).eval()
    check_params(state, file, params_sha256(modules))
    step = int(state.get("counters", {}).get("step", 0))
    return LoadedModel(cfg, modules, step, run_dir, file, dev)


class Sampler:
    """Bundles from a trained muon model in memory (`hpctrain.load(run_or_export).sampler`): the events `hpctrain
    sample` writes, as `layouts.Events` in physical units (module docstring). Each call seeds its own draws and
    leaves torch's global RNG as it was. `at_cap`: how many events of the last call got a multiplicity at the
    model's cap (`cap` muons; said as a warning when any did)."""

    def __init__(self, trained: Any) -> None:
        self.model = LoadedModel(
            trained.config, trained.models, trained.step, trained.run_dir, trained.checkpoint, trained.device
        )
        self.at_cap = 0

    @property
    def cap(self) -> int:
        return self.model.cap

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
        events = layouts.concat_events(parts) if parts else _no_events()
        self._say_cap(events.counts)
        return events

    def generate(
        self,
        primaries: Any,
        counts: Any = None,
        seed: int = 0,
        batch_size: int = SAMPLE_BATCH,
    ) -> layouts.Events:
        """Bundles for your primaries, by named columns with units: a dict of arrays, a pandas DataFrame, a NumPy
        structured array or a pyarrow Table with energy_GeV, zenith_rad (radians, 0 = vertical, to pi/2) or
        cos_zenith, mass_GeV and depth_m; or a plain (n, 4) array in the order (energy_GeV, zenith_rad,
        mass_GeV, depth_m). A value out of range (a zenith outside [0, pi/2], a non-positive energy, mass or
        depth) is a UserError naming its row. `counts` (n,) fixes the multiplicities instead of sampling them
        (then no cap applies). Returns `layouts.Events`: muons (M, 3) (energy GeV, x m, y m), counts (n,)."""
        prims = named.as_primaries(primaries)
        fixed = None if counts is None else _fixed_counts(counts, len(prims))
        _check(len(prims), seed, batch_size)
        with self._seeded(seed):
            events = generate_events(self.model, prims, None, batch_size, fixed)
        self._say_cap(events.counts if fixed is None else None)
        return events

    def counts(self, primaries: Any, seed: int = 0, batch_size: int = SAMPLE_BATCH) -> np.ndarray:
        """(n,) sampled multiplicities for primaries given as `generate` takes them."""
        prims = named.as_primaries(primaries)
        _check(len(prims), seed, batch_size)
        with self._seeded(seed):
            drawn = sample_counts(self.model, prims, batch_size)
        self._say_cap(drawn)
        return drawn

    def _say_cap(self, counts: np.ndarray | None) -> None:
        self.at_cap = 0 if counts is None else int((counts >= self.cap).sum())
        if self.at_cap:
            log.warning("%s", cap_line(self.at_cap, len(counts) if counts is not None else 0, self.cap))

    @contextlib.contextmanager
    def _seeded(self, seed: int) -> Iterator[None]:
        device = self.model.device
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            # the CPU's and this device's generators only: torch.manual_seed would also queue a lazy seed of
            # every CUDA device, formatting a stack trace each call (~0.2 ms, a twentieth of a one-event call)
            torch.default_generator.manual_seed(seed)
            if device.type == "cuda":
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(seed)
            yield


def cap_line(at_cap: int, events: int, cap: int) -> str:
    """What a sample says about its events at the muon cap."""
    share = 100.0 * at_cap / events if events else 0.0
    return (
        f"{at_cap} of {events} generated events ({share:.2f} %) have a multiplicity at the model's cap of {cap} "
        "muons (clamped there: the training removed the true events above data.max_muons_per_event)"
    )


def _no_events() -> layouts.Events:
    return layouts.Events(
        np.zeros((0, 4), np.float32),
        np.zeros((0, 3), np.float32),
        np.zeros(0, np.int64),
        np.zeros((0, 2), np.int64),
    )


def _fixed_counts(counts: Any, n: int) -> np.ndarray:
    try:
        fixed = np.asarray(counts)
    except (TypeError, ValueError):
        fixed = np.zeros(0)
    expected = f"counts: expected ({n},) non-negative integers, one per primary"
    if fixed.shape != (n,):
        raise UserError(f"{expected}; got shape {fixed.shape}")
    if not np.issubdtype(fixed.dtype, np.integer):  # it said "got shape (n,)", the shape asked for
        raise UserError(f"{expected}; got {fixed.dtype} values")
    if (fixed < 0).any():
        row = int(np.flatnonzero(fixed < 0)[0])
        raise UserError(f"{expected}; row {row} is {fixed[row]}")
    return fixed.astype(np.int64)


def _check(n_events: int, seed: int, batch_size: int) -> None:
    given = {"n_events": n_events, "seed": seed, "batch_size": batch_size}
    for name, value in given.items():  # a float or a string was a TypeError from deep inside
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise UserError(f"{name}: an integer, not {value!r}")
    if n_events < 0 or not 0 <= seed <= SEED_MAX or batch_size < 1:
        raise UserError(
            f"n_events {n_events}, seed {seed}, batch_size {batch_size}: need n_events >= 0, seed in "
            "0 .. 2**63-1 and batch_size >= 1"
        )


@torch.no_grad()
def sample_counts(model: LoadedModel, primaries: np.ndarray, batch_size: int = SAMPLE_BATCH) -> np.ndarray:
    """(n,) sampled multiplicities, capped at the model's cap, for physical primaries (n, 4) (energy GeV, zenith
    rad, mass GeV, depth m: checked by the caller) (torch's global RNG: seed it first)."""
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
    """Generated bundles for physical primaries (n, 4) (energy GeV, zenith rad, mass GeV, depth m: checked by the
    caller, primaries.py), muons (energy GeV, x m, y m), one `layouts.Events` per batch of `batch_size` events
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
        muons = generator(norm, c, event_index(c, total), normalised=True).muons.float().cpu()  # (total, 3)
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
    return layouts.concat_events(parts) if parts else _no_events()


def primary_chunks(
    n_events: int | None, path: str | None, seed: int, chunk: int
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """(primaries (k, 4), ids (k, 2) or None) in chunks of at most `chunk` events: `n_events` drawn from the
    synthetic truth (one stream, seed), or every event of the files `path` names: tables of named primaries
    (CSV or Parquet, primaries.py), or muon files (any layout, one row group at a time, muons ignored). Every
    primary read is checked (units, ranges: one line naming the file and row). Memory: one chunk."""
    if path is None:
        assert n_events is not None
        rng = numpy_rng(seed, TRUTH_PRIMARIES)
        for start in range(0, n_events, chunk):
            yield (
                truth.sample_primaries(min(chunk, n_events - start), rng),
                _ids(start, min(chunk, n_events - start)),
            )
        return
    for file in local_files(path):
        if named.is_table(file):
            start = 0
            for rows in named.table_chunks(file, chunk):
                yield rows, _ids(start, len(rows))
                start += len(rows)
            continue
        try:
            reader = layouts.open_reader(file)
        except layouts.LayoutError as err:
            raise UserError(
                f"{err}; or a table of primaries (CSV or Parquet) with columns {', '.join(named.COLUMNS)}"
            ) from None
        try:
            first = 0
            for u in range(len(reader.unit_rows)):
                unit = reader.read_unit(u)
                named.check(unit.primaries, file, first_row=first)
                first += len(unit)
                for start in range(0, len(unit), chunk):
                    yield unit.primaries[start : start + chunk], unit.ids[start : start + chunk]
        finally:
            reader.close()


def _ids(start: int, n: int) -> np.ndarray:
    """(n, 2) ids (0, start + i) of events numbered from `start` in their file."""
    return np.stack([np.zeros(n, np.int64), np.arange(start, start + n, dtype=np.int64)], 1)


def write_stream(path: str, chunks: Iterable[layouts.Events]) -> tuple[int, int]:
    """Write events chunk by chunk to one Parquet file of the current layout (a row group per chunk,
    atomically: temporary name, then rename); returns (events, muons). A chunk is turned into Arrow and written
    by a thread while the next one is generated (pyarrow and torch both release the GIL: 64 chunks of 1,024
    events spent ~2.7 s of 14 s writing in line); at most two chunks are held."""
    events = muons = 0
    with atomic_path(Path(path)) as tmp, ThreadPoolExecutor(1, thread_name_prefix="parquet-writer") as pool:
        file = _ChunkWriter(str(tmp))
        pending: Future[None] | None = None
        try:
            for part in chunks:
                if pending is not None:
                    pending.result()  # its error, if any, here
                pending = pool.submit(file.write, part)
                events += len(part)
                muons += len(part.muons)
            if pending is not None:
                pending.result()
                pending = None
            if file.writer is None:  # nothing asked: an empty file of the layout
                file.write(_no_events())
        finally:
            if pending is not None:  # unwinding: the write in flight ends before the file closes
                wait([pending])
            file.close()
    return events, muons


class _ChunkWriter:
    """The Parquet file of `write_stream`: opened with the first chunk's schema, one row group per chunk."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: pq.ParquetWriter | None = None

    def write(self, part: layouts.Events) -> None:
        table = layouts.events_table(part, "parquet")
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, **layouts.PARQUET_WRITE)
        self.writer.write_table(table)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
