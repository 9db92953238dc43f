"""A background thread keeping ready batches ahead of the training loop (data.prefetch_batches)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

from hpctrain.runtime.budget import check_stop

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Keeps up to `size` items of `source` ready; an exception in the source is raised in the consumer."""

    _END = object()

    def __init__(self, source: Iterator[T], size: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._source = source
        self._thread = threading.Thread(target=self._run, name="hpctrain-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._source:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as err:  # handed to the consumer, raised there
            self._queue.put(err)

    def __iter__(self) -> Iterator[T]:
        while True:
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                check_stop()  # a stop (signal, deadline) must not wait for data that is slow to come
                continue
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]  # put by _run: a T

    def close(self) -> None:
        """Stop the thread (draining the queue so that a blocked put sees the stop)."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.1)
        self._thread.join()
