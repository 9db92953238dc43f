"""Reads announced ahead of their use, run in order on one background thread, a bounded number ahead.

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

    At most `depth` reads are started and not yet got: what is read ahead holds at most `depth` results in
    memory (the rest of the announced keys wait their turn)."""

    def __init__(self, read: Callable[[K], V], depth: int = 2) -> None:
        assert depth >= 1
        self._read, self.depth = read, depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpctrain-read-ahead")
        self._waiting: OrderedDict[K, None] = OrderedDict()  # announced, not started
        self._started: OrderedDict[K, Future[V]] = OrderedDict()  # started (maybe done), not got

    def announce(self, keys: Iterable[K]) -> None:
        """Read `keys` (those not announced already) after the keys announced before."""
        for key in keys:
            if key not in self._started:
                self._waiting[key] = None
        self._start()

    def _start(self) -> None:
        while self._waiting and len(self._started) < self.depth:
            key = next(iter(self._waiting))
            del self._waiting[key]
            self._started[key] = self._pool.submit(self._read, key)

    def get(self, key: K) -> V:
        """The result of `read(key)`: the one read ahead, else read now (on the thread, after the reads started
        already). The read's exception, if any, is raised here."""
        future = self._started.pop(key, None)
        if future is None:
            self._waiting.pop(key, None)
            future = self._pool.submit(self._read, key)
        self._start()  # the next announced reads follow this one at once
        return future.result()

    def forget(self) -> None:
        """Drop every announced read (the order they were announced for is no longer followed)."""
        self._waiting.clear()
        while self._started:
            self._started.popitem()[1].cancel()  # (one already running ends, and its result is dropped)

    def close(self) -> None:
        """Stop the thread once the read in progress, if any, is done."""
        self.forget()
        self._pool.shutdown(wait=True, cancel_futures=True)
