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

Names, sizes and event counts miss a file rewritten with other events at the same size (generated HDF5 files
come out at a fixed size). So each local file also carries cheap content evidence (`content_evidence`): its
mtime_ns and a hash of a few small byte ranges (head, tail and three fixed fractions of the size: at most
5 x 4 KiB read per file). On resume a file whose size and mtime_ns are the saved ones is taken as the same without
reading it (a stat); one whose mtime differs is sampled again, and only a different hash is a change (a copy to
another volume keeps its bytes and changes its mtime). Remote files bring the same pair from their index (the
muons' remote_index.py): the listing's last-modified time as the stamp, and the same sampled hash read with
ranged GETs, so identical bytes hash alike whether local or remote. A checkpoint written before the evidence
existed resumes with the old comparison.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpctrain.config.secrets import mask_secrets
from hpctrain.errors import UserError

log = logging.getLogger("hpctrain.data")
_SHOWN = 3  # names shown per kind of difference
SAMPLE_BYTES = 4096  # bytes per sampled range
SAMPLE_AT = (0.25, 0.5, 0.75)  # fixed fractions of the size sampled besides head and tail
_UNKNOWN = ""
# (path, size, mtime_ns) -> sampled hash: a resume that found the saved mtime trusts the saved hash, and the first
# save after it reuses it instead of reading every file again.
_sampled: dict[tuple[str, int, int], str] = {}


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """The (offset, length) ranges `content_evidence` reads of a file of `size` bytes, merged where they meet."""
    starts = [0, *(int(size * f) for f in SAMPLE_AT), max(0, size - SAMPLE_BYTES)]
    ranges: list[tuple[int, int]] = []
    for start in sorted(starts):
        end = min(size, start + SAMPLE_BYTES)
        if ranges and start <= ranges[-1][0] + ranges[-1][1]:
            first = ranges[-1][0]
            ranges[-1] = (first, max(ranges[-1][1], end - first))
        elif end > start:
            ranges.append((start, end - start))
    return ranges


def sampled_hash(read: Callable[[int, int], bytes], size: int) -> str:
    """The hash of the `sample_ranges` of a file of `size` bytes, each read as `read(offset, length)`: the same
    for the same bytes wherever they are read from (a local file, ranged GETs of a remote one)."""
    digest = hashlib.blake2b(digest_size=8)
    for offset, length in sample_ranges(size):
        digest.update(read(offset, length))
    return digest.hexdigest()


def content_evidence(path: str) -> tuple[int, str]:
    """(mtime_ns, sampled hash) of a local file; (-1, "") if it cannot be read (the reader says why later)."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, _UNKNOWN
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _sampled:
        try:
            with open(path, "rb") as fh:
                _sampled[key] = sampled_hash(lambda offset, n: os.pread(fh.fileno(), n, offset), st.st_size)
        except OSError:
            return st.st_mtime_ns, _UNKNOWN
    return st.st_mtime_ns, _sampled[key]


def _is_remote(name: str) -> bool:
    return "://" in name


def _root(names: Sequence[str]) -> str:
    """The longest common folder prefix of `names` (ending in '/'), '' if none."""
    if not names:
        return ""
    # by characters, cut at the last "/": URIs too (commonpath would fold the "//" of pelican://)
    prefix = os.path.commonprefix(list(names))  # noqa: RUF071
    return prefix[: prefix.rfind("/") + 1]


@dataclass
class FileList:
    """Files of a stream in their order: `sizes` in bytes and `events` per file (-1: unknown). `remote`: the
    (stamp, sampled hash) of remote files as their index found them (a remote file not in it: unknown)."""

    names: list[str]
    sizes: list[int]
    events: list[int]
    remote: Mapping[str, tuple[int, str]] = field(default_factory=dict, repr=False, compare=False)
    # per file (mtime_ns or stamp, sampled hash): computed when first asked
    _evidence: list[tuple[int, str]] | None = field(default=None, repr=False, compare=False)

    def evidence(self) -> list[tuple[int, str]]:
        if self._evidence is None:
            self._evidence = [
                self.remote.get(n, (-1, _UNKNOWN)) if _is_remote(n) else content_evidence(n)
                for n in self.names
            ]
        return self._evidence

    def shown(self) -> list[str]:
        """The names as a checkpoint keeps and compares them: a token in a URI's query masked (`?authz=***`),
        so it is never stored, and a renewed token names the same file."""
        return [mask_secrets(n) if "?" in n or "@" in n else n for n in self.names]  # a query, a user part

    def state(self) -> dict[str, Any]:
        names = self.shown()
        root = _root(names)
        evidence = self.evidence()
        return {
            "root": root,
            "names": [n[len(root) :] for n in names],
            "sizes": list(self.sizes),
            "events": list(self.events),
            "mtimes": [m for m, _ in evidence],
            "samples": [h for _, h in evidence],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> FileList:
        root = str(state.get("root", ""))
        names = [root + str(n) for n in state["names"]]
        n = len(names)
        saved = cls(
            names,
            [int(s) for s in state.get("sizes", [-1] * n)],
            [int(e) for e in state.get("events", [-1] * n)],
        )
        # a checkpoint written before the content evidence existed: unknown, compared by the rest alone
        mtimes, samples = state.get("mtimes", [-1] * n), state.get("samples", [_UNKNOWN] * n)
        saved._evidence = [(int(m), str(h)) for m, h in zip(mtimes, samples)]
        return saved

    def _content_changed(self, saved: FileList) -> set[str]:
        """Names (relative to the list's root) of files whose bytes differ from the saved evidence. A local file
        with its saved size and mtime_ns is not read (the saved hash is taken for it); a remote file is judged
        by its index's evidence (a new stamp: its hash, sampled again there)."""
        saved_names, names = saved.shown(), self.shown()
        old_root, new_root = _root(saved_names), _root(names)
        old = {
            n[len(old_root) :]: (size, ev) for n, size, ev in zip(saved_names, saved.sizes, saved.evidence())
        }
        changed = set()
        for name, shown, size in zip(self.names, names, self.sizes):
            rel = shown[len(new_root) :]
            if rel not in old or not old[rel][1][1] or old[rel][0] != size:
                continue  # new, saved without evidence, or a size change (said as such)
            if _is_remote(name):
                if _remote_changed(old[rel][1], self.remote.get(name, (-1, _UNKNOWN))):
                    changed.add(rel)
                continue
            mtime, digest = old[rel][1]
            try:
                st = os.stat(name)
            except OSError:
                continue  # the reader says why
            if st.st_mtime_ns == mtime and st.st_size == size:
                _sampled.setdefault((name, st.st_size, st.st_mtime_ns), digest)
            elif content_evidence(name)[1] not in (digest, _UNKNOWN):
                changed.add(rel)
        return changed

    def changes(self, saved: FileList) -> str | None:
        """What differs from `saved` (the checkpoint's list), in a few words; None if the same files."""
        saved_names, names = saved.shown(), self.shown()
        old_root, new_root = _root(saved_names), _root(names)
        old = {n[len(old_root) :]: (s, e) for n, s, e in zip(saved_names, saved.sizes, saved.events)}
        new = {n[len(new_root) :]: (s, e) for n, s, e in zip(names, self.sizes, self.events)}
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        changed = []
        rewritten = self._content_changed(saved)
        for name in (n for n in new if n in old):
            (s0, e0), (s1, e1) = old[name], new[name]
            if s0 >= 0 and s1 >= 0 and s0 != s1:
                changed.append(f"{name} {s0} -> {s1} bytes")
            elif e0 >= 0 and e1 >= 0 and e0 != e1:
                changed.append(f"{name} {e0} -> {e1} events")
            elif name in rewritten:
                changed.append(f"{name} rewritten (same size, other bytes)")
        parts = [
            f"{len(items)} {what} ({_few(items)})"
            for what, items in (("added", added), ("removed", removed), ("changed", changed))
            if items
        ]
        if not parts and [n[len(old_root) :] for n in saved_names] != [n[len(new_root) :] for n in names]:
            parts.append("the same files in another order")
        if not parts:
            if old_root != new_root:
                log.info(
                    "the data files moved from %s to %s (same names, sizes and events)", old_root, new_root
                )
            return None
        return ", ".join(parts)


def _remote_changed(saved: tuple[int, str], now: tuple[int, str]) -> bool:
    """Whether a remote file's evidence says other bytes: the same known stamp is the same file (nothing read);
    otherwise the sampled hashes decide (the index samples again whenever the stamp is not the saved one)."""
    if saved[0] >= 0 and saved[0] == now[0]:
        return False
    return bool(now[1]) and now[1] != saved[1]


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
