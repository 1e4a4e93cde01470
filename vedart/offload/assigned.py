"""Attributes a GPU run assigns to the objects among a call's arguments.

The GPU path hands a call's arrays to the device clone as device copies, but other objects as
they are: a decorated method's ``self``, a model passed in. So ``self.coef =
np.linalg.solve(...)`` there assigns a device array to the caller's object, where the CPU path
assigns a NumPy array. vedart binds such attributes as the CPU path would: after a GPU run
succeeds, each attribute it assigned (a value other than the one it held before the run) and
still holds is converted together with the result, as results are
(:func:`~vedart.offload.results.results_to_host`: the same types, one host array for one
device array however many attributes and results hold it, objects made in the call given
their class back); after a GPU attempt that fails, each attribute it assigned and still holds
is bound again to what it held before (or removed), so that the CPU re-run starts from the
caller's bindings. What the attributes hold is not undone: ``self.history.append(...)`` on
the failed attempt stays. A run only touches attributes that still hold the values it left,
so runs in flight together (a GPU lane's items, threads) each convert their own.

The objects are the call's own arguments, those a bound method, a callable object or a
``functools.partial`` holds (not those inside containers or other objects), and their
attributes those in their ``__dict__`` (not ``__slots__``), read and written there directly.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

# Arguments that are not such objects: values, containers (their arrays go to the device as
# copies), and code and namespaces (their attributes are not the call's state).
_NOT_OBJECTS = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None), list,
                tuple, dict, set, frozenset, type, types.ModuleType, types.FunctionType,
                types.BuiltinFunctionType, types.MethodType, functools.partial)
_ABSENT = object()


def _attributes(value: Any) -> dict[str, Any] | None:
    try:
        if isinstance(value, _NOT_OBJECTS):
            return None
        attributes = vars(value)
    except Exception:  # no __dict__, or a proxy whose lookups raise: not watched
        return None
    return attributes if type(attributes) is dict else None


def bound_arguments(func: Any) -> tuple[Any, ...]:
    """The arguments ``func`` passes on by itself: a bound method's object, a partial's
    arguments (through nested ones), a callable object itself."""
    bound: list[Any] = []
    while isinstance(func, (types.MethodType, functools.partial)):
        if isinstance(func, types.MethodType):
            bound.append(func.__self__)
            func = func.__func__
        else:
            bound += (*func.args, *func.keywords.values())
            func = func.func
    if not isinstance(func, (types.FunctionType, types.BuiltinFunctionType, type)):
        bound.append(func)  # a callable object: its attributes are its state
    return tuple(bound)


class ArgumentObjects:
    """The argument objects' attributes around one GPU run (see the module doc): made before
    the run, :meth:`launched` once it has run, then :meth:`held` and :meth:`bind` after a
    success or :meth:`restore` after a failure. False when the call has no such object."""

    __slots__ = ("_before", "_assigned")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 bound: tuple[Any, ...] = ()) -> None:
        """``bound``: what the function passes on by itself (:func:`bound_arguments`)."""
        self._before: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (__dict__, copy)
        self._assigned: list[dict[str, Any]] | None = None  # per object of _before
        seen: set[int] = set()
        for value in (*bound, *args, *kwargs.values()):
            attributes = _attributes(value)
            if attributes is not None and id(attributes) not in seen:
                seen.add(id(attributes))
                self._before.append((attributes, dict(attributes)))

    def __bool__(self) -> bool:
        return bool(self._before)

    def _changed(self) -> list[dict[str, Any]]:
        """Per object, each attribute bound or unbound since the snapshot, with its value now
        (``_ABSENT``: deleted)."""
        changed = []
        for attributes, before in self._before:
            now = dict(attributes)
            bound = {name: value for name, value in now.items()
                     if before.get(name, _ABSENT) is not value}
            bound.update((name, _ABSENT) for name in before if name not in now)
            changed.append(bound)
        return changed

    def launched(self) -> None:
        """Note the values the run left: the attributes it assigned."""
        self._assigned = self._changed()

    def held(self) -> list[tuple[int, str, Any]]:
        """(object's index, name, value) of each attribute the run assigned that still holds
        the value it left."""
        assert self._assigned is not None, "launched() first"
        return [(index, name, value) for index, ((attributes, _), assigned) in
                enumerate(zip(self._before, self._assigned, strict=True))
                for name, value in assigned.items()
                if value is not _ABSENT and attributes.get(name, _ABSENT) is value]

    def bind(self, held: Sequence[tuple[int, str, Any]], values: Sequence[Any]) -> None:
        """Bind each of ``held`` still holding its value to the matching one of ``values``
        (which :meth:`restore` then takes for the run's own)."""
        assert self._assigned is not None, "launched() first"
        for (index, name, value), converted in zip(held, values, strict=True):
            attributes, assigned = self._before[index][0], self._assigned[index]
            if converted is not value and attributes.get(name, _ABSENT) is value:
                attributes[name] = assigned[name] = converted

    def restore(self) -> None:
        """Bind each attribute the run bound or deleted, and that is still as it left it, to
        what it held before (removing those it added): after a failure, also before
        :meth:`launched` (then every attribute that changed counts as the run's)."""
        assigned = self._assigned if self._assigned is not None else self._changed()
        for (attributes, before), now in zip(self._before, assigned, strict=True):
            for name, value in now.items():
                if attributes.get(name, _ABSENT) is not value:
                    continue
                held = before.get(name, _ABSENT)
                if held is not _ABSENT:
                    attributes[name] = held
                elif value is not _ABSENT:
                    del attributes[name]
