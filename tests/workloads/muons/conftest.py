"""Tiny muon files for the loader tests, and a tiny WGAN trained on such files once for the tests that read a
trained run (sample, evaluate, export)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.data.stream.staged import StagingSpec
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import EventStream
from hpctrain.workloads.muons.spec import MuonData
from hpctrain.workloads.registry import config_model, fill_default_types


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


CAP = 150


def wgan_overrides(data: Path, out: Path) -> list[str]:
    return [
        "run.name=t",
        f"run.out_dir={out}",
        "model.type=muon_wgan",
        f"data.paths=[{data / 'train'}]",
        f"data.val_paths=[{data / 'val'}]",
        "data.batch_size=16",
        f"data.max_muons_per_event={CAP}",
        "data.max_muons_per_batch=400",  # several micro-batches per update
        "data.shuffle_window=64",
        "model.latent_global=4",
        "model.latent_local=2",
        "model.hidden=16",
        "model.critic_hidden=16",
        "model.multiplicity.hidden=[8]",
        "model.critic_steps=1",
        "model.gp_every=2",  # counted over critic updates: GP on every other update here
        "model.gp_max_pairs=50",
        "optim.name=adam",
        "optim.betas=[0.0, 0.9]",
        "optim.grad_clip_norm=5.0",
        "model.critic_lr=2e-3",
        "train.total_updates=10",
        "train.eval_every=5",
        "train.eval_batches=2",
        "train.device=cpu",
        "logging.log_every=1",
        "logging.progress=lines",
        "checkpoint.best_metric=val_multiplicity_nll",
    ]


def make_cfg(data: Path, out: Path, *extra: str):
    request = ConfigRequest(None, None, [*wgan_overrides(data, out), *extra], None)
    return load_config(request, config_model(), environ={}, prepare=fill_default_types)


@pytest.fixture(scope="session")
def wgan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Training and validation files of make_cfg: read only."""
    root = tmp_path_factory.mktemp("muondata")
    write_set(root / "train", files=2, events=160, row_group=40, seed=3)
    write_set(root / "val", files=1, events=60, row_group=60, seed=4)
    return root


@pytest.fixture(scope="session")
def trained_wgan(wgan_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of make_cfg trained to its end, once for the session: copy it before changing it (the
    `reference` fixture of test_model_run.py does)."""
    out = tmp_path_factory.mktemp("wgan")
    assert run(make_cfg(wgan_data, out), ClusterEnv()) == EXIT_OK
    return out / "t"
