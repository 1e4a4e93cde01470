"""Positional stages (enumerate, zip, take, skip, chunk): they depend on an item's place, so they
run in order on the thread that drives the pipeline, on whole batches.

A failed item counts as one item here (it is numbered, paired, taken, skipped) and keeps its
place; a chunk holding a failed item fails as a whole, with its first failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from vedart.parallel.batch import DEFAULT_READ, Batch, ItemFailure, Reader, Stage


class Enumerate(Stage):
    """Items become ``(count, item)`` with count from ``start``."""

    def __init__(self, upstream: Reader, start: int) -> None:
        super().__init__(upstream)
        self._count = start

    def _next_batch(self, limit: int | None) -> Batch | None:
        batch = self._upstream.read(limit)
        if batch is None:
            return None
        counts = range(self._count, self._count + len(batch))
        self._count = counts.stop
        return batch.with_items(list(zip(counts, batch.items)))


class Zip(Stage):
    """Items become ``(item, other_1, ...)``; ends with the shortest. When another iterable
    raises, the pairs before it are delivered and the next read raises ParIterError."""

    def __init__(self, upstream: Reader, others: tuple[Iterable[Any], ...], label: str) -> None:
        super().__init__(upstream)
        self._iterators = [iter(other) for other in others]
        self._label = label
        self._ended = False
        self._failure: ItemFailure | None = None

    def _next_batch(self, limit: int | None) -> Batch | None:
        if self._failure is not None:
            raise self._failure.to_error() from self._failure.error
        if self._ended:
            return None
        batch = self._upstream.read(limit)
        if batch is None:
            return None
        # Row by row, as the builtin zip reads them: no iterable is read past the row where
        # one ended, so an error it would raise later is never seen, and none loses items.
        if not self._iterators:  # the builtin zip of one iterable: each item in a 1-tuple
            return batch.with_items([(item,) for item in batch.items])
        rows: list[tuple[Any, ...]] = []
        try:
            rows.extend(islice(zip(*self._iterators), len(batch)))
        except Exception as error:  # kept for the item of the row where it came
            self._failure = ItemFailure(batch.origins[len(rows)], self._label, error)
        if len(rows) < len(batch):
            self._ended = True
            batch = batch.slice(0, len(rows))
            self._upstream.close()
        return batch.with_items([(item, *row) for item, row in zip(batch.items, rows)])


class Take(Stage):
    """The first ``count`` items; stops reading (and cancels work ahead) once it has them."""

    def __init__(self, upstream: Reader, count: int) -> None:
        super().__init__(upstream)
        self._remaining = count

    def _next_batch(self, limit: int | None) -> Batch | None:
        if self._remaining == 0:
            return None
        # Reads of at most DEFAULT_READ items: take(30_000_000).count() must not hold
        # thirty million items at once.
        batch = self._upstream.read(min(DEFAULT_READ if limit is None else limit,
                                        self._remaining))
        if batch is None:
            self._remaining = 0
            return None
        self._remaining -= len(batch)
        if self._remaining == 0:
            self._upstream.close()
        return batch


class Skip(Stage):
    """All but the first ``count`` items (failed ones among those are dropped too)."""

    def __init__(self, upstream: Reader, count: int) -> None:
        super().__init__(upstream)
        self._remaining = count

    def _next_batch(self, limit: int | None) -> Batch | None:
        while self._remaining:
            skipped = self._upstream.read(min(self._remaining, DEFAULT_READ))
            if skipped is None:
                return None
            self._remaining -= len(skipped)
        return self._upstream.read(limit)


class Chunk(Stage):
    """Items grouped into lists of ``size`` (the last may be shorter); a group's source index is
    its first member's."""

    def __init__(self, upstream: Reader, size: int) -> None:
        super().__init__(upstream)
        self._size = size
        self._partial = Batch([], [])

    def _next_batch(self, limit: int | None) -> Batch | None:
        batch = self._upstream.read(None if limit is None else limit * self._size)
        if batch is None:
            if not self._partial.items:
                return None
            last, self._partial = self._partial, Batch([], [])
            return _groups(last, self._size)
        combined = self._partial + batch
        whole = len(combined) - len(combined) % self._size
        self._partial = combined.slice(whole, len(combined))
        return _groups(combined.slice(0, whole), self._size)


def _groups(batch: Batch, size: int) -> Batch:
    starts = range(0, len(batch), size)
    items: list[Any] = [batch.items[start:start + size] for start in starts]
    failures: dict[int, ItemFailure] = {}
    for position in sorted(batch.failures):
        failures.setdefault(position // size, batch.failures[position])
    for group, failure in failures.items():
        items[group] = failure
    return Batch(items, [batch.origins[start] for start in starts], failures)
