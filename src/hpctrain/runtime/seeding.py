"""Seeds: one way to derive a stream's seed from the run's, and RNG states in a form `torch.load(weights_only=True)`
accepts (no NumPy arrays, no pickles).

Every random stream of a run is named by keys after `run.seed`: `derive(seed, STREAM, *keys)` for a seed handed
to torch, `numpy_rng(seed, *keys)` for a NumPy Generator. Both go through NumPy's SeedSequence, which mixes the
keys so that nearby seeds and keys give unrelated streams (a linear formula like `seed * 7919 + epoch` collides:
seed 1 epoch 0 against seed 0 epoch 7919). The tag values are fixed: changing one changes the data order of
every run (the NumPy tags keep the values the muon stream and samplers had before they were named here).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

# Tags of the streams seeded through `derive` (a torch seed; the tag comes right after the run's seed).
RANK_STREAM = 1  # each rank's global RNGs after the shared initialisation (dropout, sampling): keys (rank,)
EPOCH_ORDER = 2  # the sample order of one epoch of an IndexedStream: keys (epoch,)
LOADER_WORKERS = 3  # the DataLoader's worker base seed: keys (epoch, rank)
TASK_STREAM = 4  # a task's own training generator (the muon GAN's noise): keys (rank,)

# Tags of NumPy streams through `numpy_rng` (last key; kept from before they were named, see above).
EPOCH_UNITS = 17  # the muon stream's file and row-group order: keys (epoch, EPOCH_UNITS)
CHUNK_EVENTS = 29  # the muon stream's event order within a chunk: keys (epoch, chunk, CHUNK_EVENTS)
TRUTH_PRIMARIES = 7919  # primaries of the synthetic truth for sampling: keys (TRUTH_PRIMARIES,)
TRUTH_EVENTS = 104_729  # events of the synthetic truth for evaluation: keys (TRUTH_EVENTS,)

NUMPY_SEED_SPAN = 2**32  # np.random.seed and random.seed of a worker take seeds below this
_SEED_BITS = 63  # torch.manual_seed takes any int64: derived seeds stay non-negative


def derive(seed: int, *keys: int) -> int:
    """A seed in [0, 2**63) for the stream named by `keys` (a tag above, then e.g. epoch, rank) of `seed`:
    a pure function of its arguments, unrelated for different arguments."""
    words = np.random.SeedSequence([seed, *keys]).generate_state(2, np.uint32)
    return (int(words[1]) << 32 | int(words[0])) & ((1 << _SEED_BITS) - 1)


def numpy_rng(seed: int, *keys: int) -> np.random.Generator:
    """The NumPy Generator of the stream named by `keys` of `seed` (same mixing as `derive`)."""
    return np.random.default_rng([seed, *keys])


# torch is imported where it is used: `numpy_rng` serves verbs that never touch torch (`hpctrain data generate`,
# `data inspect`), and importing it costs seconds of start-up on a login node or a loaded machine.


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % NUMPY_SEED_SPAN)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    import torch

    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npy["bit_generator"],
            "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]},
            "has_gauss": npy["has_gauss"],
            "gauss": npy["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
