"""Remote muon files: their index without downloading them (staging them is data/stream/staged.py's).

The global order needs the events per unit (Parquet row group, HDF5 slice) of every file, before any
file is read. For a remote file we read only its metadata through the fsspec/pelicanfs file object with Range
requests: a Parquet footer (one HEAD and usually one 64 KiB GET) or the HDF5 dataset shapes. Arrow parses the
footer from the file object (`pq.ParquetFile(fs.open(...))`); `pq.read_table(path, filesystem=pelicanfs)` is
never used (pelicanfs' string mtime breaks it). The result is cached in `<run folder>/data_index/` so that a
resumed or requeued run reads no footer again.

A file rewritten between two hops must not pass for the indexed one (data/fingerprint.py): each entry also
holds the file's content evidence: its listing's last-modified time (the stamp) and data/fingerprint.py's
sampled hash, read with five ranged GETs of 4 KiB when the file is indexed. Every start lists the files' folders
(one WebDAV PROPFIND per folder on a Pelican federation, whatever the number of files): a cached entry is used
only while its listing shows the saved size and stamp; any other (a rewritten file, a listing that gives no
time, a URI of another scheme) is indexed and sampled again, and the fingerprint then judges it by its hash.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from hpctrain.config.remote import StagingConfig
from hpctrain.config.secrets import mask_secrets
from hpctrain.data.fingerprint import sampled_hash
from hpctrain.data.staging import BadFileError, StagingError
from hpctrain.data.stream.staged import StagingSpec
from hpctrain.fsutil import atomic_path, make_folders
from hpctrain.remote.failures import classify_failure, is_folder
from hpctrain.remote.files import RemoteFiles
from hpctrain.remote.uris import PELICAN_SCHEMES, FolderError, is_remote, scheme
from hpctrain.workloads.muons.events import layouts

log = logging.getLogger("hpctrain.muons")
INDEX_VERSION = 2  # 2: content evidence (stamp, sample)
_FOOTER_BLOCK = 1 << 16  # one Range GET covers a typical Parquet footer; pyarrow asks for more if needed


@dataclass
class FileMeta:
    """What the index needs of one remote file: its format and events per unit, and its content evidence."""

    uri: str
    layout: str  # "parquet" (the Parquet family: the exact layout is found once staged) or "hdf5"
    unit_rows: list[int]
    size: int
    stamp: int = -1  # the listing's last-modified time in ns (-1: none given)
    sample: str = ""  # data/fingerprint.py's sampled hash of the file's bytes


# ---- the index of remote files -----------------------------------------------------------------------------


def _remote_format(uri: str, fh: Any) -> str:
    lower = uri.lower().split("?", 1)[0]
    if lower.endswith(layouts.PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(layouts.HDF5_SUFFIXES):
        return "hdf5"
    head = fh.read(8)
    fh.seek(0)
    if head[:4] == b"PAR1":
        return "parquet"
    if head == layouts.HDF5_MAGIC:
        return "hdf5"
    raise layouts.LayoutError(f"{uri}: neither Parquet nor HDF5 (unknown suffix and magic bytes)")


def _read_range(fh: Any, offset: int, length: int) -> bytes:
    """`length` bytes at `offset` in one ranged GET (fsspec's HTTPFile), past the file's read-ahead cache."""
    fetch = getattr(fh, "_fetch_range", None)
    if fetch is not None:
        return bytes(fetch(offset, offset + length))
    fh.seek(offset)
    return bytes(fh.read(length))


def _read_meta(uri: str, fs: Any, path: str, hdf5_unit_events: int) -> FileMeta:
    """One remote file's metadata and sampled hash through Range requests (no download)."""
    with fs.open(path, "rb", block_size=_FOOTER_BLOCK, cache_type="readahead") as fh:
        meta = _read_units(uri, fh, hdf5_unit_events)
        meta.sample = sampled_hash(lambda offset, n: _read_range(fh, offset, n), meta.size)
        return meta


def _read_units(uri: str, fh: Any, hdf5_unit_events: int) -> FileMeta:
    """The format and events per unit of an open remote file."""
    kind = _remote_format(uri, fh)
    size = int(fh.size)
    if kind == "parquet":
        pf = pq.ParquetFile(fh)
        names = set(pf.schema_arrow.names)
        if not {"primary", "muons"} <= names:
            raise layouts.LayoutError(
                f"{uri}: unknown layout with columns {sorted(names)}; {layouts._EXPECTED}"
            )
        meta = pf.metadata
        return FileMeta(
            uri, "parquet", [meta.row_group(i).num_rows for i in range(meta.num_row_groups)], size
        )
    import h5py

    with h5py.File(fh, "r") as h5:
        if "primaries" not in h5 or h5["primaries"].ndim != 2:
            raise layouts.LayoutError(f"{uri}: unknown HDF5 layout (no 2-d 'primaries' dataset)")
        n = int(h5["primaries"].shape[0])
    rows = [min(hdf5_unit_events, n - s) for s in range(0, n, hdf5_unit_events)]
    return FileMeta(uri, "hdf5", rows, size)


def remote_meta(uri: str, files: RemoteFiles, staging: StagingConfig, hdf5_unit_events: int) -> FileMeta:
    """Metadata of a remote file, retrying transient failures like the stager; BadFileError for 404/403,
    FolderError (a UserError) for a folder, LayoutError for a file of another layout."""
    fs, path = files.resolve(uri)
    if uri.endswith("/"):
        raise FolderError(uri)
    attempt = 0
    while True:
        try:
            return _read_meta(uri, fs, path, hdf5_unit_events)
        except Exception as err:  # network and format errors come in many types; classified below
            if is_folder(fs, path):  # a folder answers 403/404/405, a listing, or "neither Parquet nor HDF5"
                raise FolderError(uri) from None
            if isinstance(err, layouts.LayoutError):
                raise
            kind, reason = classify_failure(err, fs, path, files.scrub)
            if kind == "fatal":
                raise StagingError(f"{uri}: {reason}") from None
            if kind == "bad":  # 404, 403, or a footer Arrow/h5py cannot parse (a corrupt file)
                raise BadFileError(uri, reason) from None
            attempt += 1
            if attempt > staging.retries:
                raise BadFileError(uri, f"metadata: gave up after {attempt} attempts: {reason}") from None
            delay = min(staging.backoff_cap, staging.backoff_base * 2 ** (attempt - 1))
            log.warning("reading the metadata of %s: %s; retry %d in %.2f s", uri, reason, attempt, delay)
            time.sleep(delay)


def _cache_file(run_dir: str | None, uris: Sequence[str], hdf5_unit_events: int) -> Path | None:
    if run_dir is None or not uris:
        return None
    key = hashlib.sha1(("\n".join(uris) + f"\n{hdf5_unit_events}").encode()).hexdigest()[:16]
    return Path(run_dir) / "data_index" / f"remote-{key}.json"


def _load_cache(path: Path | None) -> dict[str, FileMeta]:
    if path is None or not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        if raw.get("version") != INDEX_VERSION:
            return {}
        return {
            m["uri"]: FileMeta(
                m["uri"], m["layout"], list(m["unit_rows"]), int(m["size"]), int(m["stamp"]), str(m["sample"])
            )
            for m in raw["files"]
        }
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
    ):  # damaged: indexed again
        log.warning("ignoring unreadable remote index cache %s", path)
        return {}


def _save_cache(path: Path, metas: dict[str, FileMeta]) -> None:
    make_folders(path.parent)
    # a token in a URI's query is not kept (such a URI is never listed with a time: it is read again anyway)
    body = {
        "version": INDEX_VERSION,
        "files": [{**vars(m), "uri": mask_secrets(m.uri)} for m in metas.values()],
    }
    # several ranks may write the same content: readers never see half a file; a cache lost on a power cut is
    # read again remotely, so no fsync
    with atomic_path(path, fsync=False) as tmp:
        tmp.write_text(json.dumps(body))


def listed_stamps(uris: Sequence[str], files: RemoteFiles) -> dict[str, tuple[int, int]]:
    """(size, last-modified in ns) of each Pelican/OSDF URI from a listing of its folder: one PROPFIND per folder.
    A URI whose folder cannot be listed, or whose listing gives no time, is left out (its evidence is read)."""
    folders: set[tuple[int, str]] = set()
    filesystems: dict[int, tuple[Any, str]] = {}
    for uri in uris:
        if scheme(uri) not in PELICAN_SCHEMES or uri.endswith("/"):
            continue  # an https:// folder listing is an HTML page: no times; a folder fails when indexed
        try:
            fs, path = files.resolve(uri)
        except ValueError:
            continue  # no namespace path: said when indexed
        filesystems[id(fs)] = (fs, uri)
        folders.add((id(fs), path.rsplit("/", 1)[0] or "/"))
    stamps: dict[str, tuple[int, int]] = {}
    for fs_id, folder in sorted(folders):
        fs, some_uri = filesystems[fs_id]
        try:
            listing = fs.ls(folder, detail=True)
        except (
            Exception
        ) as err:  # a listing can fail in many ways (403, 404, 5xx): the files are read instead
            log.info(
                "cannot list %s (%s): its files' content is sampled instead", folder, files.scrub(str(err))
            )
            continue
        for entry in listing:
            modified = entry.get("modified")
            if (
                entry.get("type") != "directory"
                and modified is not None
                and hasattr(modified, "utctimetuple")
            ):
                uri = files.canonical(some_uri, fs, str(entry["name"]))
                stamps[uri] = (int(entry["size"]), calendar.timegm(modified.utctimetuple()) * 10**9)
    return {u: stamps[u] for u in uris if u in stamps}


def remote_index(
    uris: Sequence[str],
    spec: StagingSpec,
    hdf5_unit_events: int,
    run_dir: str | None,
    write_cache: bool,
) -> dict[str, FileMeta | BaseException]:
    """Metadata (or the BadFileError) of each remote URI: from the run folder's cache while the folder's listing
    shows the cached size and stamp, else read remotely in parallel (a HEAD, a footer GET and five sample GETs
    each). LayoutError, FolderError and StagingError are raised."""
    remote = [u for u in uris if is_remote(u)]
    cache = _cache_file(run_dir, remote, hdf5_unit_events)
    cached = _load_cache(cache)
    files = RemoteFiles(spec.pelican, spec.storage_options, timeout=spec.staging.timeout)
    stamps = listed_stamps(remote, files)
    found: dict[str, FileMeta | BaseException] = {
        u: m for u, m in cached.items() if m.stamp >= 0 and stamps.get(u) == (m.size, m.stamp)
    }
    todo = [u for u in remote if u not in found]
    if todo:
        start = time.monotonic()

        def one(uri: str) -> FileMeta | BaseException:
            try:
                meta = remote_meta(uri, files, spec.staging, hdf5_unit_events)
            except BadFileError as err:
                return err
            # the stamp listed before the read: a file rewritten meanwhile is read again at the next start
            meta.stamp = stamps.get(uri, (-1, -1))[1]
            return meta

        with ThreadPoolExecutor(max(1, min(spec.index_threads, len(todo)))) as pool:
            for uri, meta in zip(todo, pool.map(one, todo)):
                found[uri] = meta
        log.info("read the metadata of %d remote files in %.1f s", len(todo), time.monotonic() - start)
        good = {u: m for u, m in found.items() if isinstance(m, FileMeta)}
        if write_cache and cache is not None and good:
            _save_cache(cache, good)
    return found
