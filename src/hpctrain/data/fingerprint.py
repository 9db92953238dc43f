"""The input files of a stream, kept in its checkpointed state: a resume must not continue in another list.

A resumed stream continues at a position in the epoch's global order, and that order is a function of the
file list (which files, in which order, how many events each). A file added to the data folder between two
job hops would silently shift every later event: the same position then falls on other events, some are seen
twice in the epoch and others never. So the stream stores `FileList.state()` (names, sizes in bytes, events
per file where the index knows them: no extra I/O) with its position, and `check_resume` compares it with the
list found now:

- the same files (sizes and events too): resume exactly; a different common folder alone (the data moved,
  e.g. to another scratch volume) is fine, and logged;
- different files: a UserError naming the difference (added / removed / changed, first few of each), unless
  `data.allow_changed_files` is true: then the current epoch restarts from its beginning with the new list
  (same epoch number, so the order is the new list's order for that epoch), with a warning;
- a checkpoint without a list (written before this check existed): accepted with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import UserError

log = logging.getLogger("hpctrain.data")
_SHOWN = 3  # names shown per kind of difference


def _root(names: Sequence[str]) -> str:
    """The longest common folder prefix of `names` (ending in '/'), '' if none."""
    if not names:
        return ""
    # by characters, cut at the last "/": URIs too (commonpath would fold the "//" of pelican://)
    prefix = os.path.commonprefix(list(names))  # noqa: RUF071
    return prefix[: prefix.rfind("/") + 1]


@dataclass
class FileList:
    """Files of a stream in their order: `sizes` in bytes and `events` per file (-1: unknown)."""

    names: list[str]
    sizes: list[int]
    events: list[int]

    def state(self) -> dict[str, Any]:
        root = _root(self.names)
        return {
            "root": root,
            "names": [n[len(root) :] for n in self.names],
            "sizes": list(self.sizes),
            "events": list(self.events),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> FileList:
        root = str(state.get("root", ""))
        names = [root + str(n) for n in state["names"]]
        n = len(names)
        return cls(
            names,
            [int(s) for s in state.get("sizes", [-1] * n)],
            [int(e) for e in state.get("events", [-1] * n)],
        )

    def changes(self, saved: FileList) -> str | None:
        """What differs from `saved` (the checkpoint's list), in a few words; None if the same files."""
        old_root, new_root = _root(saved.names), _root(self.names)
        old = {n[len(old_root) :]: (s, e) for n, s, e in zip(saved.names, saved.sizes, saved.events)}
        new = {n[len(new_root) :]: (s, e) for n, s, e in zip(self.names, self.sizes, self.events)}
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        changed = []
        for name in (n for n in new if n in old):
            (s0, e0), (s1, e1) = old[name], new[name]
            if s0 >= 0 and s1 >= 0 and s0 != s1:
                changed.append(f"{name} {s0} -> {s1} bytes")
            elif e0 >= 0 and e1 >= 0 and e0 != e1:
                changed.append(f"{name} {e0} -> {e1} events")
        parts = [
            f"{len(items)} {what} ({_few(items)})"
            for what, items in (("added", added), ("removed", removed), ("changed", changed))
            if items
        ]
        if not parts and [n[len(old_root) :] for n in saved.names] != [
            n[len(new_root) :] for n in self.names
        ]:
            parts.append("the same files in another order")
        if not parts:
            if old_root != new_root:
                log.info(
                    "the data files moved from %s to %s (same names, sizes and events)", old_root, new_root
                )
            return None
        return ", ".join(parts)


def _few(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f", ... {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def check_resume(saved: dict[str, Any] | None, current: FileList, allow_changed: bool, epoch: int) -> bool:
    """Whether a stream resumed from `saved` (its checkpointed file list, or None) must restart `epoch` from
    its start. Raises UserError when the files changed and `allow_changed` is false."""
    if saved is None:
        log.warning(
            "the checkpoint holds no list of its data files (written by an older hpctrain): resuming at its "
            "position without checking that the files are the same"
        )
        return False
    diff = current.changes(FileList.from_state(saved))
    if diff is None:
        return False
    if not allow_changed:
        raise UserError(
            f"the data files changed since the checkpoint was written: {diff}; the saved position would fall "
            f"on other samples. Restore the files, or set data.allow_changed_files=true to restart epoch "
            f"{epoch} from its start with the new list"
        )
    log.warning(
        "the data files changed since the checkpoint was written: %s; data.allow_changed_files=true: epoch %d "
        "restarts from its start with the new list",
        diff,
        epoch,
    )
    return True
