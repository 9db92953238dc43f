"""Buffers lent to DataLoader workers: a loan is a few integers, another process maps the very memory the main
process reads, once per buffer, and a buffer is only dropped when it was too small."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from hpctrain.data.stream import lent_buffers
from hpctrain.data.stream.lent_buffers import Borrowed, LentBuffers, Loan


def _lender(size: int = 4096, keep: int = 2) -> LentBuffers:
    lent = LentBuffers(keep)
    lent.note(-1, False, size * 4 // 5)  # a first result seen without a loan: buffers are then sized from it
    return lent


def _write_twice(loan: Loan, pattern: bytes, same: multiprocessing.queues.Queue) -> None:
    borrowed = Borrowed()
    first = borrowed.hold(loan)
    again = borrowed.hold(loan)
    assert first is not None and again is not None
    same.put(first.data_ptr() == again.data_ptr())
    first[: len(pattern)] = torch.frombuffer(bytearray(pattern), dtype=torch.uint8)


def test_a_loan_carries_no_file_descriptor() -> None:
    """Pickled for a worker as DataLoader pickles indices: no descriptor to hand over (which would cost the
    worker a socket connection to this process for every item), only integers."""
    lent = _lender()
    try:
        loan = lent.lend()
        assert loan is not None
        data = bytes(ForkingPickler.dumps(loan))
        assert b"rebuild_storage_fd" not in data and b"DupFd" not in data and b"torch" not in data
        assert len(data) < 200
    finally:
        lent.close()


def test_another_process_writes_the_memory_this_one_reads() -> None:
    lent = _lender()
    ctx = multiprocessing.get_context("fork")
    try:
        loan = lent.lend()
        assert loan is not None and loan.nbytes >= 4000
        same = ctx.Queue()
        child = ctx.Process(target=_write_twice, args=(loan, b"muons!", same))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert same.get(timeout=10) is True  # mapped once, held for the next loan of the same buffer
        view = lent_buffers.returned(loan.slot)
        assert bytes(view[:6]) == b"muons!"
    finally:
        lent.close()


def test_a_buffer_is_lent_again_only_when_no_tensor_refers_to_it() -> None:
    lent = _lender(keep=1)
    try:
        loan = lent.lend()
        assert loan is not None
        assert lent.lend() is None  # out: its result is not back
        kept = torch.from_numpy(lent_buffers.returned(loan.slot))
        lent.note(loan.slot, True, 100)
        assert lent.lend() is None  # back, but a tensor made from it is alive
        del kept
        again = lent.lend()
        assert again is not None and again.slot == loan.slot
    finally:
        lent.close()


def test_a_buffer_is_dropped_only_when_too_small() -> None:
    """A worker that could not map its loan writes into a fresh buffer: the loan's buffer stays; one too
    small for the result is replaced by a bigger one."""
    lent = _lender(keep=1)
    try:
        loan = lent.lend()
        assert loan is not None
        lent_buffers.returned(loan.slot)
        lent.note(loan.slot, False, 100)  # not written into it, though it was big enough
        again = lent.lend()
        assert again is not None and again.slot == loan.slot
        lent_buffers.returned(again.slot)
        lent.note(again.slot, False, 10 * loan.nbytes)  # too small
        bigger = lent.lend()
        assert bigger is not None and bigger.slot != loan.slot and bigger.nbytes >= 10 * loan.nbytes
    finally:
        lent.close()


def test_a_loan_that_cannot_be_mapped_is_no_buffer() -> None:
    lent = _lender()
    try:
        loan = lent.lend()
        assert loan is not None
        gone = Loan(loan.slot, loan.owner, 10_000, loan.inode, loan.nbytes)  # a descriptor the owner lacks
        assert Borrowed().hold(gone) is None
        with open(__file__, "rb") as other:  # a descriptor of another file: its inode is not the buffer's
            assert Borrowed().hold(Loan(loan.slot, loan.owner, other.fileno(), loan.inode, 4096)) is None
        assert Borrowed().hold(loan) is not None
    finally:
        lent.close()


def test_where_buffers_cannot_be_lent_none_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lent_buffers, "can_lend", lambda: False)
    lent = _lender()
    assert lent.lend() is None and lent.keep == 0


def test_memory_files_reach_other_processes_here() -> None:
    """The CI machine and clusters run Linux: lending is on (else every worker result costs fresh pages)."""
    assert lent_buffers.can_lend() == hasattr(os, "memfd_create")


def test_no_memory_file_to_make_is_no_loan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory or descriptors when a buffer is made: the item goes without a loan, nothing fails."""

    def refuse(nbytes: int) -> None:
        raise OSError(24, "Too many open files")

    lent = _lender()
    monkeypatch.setattr(lent_buffers, "_new_slot", refuse)
    assert lent.lend() is None and lent.stats["lent"] == 0
