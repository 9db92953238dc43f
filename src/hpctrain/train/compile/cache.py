"""The kept compile cache: `<run.out_dir>/.compile-cache`, checked as the user's alone before torch.compile
unpickles anything from it, and the marks that say which networks' code it holds (a warm hop compiles in its own
process, in seconds)."""

from __future__ import annotations

import hashlib
import inspect
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

import hpctrain
from hpctrain.errors import UserError
from hpctrain.fsutil import private_folder


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
    parts = [torch.__version__, hpctrain.__version__, setting]
    parts += [f"{name}={modes[name]}:{raw[name]!r}" for name in sorted(modes)]
    parts += [_source_digest(raw[name]) for name in sorted(modes)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _source_digest(net: nn.Module) -> str:
    """The bytes of the files defining the classes of `net` and its submodules, hashed (torch's own classes
    left out: the torch version stands for them); a class without a readable file counts by its name."""
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
