"""Reads announced ahead of their use, run in order on one background thread.

With no DataLoader workers, the training thread would decode each work item's files itself and then gather it.
Arrow's Parquet decode releases the GIL, so a second thread can decode the next item's units meanwhile: the
decode (most of the loader's time) then overlaps with the gather and the training step, at no copy and no
shared memory. Every read goes through the one thread, announced or not, so the readers it uses (open files)
are never used from two threads at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadAhead(Generic[K, V]):
    """`read(key)` on one background thread: for keys announced ahead (in that order) and for any key got.

    At most `keep` announced results wait to be got (the oldest are dropped beyond that: an announcement that
    turned out wrong costs one wasted read, never memory without bound)."""

    def __init__(self, read: Callable[[K], V], keep: int = 8) -> None:
        self._read, self.keep = read, keep
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpctrain-read-ahead")
        self._pending: OrderedDict[K, Future[V]] = OrderedDict()

    def announce(self, keys: Iterable[K]) -> None:
        """Start reading `keys` (those not already pending), after the reads announced before."""
        for key in keys:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._read, key)
        while len(self._pending) > self.keep:
            self._pending.popitem(last=False)[1].cancel()

    def get(self, key: K) -> V:
        """The result of `read(key)`: the announced one, else read now (on the thread, after what is pending).
        The read's exception, if any, is raised here."""
        future = self._pending.pop(key, None)
        if future is None:
            future = self._pool.submit(self._read, key)
        return future.result()

    def forget(self) -> None:
        """Drop every announced read (the order they were announced for is no longer followed)."""
        while self._pending:
            self._pending.popitem()[1].cancel()

    def close(self) -> None:
        """Stop the thread once the read in progress, if any, is done."""
        self.forget()
        self._pool.shutdown(wait=True, cancel_futures=True)
