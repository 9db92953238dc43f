from __future__ import annotations

import threading
import time

import pytest

from hpctrain.data.read_ahead import ReadAhead


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
        deadline = time.monotonic() + 30
        while len(reads.done) < 3 and time.monotonic() < deadline:  # done meanwhile, without anyone asking
            time.sleep(0.01)
        assert reads.done == ["a", "b", "c"]
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


def test_unclaimed_reads_are_bounded_and_forgotten() -> None:
    reads = Reads(delay=0.02)
    ahead = ReadAhead(reads, keep=2)
    try:
        ahead.announce(["a", "b", "c", "d"])  # a and b dropped: at most 2 wait to be got
        assert ahead.get("d") == "D"
        assert ahead.get("a") == "A"  # dropped before it ran (cancelled) or after: read again when asked
        assert reads.done.count("a") in (1, 2) and len(ahead._pending) == 1  # c still waits
        ahead.forget()
        assert not ahead._pending
    finally:
        ahead.close()
    with pytest.raises(RuntimeError):  # closed: the thread is gone
        ahead.get("e")
