"""A ragged batch of muon-bundle events and its cutting into micro-batches under a muon cap."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

from hpctrain.workloads.muons import physics


def _tensor(array: np.ndarray, dtype: type) -> torch.Tensor:
    # Batches share the decoded Arrow buffers (read-only, zero copy); nothing writes into them in place.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))


@dataclass
class MuonBatch:
    """B events of one batch; the muons of event i are `muons[offsets[i]:offsets[i+1]]`.

    primaries: (B, 4) float32 [E_GeV, zenith_rad, mass_GeV, depth_m], or normalised when `normalized`
    muons: (sum counts, 3) float32 [E_GeV, x_m, y_m], or normalised when `normalized`
    counts: (B,) int64 muons per event
    offsets: (B + 1,) int64 cumulative counts, offsets[0] == 0
    ids: (B, 2) int64 [primary_major_id, primary_minor_id]
    positions: (B,) int64 position of each event in its epoch's global order (provenance, tests)

    Tensors coming from the loader may share read-only decoded buffers: do not modify them in place.
    """

    primaries: torch.Tensor
    muons: torch.Tensor
    counts: torch.Tensor
    offsets: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    normalized: bool = False

    @classmethod
    def from_numpy(
        cls,
        primaries: np.ndarray,
        muons: np.ndarray,
        counts: np.ndarray,
        ids: np.ndarray | None = None,
        positions: np.ndarray | None = None,
    ) -> MuonBatch:
        counts = np.asarray(counts, dtype=np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        n = len(counts)
        ids = np.zeros((n, 2), dtype=np.int64) if ids is None else ids
        positions = np.arange(n, dtype=np.int64) if positions is None else positions
        return cls(
            _tensor(primaries, np.float32).reshape(n, 4),
            _tensor(muons, np.float32).reshape(-1, 3),
            _tensor(counts, np.int64),
            _tensor(offsets, np.int64),
            _tensor(ids, np.int64).reshape(n, 2),
            _tensor(positions, np.int64),
        )

    @classmethod
    def empty(cls) -> MuonBatch:
        z = np.zeros(0)
        return cls.from_numpy(z.reshape(0, 4), z.reshape(0, 3), z.astype(np.int64))

    @classmethod
    def concat(cls, batches: list[MuonBatch], pinned: bool = False) -> MuonBatch:
        """Events of the batches one after the other (all on the CPU, same normalisation); `pinned`: into
        page-locked memory (a training stream that feeds CUDA: the copy to the GPU is then one asynchronous
        transfer, not a staging copy on the host's time)."""
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        if any(b.muons.dtype != torch.float32 or b.primaries.dtype != torch.float32 for b in batches):
            counts = torch.cat([b.counts for b in batches])
            return cls(
                torch.cat([b.primaries for b in batches]),
                torch.cat([b.muons for b in batches]),
                counts,
                torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0)),
                torch.cat([b.ids for b in batches]),
                torch.cat([b.positions for b in batches]),
                first.normalized,
            )
        # One NumPy-allocated buffer (see `packed`) filled by NumPy: torch.cat's fresh allocations fault in new
        # pages each time, and its parallel copy wakes intra-op threads that compete with loader workers.
        _, out = packed(sum(len(b) for b in batches), sum(b.num_muons for b in batches), pinned=pinned)
        for name in ("primaries", "muons", "counts", "ids", "positions"):
            parts = [getattr(b, name).detach().numpy() for b in batches]
            np.concatenate(parts, out=getattr(out, name).numpy())
        offsets = out.offsets.numpy()
        offsets[0] = 0
        np.cumsum(out.counts.numpy(), out=offsets[1:])
        return replace(out, normalized=first.normalized)

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_muons(self) -> int:
        return int(self.muons.shape[0])

    def event_index(self) -> torch.Tensor:
        """(sum counts,) int64: the event of each muon (on the batch's device)."""
        return torch.repeat_interleave(torch.arange(len(self), device=self.counts.device), self.counts)

    def select(self, start: int, stop: int) -> MuonBatch:
        """The contiguous events [start, stop) (views, no copy)."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return MuonBatch(
            self.primaries[start:stop],
            self.muons[lo:hi],
            self.counts[start:stop],
            self.offsets[start : stop + 1] - lo,
            self.ids[start:stop],
            self.positions[start:stop],
            self.normalized,
        )

    def normalize(self) -> MuonBatch:
        """The same events in normalised units (see physics); a no-op if already normalised."""
        if self.normalized:
            return self
        return replace(
            self,
            primaries=physics.normalize_primaries(self.primaries),
            muons=physics.normalize_muons(self.muons),
            normalized=True,
        )

    def to(self, device: torch.device | str, non_blocking: bool = True) -> MuonBatch:
        """The batch on `device`: one transfer of its buffer when it lies in one (`packed`: every batch joined
        from pieces), else one per tensor."""
        buffer = self.buffer()
        if buffer is not None and buffer.device != torch.device(device):
            moved = from_buffer(buffer.to(device, non_blocking=non_blocking), len(self), self.num_muons)
            return replace(moved, normalized=self.normalized)

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return replace(
            self,
            primaries=move(self.primaries),
            muons=move(self.muons),
            counts=move(self.counts),
            offsets=move(self.offsets),
            ids=move(self.ids),
            positions=move(self.positions),
        )

    def for_networks(self, device: torch.device | str) -> MuonBatch:
        """The batch as the networks take it: on `device`, normalised there (the logarithms are cheap on the
        device and the loader stays at decode speed), every tensor they read in a storage of its own.
        torch.compile takes a storage offset of 0 as a constant and any other as a symbol, and AOTAutograd
        guards on a view's base: counts that lay in a buffer (a joined batch, a worker's piece, a slice) in one
        batch and not in the next compiled a second graph mid-run. The copy is of B int64s."""
        batch = self.to(device).normalize()  # primaries and muons: new tensors unless normalised already
        parts = {
            name: t.clone()
            for name in ("primaries", "muons", "counts")
            if (t := getattr(batch, name))._is_view() or t.storage_offset()
        }
        return replace(batch, **parts) if parts else batch

    def buffer(self) -> torch.Tensor | None:
        """The bytes of the one buffer `packed` laid this batch out in (uint8, a view), or None when its
        tensors lie elsewhere (views cut from a larger result, normalised copies)."""
        n, m = len(self), self.num_muons
        counts = self.counts
        if (
            counts.dtype != torch.int64
            or self.muons.dtype != torch.float32
            or self.primaries.dtype != torch.float32
        ):
            return None
        storage = counts.untyped_storage()
        base = counts.storage_offset() * 8  # byte offset of the buffer's start in the storage
        floats = base + 8 * (5 * n + 1)
        expected = (
            (self.offsets, base + 8 * n),
            (self.ids, base + 8 * (2 * n + 1)),
            (self.positions, base + 8 * (4 * n + 1)),
            (self.primaries, floats),
            (self.muons, floats + 16 * n),
        )
        for tensor, offset in expected:
            if (
                not tensor.is_contiguous()
                or tensor.untyped_storage().data_ptr() != storage.data_ptr()
                or tensor.storage_offset() * tensor.element_size() != offset
            ):
                return None
        if not counts.is_contiguous() or base + packed_size(n, m) > storage.nbytes():
            return None
        whole = torch.empty(0, dtype=torch.uint8, device=counts.device).set_(storage)
        return whole[base : base + packed_size(n, m)]

    def pin_memory(self) -> MuonBatch:
        """Page-locked copies (DataLoader calls this with pin_memory=True; only useful on CUDA)."""
        return replace(
            self,
            primaries=self.primaries.pin_memory(),
            muons=self.muons.pin_memory(),
            counts=self.counts.pin_memory(),
            offsets=self.offsets.pin_memory(),
            ids=self.ids.pin_memory(),
            positions=self.positions.pin_memory(),
        )

    def split_by_muon_cap(self, cap: int) -> list[MuonBatch]:
        return split_by_muon_cap(self, cap)


def packed_size(n_events: int, n_muons: int) -> int:
    """Bytes of the one buffer that holds a batch of `n_events` events and `n_muons` muons (see `packed`)."""
    return 8 * (5 * n_events + 1) + 16 * n_events + 12 * n_muons


def packed(
    n_events: int,
    n_muons: int,
    shared: bool = False,
    buffer: torch.Tensor | None = None,
    pinned: bool = False,
) -> tuple[torch.Tensor, MuonBatch]:
    """A byte buffer (new, in shared memory when `shared`, page-locked when `pinned`, or the start of `buffer`)
    and an unfilled batch whose tensors are views into it.

    One buffer per batch means one allocation, and one file descriptor when a DataLoader worker ships it
    (instead of six, each costing a round trip to the worker). Fill the views in place."""
    nbytes = packed_size(n_events, n_muons)
    if buffer is not None:
        assert buffer.dtype == torch.uint8 and buffer.numel() >= nbytes, "buffer too small"
        buffer = buffer[:nbytes]
    elif shared:
        buffer = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))
    elif pinned:  # torch's caching host allocator: blocks are reused once their transfers are done
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    else:
        # NumPy's allocator reuses freed blocks; torch.empty of a few MB faults in fresh pages every time
        buffer = torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
    return buffer, from_buffer(buffer, n_events, n_muons)


def from_buffer(buffer: torch.Tensor, n_events: int, n_muons: int) -> MuonBatch:
    """The batch whose tensors are views into `buffer` (made by `packed`); int64 parts first, so every part is
    aligned to its element size."""
    n = n_events
    ints = buffer[: 8 * (5 * n + 1)].view(torch.int64)  # counts | offsets | ids | positions
    floats = buffer[8 * (5 * n + 1) : packed_size(n, n_muons)].view(torch.float32)  # primaries | muons
    return MuonBatch(
        primaries=floats[: 4 * n].view(n, 4),
        muons=floats[4 * n :].view(n_muons, 3),
        counts=ints[:n],
        offsets=ints[n : 2 * n + 1],
        ids=ints[2 * n + 1 : 4 * n + 1].view(n, 2),
        positions=ints[4 * n + 1 :],
    )


def cut_points(counts: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """Greedy [start, stop) ranges of contiguous events whose muon totals stay <= cap (cap 0: one range).

    An event with more than `cap` muons alone forms a range (the loader normally removes such events)."""
    n = len(counts)
    if cap <= 0 or n == 0:
        return [(0, n)]
    cum = np.cumsum(counts)  # (B,) muons up to and including each event
    ranges = []
    start = 0
    while start < n:
        before = int(cum[start - 1]) if start else 0
        stop = int(np.searchsorted(cum, before + cap, side="right"))
        stop = max(stop, start + 1)
        ranges.append((start, stop))
        start = stop
    return ranges


def split_by_muon_cap(batch: MuonBatch, cap: int) -> list[MuonBatch]:
    """Micro-batches of whole, contiguous events, each with at most `cap` muons (0 = no cap)."""
    ranges = cut_points(batch.counts.cpu().numpy(), cap)
    if len(ranges) == 1:
        return [batch]
    return [batch.select(a, b) for a, b in ranges]
