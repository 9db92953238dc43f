"""Compile modes and activation memory: torch.compile per network, the compiler's activation-memory budget, and
explicit activation checkpointing of a network's blocks where it is not compiled."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpctrain.errors import UserError
from hpctrain.fsutil import private_folder

log = logging.getLogger(__name__)


def compile_mode_of(setting: str | Mapping[str, str], name: str) -> str:
    """train.compile for network `name`: one mode for all networks, or the mapping's (networks not named: off)."""
    if isinstance(setting, str):
        return setting
    return str(setting.get(name, "off"))


def on_cuda(device_setting: str) -> bool:
    """Whether train.device puts the networks on a CUDA device (auto: when this torch sees one)."""
    return device_setting in ("auto", "cuda") and torch.cuda.is_available()


# `auto` compiles only in hops with at least this much time left: compiling the muon networks took 51-82 s on an
# H100 (bench/gpu.py, docs/performance.md), over 10 % of anything shorter.
AUTO_COMPILE_MIN_SECONDS = 600.0


def resolve_compile(mode: str, cuda: bool) -> str:
    """`auto` as what the GPU bench found to pay (bench/gpu.py, docs/performance.md): torch's default mode on
    CUDA, off on CPU (there the compile costs a minute of 2 cores and buys little); other modes as given."""
    if mode == "auto":
        return "default" if cuda else "off"
    return mode


def compile_in_background(setting: bool | None, cuda: bool, world_size: int) -> bool:
    """train.compile_background: whether the networks compile in a helper process while the hop trains eagerly
    (train/compile_ahead.py). null = on CUDA; never under DDP, where every rank would need the switch at the same
    update and a helper of its own."""
    if world_size > 1:
        return False
    return cuda if setting is None else setting


def keep_compiled_code(out_dir: Path) -> str:
    """Point torch.compile's caches (Inductor's graphs and kernels, Triton's binaries) at `<run.out_dir>/
    .compile-cache` unless TORCHINDUCTOR_CACHE_DIR is set: /tmp is node-local, so every hop of a chain (and every
    run of a sweep) compiled from nothing, a minute each; on the shared run folder's file system the next hop
    loads what the first compiled. Returns what to say at start (empty when the user chose the folder)."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    folder = Path(chosen) if chosen else (out_dir / ".compile-cache").absolute()  # workers run elsewhere
    usable_cache(folder, "TORCHINDUCTOR_CACHE_DIR" if chosen else "run.out_dir")
    triton = os.environ.get("TRITON_CACHE_DIR")  # else Triton's binaries go under the folder above
    if triton:
        usable_cache(Path(triton), "TRITON_CACHE_DIR")
    if chosen:
        return ""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return f"compiled code kept in {folder}"


def usable_cache(folder: Path, setting: str) -> None:
    """The compile cache's folder is ours alone (made 0700 if missing) and takes files: otherwise one line
    naming it, before torch.compile uses it. Inductor unpickles what a key's folder holds, and the keys are the
    same for everyone who trains the same model: a cache another user can write would run their code in our
    training (fsutil.private_folder). A file in its place or a read-only folder would fail deep inside torch."""
    import tempfile

    private_folder(
        folder,
        f"the compile cache ({setting})",
        f"it is only a cache: remove it (`rm -rf {folder}`) and torch.compile rebuilds it, or point "
        "TORCHINDUCTOR_CACHE_DIR at a folder of your own",
    )
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            pass
    except OSError as exc:
        raise UserError(
            f"the compile cache {folder} ({setting}) cannot hold files: {exc.strerror or exc}; point "
            "TORCHINDUCTOR_CACHE_DIR at a folder you can write, or set train.compile=off"
        ) from None


def compile_key(raw: Mapping[str, nn.Module], modes: Mapping[str, str], setting: str) -> str:
    """What the compiled code of these networks depends on, hashed: their structure, the modes, the run's
    compile-related settings (`setting`: precision, memory budget, dynamic sizes, device), the versions, and the
    source files that define the networks' classes (a model edited in place, as scientists do with their own
    workload, is not warm from the code of the version before: same repr, other forward)."""
    import hashlib

    import hpctrain

    parts = [torch.__version__, hpctrain.__version__, setting]
    parts += [f"{name}={modes[name]}:{raw[name]!r}" for name in sorted(modes)]
    parts += [_source_digest(raw[name]) for name in sorted(modes)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _source_digest(net: nn.Module) -> str:
    """The bytes of the files defining the classes of `net` and its submodules, hashed (torch's own classes
    left out: the torch version stands for them); a class without a readable file counts by its name."""
    import hashlib
    import inspect

    files: set[str] = set()
    nameless: set[str] = set()
    for cls in {type(m) for m in net.modules()}:
        if cls.__module__.split(".")[0] == "torch":
            continue
        code = [f.__code__.co_filename for f in vars(cls).values() if inspect.isfunction(f)]
        if code:  # where its methods were written (also for a module not in sys.modules)
            files.update(code)
        else:
            nameless.add(f"{cls.__module__}.{cls.__qualname__}")
    digest = hashlib.sha256("\n".join(sorted(nameless)).encode())
    for file in sorted(files):
        try:
            digest.update(Path(file).read_bytes())
        except OSError:
            digest.update(file.encode())
    return digest.hexdigest()


def _compiled_marker(key: str) -> Path | None:
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(folder) / "hpctrain-compiled" / key if folder else None


def compiled_before(key: str) -> bool:
    """Whether a hop (of this run or another in the same run.out_dir) compiled networks of this `compile_key`
    into the kept cache: loading them takes seconds, so they compile in the training process."""
    marker = _compiled_marker(key)
    try:
        return marker is not None and marker.is_file()
    except OSError:  # a marker folder we may not read: as if never compiled (the safe side: the background)
        return False


def remember_compiled(key: str) -> None:
    """This hop compiled networks of this key into the kept cache (see `compiled_before`)."""
    marker = _compiled_marker(key)
    if marker is None:
        return
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only cache: the next hop compiles in the background again, nothing worse
        pass


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far: a change across an update means it compiled (or
    recompiled) in it, so that update's time is compile time, not step time."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class _LimitHits(logging.Filter):
    """Counts Dynamo's "hit config.recompile_limit" warnings: past the limit a function runs eagerly for the rest
    of the process, silently slower (torch keeps no counter of it)."""

    hits = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("torch._dynamo hit config."):
            _LimitHits.hits += 1
        return True


def watch_compiles() -> None:
    """Count recompile-limit hits from now on (once per process)."""
    logger = logging.getLogger("torch._dynamo.convert_frame")
    if not any(isinstance(f, _LimitHits) for f in logger.filters):
        logger.addFilter(_LimitHits())


# (key in compile_stats, torch counter group, counter): the compile caches' outcomes in this process
_CACHE_COUNTERS = (
    ("inductor_cache_hits", "inductor", "fxgraph_cache_hit"),
    ("inductor_cache_misses", "inductor", "fxgraph_cache_miss"),
    ("inductor_cache_bypasses", "inductor", "fxgraph_cache_bypass"),
    ("aot_cache_hits", "aot_autograd", "autograd_cache_hit"),
    ("aot_cache_misses", "aot_autograd", "autograd_cache_miss"),
    ("aot_cache_bypasses", "aot_autograd", "autograd_cache_bypass"),
)


def compile_stats() -> dict[str, int]:
    """torch.compile's process-wide counts so far: graphs made, Inductor's and AOTAutograd's cache hits, misses
    and bypasses (a warm <run.out_dir>/.compile-cache should turn misses into hits), recompile-limit hits."""
    from torch._dynamo.utils import counters

    stats = {"graphs": int(counters["stats"]["unique_graphs"])}
    for key, group, name in _CACHE_COUNTERS:
        stats[key] = int(counters[group][name])
    stats["recompile_limit_hits"] = _LimitHits.hits
    return stats


def compile_summary(before: dict[str, int], updates: int, seconds: float) -> tuple[dict[str, Any], str]:
    """What torch.compile did in this hop (counts since `before`, the updates that compiled and their seconds):
    summary.json's `compile` entry and the hop's closing line."""
    now = compile_stats()
    delta: dict[str, Any] = {key: now[key] - before.get(key, 0) for key in now}
    delta.update(updates=updates, seconds=round(seconds, 3))
    line = (
        f"torch.compile: {delta['graphs']} graph(s) in {seconds:.1f} s over {updates} update(s); cache: "
        f"Inductor {delta['inductor_cache_hits']} hit(s), {delta['inductor_cache_misses']} miss(es), "
        f"AOTAutograd {delta['aot_cache_hits']} hit(s), {delta['aot_cache_misses']} miss(es)"
    )
    if delta["recompile_limit_hits"]:
        line += (
            f"; {delta['recompile_limit_hits']} function(s) hit torch's recompile limit and ran eagerly from then "
            "on (TORCH_LOGS=recompiles says why; ragged shapes should not recompile: report it)"
        )
    return delta, line


def is_compiled(module: nn.Module) -> bool:
    """Whether `module` is torch.compile's wrapper (by its `_orig_mod`: no import of torch._dynamo, which a run
    that compiles nothing need not pay for)."""
    return hasattr(module, "_orig_mod")


def check_compile_names(setting: str | Mapping[str, str], names: list[str], workload: str) -> None:
    """A per-network mapping must name networks of this workload: a typo would silently compile nothing."""
    if not isinstance(setting, str):
        unknown = sorted(set(setting) - set(names))
        if unknown:
            raise UserError(
                f"train.compile: {', '.join(unknown)} is not a network of {workload} (its networks: "
                f"{', '.join(names)}); give one mode, or a mode per network"
            )


def compile_network(
    module: nn.Module, mode: str, memory_budget: float | None, dynamic: bool | None = None
) -> nn.Module:
    """torch.compile(module) in `mode` ("default" = torch's own), with the activation-memory budget set.

    `dynamic=True` (ragged workloads: the number of muons changes every batch) compiles sizes as symbols from the
    first call: one graph for every batch, instead of a static one, a recompile at the second batch and another
    when the last batch of an epoch is short."""
    if memory_budget is not None:
        # The min-cut partitioner keeps at most this share of the activations and recomputes the rest.
        torch._functorch.config.activation_memory_budget = memory_budget
    if dynamic:
        # With dynamic=True Dynamo also makes every Python float it meets a symbol (LayerNorm's eps, LeakyReLU's
        # slope, module constants), fails to turn them into tensors, and restarts the whole trace with them as
        # constants: every compile traced twice (5.7 of a warm compile's 8.3 s on the CPU). They never change.
        torch._dynamo.config.specialize_float = True
    compiled = torch.compile(module, mode=None if mode == "default" else mode, dynamic=dynamic)
    return compiled  # type: ignore[return-value]


def blocks_of(module: nn.Module) -> list[nn.Module]:
    """The outermost nn.Sequential blocks holding parameters (the network itself when it is one): the unit
    recomputed in backward by activation checkpointing."""
    if isinstance(module, nn.Sequential):
        return [module]
    found: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.Sequential) and any(True for _ in child.parameters()):
            found.append(child)
        else:
            found.extend(blocks_of(child) if not isinstance(child, nn.Sequential) else [])
    return found


def checkpoint_blocks(blocks: list[nn.Module]) -> int:
    """Make each block recompute its activations in backward (non-reentrant: double backward, e.g. a gradient
    penalty, works through it). Keeps parameter names (state dicts unchanged). Returns the number of blocks."""
    for block in blocks:
        forward = block.forward

        @functools.wraps(forward)
        def recomputed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
    return len(blocks)


def recompute_wanted(gradient_checkpointing: bool, memory_budget: float | None, mode: str) -> bool:
    """Whether a network recomputes activations explicitly: train.gradient_checkpointing, or a memory budget
    below 1 on a network the compiler does not see (the budget's fallback)."""
    return gradient_checkpointing or (memory_budget is not None and memory_budget < 1 and mode == "off")
