"""Finding arrays in call arguments, and rebuilding arguments with arrays converted.

Arrays are found in positional and keyword arguments and inside lists, tuples (namedtuples
included) and dicts, nested up to ``CONTAINER_DEPTH`` levels below the argument (``f([A, B])``
and ``f({"x": (A,)})`` are seen; an array three containers deep is not, and stays on the host).
Scanning is linear in the number of container elements. Numbers passed directly as arguments
(``int`` and ``float``, NumPy's included, not ``bool``) are recorded by their log2 magnitude,
because they often size the work (``monte_carlo_pi(n)``): the adaptive model learns
``f(100)`` and ``f(10**7)`` apart.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

CONTAINER_DEPTH = 2
_CONTAINERS = (list, tuple, dict)
# Types whose values hold no array and pickle as plain data.
PLAIN_TYPES = frozenset({int, float, complex, bool, str, bytes, type(None)})


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


# Set on the device class :mod:`vedart.offload.substitute` makes of a user's class: the class
# it stands for, which its objects get back when they leave a @gpu call.
HOST_CLASS = "__vedart_host_class__"


def is_record(value: Any) -> bool:
    """Whether ``value`` is a dataclass object, a ``types.SimpleNamespace`` or an object of a
    device class (made during a @gpu call): objects holding named values, which results are
    converted inside."""
    return type(value) is types.SimpleNamespace or hasattr(type(value), HOST_CLASS) or \
        (dataclasses.is_dataclass(value) and not isinstance(value, type))


def record_fields(record: Any) -> dict[str, Any]:
    """The named values of a record (see :func:`is_record`)."""
    if type(record) is types.SimpleNamespace:
        return dict(vars(record))
    if hasattr(type(record), HOST_CLASS):
        return _attributes(record)
    return {item.name: getattr(record, item.name) for item in dataclasses.fields(record)}


def _attributes(value: Any) -> dict[str, Any]:
    """The attributes an object holds: its ``__dict__`` and the slots its classes declare that
    are set (``__slots__ = ("coef",)`` leaves an object no ``__dict__``)."""
    found = dict(getattr(value, "__dict__", {}))
    for name in slot_names(type(value)):
        try:
            found[name] = getattr(value, name)
        except AttributeError:  # a slot never set
            pass
    return found


def slot_names(kind: type) -> list[str]:
    """The attribute names of the slots ``kind`` and its bases declare (private ones as
    stored, mangled)."""
    names = []
    for klass in kind.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):  # stored mangled
                name = f"_{klass.__name__.lstrip('_')}{name}"
            names.append(name)
    return names


class DeviceGlobals(dict):  # type: ignore[type-arg]
    """The globals of a function that runs with the device namespace (a clone
    :mod:`vedart.offload.substitute` makes, and every function its code defines, which gets
    the same globals). ``host_globals``: the function's module's own globals; ``origin``: the
    host function cloned. A subclass sets both."""

    host_globals: dict[str, Any]
    origin: types.FunctionType | None


def to_host_class(record: Any) -> Any:
    """``record``, an object of a device class given back its host class (in place); an
    object of a class derived from a device class in the call keeps its class."""
    host = vars(type(record)).get(HOST_CLASS)
    if host is not None:
        record.__class__ = host
    return record


# A memo entry's depth for what always stands (ArgumentState.stand_ins).
ANY_DEPTH = 1 << 30


class Memo(dict):  # type: ignore[type-arg]
    """:func:`map_arrays`' memo: ``id(value) -> (value, what it became, the depth it was
    walked from)``, with ``_WALKING`` in place of what it became while it is walked, or a
    :class:`WalkInstead` for a value that becomes what another becomes. Made on
    first use (most walks need neither): ``fills``, per value being walked, what to fill
    with what it becomes (new closure cells and defaults of functions it holds, which refer
    to it); ``switched``, the objects of device classes met unchanged, given their host
    class by :meth:`give_host_classes` once the walk is over (before, a walk meeting one
    again would no longer see a record in it)."""

    def fill_later(self, value: Any, fill: Callable[[Any], None]) -> None:
        """Call ``fill`` with what ``value``, being walked, becomes."""
        self.__dict__.setdefault("fills", {}).setdefault(id(value), []).append(fill)

    def switch_later(self, record: Any) -> None:
        """Give ``record`` its host class in :meth:`give_host_classes`."""
        self.__dict__.setdefault("switched", []).append(record)

    def give_host_classes(self) -> None:
        """Give the objects met unchanged their host class, in place."""
        for record in self.__dict__.pop("switched", ()):
            to_host_class(record)


_WALKING = object()  # what a memo entry holds for what its value becomes while it is walked


class WalkInstead:
    """What a memo entry can hold for what its value becomes: ``value`` walked in its place
    (the caller's list or dict a device copy of it stands for, once given the copy's
    changes: what it becomes then)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _walked_now(memo: Memo | None, value: Any) -> bool:
    """Whether ``value`` is being walked (a walk of what holds it is under way)."""
    known = None if memo is None else memo.get(id(value))
    return known is not None and known[0] is value and known[1] is _WALKING


def map_arrays(value: Any, array_type: type, convert: Callable[[Any], Any],
               depth: int, *, records: bool = False, rebuild: bool = True,
               memo: Memo | None = None) -> Any:
    """``value`` with every ``array_type`` instance replaced by ``convert(instance)``, opening at
    most ``depth`` levels of lists, tuples, namedtuples and dicts (and, with ``records``,
    dataclass objects, SimpleNamespaces and objects of device classes, rebuilt as a shallow
    copy with the converted fields set, an object of a device class given its host class, as
    is a device class itself, and functions and methods as :func:`_host_code` says); other
    values are kept as they are (containers without arrays are returned as the same object).
    ``rebuild=False`` only walks: ``convert`` sees every array, and what comes back is
    ``value``. With a ``memo`` (:class:`Memo`, which may be passed to several calls while
    the values they walk stay alive) a container, record, function or closure cell met
    again, no deeper than it was walked before, becomes what it became then, so two places
    holding one list hold one converted list (met deeper, it is walked again: a second
    copy, converted as deep); a function inside a container or record that refers to the
    container through a closure cell or a default gets what the container becomes. Two
    walks with equal memos, one with ``rebuild=False``, meet the same arrays."""
    if isinstance(value, array_type):
        return convert(value)
    if memo is not None:
        known = memo.get(id(value))
        if known is not None and known[0] is value:
            if type(known[1]) is WalkInstead:
                return map_arrays(known[1].value, array_type, convert, depth, records=records,
                                  rebuild=rebuild, memo=memo)
            if known[2] >= depth and known[1] is not _WALKING:
                return known[1]
    if depth <= 0:
        return value
    record = records and is_record(value)
    if not record and (not isinstance(value, _CONTAINERS) or not value):
        if records and type(value) in _CODE_TYPES:
            return _host_code(value, array_type, convert, depth, rebuild, memo)
        if records and rebuild and isinstance(value, type):
            return vars(value).get(HOST_CLASS, value)  # a device class: its host class
        return value
    if memo is None:
        return _map_record(value, array_type, convert, depth, rebuild, memo) if record else \
            _map_container(value, array_type, convert, depth, records, rebuild, memo)
    key = id(value)
    before = memo.get(key)  # (a value that holds itself is walked again inside its walk)
    memo[key] = (value, _WALKING, depth)
    became = _map_record(value, array_type, convert, depth, rebuild, memo) if record else \
        _map_container(value, array_type, convert, depth, records, rebuild, memo)
    if before is not None and before[0] is value and before[1] is _WALKING:
        memo[key] = before  # an outer walk of it goes on
        return became
    memo[key] = (value, became, depth)
    fills = memo.__dict__.get("fills")
    if fills:
        for fill in fills.pop(key, ()):
            fill(became)
    return became


def _map_container(value: Any, array_type: type, convert: Callable[[Any], Any], depth: int,
                   records: bool, rebuild: bool, memo: Memo | None) -> Any:
    """A non-empty list, tuple or dict for :func:`map_arrays`."""
    if type(value) is dict or isinstance(value, dict):
        items = {key: map_arrays(item, array_type, convert, depth - 1, records=records,
                                 rebuild=rebuild, memo=memo)
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
    converted = [convert(item) if isinstance(item, array_type) else
                 map_arrays(item, array_type, convert, depth - 1, records=records,
                            rebuild=rebuild, memo=memo)
                 if records or depth > 1 and isinstance(item, _CONTAINERS) else item
                 for item in value]
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


def _remember(memo: Memo | None, value: Any, became: Any, depth: int) -> Any:
    """``became``, noted in ``memo`` (when given) as what ``value`` became from ``depth``."""
    if memo is not None:
        memo[id(value)] = (value, became, depth)
    return became


def _map_record(value: Any, array_type: type, convert: Callable[[Any], Any], depth: int,
                rebuild: bool, memo: Memo | None) -> Any:
    """A record (:func:`is_record`) for :func:`map_arrays`: a shallow copy holding its
    converted fields when one changed, else the record itself, given its host class (with
    a memo, once the walk is over: :meth:`Memo.switch_later`)."""
    fields = record_fields(value)
    converted_fields = {name: map_arrays(item, array_type, convert, depth - 1, records=True,
                                         rebuild=rebuild, memo=memo)
                        for name, item in fields.items()}
    if all(map(operator.is_, converted_fields.values(), fields.values())):
        if rebuild and memo is not None:
            memo.switch_later(value)
        elif rebuild:
            to_host_class(value)
        return value
    rebuilt = copy.copy(value)
    for name, item in converted_fields.items():
        object.__setattr__(rebuilt, name, item)  # a frozen dataclass too
    return to_host_class(rebuilt) if rebuild else rebuilt


_CODE_TYPES = (types.FunctionType, types.MethodType)


def _host_code(value: Any, array_type: type, convert: Callable[[Any], Any], depth: int,
               rebuild: bool, memo: Memo | None) -> Any:
    """A function or bound method (:func:`map_arrays` with ``records``) as the host has it: a
    device clone is the host function it clones; a function the device code defined (a
    lambda, a closure it returns) is the same code over its module's own globals, with its
    defaults, attributes and closure converted (into new cells: the device function keeps
    its own; functions sharing a cell share its new cell when one memo covers both; the
    cloned function's own cells, its caller's variables, are shared as they are); a method
    is bound to its object converted. Other functions are returned as they are."""
    def mapped(item: Any) -> Any:
        return map_arrays(item, array_type, convert, depth - 1, records=True, rebuild=rebuild,
                          memo=memo)

    if type(value) is types.MethodType:
        function, owner = mapped(value.__func__), mapped(value.__self__)
        if function is not value.__func__ or owner is not value.__self__:
            return _remember(memo, value, types.MethodType(function, owner), depth)
        return _remember(memo, value, value, depth)
    device_globals = value.__globals__
    if not isinstance(device_globals, DeviceGlobals):
        return value
    origin = device_globals.origin
    if origin is not None and value.__code__ is origin.__code__:
        return origin if rebuild else value
    outer = () if origin is None else origin.__closure__ or ()
    cells, fresh = [], []  # its closure as the host function has it; (cell, new cell) to fill
    for cell in value.__closure__ or ():
        made = None if memo is None else memo.get(id(cell))
        if made is not None and made[0] is cell and made[2] >= depth:
            cells.append(made[1])
        elif any(cell is shared for shared in outer):
            cells.append(cell)
        else:
            new_cell = _remember(memo, cell, types.CellType() if rebuild else cell, depth)
            fresh.append((cell, new_cell))
            cells.append(new_cell)
    host = value
    if rebuild:
        host = types.FunctionType(value.__code__, device_globals.host_globals, value.__name__,
                                  None, value.__closure__ and tuple(cells))
    _remember(memo, value, host, depth)  # before what it holds: functions calling each other

    def held(item: Any, fill: Callable[[Any], None]) -> Any:
        """What ``item`` (a default or a cell's value) becomes; a container or record being
        walked (one holding this function) is left as it is, to be filled in by ``fill``
        with what it becomes."""
        if not _walked_now(memo, item):
            return host if item is value else mapped(item)  # (a recursive function)
        if rebuild:
            assert memo is not None
            memo.fill_later(item, fill)
        return item

    if value.__defaults__:
        defaults = list(value.__defaults__)
        for index, item in enumerate(defaults):
            def fill_default(became: Any, index: int = index) -> None:
                host.__defaults__ = (*host.__defaults__[:index], became,
                                     *host.__defaults__[index + 1:])
            defaults[index] = held(item, fill_default)
        if rebuild:
            host.__defaults__ = tuple(defaults)
    if value.__kwdefaults__:
        kwdefaults = dict(value.__kwdefaults__)
        for name, item in kwdefaults.items():
            def fill_kwdefault(became: Any, name: str = name) -> None:
                host.__kwdefaults__[name] = became
            kwdefaults[name] = held(item, fill_kwdefault)
        if rebuild:
            host.__kwdefaults__ = kwdefaults
    attributes = mapped(value.__dict__)
    for cell, new_cell in fresh:
        try:
            content = cell.cell_contents
        except ValueError:  # a variable not bound yet
            continue
        converted = held(content, functools.partial(setattr, new_cell, "cell_contents"))
        if rebuild:
            new_cell.cell_contents = converted
    if rebuild:
        host.__qualname__ = value.__qualname__
        host.__module__ = value.__module__
        host.__doc__ = value.__doc__
        host.__annotations__ = dict(value.__annotations__)
        host.__dict__.update(attributes)
    return host


_SIGNATURE_PARTS: dict[tuple[np.dtype[Any], int], str] = {}  # (dtype, ndim) -> "<f4:2"
_SIGNATURE_PARTS_KEPT = 1024  # string dtypes of many lengths must not grow it without bound
_SCALAR_PARTS: dict[tuple[tuple[str, int], ...], str] = {}  # ((name, log2), ...) -> ";n~2^9"


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


_NUMBERS = (int, float, np.integer, np.floating)


# Magnitudes above this count as this: no call's work grows with a number that large, and a
# work size of 2**1100 overflowed the cost model's floats (``f(2**1100)`` raised, then every
# call of ``f`` did).
MAGNITUDE_MOST = 64


def magnitude(value: Any) -> int | None:
    """``floor(log2(|value|))`` (0 below 2, at most ``MAGNITUDE_MOST``) of a number that may
    size work, else None (bools, durations, non-finite floats, anything not an int or
    float)."""
    if not isinstance(value, _NUMBERS) or isinstance(value, (bool, np.bool_, np.timedelta64)):
        return None  # (a timedelta64 is an np.integer that int() does not take)
    if isinstance(value, (int, np.integer)):
        return min(max(abs(int(value)).bit_length() - 1, 0), MAGNITUDE_MOST)
    value = float(value)
    if not math.isfinite(value):
        return None
    return min(max(math.frexp(abs(value))[1] - 1, 0), MAGNITUDE_MOST)


class ArgumentFacts:
    """What the cost model needs to know about one call's arguments (slow path only):
    ``host_bytes`` of the ``host_arrays``, the ``device_ordinals`` of device arrays, and
    ``scalars``, (parameter name, log2 magnitude) of each number passed directly. (A plain
    class: every call past the fast path makes one, and a dataclass's generated ``__init__``
    with its default factories, and ``cached_property``, cost about a microsecond more.)"""

    __slots__ = ("host_bytes", "host_arrays", "device_ordinals", "scalars", "_signature")

    def __init__(self) -> None:
        self.host_bytes = 0
        self.host_arrays: list[np.ndarray] = []
        self.device_ordinals: list[int] = []
        self.scalars: list[tuple[str, int]] = []
        self._signature: str | None = None

    @property
    def signature(self) -> str:
        """:func:`signature_of` the host arrays, then ``;name~2^k`` parts for the scalars in
        the order of their names (``f(rows=4096, cols=64)`` and ``f(cols=64, rows=4096)`` are
        one bucket; computed once: the adaptive model reads it when deciding and again when
        learning)."""
        signature = self._signature
        if signature is None:
            signature = signature_of(self.host_arrays) if self.host_arrays else ""
            if self.scalars:
                scalars = tuple(self.scalars) if len(self.scalars) == 1 else \
                    tuple(sorted(self.scalars))
                part = _SCALAR_PARTS.get(scalars)
                if part is None:
                    part = ";" + ",".join(f"{name}~2^{bits}" for name, bits in scalars)
                    if len(_SCALAR_PARTS) < _SIGNATURE_PARTS_KEPT:
                        _SCALAR_PARTS[scalars] = part
                signature += part
            self._signature = signature
        return signature


def scan(args: tuple[Any, ...], kwargs: dict[str, Any], device_type: type,
         names: tuple[str, ...] = ()) -> ArgumentFacts:
    """Collect host arrays (with their bytes), the devices of device arrays and the numbers
    passed directly (named by ``names``, the positional parameters' names, else by position),
    in one pass."""
    facts = ArgumentFacts()
    for position, value in enumerate(args):
        # The commonest arguments inline: every call past the fast path scans.
        kind = type(value)
        if kind is _ndarray:
            facts.host_arrays.append(value)
            facts.host_bytes += value.nbytes
        elif kind is int:
            facts.scalars.append((names[position] if position < len(names) else f"arg{position}",
                                  min(max(abs(value).bit_length() - 1, 0), MAGNITUDE_MOST)))
        elif not _scalar(facts, names[position] if position < len(names) else f"arg{position}",
                         value):
            _collect(value, device_type, CONTAINER_DEPTH, facts)
    for name, value in kwargs.items():
        if not _scalar(facts, name, value):
            _collect(value, device_type, CONTAINER_DEPTH, facts)
    return facts


class _Unkeyed:
    """The key part of an argument no key can stand for (a container may hold arrays)."""

    def __repr__(self) -> str:
        return "UNKEYED"


UNKEYED = _Unkeyed()
_MAY_HOLD_ARRAYS = (np.ndarray, *_CONTAINERS)  # an ndarray subclass, or what scan opens


def key_part(value: Any) -> Any:
    """``value``'s part of a call key (:func:`call_key`): (dtype, ndim) of an ndarray, the bit
    length of an int, (-3, binary exponent) of a finite float and -4 of another float,
    ``UNKEYED`` for what :func:`scan` looks into (ndarray subclasses, containers), (-9, type,
    magnitude) of other numbers (NumPy's, int subclasses), and the type of anything else
    (``self``, ``None``, a dtype, a device array: what a scan records nothing of, or whose
    calls are never settled on the CPU). Parts of different kinds never compare equal: a
    dtype is only ever compared with a dtype, an int or a type, and equals none of them (it
    would equal ``float``, ``np.float64`` or ``"f8"``, which stand in tuples after a tag)."""
    kind = type(value)
    if kind is _ndarray:
        return (value.dtype, value.ndim)
    if kind is int:
        return value.bit_length()
    if kind is float:
        return (-3, math.frexp(value)[1]) if value - value == 0.0 else -4  # inf, nan: no size
    if isinstance(value, _MAY_HOLD_ARRAYS):
        return UNKEYED
    bits = magnitude(value)
    return kind if bits is None else (-9, kind, bits)


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A key two calls share only if :func:`scan` gives them the same signature and size
    bucket, unless it holds ``UNKEYED`` (then it stands for nothing); finer than that
    (positions, keyword order, exact bit lengths and the types of other arguments count):
    the key parts of the arguments, their keywords, and the bit length of the ndarrays'
    bytes. (@gpu's wrapper builds the same parts inline for a function's named
    parameters.)"""
    nbytes = 0
    for value in (*args, *kwargs.values()) if kwargs else args:
        if type(value) is _ndarray:
            nbytes += value.nbytes
    return (*map(key_part, args), *map(key_part, kwargs.values()), tuple(kwargs),
            nbytes.bit_length())


def keyed(key: tuple[Any, ...]) -> bool:
    """Whether ``key`` stands for a signature and size bucket (holds no ``UNKEYED``)."""
    return not any(part is UNKEYED for part in key)


def _scalar(facts: ArgumentFacts, name: str, value: Any) -> bool:
    """Record ``value`` as a scalar argument if it is a number; whether it was."""
    if type(value) is np.ndarray:
        return False
    bits = magnitude(value)
    if bits is None:
        return False
    facts.scalars.append((name, bits))
    return True


def _collect(value: Any, device_type: type, depth: int, facts: ArgumentFacts) -> None:
    if isinstance(value, np.ndarray):
        facts.host_arrays.append(value)
        facts.host_bytes += value.nbytes
    elif isinstance(value, device_type):
        facts.device_ordinals.append(int(value.device.id))
    elif depth > 0 and isinstance(value, _CONTAINERS):
        for item in _values(value):
            _collect(item, device_type, depth - 1, facts)
