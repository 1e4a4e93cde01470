"""What a GPU run changes in the objects and containers among a call's arguments.

The GPU path hands the device clone device copies of a call's arrays, copies of the lists,
dicts and tuples that hold arrays (holding device copies), and everything else as it is:
objects (a decorated method's ``self``, a model passed in) and containers without arrays. A
run can so leave the caller's state other than the CPU path leaves it, in two ways: it gives
the caller's own objects and containers device arrays (``self.coef = np.linalg.solve(...)``,
``self.child.coef = ...``, ``log.append(x.sum())``), and its changes to a copied container
(``state["w"] = state["w"] - step``, ``del state["tmp"]``, ``arrays.append(y)``) do not reach
the caller's. vedart leaves what the CPU path leaves:

- after a GPU run succeeds, each attribute or item it bound that still holds what it left is
  converted as results are, just before the result
  (:func:`~vedart.offload.results.results_to_host`: the same types, one host array for one
  device array however many of these hold it, objects made in the call given their class
  back; the result shares the host arrays of those bound directly);
  the caller's own values stay themselves: a device copy of the caller's array stands for it
  (``self.x_ = x`` keeps the caller's ``x``), and a watched object or container bound
  elsewhere is that same one; each copied dict gives the caller's the keys the run bound or
  removed, each copied list the items it appended (a list changed otherwise: its items);
- after a GPU attempt that fails, each attribute or item it bound or removed in the objects,
  lists and dicts the call was given (among the arguments, or in their lists, dicts and
  tuples), and that is still as it left it, is put back, so that the CPU re-run starts from
  the caller's state (``self.steps += 1`` counts once); the copies are dropped. What objects
  hold through their attributes is converted after a success but not put back after a failure
  (``self.history.append(...)`` on the failed attempt stays): other threads may change an
  object's internals while the run goes on.

What arrays hold is neither undone nor copied back (in-place writes: see ``writes=``).
Watched are the objects (their ``__dict__``, or the slots of one without a ``__dict__``),
lists and dicts the call was given, as deep in its lists, dicts and tuples as the upload
looks for arrays (all of them: the upload walks them anyway), and what those objects hold
through attributes, items and tuples, ``STATE_DEPTH`` steps below them, nearest first,
while the values looked at and the items of what is watched number ``STATE_VALUES`` at most.
Runs in flight together (a GPU lane's items, threads) each touch only what still holds the
values they left (docs/offload.md names the cases this leaves).
"""

from __future__ import annotations

import functools
import itertools
import operator
import types
from collections import deque
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import numpy as np

from vedart.offload.arguments import (
    ANY_DEPTH,
    CONTAINER_DEPTH,
    PLAIN_TYPES,
    Memo,
    WalkInstead,
    slot_names,
)

STATE_DEPTH = 3  # self.a.b.c.coef: three watched below the object (self.layers[0] two)
STATE_VALUES = 256  # values looked at per call, at most (a big list is not walked through)

# Values that are not such state: values, code and namespaces (their attributes are not the
# call's state), sets (a device array is unhashable) and arrays.
_NOT_STATE = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None), set,
              frozenset, type, types.ModuleType, types.FunctionType,
              types.BuiltinFunctionType, types.MethodType, functools.partial)
_ABSENT = object()


def _attributes(value: Any) -> dict[str, Any] | _Slots | None:
    """An object's ``__dict__``, or its slots when it has none, or None."""
    try:
        attributes = vars(value)
    except TypeError:  # no __dict__
        names = slot_names(type(value))
        return _Slots(value, names) if names else None
    except Exception:  # a proxy whose lookups raise: not watched
        return None
    return attributes if type(attributes) is dict else None


class _Slots(MutableMapping[str, Any]):
    """The slots set on an object without a ``__dict__`` (``__slots__``, ``attrs.define``),
    read and written as a dict is, past the class's own ``__setattr__`` as its ``__dict__``
    would be."""

    __slots__ = ("_value", "_names")

    def __init__(self, value: Any, names: list[str]) -> None:
        self._value = value
        self._names = names

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        try:
            return object.__getattribute__(self._value, name)
        except AttributeError:  # a slot never set
            raise KeyError(name) from None

    def __setitem__(self, name: str, value: Any) -> None:
        object.__setattr__(self._value, name, value)

    def __delitem__(self, name: str) -> None:
        object.__delattr__(self._value, name)

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._names if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


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


# Types that never hold state, checked for a whole list at once (a list of numbers is common).
_PLAIN_TYPES = PLAIN_TYPES | {np.ndarray, np.float64, np.float32, np.int64, np.int32, np.bool_}


def _opened(values: Sequence[Any], leaf_type: type) -> list[Any]:
    """Those of ``values`` that may be state (by type: a proxy's ``__class__`` may raise)."""
    try:
        kinds = set(map(type, values))
    except TypeError:  # a metaclass whose classes are unhashable: look at each
        kinds = {object}
    kinds.discard(leaf_type)
    if kinds <= _PLAIN_TYPES:
        return []
    return [value for value in values
            if type(value) is not leaf_type and not issubclass(type(value), _NOT_STATE)]


def _position(items: list[Any], value: Any) -> int:
    """Where ``value`` itself is in ``items`` (searched from the end, where appends go), or
    -1."""
    for position in range(len(items) - 1, -1, -1):
        if items[position] is value:
            return position
    return -1


class _Watched:
    """One object's ``__dict__``, dict or list (``items``, of ``value``) the run may change:
    what it held before the run (``before``), and what of it the run changed (``left``: per
    key, the value it left, ``_ABSENT`` where it removed one; of a list, the items it left;
    None when nothing)."""

    __slots__ = ("value", "items", "given", "before", "left", "undo")

    def __init__(self, value: Any, items: dict[Any, Any] | list[Any], given: bool) -> None:
        """``given``: the call was given it (it is among the arguments, or in their lists,
        dicts and tuples), rather than held by an object's attributes."""
        self.value = value
        self.items = items
        self.given = given
        self.before: dict[Any, Any] | list[Any] = \
            list(items) if isinstance(items, list) else dict(items)
        self.left: dict[Any, Any] | list[Any] | None = None
        # What bind changed in the caller's container a copy stands for, to put back after a
        # failure: (container, key or slice, what it held there, what bind put there).
        self.undo: list[tuple[Any, Any, Any, Any]] = []

    def changes(self) -> dict[Any, Any] | list[Any] | None:
        before = self.before
        if isinstance(before, list):
            items = list(self.items)
            unchanged = len(items) == len(before) and all(map(operator.is_, items, before))
            return None if unchanged else items
        now = dict(self.items)  # one step: another thread may change it meanwhile
        if len(now) == len(before) and now.keys() == before.keys() and \
                all(map(operator.is_, now.values(), before.values())):
            return None  # most are left alone: one pass in C
        changed = {key: value for key, value in now.items()
                   if before.get(key, _ABSENT) is not value}
        changed.update((key, _ABSENT) for key in before if key not in now)
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

    def rebind(self, key: Any, value: Any, new: Any) -> None:
        """Bind ``new`` where ``value`` is (a list: wherever it now is) if it still is."""
        items = self.items
        if isinstance(items, list):
            position = _position(items, value)
            if position < 0:
                return
            items[position] = new
        elif items.get(key, _ABSENT) is value:
            items[key] = new
        else:
            return
        self.left[key] = new  # type: ignore[index]  # what restore takes for the run's

    def holds(self, key: Any, value: Any) -> bool:
        items = self.items
        return _position(items, value) >= 0 if isinstance(items, list) else \
            items.get(key, _ABSENT) is value

    def give(self, caller: dict[Any, Any] | list[Any], host: Callable[[Any, Any], Any]) -> None:
        """Give ``caller``, the container this copy stands for, the run's changes (``host``:
        the caller's value for a key and the value the run left there)."""
        left, before = self.left, self.before
        if isinstance(caller, dict):
            assert isinstance(left, dict)
            for key, value in left.items():
                held = caller.get(key, _ABSENT)
                new = _ABSENT if value is _ABSENT else host(key, value)
                if new is _ABSENT:
                    caller.pop(key, None)
                else:
                    caller[key] = new
                self.undo.append((caller, key, held, new))
            return
        assert isinstance(left, list) and isinstance(caller, list)
        start = len(before)
        if len(left) >= start and all(map(operator.is_, left[:start], before)):
            added = [host(position, item) for position, item in enumerate(left[start:], start)]
            where = slice(len(caller), len(caller) + len(added))
            caller.extend(added)  # appends only: onto the caller's, as another run's may be
            self.undo.append((caller, where, [], added))
        else:
            given = [host(position, item) for position, item in enumerate(left)]
            self.undo.append((caller, slice(None), list(caller), given))
            caller[:] = given

    def put_back(self) -> None:
        """Undo :meth:`give` where the caller's container still holds what it gave, else
        what the run changed in its own ``items`` (a given one's)."""
        if self.undo:
            for caller, where, held, new in reversed(self.undo):
                if isinstance(where, slice):
                    now = caller[where]
                    if len(now) == len(new) and all(map(operator.is_, now, new)):
                        caller[where] = held
                elif caller.get(where, _ABSENT) is new:
                    if held is _ABSENT:
                        del caller[where]
                    else:
                        caller[where] = held
            return
        if not self.given:
            return
        left, items, before = self.left, self.items, self.before
        if isinstance(before, list):
            assert isinstance(items, list)
            now = list(items)
            if len(now) == len(left) and all(map(operator.is_, now, left)):  # type: ignore
                items[:] = before
            else:  # others changed it since: take out what this run added
                for _, value in self.bound():
                    position = _position(items, value)
                    if position >= 0:
                        del items[position]
            return
        assert isinstance(left, dict) and not isinstance(items, list)
        for name, value in left.items():
            if items.get(name, _ABSENT) is not value:
                continue
            held = before.get(name, _ABSENT)
            if held is not _ABSENT:
                items[name] = held
            elif value is not _ABSENT:
                del items[name]


class ArgumentState:
    """The argument state around one GPU run (see the module doc): made from the values the
    run is given, before it runs; :meth:`launched` once it has run; then :meth:`held` and
    :meth:`bind` after a success, or :meth:`restore` after a failure. False when there is
    nothing to watch."""

    __slots__ = ("_watched", "_launched", "_leaf_type", "_stood_in")

    def __init__(self, values: Sequence[Any], leaf_type: type = type(None)) -> None:
        """``values``: what the run is given (its arguments, their device copies among them,
        and what the function passes on by itself: :func:`bound_arguments`); ``leaf_type``:
        the device array type, never looked into."""
        self._watched: list[_Watched] = []
        # (value, what it stands for) of each watched value :meth:`stand_ins` put in a memo
        self._stood_in: list[tuple[Any, Any]] = []
        self._launched = False
        self._leaf_type = leaf_type
        level = _opened(values, leaf_type)
        if not level:  # arrays and numbers only: the commonest call
            return
        seen: set[int] = set()
        objects: deque[tuple[_Watched, int]] = deque()
        # What the call was given: the arguments, and what their lists, dicts and tuples
        # hold as deep as the upload looks (which walked them already): all watched.
        depth = CONTAINER_DEPTH
        while level:
            inner: list[Any] = []
            for value in level:
                kind = type(value)
                if issubclass(kind, tuple):
                    inner += value
                    continue
                container = issubclass(kind, (list, dict))
                watched = self._watch(value, value if container else _attributes(value), True,
                                      seen)
                if watched is None:
                    continue
                if not container:
                    objects.append((watched, STATE_DEPTH))
                elif depth:
                    inner += watched.before.values() if isinstance(watched.before, dict) \
                        else watched.before
            level = _opened(inner, leaf_type) if depth else []
            depth -= 1
        # What those objects hold through their attributes, nearest first: each value looked
        # at and each item of what is watched counts towards STATE_VALUES.
        budget = STATE_VALUES
        while objects and budget > 0:
            holder, depth = objects.popleft()
            before = holder.before
            taken = list(itertools.islice(
                before.values() if isinstance(before, dict) else before, budget))
            budget -= len(taken)
            values = _opened(taken, leaf_type)
            for value in values:
                if issubclass(type(value), tuple):  # what it holds is the object's state
                    inner = list(itertools.islice(tuple.__iter__(value), max(budget, 0)))
                    budget -= len(inner)
                    values += _opened(inner, leaf_type)
                    continue
                container = issubclass(type(value), (list, dict))
                items = value if container else _attributes(value)
                try:
                    if items is None or len(items) > budget:
                        continue  # watching costs a copy and a comparison on every call
                except Exception:  # a container whose length raises: not watched
                    continue
                watched = self._watch(value, items, False, seen)
                if watched is not None:
                    budget -= len(items)
                    if depth > 1:
                        objects.append((watched, depth - 1))

    def _watch(self, value: Any, items: Any, given: bool, seen: set[int]) -> _Watched | None:
        if items is None or id(value) in seen:
            return None
        seen.add(id(value))
        try:
            watched = _Watched(value, items, given)
        except Exception:  # a container subclass that refuses to be read: not watched
            return None
        self._watched.append(watched)
        return watched

    def __bool__(self) -> bool:
        return bool(self._watched)

    def twins(self, args: tuple[Any, ...], kwargs: dict[str, Any],
              device_args: tuple[Any, ...], device_kwargs: dict[str, Any]) -> dict[int, Any]:
        """``id(copy) -> the caller's value`` for each array and list, dict or tuple of the
        caller's ``args`` and ``kwargs`` that the ones the run was given (with arrays
        converted by :func:`~vedart.offload.arguments.map_arrays`) held a copy of in its
        place when the run began (a list or dict read as it was then)."""
        before = self._before()
        twins: dict[int, Any] = {}
        for position, item in enumerate(device_args):
            twins.update((id(copy), host) for host, copy in self._pairs(
                args[position], item, CONTAINER_DEPTH, before))
        for name, item in device_kwargs.items():
            twins.update((id(copy), host) for host, copy in self._pairs(
                kwargs[name], item, CONTAINER_DEPTH, before))
        return twins

    def array_twins(self, host: Any, device: Any) -> list[tuple[np.ndarray, Any]]:
        """(the caller's array, its device copy) for each array in the caller's list, dict
        or tuple ``host`` whose copy ``device`` (the one the run was given) held a copy of
        it in its place when the run began."""
        return [(value, copy) for value, copy in self._pairs(
            host, device, CONTAINER_DEPTH, self._before())
            if type(copy) is self._leaf_type and type(value) is np.ndarray]

    def _pairs(self, host: Any, device: Any, depth: int, before: dict[int, Any]
               ) -> Iterator[tuple[Any, Any]]:
        """(the caller's value, its copy) for ``host`` and what it holds, ``depth`` levels
        deep, and their copies in ``device`` (see :meth:`twins`)."""
        if host is device:
            return
        if type(device) is self._leaf_type:
            yield host, device
            return
        held = device if isinstance(device, tuple) else before.get(id(device))
        if held is None or type(host) is not type(device):
            return  # not a copy of the caller's (another thread rebound it, say)
        yield host, device
        if depth <= 0:
            return
        host_held = before.get(id(host), host)  # as the run began, when the run changed it
        if isinstance(held, dict):
            for key, item in held.items():
                if key in host_held:
                    yield from self._pairs(host_held[key], item, depth - 1, before)
        elif len(held) == len(host_held):
            for host_item, item in zip(host_held, held, strict=True):
                yield from self._pairs(host_item, item, depth - 1, before)

    def _before(self) -> dict[int, Any]:
        """``id(value) -> what it held as the run began`` of each watched list and dict."""
        return {id(watched.value): watched.before for watched in self._watched
                if isinstance(watched.value, (list, dict))}

    def stand_ins(self, twins: dict[int, Any], given: Sequence[Any]) -> Memo:
        """What each watched object, list and dict stands for where the values the run
        bound hold it, as a memo for :func:`~vedart.offload.results.results_to_host`: the
        caller's for a copy of the caller's (``twins``: :meth:`twins`), else itself, whose
        contents :meth:`bind` converts in place; a copy not paired with the caller's
        (``given``: what the caller gave the call, whose lists and dicts, as the run began,
        are the caller's) is left out, converted as results are. Once :meth:`bind` has
        run, :meth:`as_bound` makes it the memo for the result."""
        before = self._before()
        callers: set[int] = set()
        level, depth = _opened(given, self._leaf_type), CONTAINER_DEPTH
        while level and depth >= 0:
            inner: list[Any] = []
            for value in level:
                if isinstance(value, (list, tuple, dict)):
                    callers.add(id(value))
                    # (in one step: another thread may change the caller's dict meanwhile)
                    held = before.get(id(value), value)
                    inner += list(held.values()) if isinstance(held, dict) else held
            level, depth = _opened(inner, self._leaf_type), depth - 1
        memo = Memo()
        for watched in self._watched:
            value = watched.value
            stand_in = twins.get(id(value), value)
            if stand_in is value and watched.given and id(value) not in callers and \
                    isinstance(value, (list, dict)):
                continue
            memo[id(value)] = (value, stand_in, ANY_DEPTH)
            self._stood_in.append((value, stand_in))
        return memo

    def as_bound(self, memo: Memo) -> None:
        """Make ``memo`` (:meth:`stand_ins`, as the conversion of the values the run bound
        left it) the memo for the result, once :meth:`bind` has run: the caller's own
        objects are walked as results are (one still holding a CuPy array comes back as a
        converted copy), and a copy of the caller's list or dict stands for what the
        caller's, walked so after bind, becomes (what the bound values made of the caller's
        one before bind is forgotten)."""
        for value, stand_in in self._stood_in:
            if stand_in is value:
                memo.pop(id(value), None)
                continue
            memo[id(value)] = (value, WalkInstead(stand_in), ANY_DEPTH)
            known = memo.get(id(stand_in))
            if known is not None and known[0] is stand_in:  # met before bind gave it changes
                del memo[id(stand_in)]
        self._stood_in = []

    def launched(self) -> None:
        """Note what the run left."""
        for watched in self._watched:
            watched.left = watched.changes()
        self._launched = True

    def held(self, twins: dict[int, Any]) -> list[tuple[int, Any, Any]]:
        """(watched index, key or position, value) of each item the run bound that still
        holds the value it left, and is neither a copy of the caller's (``twins``:
        :meth:`twins`) nor watched itself (the caller's, converted in place): the values to
        convert."""
        own = {id(watched.value) for watched in self._watched}
        return [(index, key, value) for index, watched in enumerate(self._watched)
                for key, value in watched.bound()
                if id(value) not in twins and id(value) not in own and
                (twins.get(id(watched.value)) is not None or watched.holds(key, value))]

    def bind(self, held: Sequence[tuple[int, Any, Any]], values: Sequence[Any],
             twins: dict[int, Any]) -> None:
        """Give the caller's state what the run left, ``held`` converted to ``values`` and
        copies standing for the caller's own (which :meth:`restore` then takes for the
        run's)."""
        converted = {(index, key): value
                     for (index, key, _), value in zip(held, values, strict=True)}
        for index, watched in enumerate(self._watched):
            if watched.left is None:
                continue

            def host(key: Any, value: Any, index: int = index) -> Any:
                found = converted.get((index, key), _ABSENT)
                return twins.get(id(value), value) if found is _ABSENT else found

            caller = twins.get(id(watched.value))
            if caller is not None:  # a copy the run changed: the caller's gets the changes
                watched.give(caller, host)
                continue
            for key, value in watched.bound():  # the caller's own: where it holds the value
                new = host(key, value)
                if new is not value:
                    watched.rebind(key, value, new)

    def restore(self) -> None:
        """Put back each attribute or item the run bound or removed in what the call was
        given, and that is still as it left it (removing those it added; of a list others
        changed since, the items it added are taken out), and what :meth:`bind` gave the
        caller's containers the copies stand for: after a failure, also before
        :meth:`launched` (then every change counts as the run's). What objects hold through
        their attributes is not put back: other threads may change an object's internals
        (a client's, an executor's) while the run goes on."""
        for watched in self._watched:
            if watched.left is None and not self._launched:
                watched.left = watched.changes()
            if watched.left is None:
                continue
            try:
                watched.put_back()
            except Exception:  # an odd container: the others are put back all the same
                continue
