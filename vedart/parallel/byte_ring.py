"""A first-in first-out allocator over one fixed byte range (a worker process's shared input
ring): spans are handed out in order and released in the same order, because a worker
returns its results in the order it was sent the items they came from."""

from __future__ import annotations

from collections import deque

ALIGN = 64  # every span starts on a cache line (and on any dtype's alignment)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ALIGN`` (at least one ``ALIGN``)."""
    return max(-(-nbytes // ALIGN) * ALIGN, ALIGN)


class ByteRing:
    """Spans of ``[0, capacity)``: :meth:`allocate` takes the next free span after the newest
    one (wrapping to 0 when the end is too near), :meth:`release` frees the oldest. Not
    thread-safe: the owner locks."""

    def __init__(self, capacity: int) -> None:
        if capacity < ALIGN:
            raise ValueError(f"capacity: got {capacity}; allowed: at least {ALIGN} bytes")
        self.capacity = capacity
        self._spans: deque[tuple[int, int]] = deque()  # (start, end) of spans in use, oldest first

    def fits(self, nbytes: int) -> bool:
        """Whether a span of ``nbytes`` could ever be allocated (the ring empty)."""
        return aligned(nbytes) <= self.capacity

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a span of ``nbytes`` (aligned), or None until older spans are
        released; ValueError when it could never fit."""
        size = aligned(nbytes)
        if size > self.capacity:
            raise ValueError(f"nbytes: got {nbytes}; allowed: at most {self.capacity} "
                             "(the ring's capacity)")
        if not self._spans:
            start = 0
        else:
            oldest, newest_end = self._spans[0][0], self._spans[-1][1]
            if newest_end > oldest:  # in use: [oldest, newest_end); free after it, then before
                if newest_end + size <= self.capacity:
                    start = newest_end
                elif size <= oldest:
                    start = 0
                else:
                    return None
            elif newest_end + size <= oldest:  # wrapped: free between the newest and oldest
                start = newest_end
            else:
                return None
        self._spans.append((start, start + size))
        return start

    def release(self) -> None:
        """Free the oldest span."""
        self._spans.popleft()

    @property
    def in_use(self) -> int:
        """Spans allocated and not yet released."""
        return len(self._spans)
