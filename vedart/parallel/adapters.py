"""Positional stages (enumerate, zip, take, skip, chunk): they depend on an item's place, so they
run in order on the thread that drives the pipeline, on whole batches.

A failed item counts as one item here (it is numbered, paired, taken, skipped) and keeps its
place; a chunk holding a failed item fails as a whole, with its first failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from vedart.parallel.batch import Batch, ItemFailure, Reader, Stage


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
        # As the builtin zip reads them: no iterable is read past where an earlier one ended,
        # so an error it would raise there is never seen.
        columns, width = [], len(batch)
        for iterator in self._iterators:
            columns.append(self._column(iterator, batch, width))
            width = len(columns[-1])
        if width < len(batch):
            self._ended = True
            batch = batch.slice(0, width)
            self._upstream.close()
        return batch.with_items(list(zip(batch.items, *columns)))

    def _column(self, iterator: Iterable[Any], batch: Batch, width: int) -> list[Any]:
        """Up to ``width`` items of ``iterator``; fewer where it ends or raises (the error is
        kept for the item where it came)."""
        column: list[Any] = []
        try:
            column.extend(islice(iterator, width))
        except Exception as error:
            self._failure = ItemFailure(batch.origins[len(column)], self._label, error)
        return column


class Take(Stage):
    """The first ``count`` items; stops reading (and cancels work ahead) once it has them."""

    def __init__(self, upstream: Reader, count: int) -> None:
        super().__init__(upstream)
        self._remaining = count

    def _next_batch(self, limit: int | None) -> Batch | None:
        if self._remaining == 0:
            return None
        batch = self._upstream.read(self._remaining if limit is None
                                    else min(limit, self._remaining))
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
            skipped = self._upstream.read(self._remaining)
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
