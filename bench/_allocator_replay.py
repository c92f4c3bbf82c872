"""PyTorch's CUDA caching allocator, replayed over a recorded sequence of allocations and frees.

The rules are those of c10/cuda/CUDACachingAllocator.cpp with the default configuration (no
max_split_size_mb, no expandable segments, no garbage-collection threshold) and one stream:

* a request is rounded up to a multiple of 512 bytes;
* requests of at most 1 MiB come from the small pool, whose segments are 2 MiB; larger ones from the
  large pool, whose new segments are 20 MiB for requests under 10 MiB and otherwise the request
  rounded up to 2 MiB;
* a request takes the smallest cached free block of its pool that is large enough (best fit); the
  rest is split off as a free block when it is at least 512 bytes (small pool) or more than 1 MiB
  (large pool), else the whole block is handed out;
* a freed block merges with free neighbours of its segment and stays cached: reserved memory never
  shrinks unless a segment cannot be created, when every wholly free segment is released and the
  request retried (a capacity of None never runs out).

`reserved_peak_bytes` is what torch.cuda.max_memory_reserved reports for the same sequence; the
difference from `allocated_peak_bytes` (block-rounded max_memory_allocated) is the fragmentation
that sizes and order alone produce.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

MIB = 1 << 20
SMALL_REQUEST = MIB
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB
LARGE_THRESHOLD = 10 * MIB
ROUND_LARGE = 2 * MIB
MIN_BLOCK = 512


def rounded(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def segment_size(size: int) -> int:
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < LARGE_THRESHOLD:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class CachingAllocator:
    """Blocks are (segment, offset); each pool keeps its free blocks sorted by (size, segment, offset)."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity = capacity_bytes
        self.reserved = self.reserved_peak = 0
        self.allocated = self.allocated_peak = 0
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._size: dict[tuple[int, int], int] = {}  # every block -> size
        self._is_free: dict[tuple[int, int], bool] = {}
        self._ends: dict[tuple[int, int], int] = {}  # (segment, end offset) of a free block -> its offset
        self._segments: dict[int, tuple[int, bool]] = {}  # segment -> (bytes, small pool?)
        self._next_segment = 0
        self._live: dict[object, tuple[int, int, bool]] = {}

    # -- free-block bookkeeping -------------------------------------------------------------
    def _add_free(self, small: bool, seg: int, off: int, size: int) -> None:
        self._size[(seg, off)] = size
        self._is_free[(seg, off)] = True
        self._ends[(seg, off + size)] = off
        bisect.insort(self._free[small], (size, seg, off))

    def _take_free(self, small: bool, seg: int, off: int) -> int:
        size = self._size[(seg, off)]
        pool = self._free[small]
        del pool[bisect.bisect_left(pool, (size, seg, off))]
        del self._ends[(seg, off + size)]
        self._is_free[(seg, off)] = False
        return size

    # -- segments ---------------------------------------------------------------------------
    def _new_segment(self, nbytes: int, small: bool) -> int | None:
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self._release_free_segments()
            if self.reserved + nbytes > self.capacity:
                return None
        seg = self._next_segment
        self._next_segment += 1
        self._segments[seg] = (nbytes, small)
        self.reserved += nbytes
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self._add_free(small, seg, 0, nbytes)
        return seg

    def _release_free_segments(self) -> None:
        for seg, (nbytes, small) in list(self._segments.items()):
            if self._is_free.get((seg, 0)) and self._size[(seg, 0)] == nbytes:
                self._take_free(small, seg, 0)
                del self._size[(seg, 0)], self._is_free[(seg, 0)], self._segments[seg]
                self.reserved -= nbytes

    # -- the allocator's two calls ----------------------------------------------------------
    def malloc(self, key: object, nbytes: int) -> bool:
        """Allocate `nbytes` for `key`; False when the capacity cannot hold it (an OOM)."""
        size = rounded(nbytes)
        small = size <= SMALL_REQUEST
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            _, seg, off = pool[i]
        else:
            seg = self._new_segment(segment_size(size), small)
            if seg is None:
                return False
            off = 0
        block = self._take_free(small, seg, off)
        rest = block - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_REQUEST):
            self._size[(seg, off)] = size
            self._add_free(small, seg, off + size, rest)
        else:
            size = block
        self._live[key] = (seg, off, small)
        self.allocated += size
        self.allocated_peak = max(self.allocated_peak, self.allocated)
        return True

    def free(self, key: object) -> None:
        seg, off, small = self._live.pop(key)
        size = self._size[(seg, off)]
        self.allocated -= size
        after = (seg, off + size)
        if self._is_free.get(after):
            size += self._take_free(small, *after)
            del self._size[after], self._is_free[after]
        before = self._ends.get((seg, off))
        if before is not None:
            del self._size[(seg, off)], self._is_free[(seg, off)]
            size += self._take_free(small, seg, before)
            off = before
        self._add_free(small, seg, off, size)


def replay(events: Iterable[tuple[str, object, int]], capacity_bytes: int | None = None) -> CachingAllocator:
    """Run ("alloc", key, bytes) / ("free", key, 0) events through a fresh allocator."""
    alloc = CachingAllocator(capacity_bytes)
    for kind, key, nbytes in events:
        if kind == "alloc":
            if not alloc.malloc(key, nbytes):
                raise MemoryError(f"{nbytes} bytes do not fit in {capacity_bytes} (reserved {alloc.reserved})")
        elif kind == "free":
            alloc.free(key)
    return alloc


def least_capacity(events: list[tuple[str, object, int]], step_bytes: int = 1 << 24,
                   free: CachingAllocator | None = None) -> int:
    """The smallest capacity (to `step_bytes`) the sequence runs in without an OOM: between the
    allocated peak and the free-running reserved peak (`free`, the sequence's replay without a
    capacity, replayed here when not given), found by bisection. The allocator frees its wholly free
    segments and retries before failing, as PyTorch's does."""
    free = free or replay(events)
    low, high = free.allocated_peak, free.reserved_peak
    while high - low > step_bytes:
        mid = (low + high) // 2
        try:
            replay(events, mid)
            high = mid
        except MemoryError:
            low = mid
    return high
