"""Attributes a GPU run assigns to the objects among a call's arguments.

The GPU path hands a call's arrays to the device clone as device copies, but other objects as
they are: a decorated method's ``self``, a model passed in. So ``self.coef =
np.linalg.solve(...)`` there assigns a device array to the caller's object, where the CPU path
assigns a NumPy array. vedart leaves such objects as the CPU path would: after a GPU run
succeeds, each attribute it assigned (a value other than the one it held before the run) is
converted as results are (:func:`~vedart.offload.results.results_to_host`: the same types,
objects made in the call given their class back); after a GPU attempt that fails, every
attribute is put back as it was before it, so that the CPU re-run starts from the caller's
state. The objects are the call's own arguments, including those a bound method or a
``functools.partial`` holds (not those inside containers or other objects), and their
attributes those in their ``__dict__``, read and written there directly.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import numpy as np

# Arguments that are not such objects: values, containers (their arrays go to the device as
# copies), and code and namespaces (their attributes are not the call's state).
_NOT_OBJECTS = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None), list,
                tuple, dict, set, frozenset, type, types.ModuleType, types.FunctionType,
                types.BuiltinFunctionType, types.MethodType, functools.partial)


def _attributes(value: Any) -> dict[str, Any] | None:
    if isinstance(value, _NOT_OBJECTS):
        return None
    attributes = getattr(value, "__dict__", None)
    return attributes if type(attributes) is dict else None


def bound_arguments(func: Any) -> tuple[Any, ...]:
    """The arguments ``func`` passes on by itself: a bound method's object, a partial's
    arguments (through nested ones)."""
    bound: list[Any] = []
    while isinstance(func, (types.MethodType, functools.partial)):
        if isinstance(func, types.MethodType):
            bound.append(func.__self__)
            func = func.__func__
        else:
            bound += (*func.args, *func.keywords.values())
            func = func.func
    return tuple(bound)


class ArgumentObjects:
    """The attributes of a call's argument objects before a GPU attempt (see the module doc);
    false when the call has no such object."""

    __slots__ = ("_before",)

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 bound: tuple[Any, ...] = ()) -> None:
        """``bound``: what the function passes on by itself (:func:`bound_arguments`)."""
        self._before: list[tuple[dict[str, Any], dict[str, Any]]] = []
        seen: set[int] = set()
        for value in (*bound, *args, *kwargs.values()):
            attributes = _attributes(value)
            if attributes is not None and id(attributes) not in seen:
                seen.add(id(attributes))
                self._before.append((attributes, dict(attributes)))

    def __bool__(self) -> bool:
        return bool(self._before)

    def to_host(self, convert: Callable[[Any], tuple[Any, int]]) -> int:
        """Set each attribute assigned since to ``convert(value)``'s value, where that is
        another object; the bytes ``convert`` moved."""
        moved = 0
        for attributes, before in self._before:
            for name, value in list(attributes.items()):
                if before.get(name, _ABSENT) is not value:
                    converted, nbytes = convert(value)
                    moved += nbytes
                    if converted is not value:
                        attributes[name] = converted
        return moved

    def restore(self) -> None:
        """Put every attribute back as it was (dropping those added since)."""
        for attributes, before in self._before:
            for name in [name for name in attributes if name not in before]:
                del attributes[name]
            attributes.update(before)


_ABSENT = object()
