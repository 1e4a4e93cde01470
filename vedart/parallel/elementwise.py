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
    values: list[Any] = []
    origins: list[int] = []
    failures: dict[int, ItemFailure] = {}
    for position, (item, origin) in enumerate(zip(batch.items, batch.origins)):
        failed = batch.failures.get(position)
        outcome, any_failed = ([failed], True) if failed is not None else \
            _apply(steps, item, origin)
        if any_failed:
            for offset, value in enumerate(outcome):
                if isinstance(value, ItemFailure):
                    failures[len(values) + offset] = value
        values.extend(outcome)
        origins.extend([origin] * len(outcome))
    return Batch(values, origins, failures)


def _apply(steps: tuple[Step, ...], item: Any, origin: int) -> tuple[list[Any], bool]:
    """What ``steps`` make of ``item``: its values, each an item of its own for the next step,
    with an :class:`ItemFailure` in the place of each value a step failed on; and whether any
    step failed."""
    values = [item]
    any_failed = False
    for step in steps:
        values, failed = _apply_each(step, values, origin)
        any_failed = any_failed or failed
    return values, any_failed


def _apply_each(step: Step, values: list[Any], origin: int) -> tuple[list[Any], bool]:
    """``step`` over each of ``values`` apart (failures pass through), in one loop that
    resumes after a value the step fails on (no ``try`` set up per value)."""
    function, kind = step.function, step.kind
    produced: list[Any] = []
    append = produced.append
    failed = False
    remaining = iter(values)
    while True:
        try:
            for value in remaining:
                if type(value) is ItemFailure:
                    append(value)
                elif kind == "map":
                    append(function(value))
                elif kind == "filter":
                    if function(value):
                        append(value)
                else:  # flat_map: all of a value's outputs, or its failure alone
                    produced.extend(list(function(value)))
            return produced, failed
        except Exception as error:  # the loop resumes after the failed value
            append(ItemFailure(origin, step.label, error))
            failed = True
