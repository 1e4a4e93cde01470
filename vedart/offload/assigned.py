"""What a GPU run changes in the objects and containers among a call's arguments.

The GPU path hands the device clone device copies of a call's arrays, copies of the lists and
dicts that hold arrays (holding device copies), and everything else as it is: objects (a
decorated method's ``self``, a model passed in) and containers without arrays. A run can so
leave the caller's state other than the CPU path leaves it, in two ways: it gives the caller's
own objects and containers device arrays (``self.coef = np.linalg.solve(...)``,
``self.child.coef = ...``, ``log.append(x.sum())``), and its changes to a copied container
(``state["w"] = state["w"] - step``, ``del state["tmp"]``, ``arrays.append(y)``) do not reach
the caller's. vedart leaves what the CPU path leaves:

- after a GPU run succeeds, each attribute or item it bound that still holds what it left is
  converted together with the result, as results are
  (:func:`~vedart.offload.results.results_to_host`: the same types, one host array for one
  device array however many places hold it, objects made in the call given their class back);
  a device copy of the caller's array or container stands for the caller's own (``self.x_ =
  x`` keeps the caller's ``x``), and each copied container the run changed gives the caller's
  its items;
- after a GPU attempt that fails, each attribute or item it bound or removed in the caller's
  own objects and containers, and that is still as it left it, is put back, so that the CPU
  re-run starts from the caller's state; the copies are dropped.

What arrays hold is neither undone nor copied back (in-place writes: see ``writes=``).
Watched are the objects (their ``__dict__``, not ``__slots__``), lists and dicts among the
arguments and those a bound method, a callable object or a ``functools.partial`` holds, and,
``STATE_DEPTH`` levels below these, the objects, lists and dicts inside them (through
attributes, items and tuples), ``STATE_VALUES`` values at most, nearest first; one of more
than ``STATE_VALUES`` items or attributes is not watched. Runs in flight
together (a GPU lane's items, threads) each touch only what still holds the values they left.
"""

from __future__ import annotations

import functools
import itertools
import operator
import types
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from vedart.offload.arguments import CONTAINER_DEPTH

STATE_DEPTH = 3  # self.layers[0].coef: the object, its list, the list's object
STATE_VALUES = 256  # values looked at per call, at most (a big list is not walked through)

# Values that are not such state: values, code and namespaces (their attributes are not the
# call's state), sets (a device array is unhashable) and arrays.
_NOT_STATE = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None), set,
              frozenset, type, types.ModuleType, types.FunctionType,
              types.BuiltinFunctionType, types.MethodType, functools.partial)
_ABSENT = object()


def _attributes(value: Any) -> dict[str, Any] | None:
    try:
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


def _opened(values: Sequence[Any], leaf_type: type) -> list[Any]:
    """Those of ``values`` that may be state (by type: a proxy's ``__class__`` may raise)."""
    return [value for value in values
            if type(value) is not leaf_type and not issubclass(type(value), _NOT_STATE)]


class _Watched:
    """One dict (an object's ``__dict__``, or a dict) or list the run may change: what it
    held before the run (``before``), and what of it the run changed (``left``: per key, the
    value it left, ``_ABSENT`` where it removed one; of a list, the items it left, or None)."""

    __slots__ = ("items", "before", "left", "applied")

    def __init__(self, items: dict[Any, Any] | list[Any]) -> None:
        self.items = items
        self.before: dict[Any, Any] | list[Any] = items.copy()
        self.left: dict[Any, Any] | list[Any] | None = None
        # A copy's caller's container once given the run's items: (container, what it held,
        # what it was given), for a failure after that.
        self.applied: tuple[Any, Any, list[Any]] | None = None

    def changes(self) -> dict[Any, Any] | list[Any] | None:
        items, before = self.items, self.before
        if isinstance(items, list):
            assert isinstance(before, list)
            unchanged = len(items) == len(before) and all(map(operator.is_, items, before))
            return None if unchanged else list(items)
        assert isinstance(before, dict)
        if len(items) == len(before) and items.keys() == before.keys() and \
                all(map(operator.is_, items.values(), before.values())):
            return None  # most are left alone: one pass in C
        changed = {key: value for key, value in items.items()
                   if before.get(key, _ABSENT) is not value}
        changed.update((key, _ABSENT) for key in before if key not in items)
        return changed or None

    def bound(self) -> list[tuple[Any, Any]]:
        """(key or position, value) of each item the run bound: a value it left that is new."""
        left = self.left
        if left is None:
            return []
        if isinstance(left, list):
            kept = {id(item) for item in self.before}
            return [(position, item) for position, item in enumerate(left)
                    if id(item) not in kept]
        return [(key, value) for key, value in left.items() if value is not _ABSENT]

    def holds(self, key: Any, value: Any) -> bool:
        items = self.items
        if isinstance(items, list):
            return key < len(items) and items[key] is value
        return items.get(key, _ABSENT) is value


class ArgumentState:
    """The argument state around one GPU run (see the module doc): made from the values the
    run is given, before it runs; :meth:`launched` once it has run; then :meth:`held` and
    :meth:`bind` after a success, or :meth:`restore` after a failure. False when there is
    nothing to watch."""

    __slots__ = ("_watched", "_launched")

    def __init__(self, values: Sequence[Any], leaf_type: type = type(None)) -> None:
        """``values``: what the run is given (its arguments, their device copies among them,
        and what the function passes on by itself: :func:`bound_arguments`); ``leaf_type``:
        the device array type, never looked into."""
        self._watched: list[_Watched] = []
        self._launched = False
        roots = _opened(values, leaf_type)
        if not roots:  # arrays and numbers only: the commonest call
            return
        queue = deque((value, STATE_DEPTH) for value in roots)
        budget = STATE_VALUES - len(values)  # every value looked at counts, leaves too
        seen: set[int] = set()
        while queue:
            value, depth = queue.popleft()
            kind = type(value)
            if issubclass(kind, tuple):
                inner: Any = value
            else:
                items = value if issubclass(kind, (list, dict)) else _attributes(value)
                if items is None or id(items) in seen:
                    continue
                seen.add(id(items))
                try:  # a long one would cost a copy and a comparison on every call
                    if len(items) > STATE_VALUES:
                        continue
                    self._watched.append(_Watched(items))
                except Exception:  # a container subclass whose copy refuses: not watched
                    continue
                inner = items.values() if isinstance(items, dict) else items
            if depth and budget > 0:
                taken = list(itertools.islice(inner, budget))
                budget -= len(taken)
                queue.extend((item, depth - 1) for item in _opened(taken, leaf_type))

    def __bool__(self) -> bool:
        return bool(self._watched)

    def twins(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              device_args: tuple[Any, ...], device_kwargs: dict[str, Any]) -> dict[int, Any]:
        """``id(copy) -> the caller's value`` for each array and container of the caller's
        ``args`` and ``kwargs`` that the ones the run was given (with arrays converted by
        :func:`~vedart.offload.arguments.map_arrays`) held a copy of in its place when the run
        began (a container is read as it was then; one not watched is not looked into)."""
        before = {id(watched.items): watched.before for watched in self._watched}
        twins: dict[int, Any] = {}

        def pair(host: Any, device: Any, depth: int) -> None:
            if host is device:
                return
            twins[id(device)] = host
            if depth <= 0:
                return
            if isinstance(device, tuple):
                held: Any = device
            else:
                held = before.get(id(device))
                if held is None:
                    return
            if isinstance(held, dict) and isinstance(host, dict):
                for key, item in held.items():
                    if key in host:
                        pair(host[key], item, depth - 1)
            elif isinstance(held, (list, tuple)) and isinstance(host, (list, tuple)) and \
                    len(held) == len(host):
                for host_item, item in zip(host, held, strict=True):
                    pair(host_item, item, depth - 1)

        for position, item in enumerate(device_args):
            pair(args[position], item, CONTAINER_DEPTH)
        for name, item in device_kwargs.items():
            pair(kwargs[name], item, CONTAINER_DEPTH)
        return twins

    def launched(self) -> None:
        """Note what the run left."""
        for watched in self._watched:
            watched.left = watched.changes()
        self._launched = True

    def held(self, twins: dict[int, Any]) -> list[tuple[int, Any, Any]]:
        """(watched index, key or position, value) of each item the run bound that still
        holds the value it left and is not a device copy of the caller's (``twins``,
        :meth:`twins`): the values to convert."""
        return [(index, key, value) for index, watched in enumerate(self._watched)
                for key, value in watched.bound()
                if id(value) not in twins and watched.holds(key, value)]

    def bind(self, held: Sequence[tuple[int, Any, Any]], values: Sequence[Any],
             twins: dict[int, Any]) -> None:
        """Give the caller's state what the run left, ``held`` converted to ``values`` and
        device copies standing for the caller's own (which :meth:`restore` then takes for
        the run's)."""
        converted = {(index, key): value
                     for (index, key, _), value in zip(held, values, strict=True)}

        def host(index: int, key: Any, value: Any) -> Any:
            found = converted.get((index, key), _ABSENT)
            return twins.get(id(value), value) if found is _ABSENT else found

        for index, watched in enumerate(self._watched):
            left = watched.left
            if left is None:
                continue
            caller = twins.get(id(watched.items))
            if caller is None:  # the caller's own: what still holds the run's value
                for key, value in watched.bound():
                    new = host(index, key, value)
                    if new is not value and watched.holds(key, value):
                        watched.items[key] = left[key] = new
                continue
            # A copy the run changed: the caller's container gets its items.
            if isinstance(watched.items, list):
                given = [host(index, position, item)
                         for position, item in enumerate(watched.items)]
                watched.applied = (caller, caller.copy(), given)
                caller[:] = given
            else:
                pairs = [(key, host(index, key, value)) for key, value in watched.items.items()]
                watched.applied = (caller, caller.copy(), [value for _, value in pairs])
                caller.clear()
                caller.update(pairs)

    def restore(self) -> None:
        """Put back each attribute or item the run bound or removed, and that is still as it
        left it (removing those it added), and each caller's container :meth:`bind` gave a
        copy's items: after a failure, also before :meth:`launched` (then every change counts
        as the run's)."""
        for watched in self._watched:
            if watched.applied is not None:
                caller, held_before, given = watched.applied
                now = list(caller.values() if isinstance(caller, dict) else caller)
                if len(now) == len(given) and all(map(operator.is_, now, given)):
                    caller.clear()
                    if isinstance(caller, dict):
                        caller.update(held_before)
                    else:
                        caller.extend(held_before)
                continue
            left = watched.left if self._launched else watched.changes()
            if left is None:
                continue
            items, before = watched.items, watched.before
            if isinstance(items, list):
                if len(items) == len(left) and all(map(operator.is_, items, left)):
                    items[:] = before
                continue
            assert isinstance(before, dict) and isinstance(left, dict)
            for name, value in left.items():
                if items.get(name, _ABSENT) is not value:
                    continue
                held = before.get(name, _ABSENT)
                if held is not _ABSENT:
                    items[name] = held
                elif value is not _ABSENT:
                    del items[name]
