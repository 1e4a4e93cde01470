"""What flows between par_iter stages: batches of items, each item tagged with its source index.

A stage is a :class:`Reader`: the stage after it pulls ``read(limit)`` and gets the next
:class:`Batch` (at most ``limit`` items) or None at the end. Pulling, not pushing, is what makes
pipelines lazy: nothing is read from the source until a terminal asks, and a stage reads only
as far ahead as its bounded window allows.

An item that raised stays in its place as an :class:`ItemFailure`: later stages count it
(``take``, ``enumerate``, ...) but apply no function to it, and the terminal raises it, drops it
or returns it (``collect(errors=...)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from vedart.errors import ParIterError

SOURCE_STAGE = "source"
DEFAULT_READ = 1024  # items per read when the reader names no limit


@dataclass(frozen=True)
class ItemFailure:
    """An item that raised: its source ``index``, the ``stage`` that raised, the exception."""

    index: int
    stage: str
    error: BaseException

    def to_error(self) -> ParIterError:
        """The ParIterError a terminal raises for this item (chain it to ``self.error``)."""
        return ParIterError(
            f"par_iter item {self.index} failed in stage {self.stage}: "
            f"{type(self.error).__name__}: {self.error}", index=self.index, stage=self.stage)


@dataclass
class Batch:
    """Consecutive items of a stage's output.

    ``origins[i]`` is the source index ``items[i]`` came from (a ``range`` while contiguous).
    ``failures`` maps positions whose item failed to their :class:`ItemFailure` (which also sits
    at ``items[position]``); it is empty in the common case, which keeps the fast paths fast.
    """

    items: list[Any]
    origins: Sequence[int]
    failures: dict[int, ItemFailure] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def slice(self, start: int, stop: int) -> Batch:
        failures = {position - start: failure for position, failure in self.failures.items()
                    if start <= position < stop}
        return Batch(self.items[start:stop], self.origins[start:stop], failures)

    def first_failure(self) -> ItemFailure | None:
        return self.failures[min(self.failures)] if self.failures else None

    def __add__(self, other: Batch) -> Batch:
        failures = dict(self.failures)
        failures.update({len(self) + position: failure
                         for position, failure in other.failures.items()})
        return Batch(self.items + other.items, [*self.origins, *other.origins], failures)

    def with_items(self, items: list[Any]) -> Batch:
        """This batch with each non-failed item replaced by ``items[i]`` (same length)."""
        for position, failure in self.failures.items():
            items[position] = failure
        return Batch(items, self.origins, self.failures)


class Reader(ABC):
    """A pipeline stage seen from downstream. Not thread-safe: one consumer pulls."""

    def __init__(self) -> None:
        self._leftover: Batch | None = None

    def read(self, limit: int | None = None) -> Batch | None:
        """The next non-empty batch of at most ``limit`` items (None: any size), or None at
        the end. May raise ParIterError for a failure that ends the stream (e.g. the source)."""
        batch = self._leftover
        self._leftover = None
        while batch is None or not batch.items:
            batch = self._next_batch(limit)
            if batch is None:
                return None
        if limit is not None and len(batch) > limit:
            batch, self._leftover = batch.slice(0, limit), batch.slice(limit, len(batch))
        return batch

    @abstractmethod
    def _next_batch(self, limit: int | None) -> Batch | None:
        """The next batch in order (may be empty, may exceed ``limit``, a hint), or None at
        the end."""

    def close(self) -> None:
        """Stop: cancel work still queued here and upstream. Idempotent."""


class Stage(Reader):
    """A reader that pulls from another one."""

    def __init__(self, upstream: Reader) -> None:
        super().__init__()
        self._upstream = upstream

    def close(self) -> None:
        self._upstream.close()


class SourceReader(Reader):
    """Reads the pipeline's iterable, exactly as many items as asked for.

    When the iterable raises, the items it yielded before are delivered first; the next read
    raises ParIterError naming the index it failed at.
    """

    def __init__(self, iterable: Iterable[Any]) -> None:
        super().__init__()
        self._iterator = iter(iterable)
        self._position = 0
        self._error: BaseException | None = None
        self._ended = False

    def _next_batch(self, limit: int | None) -> Batch | None:
        if self._error is not None:
            raise ItemFailure(self._position, SOURCE_STAGE, self._error).to_error() \
                from self._error
        if self._ended:
            return None
        wanted = DEFAULT_READ if limit is None else limit
        items: list[Any] = []
        try:
            # extend keeps what the iterator yielded before raising, so the index is exact.
            items.extend(islice(self._iterator, wanted))
        except Exception as error:
            self._error = error
        self._ended = len(items) < wanted
        start, self._position = self._position, self._position + len(items)
        return Batch(items, range(start, self._position))
