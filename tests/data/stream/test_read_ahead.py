from __future__ import annotations

import threading
import time

import pytest

from hpctrain.data.stream.read_ahead import ReadAhead


class Reads:
    """A read that notes which key it ran for, on which thread, and fails for 'bad'."""

    def __init__(self, delay: float = 0.0) -> None:
        self.done: list[str] = []
        self.threads: set[str] = set()
        self.delay = delay

    def __call__(self, key: str) -> str:
        time.sleep(self.delay)
        self.threads.add(threading.current_thread().name)
        if key == "bad":
            raise ValueError("bad key")
        self.done.append(key)
        return key.upper()


def test_announced_reads_run_ahead_in_order_on_one_thread() -> None:
    reads = Reads(delay=0.05)
    ahead = ReadAhead(reads)
    try:
        ahead.announce(["a", "b", "c"])
        _settle(reads, 2)  # done meanwhile, without anyone asking (two ahead: the default depth)
        assert reads.done == ["a", "b"]
        assert [ahead.get(k) for k in ("a", "b", "c")] == ["A", "B", "C"]
        assert ahead.get("d") == "D"  # not announced: read now, on the same thread
        assert reads.done == ["a", "b", "c", "d"]
        assert (
            reads.threads == {"hpctrain-read-ahead_0"}
            and threading.current_thread().name not in reads.threads
        )
        ahead.announce(["b"])  # announced again after it was got: read again
        assert ahead.get("b") == "B" and reads.done.count("b") == 2
    finally:
        ahead.close()


def test_an_announced_key_is_read_once_and_its_error_raised_where_it_is_got() -> None:
    reads = Reads()
    ahead = ReadAhead(reads)
    try:
        ahead.announce(["a", "bad", "a"])
        with pytest.raises(ValueError, match="bad key"):
            ahead.get("bad")
        assert ahead.get("a") == "A" and reads.done == ["a"]
    finally:
        ahead.close()


def _settle(reads: Reads, count: int) -> None:
    """Wait (up to 30 s) until `count` reads are done; a moment more so that a read too many would show."""
    deadline = time.monotonic() + 30
    while len(reads.done) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)


def test_at_most_depth_reads_are_ahead_and_forgotten_ones_are_dropped() -> None:
    reads = Reads()
    ahead = ReadAhead(reads, depth=2)
    try:
        ahead.announce(["a", "b", "c", "d"])
        _settle(reads, 2)
        assert reads.done == ["a", "b"]  # two results held, the rest wait their turn
        assert ahead.get("a") == "A"
        _settle(reads, 3)
        assert reads.done == ["a", "b", "c"]
        ahead.forget()  # b and c read for nothing; d never read
        assert ahead.get("d") == "D" and reads.done == ["a", "b", "c", "d"]
        assert ahead.get("b") == "B" and reads.done.count("b") == 2  # forgotten: read again
    finally:
        ahead.close()
    with pytest.raises(RuntimeError):  # closed: the thread is gone
        ahead.get("e")
