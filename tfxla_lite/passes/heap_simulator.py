"""Packing buffers with known live ranges into memory: the heap simulator.

Buffer assignment decides *which* values may share memory; this module decides *where*
they go, as XLA's `heap_simulator.cc`: `host_in_fixed_buffers` places temporaries in the
caller's output buffers where they fit, and `global_decreasing_size_best_fit` packs the
rest into one arena, keeping the smaller of a spatial and a temporal order. Live ranges
are closed intervals (buffers share bytes only when one ends strictly before the other
begins). It knows nothing of HLO: its tests run on plain numbers. docs/buffers.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True)
class BufferInterval:
    """A buffer of `size` bytes live at positions `start` through `end` (inclusive)."""

    name: str
    size: int
    start: int
    end: int

    def overlaps(self, start: int, end: int) -> bool:
        return not (self.end < start or end < self.start)


@dataclass(frozen=True)
class Chunk:
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class HeapResult:
    chunks: dict[str, Chunk]  # by interval name
    heap_size: int  # the end of the highest chunk
    order: str = "spatial"  # the sort order that won


@dataclass
class FixedBuffer:
    """A buffer placed outside the arena (an output), with the live ranges it holds."""

    name: str
    capacity: int
    busy: list[tuple[int, int]] = field(default_factory=list)

    def admits(self, interval: BufferInterval) -> bool:
        return interval.size <= self.capacity and not any(
            interval.overlaps(start, end) for start, end in self.busy)


def align_up(size: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
    return -(-size // alignment) * alignment


def spatial_order(intervals: Sequence[BufferInterval]) -> list[BufferInterval]:
    """Size descending, then the longer live range, then the earlier buffer."""
    rank = {id(b): n for n, b in enumerate(intervals)}
    return sorted(intervals, key=lambda b: (-b.size, b.start - b.end, rank[id(b)]))


def temporal_order(intervals: Sequence[BufferInterval]) -> list[BufferInterval]:
    """Live range length descending, then size descending, then the earlier buffer."""
    rank = {id(b): n for n, b in enumerate(intervals)}
    return sorted(intervals, key=lambda b: (b.start - b.end, -b.size, rank[id(b)]))


ORDERS: dict[str, Callable[[Sequence[BufferInterval]], list[BufferInterval]]] = {
    "spatial": spatial_order,
    "temporal": temporal_order,
}


def best_fit_offset(size: int, busy: Iterable[Chunk], alignment: int) -> int:
    """The aligned offset of the smallest free gap between `busy` chunks that holds
    `size` bytes; failing that, the aligned end of the highest busy chunk."""
    return _best_fit(size, sorted((c.offset, c.end) for c in busy), alignment)


def _best_fit(size: int, busy: list[tuple[int, int]], alignment: int) -> int:
    """`best_fit_offset` over busy (offset, end) pairs sorted by offset, then end."""
    best_offset, best_gap = None, None
    cursor = 0  # the lowest aligned offset not covered by the chunks seen so far
    for offset, end in busy:
        gap = offset - cursor
        if gap >= size and (best_gap is None or gap < best_gap):
            best_offset, best_gap = cursor, gap
        cursor = max(cursor, align_up(end, alignment))
    return cursor if best_offset is None else best_offset


def pack_in_order(ordered: Iterable[BufferInterval], alignment: int) -> tuple[
        dict[str, Chunk], int]:
    """Place each interval, in the given order, by `best_fit_offset` against the
    chunks already placed whose live ranges overlap its own."""
    # (start, end, offset, offset + size) of each placed interval: plain tuples, since
    # every placement scans all the earlier ones.
    placed: list[tuple[int, int, int, int]] = []
    chunks: dict[str, Chunk] = {}
    heap_size = 0
    for interval in ordered:
        if interval.size == 0:
            chunks[interval.name] = Chunk(0, 0)
            continue
        start, end = interval.start, interval.end
        busy = sorted((offset, top) for other_start, other_end, offset, top in placed
                      if not (other_end < start or end < other_start))
        chunk = Chunk(_best_fit(interval.size, busy, alignment), interval.size)
        placed.append((start, end, chunk.offset, chunk.end))
        chunks[interval.name] = chunk
        heap_size = max(heap_size, chunk.end)
    return chunks, heap_size


def global_decreasing_size_best_fit(intervals: Iterable[BufferInterval],
                                    alignment: int = DEFAULT_ALIGNMENT,
                                    orders: Sequence[str] = ("spatial", "temporal")
                                    ) -> HeapResult:
    """Pack `intervals` into one arena under each of `orders`; keep the smallest
    (the first order listed wins a tie)."""
    intervals = list(intervals)
    names = [b.name for b in intervals]
    if len(set(names)) != len(names):
        raise ValueError("interval names must be distinct")
    if any(b.size < 0 or b.end < b.start for b in intervals):
        raise ValueError("an interval needs size >= 0 and start <= end")
    best: HeapResult | None = None
    for order in orders:
        chunks, heap_size = pack_in_order(ORDERS[order](intervals), alignment)
        if best is None or heap_size < best.heap_size:
            best = HeapResult(chunks, heap_size, order)
    assert best is not None, "no order given"
    return best


def host_in_fixed_buffers(intervals: Iterable[BufferInterval],
                          fixed: Sequence[FixedBuffer]) -> dict[str, str]:
    """Move temporaries into fixed buffers (the outputs) where they fit and overlap
    nothing already there: biggest first (spatial order), each into the smallest
    fixed buffer that admits it (the first listed on a tie). Returns interval name
    -> fixed buffer name; `fixed` records the ranges it took in."""
    hosted: dict[str, str] = {}
    # Smallest first, the order given on a tie (a stable sort): the first buffer that
    # admits an interval is the smallest that does, and the search starts at the first
    # one large enough.
    by_capacity = sorted(fixed, key=lambda f: f.capacity)
    capacities = [f.capacity for f in by_capacity]
    for interval in spatial_order(list(intervals)):
        if interval.size == 0:
            continue
        large_enough = by_capacity[bisect.bisect_left(capacities, interval.size):]
        target = next((f for f in large_enough if f.admits(interval)), None)
        if target is not None:
            target.busy.append((interval.start, interval.end))
            hosted[interval.name] = target.name
    return hosted


def check_packing(intervals: Iterable[BufferInterval], chunks: dict[str, Chunk],
                  alignment: int = DEFAULT_ALIGNMENT) -> None:
    """Raise AssertionError if two intervals live at once share a byte, or an offset
    is not aligned (a plan's invariant, checked by the tests)."""
    placed = [(b, chunks[b.name]) for b in intervals if b.size]
    for b, chunk in placed:
        assert chunk.offset % alignment == 0, f"{b.name} at unaligned offset {chunk.offset}"
        assert chunk.size >= b.size, f"{b.name}: chunk of {chunk.size} < {b.size} bytes"
    for n, (a, chunk_a) in enumerate(placed):
        for b, chunk_b in placed[n + 1:]:
            if a.overlaps(b.start, b.end):
                assert chunk_a.end <= chunk_b.offset or chunk_b.end <= chunk_a.offset, \
                    f"{a.name} {chunk_a} and {b.name} {chunk_b} are live at once and overlap"
