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
come out at a fixed size), or one map of an HDF5 shard edited in place. So each local file also carries content
evidence (`content_evidence`): its mtime_ns, a hash of a few small byte ranges (head, tail and three fixed
fractions of the size: 5 x 4 KiB) and a hash of the whole file (the first WHOLE_BYTES of the list's files in its
order: read once per run, at the first save). On resume a file whose size and mtime_ns are the saved ones is
taken as the same without reading it (a stat); one whose mtime differs is hashed again, whole when its whole hash
was saved (an edit anywhere in it is a change; a copy to another volume keeps its bytes and changes its mtime),
else on the sampled ranges, and a file that passes on those alone is named in a warning (what an edit between
them would escape). Remote files bring a stamp and the sampled hash from their index (the muons'
remote_index.py): the listing's last-modified time, and the same ranges read with ranged GETs, so identical bytes
hash alike whether local or remote. A checkpoint written before the evidence existed resumes with the old
comparison.
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
# Bytes of local files hashed whole per file list (the first files in its order, up to this many): a file past
# it has its sampled ranges alone (said at a resume that has to rely on them). A data set up to this size is
# read once per run for it, at the first save (and only the files whose mtime changed again at a resume).
WHOLE_BYTES = 4 << 30
_CHUNK = 8 << 20
# (path, size, mtime_ns) -> (sampled hash, whole hash or ""): a resume that found the saved mtime trusts the
# saved hashes, and the first save after it reuses them instead of reading every file again.
_hashed: dict[tuple[str, int, int], tuple[str, str]] = {}
Evidence = tuple[int, str, str]  # (mtime_ns or remote stamp, sampled hash, whole-file hash; "" when unknown)


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


def content_evidence(path: str, whole: bool = True) -> Evidence:
    """(mtime_ns, sampled hash, whole hash) of a local file; the whole hash only when `whole` (else ""); (-1, "",
    "") if it cannot be read (the reader says why later)."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, _UNKNOWN, _UNKNOWN
    key = (path, st.st_size, st.st_mtime_ns)
    known = _hashed.get(key, (_UNKNOWN, _UNKNOWN))
    if known[0] and (known[1] or not whole):
        return st.st_mtime_ns, *known
    try:
        with open(path, "rb") as fh:
            sampled = sampled_hash(lambda offset, n: os.pread(fh.fileno(), n, offset), st.st_size)
            full = _whole_hash(fh) if whole else known[1]
    except OSError:
        return st.st_mtime_ns, _UNKNOWN, _UNKNOWN
    _hashed[key] = (sampled, full)
    return st.st_mtime_ns, sampled, full


def _whole_hash(fh: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    fh.seek(0)
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)  # (hashlib lets go of the GIL for large updates: the loader's threads go on)
    return digest.hexdigest()


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
    # per file (mtime_ns or stamp, sampled hash, whole hash): computed when first asked
    _evidence: list[Evidence] | None = field(default=None, repr=False, compare=False)

    def evidence(self) -> list[Evidence]:
        """Each file's evidence; local files hashed whole in list order while WHOLE_BYTES last."""
        if self._evidence is None:
            budget, found = WHOLE_BYTES, []
            for name, size in zip(self.names, self.sizes):
                if _is_remote(name):
                    found.append((*self.remote.get(name, (-1, _UNKNOWN)), _UNKNOWN))
                    continue
                whole = 0 <= size <= budget
                found.append(content_evidence(name, whole))
                budget -= size if whole else 0
            self._evidence = found
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
            "mtimes": [m for m, _, _ in evidence],
            "samples": [h for _, h, _ in evidence],
            "wholes": [w for _, _, w in evidence],
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
        # a checkpoint written before the content evidence (or the whole hashes) existed: unknown, compared by
        # the rest alone (or by the sampled ranges)
        mtimes, samples = state.get("mtimes", [-1] * n), state.get("samples", [_UNKNOWN] * n)
        wholes = state.get("wholes", [_UNKNOWN] * n)
        saved._evidence = [(int(m), str(h), str(w)) for m, h, w in zip(mtimes, samples, wholes)]
        return saved

    def _content_changed(self, saved: FileList) -> tuple[set[str], list[str]]:
        """Names (relative to the list's root) of files whose bytes differ from the saved evidence, and of those
        that pass on their sampled ranges alone although they were touched (a new mtime or remote stamp) and no
        whole hash was saved for them. A local file with its saved size and mtime_ns is not read (the saved
        hashes are taken for it); one with a new mtime is hashed whole when the checkpoint holds its whole hash
        (an edit anywhere in it is found), else sampled; a remote file is judged by its index's evidence (a
        new stamp: its sampled hash, read again there)."""
        saved_names, names = saved.shown(), self.shown()
        old_root, new_root = _root(saved_names), _root(names)
        old = {
            n[len(old_root) :]: (size, ev) for n, size, ev in zip(saved_names, saved.sizes, saved.evidence())
        }
        changed, sampled_only = set(), []
        for name, shown, size in zip(self.names, names, self.sizes):
            rel = shown[len(new_root) :]
            if rel not in old or not old[rel][1][1] or old[rel][0] != size:
                continue  # new, saved without evidence, or a size change (said as such)
            mtime, digest, whole = old[rel][1]
            if _is_remote(name):
                now = self.remote.get(name, (-1, _UNKNOWN))
                if _remote_changed((mtime, digest), now):
                    changed.add(rel)
                elif not (mtime >= 0 and mtime == now[0]) and now[1]:
                    sampled_only.append(rel)
                continue
            try:
                st = os.stat(name)
            except OSError:
                continue  # the reader says why
            if st.st_mtime_ns == mtime and st.st_size == size:
                _hashed.setdefault((name, st.st_size, st.st_mtime_ns), (digest, whole))
                continue
            _, now_digest, now_whole = content_evidence(name, whole=bool(whole))
            if whole and now_whole:
                if now_whole != whole:
                    changed.add(rel)
            elif now_digest not in (digest, _UNKNOWN):
                changed.add(rel)
            elif now_digest:
                sampled_only.append(rel)
        return changed, sampled_only

    def changes(self, saved: FileList) -> str | None:
        """What differs from `saved` (the checkpoint's list), in a few words; None if the same files."""
        saved_names, names = saved.shown(), self.shown()
        old_root, new_root = _root(saved_names), _root(names)
        old = {n[len(old_root) :]: (s, e) for n, s, e in zip(saved_names, saved.sizes, saved.events)}
        new = {n[len(new_root) :]: (s, e) for n, s, e in zip(names, self.sizes, self.events)}
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        changed = []
        rewritten, sampled_only = self._content_changed(saved)
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
            if sampled_only:
                log.warning(
                    "%d data file%s changed since the checkpoint (a new modification time) and pass on %d "
                    "sampled ranges of %d KiB alone (%s): no whole-file hash was saved for them (past the "
                    "first %d GiB of the list, a remote file, or an older checkpoint); an edit outside those "
                    "ranges would go unseen",
                    len(sampled_only),
                    "s" if len(sampled_only) > 1 else "",
                    len(SAMPLE_AT) + 2,
                    SAMPLE_BYTES // 1024,
                    _few(sampled_only),
                    WHOLE_BYTES >> 30,
                )
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
