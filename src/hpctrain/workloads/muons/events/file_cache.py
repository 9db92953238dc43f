"""A process-local LRU of whole Parquet files' bytes (data.memory_cache_mb): for runs over a few files for many
epochs, each file is read from disk once per process and decoded from memory after that.

Bounded by bytes (a file larger than the bound is never cached); keyed by path, size and modification time, so a
replaced file is read again. DataLoader workers each hold their own (forked with the setting; a worker started
by spawn keeps it off). Off (0) by default: with many files per epoch it would only churn.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict

import pyarrow as pa

log = logging.getLogger(__name__)


class FileBytesCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._files: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0

    def source(self, path: str) -> str | pa.BufferReader:
        """What pyarrow reads `path` from: its cached bytes (read now on a miss), or the path when uncacheable."""
        if self.max_bytes <= 0:
            return path
        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        data = self._files.get(key)
        if data is not None:
            self.hits += 1
            self._files.move_to_end(key)
            return pa.BufferReader(data)
        self.misses += 1
        if stat.st_size > self.max_bytes:
            return path
        with open(path, "rb") as fh:
            data = fh.read()
        self._files[key] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes:
            _, dropped = self._files.popitem(last=False)
            self._bytes -= len(dropped)
        return pa.BufferReader(data)

    @property
    def held_bytes(self) -> int:
        return self._bytes


_cache = FileBytesCache(0)  # this process's; configure() sets its bound


def configure(megabytes: int) -> FileBytesCache:
    """Set this process's cache bound (emptied when it changes); returns the cache."""
    global _cache
    if _cache.max_bytes != megabytes * 2**20:
        _cache = FileBytesCache(megabytes * 2**20)
    return _cache


def source(path: str) -> str | pa.BufferReader:
    return _cache.source(path)


def cache() -> FileBytesCache:
    return _cache
