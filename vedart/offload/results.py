"""Device results to host objects, as NumPy would have returned them.

- CuPy arrays become NumPy arrays. Arrays whose device memory overlaps (``return x, x[::2]``,
  ``return a, a``) come back as views of one host copy of the overlapping range, so they share
  memory on the host as they did on the device; the same array twice is the same host array.
- A result that is a ``writes=`` argument (``return out``) is the caller's own array; a view of
  one is a view of the caller's array when both sides have the same layout.
- 0-d CuPy arrays (CuPy's reductions return them where NumPy returns scalars) become the NumPy
  scalar (``x.sum()`` -> ``numpy.float64``), except those NumPy also returns as 0-d arrays: a
  0-d argument, an array made by one of the NumPy functions in ``ARRAY_MAKERS``
  (``np.array(2.0)``, ``np.zeros(())``, ``np.where(c, a, b)``), and the result of one in
  ``ARRAY_KEEPERS`` (``np.reshape(m, ())``) given an array (not a 0-d array NumPy would have
  had as a scalar), recorded while the function ran (:data:`made_recording`).
- Integer results carry NumPy's own type for their dtype (``numpy.int64``; CuPy's
  ``argmax`` gives ``numpy.longlong`` dtypes).
- Tuples, lists, dicts, namedtuples, dataclass objects and SimpleNamespaces are rebuilt around
  converted items (a shallow copy with converted fields); so are objects of the device classes
  substitution makes of a user's classes, which get their own class back (``type(model) is
  LinearModel``). A container or object held in two places comes back as one converted
  copy held in both, when it is met first no deeper than later (a memo: see ``memo``).
- Functions and device classes the call hands back compute with NumPy after it: a device
  clone of a helper, method or class is the helper, method or class itself; a function the
  call defined (a closure, a lambda) gets its module's globals back, and the values its
  defaults and closure hold are converted as results are.
- Every other value is returned unchanged, and :func:`unconverted_paths` names the device
  arrays left inside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from vedart.gpu import transfer
from vedart.offload.arguments import (
    ANY_DEPTH,
    Memo,
    is_record,
    map_arrays,
    record_fields,
)

# Results are walked deeper than arguments: functions return nested structures more often.
RESULT_DEPTH = 8
# NumPy functions whose 0-d results NumPy returns as 0-d arrays, not scalars.
ARRAY_MAKERS = frozenset({
    "array", "asarray", "asanyarray", "copy", "zeros", "ones", "empty", "full", "zeros_like",
    "ones_like", "empty_like", "full_like", "where", "broadcast_to"})
# NumPy functions whose 0-d result is a 0-d array when their first argument is an array, and a
# scalar when it is a scalar (``np.reshape(x.sum(), ())``).
ARRAY_KEEPERS = frozenset({"transpose", "reshape", "squeeze", "real", "imag", "moveaxis"})
# How far and how much unconverted_paths looks into what results_to_host leaves alone.
_UNCONVERTED_DEPTH = 16
_UNCONVERTED_VISITS = 10_000
# Values unconverted_paths never looks into (what results_to_host makes of a device array
# is one of them).
HOST_LEAVES = (np.ndarray, np.generic, int, float, complex, str, bytes, type(None))

# While set to a list (on this thread or task), :func:`note_made_array` keeps there the 0-d
# arrays it sees: the 0-d results that stay arrays on the host. A GPU call sets it around the
# device function (``token = made_recording.set([])``, then ``made_recording.reset(token)``): a
# context manager would add two Python calls to every GPU call.
made_recording: ContextVar[list[Any] | None] = ContextVar("vedart_made_arrays", default=None)


def note_made_array(value: Any) -> Any:
    """``value``, kept as a made array when it is 0-d and a recording is active."""
    made = made_recording.get()
    if made is not None and getattr(value, "ndim", None) == 0:
        made.append(value)
    return value


def is_array_to_numpy(value: Any) -> bool:
    """Whether NumPy would have ``value`` as an array rather than a scalar: anything but a
    0-d array that is not a made array (while a recording is active), or a NumPy scalar."""
    if getattr(value, "ndim", None) != 0:
        return True
    made = made_recording.get()
    return made is not None and any(value is array for array in made)


_CANONICAL: dict[np.dtype[Any], np.dtype[Any]] = {}


def _numpys_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype NumPy gives its own results of this kind (``q`` -> ``l`` on Linux: the same
    int64, but scalars of type ``numpy.int64`` rather than ``numpy.longlong``)."""
    canonical = _CANONICAL.get(dtype)
    if canonical is None:
        canonical = np.dtype(dtype.str) if dtype.kind in "iu" else dtype
        _CANONICAL[dtype] = canonical
    return canonical


def _span(array: Any) -> tuple[int, int]:
    """The device addresses ``[low, high)`` that ``array``'s elements occupy."""
    low = high = int(array.data.ptr)
    for extent, stride in zip(array.shape, array.strides):
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + array.itemsize


def _within(array: Any, known: Mapping[int, tuple[Any, np.ndarray]]) -> bool:
    """Whether ``array``'s elements lie in those of one of the ``known`` device arrays."""
    low, high = _span(array)
    for device, _ in known.values():
        if device.size:
            device_low, device_high = _span(device)
            if device_low <= low and high <= device_high:
                return True
    return False


def _view(array: Any, host_buffer: np.ndarray, offset: int) -> np.ndarray:
    """A host array laid out as the device ``array``, whose first element sits ``offset``
    bytes into the flat, contiguous ``host_buffer``."""
    return np.ndarray(array.shape, _numpys_dtype(array.dtype), buffer=host_buffer,
                      offset=offset, strides=array.strides)


def _copy_to_host(array: Any, copy: Callable[[Any], np.ndarray]) -> np.ndarray:
    host = copy(array)
    canonical = _CANONICAL.get(host.dtype)  # found inline: every GPU call's result comes here
    if canonical is None:
        canonical = _numpys_dtype(host.dtype)
    return host if canonical is host.dtype else host.view(canonical)


def _as_bytes(host: np.ndarray) -> np.ndarray | None:
    """A flat uint8 view of a contiguous host array, or None when it is not contiguous."""
    if not (host.flags.c_contiguous or host.flags.f_contiguous):
        return None
    return host.reshape(-1, order="A").view(np.uint8)


def _hosts(arrays: Sequence[Any], device_type: type,
           known: Mapping[int, tuple[Any, np.ndarray]], copy: Callable[[Any], np.ndarray]
           ) -> tuple[dict[int, np.ndarray], int]:
    """Host arrays for the distinct device ``arrays`` (by id), and the bytes moved. ``known``:
    ``id(device array) -> (device array, its host array)`` of arrays that have one already
    (``writes=`` arguments, arrays converted earlier), which those arrays get, and whose views
    get views of it when both sides are laid out alike."""
    hosts: dict[int, np.ndarray] = {}
    anchors = []  # known arrays whose host and device bytes are laid out alike
    for device, host in known.values():
        host_bytes = _as_bytes(host)
        if host_bytes is not None and host.dtype == device.dtype and \
                host.strides == device.strides and device.size:
            anchors.append((_span(device), host_bytes))
    pending = []
    for array in arrays:
        if id(array) in known:
            hosts[id(array)] = known[id(array)][1]
            continue
        if array.size:
            low, high = _span(array)
            for (anchor_low, anchor_high), host_bytes in anchors:
                if anchor_low <= low and high <= anchor_high:
                    hosts[id(array)] = _view(array, host_bytes,
                                             int(array.data.ptr) - anchor_low)
                    break
            else:
                pending.append(((low, high), array))
        else:
            hosts[id(array)] = _copy_to_host(array, copy)
    moved = 0
    pending.sort(key=lambda item: item[0][0])
    index = 0
    while index < len(pending):  # groups of arrays whose spans overlap, in address order
        (low, high), first = pending[index]
        group = [first]
        index += 1
        while index < len(pending) and pending[index][0][0] < high:
            high = max(high, pending[index][0][1])
            group.append(pending[index][1])
            index += 1
        if len(group) == 1:
            hosts[id(first)] = _copy_to_host(first, copy)
            moved += first.nbytes
            continue
        span = device_type((high - low,), dtype=np.uint8,
                           memptr=first.data + (low - int(first.data.ptr)))
        host_bytes = copy(span)
        moved += high - low
        for array in group:
            hosts[id(array)] = _view(array, host_bytes, int(array.data.ptr) - low)
    return hosts, moved


def results_to_host(value: Any, device_type: type, *, made_arrays: Sequence[Any] = (),
                    writes: Mapping[int, tuple[Any, np.ndarray]] | None = None,
                    copy: Callable[[Any], np.ndarray] = transfer.to_host,
                    memo: Memo | None = None, depth: int = RESULT_DEPTH) -> tuple[Any, int]:
    """``value`` with every ``device_type`` array converted as the module docstring says, and
    the bytes moved. ``made_arrays``: 0-d device arrays that stay arrays; ``writes``: the
    ``writes=`` arguments, ``id(device array) -> (device array, caller's array)``, whose data
    the caller's arrays receive after this (views of them are made now, filled then);
    ``copy``: makes the host copy of one device array (a transfer engine's ``to_host``);
    ``memo``: :class:`~vedart.offload.arguments.Memo` (one is made when None), to share
    with another call converting values that may hold the same containers and arrays
    (what a call bound, then its result), so that each comes back once: its containers,
    records and functions as :func:`~vedart.offload.arguments.map_arrays` says, and its
    arrays as the host arrays an earlier call made (views of them as views); ``depth``: how
    many levels of containers to open (one more for a tuple of values to convert as
    results each). With a ``memo`` given, objects of device classes met unchanged get
    their host class when the caller calls its ``give_host_classes`` (after the last call
    sharing it); else before this returns."""
    writes = writes or {}
    known = writes
    if memo:
        known = {**{key: (device, host) for key, (device, host, _) in memo.items()
                    if type(device) is device_type}, **writes}
    if type(value) is device_type and id(value) not in known and not (  # the common case
            known and value.size and _within(value, known)):  # (out[1:]: the anchors below)
        host = _copy_to_host(value, copy)
        kept = host.ndim == 0 and bool(made_arrays) and any(value is array
                                                             for array in made_arrays)
        return (host[()] if host.ndim == 0 and not kept else host), value.nbytes
    shared = memo is not None
    memo = Memo() if memo is None else memo
    found: dict[int, Any] = {}
    # (What the memo holds comes back as it says: the walk does not look into it either.)
    map_arrays(value, device_type, lambda array: found.setdefault(id(array), array),
               depth, records=True, rebuild=False, memo=Memo(memo))
    if not found:  # a walk still gives objects of device classes their host class back
        result = map_arrays(value, device_type, lambda array: array, depth, records=True,
                            memo=memo)
        if not shared:
            memo.give_host_classes()
        return result, 0
    hosts, moved = _hosts(list(found.values()), device_type, known, copy)
    kept = {id(array) for array in made_arrays} | writes.keys()
    if shared:  # for the next call: the same device array is the same host array
        for key, array in found.items():
            memo[key] = (array, hosts[key], ANY_DEPTH)

    def convert(array: Any) -> Any:
        nonlocal moved
        host = hosts.get(id(array))
        if host is None:  # another thread put it in a shared container since the first walk
            host = hosts[id(array)] = _copy_to_host(array, copy)
            moved += array.nbytes
            if shared:
                memo[id(array)] = (array, host, ANY_DEPTH)
        return host[()] if host.ndim == 0 and id(array) not in kept else host

    result = map_arrays(value, device_type, convert, depth, records=True, memo=memo)
    if not shared:
        memo.give_host_classes()
    return result, moved


def unconverted_paths(value: Any, device_type: type, name: str = "result") -> list[str]:
    """Where ``device_type`` arrays sit in ``value`` (``"result.model[0]"``): inside objects
    :func:`results_to_host` does not rebuild, or deeper than it looks. Looks through
    containers, sets, records and object attributes, ``_UNCONVERTED_DEPTH`` levels and
    ``_UNCONVERTED_VISITS`` values at most."""
    if isinstance(value, HOST_LEAVES):
        return []
    found: list[str] = []
    seen: set[int] = set()

    def visit(item: Any, path: str, depth: int) -> None:
        if isinstance(item, device_type):
            found.append(path)
            return
        if depth == 0 or len(seen) >= _UNCONVERTED_VISITS or id(item) in seen or \
                isinstance(item, HOST_LEAVES):
            return
        seen.add(id(item))
        if isinstance(item, dict):
            for key, inner in list(item.items()):
                visit(inner, f"{path}[{key!r}]", depth - 1)
        elif isinstance(item, (list, tuple)):
            for index, inner in enumerate(item):
                visit(inner, f"{path}[{index}]", depth - 1)
        elif isinstance(item, (set, frozenset)):
            for inner in item:
                visit(inner, f"{path}{{{type(inner).__name__}}}", depth - 1)
        elif is_record(item):
            for field_name, inner in record_fields(item).items():
                visit(inner, f"{path}.{field_name}", depth - 1)
        else:
            attributes = getattr(item, "__dict__", None)
            if isinstance(attributes, dict):
                for field_name, inner in list(attributes.items()):
                    visit(inner, f"{path}.{field_name}", depth - 1)

    visit(value, name, _UNCONVERTED_DEPTH)
    return found


def to_host(value: Any) -> Any:
    """Convert the CuPy arrays in ``value`` (e.g. from ``@gpu(returns="device")``) to host
    types as a @gpu call would; ``value`` is returned unchanged when CuPy is not loaded."""
    cupy = sys.modules.get("cupy")
    return value if cupy is None else results_to_host(value, cupy.ndarray)[0]
