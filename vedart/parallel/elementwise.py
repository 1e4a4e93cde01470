"""Element-wise stages (map, filter, flat_map) fused into one function over a batch, so a run
of them costs one task per batch rather than one per stage or per item.

An item whose function raises becomes an :class:`ItemFailure` in its place; items that failed
upstream pass through untouched. After a ``flat_map``, each value it produced is an item of its
own: a later stage failing on one of them fails that one alone, as it would were the stages not
fused (a ``take`` between them stops fusion).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from vedart.parallel.batch import Batch, ItemFailure

KINDS = ("map", "filter", "flat_map")


@dataclass(frozen=True)
class Step:
    """One element-wise stage: ``kind`` (map, filter, flat_map), its function, and the label
    errors name it by, e.g. ``"#2 map(parse)"``."""

    kind: str
    function: Callable[[Any], Any]
    label: str


def fuse(steps: Sequence[Step]) -> Callable[[Batch], Batch]:
    """One Batch -> Batch function running ``steps`` in order on each item."""
    if len(steps) == 1 and steps[0].kind == "map":
        return partial(_map_batch, steps[0])
    return partial(_fused_batch, tuple(steps))


def _map_batch(step: Step, batch: Batch) -> Batch:
    """The hot path (a single map over a batch without failures): a plain loop; exceptions
    are caught per item without a per-item ``try`` setup."""
    if batch.failures:
        return _fused_batch((step,), batch)
    function = step.function
    values: list[Any] = []
    append = values.append
    failures: dict[int, ItemFailure] = {}
    remaining = iter(batch.items)
    while True:
        try:
            for item in remaining:
                append(function(item))
            break
        except Exception as error:  # the loop resumes after the failed item
            failure = ItemFailure(batch.origins[len(values)], step.label, error)
            failures[len(values)] = failure
            append(failure)
    return Batch(values, batch.origins, failures)


def _fused_batch(steps: tuple[Step, ...], batch: Batch) -> Batch:
    """``steps`` over ``batch`` one step at a time, each over every value the step before it
    made (failures pass through in their places): item by item, ``filter(...).count()`` over a
    million ints took 14.8x the builtin loop, step by step 3.3x (2 cores, 2026-11-27)."""
    values, origins = batch.items, batch.origins
    failed = bool(batch.failures)
    for step in steps:
        values, origins, failed = _step_over(step, values, origins, failed)
    failures = {position: value for position, value in enumerate(values)
                if type(value) is ItemFailure} if failed else {}
    return Batch(values, origins, failures)


def _step_over(step: Step, values: list[Any], origins: list[int], failed: bool
               ) -> tuple[list[Any], list[int], bool]:
    """``step`` over each of ``values`` (with their ``origins``), in one loop that resumes
    after a value the step fails on (no ``try`` set up per value): the values it made, their
    origins, and whether any of them is a failure (``failed``: whether any of ``values`` is)."""
    function, kind = step.function, step.kind
    produced: list[Any] = []
    made_from: list[int] = [] if kind != "map" else origins
    pairs = iter(zip(values, origins))
    origin = -1
    while True:
        try:
            if kind == "map" and not failed:
                produced.extend(map(function, values))  # the first pass: nothing made yet
            else:
                for value, origin in pairs:
                    if type(value) is ItemFailure:
                        produced.append(value)
                        if kind != "map":
                            made_from.append(origin)
                    elif kind == "map":
                        produced.append(function(value))
                    elif kind == "filter":
                        if function(value):
                            produced.append(value)
                            made_from.append(origin)
                    else:  # flat_map: each of a value's outputs is an item of its own
                        outputs = list(function(value))
                        produced.extend(outputs)
                        made_from.extend([origin] * len(outputs))
            return produced, made_from, failed
        except Exception as error:  # the loop resumes after the failed value
            if kind == "map" and not failed:
                origin = origins[len(produced)]
                pairs = iter(zip(values[len(produced) + 1:], origins[len(produced) + 1:]))
            produced.append(ItemFailure(origin, step.label, error))
            if kind != "map":
                made_from.append(origin)
            failed = True
