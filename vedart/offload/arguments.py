"""Finding arrays in call arguments, and rebuilding arguments with arrays converted.

Arrays are found in positional and keyword arguments and inside lists, tuples (namedtuples
included) and dicts, nested up to ``CONTAINER_DEPTH`` levels below the argument (``f([A, B])``
and ``f({"x": (A,)})`` are seen; an array three containers deep is not, and stays on the host).
Scanning is linear in the number of container elements.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

CONTAINER_DEPTH = 2
_CONTAINERS = (list, tuple, dict)


def _values(container: Any) -> Any:
    return container.values() if type(container) is dict else container


ON_DEVICE = 1 << 62  # host_bytes' answer when a device array is present: above any threshold
_ndarray = np.ndarray  # bound once: the fast path reads it per argument


def host_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], device_type: type) -> int:
    """Bytes of the host ndarrays in the arguments, or ``ON_DEVICE`` if any is a device array.

    The @gpu fast path calls this on every call, so it allocates nothing and returns an int.
    """
    total = 0
    for value in args:
        kind = type(value)
        if kind is _ndarray:
            total += value.nbytes
        elif kind is device_type:
            return ON_DEVICE
        elif kind in _CONTAINERS or isinstance(value, _ndarray):
            total += value_bytes(value, device_type)
    if kwargs:
        total += value_bytes(kwargs, device_type, CONTAINER_DEPTH + 1)
    return total


def value_bytes(value: Any, device_type: type, depth: int = CONTAINER_DEPTH) -> int:
    """Bytes of the host ndarrays in one argument value (``ON_DEVICE`` or more if it holds a
    device array), opening at most ``depth`` container levels."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if type(value) is device_type:
        return ON_DEVICE
    if depth == 0 or not isinstance(value, _CONTAINERS):
        return 0
    return sum(value_bytes(item, device_type, depth - 1) for item in _values(value))


def iter_arrays(value: Any, array_type: type, depth: int) -> Iterator[Any]:
    """Every ``array_type`` object in ``value``, opening at most ``depth`` container levels
    (pass ``CONTAINER_DEPTH + 1`` for the args tuple or kwargs dict, which are a level too)."""
    if isinstance(value, array_type):
        yield value
    elif depth > 0 and isinstance(value, _CONTAINERS):
        for item in _values(value):
            yield from iter_arrays(item, array_type, depth - 1)


def map_arrays(value: Any, array_type: type, convert: Callable[[Any], Any],
               depth: int) -> Any:
    """``value`` with every ``array_type`` object replaced by ``convert(object)``, opening at
    most ``depth`` levels of lists, tuples, namedtuples and dicts; other values are kept as they are
    (containers without arrays are returned as the same object)."""
    if isinstance(value, array_type):
        return convert(value)
    if depth <= 0 or not isinstance(value, _CONTAINERS) or not value:
        return value
    if type(value) is dict or isinstance(value, dict):
        items = {key: map_arrays(item, array_type, convert, depth - 1)
                 for key, item in value.items()}
        if all(map(operator.is_, items.values(), value.values())):
            return value
        if type(value) is dict:
            return items
        # A subclass may not take its items as its one argument (a defaultdict takes its
        # factory): a shallow copy keeps what it carries, then gets the converted items.
        rebuilt = copy.copy(value)
        rebuilt.update(items)
        return rebuilt
    converted = [map_arrays(item, array_type, convert, depth - 1) for item in value]
    if all(map(operator.is_, converted, value)):
        return value
    if isinstance(value, list):
        if type(value) is list:
            return converted
        rebuilt = copy.copy(value)
        rebuilt[:] = converted
        return rebuilt
    if hasattr(value, "_fields"):  # namedtuple
        return type(value)(*converted)
    return tuple(converted) if type(value) is tuple else type(value)(converted)


_SIGNATURE_PARTS: dict[tuple[np.dtype[Any], int], str] = {}  # (dtype, ndim) -> "<f4:2"
_SIGNATURE_PARTS_KEPT = 1024  # string dtypes of many lengths must not grow it without bound


def signature_of(arrays: list[np.ndarray]) -> str:
    """The arrays' dtypes and ranks, e.g. ``"<f4:2,<f8:1"``. (Each part is formatted once per
    process: a GPU call computes this, and formatting took a few microseconds.)"""
    parts = []
    for array in arrays:
        key = (array.dtype, array.ndim)
        part = _SIGNATURE_PARTS.get(key)
        if part is None:
            part = f"{array.dtype.str}:{array.ndim}"
            if len(_SIGNATURE_PARTS) < _SIGNATURE_PARTS_KEPT:
                _SIGNATURE_PARTS[key] = part
        parts.append(part)
    return ",".join(parts)


@dataclass
class ArgumentFacts:
    """What the cost model needs to know about one call's arguments (slow path only)."""

    host_bytes: int = 0
    host_arrays: list[np.ndarray] = field(default_factory=list)
    device_ordinals: list[int] = field(default_factory=list)

    @cached_property
    def signature(self) -> str:
        """:func:`signature_of` the host arrays (computed once: the adaptive model reads it
        when deciding and again when learning)."""
        return signature_of(self.host_arrays)


def scan(args: tuple[Any, ...], kwargs: dict[str, Any], device_type: type) -> ArgumentFacts:
    """Collect host arrays (with their bytes) and the devices of device arrays, in one pass."""
    facts = ArgumentFacts()
    _collect(args, device_type, CONTAINER_DEPTH + 1, facts)
    if kwargs:
        _collect(kwargs, device_type, CONTAINER_DEPTH + 1, facts)
    return facts


def _collect(value: Any, device_type: type, depth: int, facts: ArgumentFacts) -> None:
    if isinstance(value, np.ndarray):
        facts.host_arrays.append(value)
        facts.host_bytes += value.nbytes
    elif isinstance(value, device_type):
        facts.device_ordinals.append(int(value.device.id))
    elif depth > 0 and isinstance(value, _CONTAINERS):
        for item in _values(value):
            _collect(item, device_type, depth - 1, facts)
