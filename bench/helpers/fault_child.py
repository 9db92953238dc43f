"""Run `hpctrain` with a SIGKILL armed at one precise point of the checkpoint commit protocol (for bench/faults.py).

    python bench/helpers/fault_child.py [--point NAME --nth N] [--marker FILE] [--counts FILE] -- train ARGS...

The patches sit where any refactoring of hpctrain must still pass: `os.replace`/`os.rename`, `os.unlink`,
`os.fsync` and `torch.save`, matched on the target path (a `.pt` temporary, the `step_*.json` sidecar, `latest`,
...), never on hpctrain's own functions. The Nth matching call of this process (DataLoader workers are ignored)
writes the marker file (what was hit) and then kills the whole process group with SIGKILL, as a node failure
would: no handler, no `finally`, nothing flushed. `--counts` only counts the matching calls of an uninterrupted
run and writes them at exit, so the parent knows how often each point occurs. Without `--point` this is plain
`hpctrain`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's hpctrain, as -m would

_STEP_PT = re.compile(r"^step_\d+\.pt$")
_STEP_JSON = re.compile(r"^step_\d+\.json$")


def _is_pt_temporary(name: str) -> bool:
    """A checkpoint being written: a temporary name (hidden or *tmp*) of a `.pt` file."""
    return ".pt" in name and not name.endswith(".pt") and ("tmp" in name or name.startswith("."))


# point -> (which call: "replace" | "replace_after" | "fsync" | "unlink" | "serialize", predicate on the target)
POINTS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "save:serialize": ("serialize", lambda name: True),
    "save:torn_write": ("fsync_torn", _is_pt_temporary),
    "save:before_fsync": ("fsync", _is_pt_temporary),
    "save:rename": ("replace", lambda name: bool(_STEP_PT.match(name))),
    "save:after_rename": ("replace_after", lambda name: bool(_STEP_PT.match(name))),
    "save:dir_fsync": ("fsync_dir", lambda name: name == "checkpoints"),
    "save:sidecar": ("replace", lambda name: bool(_STEP_JSON.match(name))),
    "save:latest": ("replace", lambda name: name == "latest"),
    "save:after_latest": ("replace_after", lambda name: name == "latest"),
    "save:best": ("replace", lambda name: name == "best.pt"),
    "save:prune": ("unlink", lambda name: bool(_STEP_PT.match(name))),
    "start:config": ("replace", lambda name: name == "config.yaml"),
    "start:metrics_truncate": ("replace", lambda name: name == "metrics.jsonl"),
    "exit:summary": ("replace", lambda name: name == "summary.json"),
}


class Injector:
    """Counts the calls matching each point; kills the process group at the armed one."""

    def __init__(self, point: str | None, nth: int, marker: Path | None) -> None:
        self.point, self.nth, self.marker = point, nth, marker
        self.counts = dict.fromkeys(POINTS, 0)
        self.pid = os.getpid()

    def hit(self, kind: str, target: str, before_kill: Callable[[], None] | None = None) -> None:
        if os.getpid() != self.pid:
            return  # a DataLoader worker (forked, patches inherited): not the trainer
        name = os.path.basename(target.rstrip("/"))
        for point, (point_kind, match) in POINTS.items():
            if point_kind != kind or not match(name):
                continue
            self.counts[point] += 1
            if point == self.point and self.counts[point] == self.nth:
                if before_kill is not None:
                    before_kill()
                self._die(point, name)

    def _die(self, point: str, name: str) -> None:
        if self.marker is not None:
            # Plain write, no fsync: the parent reads it after our death, from the same page cache.
            self.marker.write_text(json.dumps({"point": point, "nth": self.nth, "target": name}) + "\n")
        # Our DataLoader workers die with us, as on a failed node (we lead our own session).
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def install(inj: Injector) -> None:
    import torch

    real_replace, real_rename, real_unlink, real_remove = os.replace, os.rename, os.unlink, os.remove
    real_fsync, real_save = os.fsync, torch.save

    def make_mover(real: Callable[..., Any]) -> Callable[..., Any]:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            inj.hit("replace", os.fspath(dst))
            result = real(src, dst, *args, **kwargs)
            inj.hit("replace_after", os.fspath(dst))
            return result

        return move

    def make_remover(real: Callable[..., Any]) -> Callable[..., Any]:
        def remove(path: Any, *args: Any, **kwargs: Any) -> Any:
            inj.hit("unlink", os.fspath(path))
            return real(path, *args, **kwargs)

        return remove

    def fsync(fd: Any) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        target = _fd_path(number)
        if os.path.isdir(target):
            inj.hit("fsync_dir", target)
        else:
            size = os.fstat(number).st_size

            def tear() -> None:  # the write was cut halfway: only a prefix reached the file
                os.ftruncate(number, size // 2)

            inj.hit("fsync_torn", target, before_kill=tear)
            inj.hit("fsync", target)
        real_fsync(fd)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        inj.hit("serialize", str(f) if isinstance(f, (str, os.PathLike)) else "<buffer>")
        return real_save(obj, f, *args, **kwargs)

    os.replace, os.rename = make_mover(real_replace), make_mover(real_rename)  # type: ignore[assignment]
    os.unlink, os.remove = make_remover(real_unlink), make_remover(real_remove)  # type: ignore[assignment]
    os.fsync = fsync  # type: ignore[assignment]
    torch.save = save  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit("usage: fault_child.py [--point NAME --nth N] [--marker F] [--counts F] -- ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="fault_child.py")
    parser.add_argument("--point", choices=sorted(POINTS))
    parser.add_argument("--nth", type=int, default=1)
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--counts", type=Path)
    opts = parser.parse_args(argv[:split])
    inj = Injector(opts.point, opts.nth, opts.marker)
    install(inj)
    from hpctrain.cli import main as hpctrain_main

    code = hpctrain_main(argv[split + 1 :])
    if opts.counts is not None:
        opts.counts.write_text(json.dumps(inj.counts) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
