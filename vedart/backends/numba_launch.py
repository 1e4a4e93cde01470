"""Launching ``@cuda.jit`` kernels on CuPy arrays without Numba's per-call dispatch.

Numba's own launch (``kernel[grid, block](*args)``) types every argument on every call, and
for a CuPy array that means exporting it through DLPack (``StridedMemoryView.from_dlpack``,
with its stream handshake) twice: once to type it, once to marshal it. That is most of the
135 us per launch measured on an H100. This launcher keys each call by what decides the
compiled kernel -- per argument, an array's (dtype, ndim, C/F contiguity) or a scalar's type --
and, per key and device, keeps the compiled kernel, its device function and the Numba types.
A launch with a known key then builds the kernel parameters straight from the CuPy arrays and
calls ``cuda.core.launch``, the same call Numba ends in.

The first call for a key goes through Numba's own launch, so compilation, the on-disk cache
(``@cuda.jit(cache=True)``) and every feature Numba supports behave exactly as in Numba; calls
whose arguments the fast path does not cover (other array types, tuples, records, huge ints)
and kernels it does not cover (debug, cooperative, extensions, launch-configuration-sensitive)
always do. Kernels run on CuPy's current stream, as CuPy's own kernels do.

Depends on Numba internals, checked on first use per key: ``_Kernel._codelibrary``,
``_Kernel._prepare_args`` for scalars, and Numba's array data model (meminfo, parent, nitems,
itemsize, data, shape..., strides... in bytes) for arrays. If building a plan or its first
launch fails for that reason, the key falls back to Numba's own launch and a warning is logged.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vedart._logging import logger
from vedart.backends.dims import Dim3, LaunchDims

_INT64_BOUND = 2**63  # Numba types a Python int as int64 when -2**63 < value < 2**63
_PYTHON_SCALARS = frozenset({bool, float, complex})
_NUMPY_SCALARS = (np.bool_, np.integer, np.floating, np.complexfloating)
_MARSHALLING_FAILURES = (AttributeError, TypeError, ValueError)

ArgumentKey = tuple[Any, ...]


def argument_key(args: Sequence[Any], array_type: type) -> ArgumentKey | None:
    """What decides the compiled kernel for ``args``, or None when some argument is not an
    ``array_type`` array or a bool/int64/float/complex/NumPy scalar (the fast path skips it)."""
    key: list[Any] = []
    for value in args:
        kind = type(value)
        if kind is array_type:
            key.append((value.dtype, value.ndim, value._c_contiguous, value._f_contiguous))
        elif kind in _PYTHON_SCALARS or issubclass(kind, _NUMPY_SCALARS) or (
                kind is int and -_INT64_BOUND < value < _INT64_BOUND):
            key.append(kind)
        else:
            return None
    return tuple(key)


def array_parameters(array: Any) -> tuple[int, ...]:
    """The kernel parameters of one array argument in Numba's array data model."""
    return (0, 0, array.size, array.itemsize, array.data.ptr, *array.shape, *array.strides)


@dataclass
class _FastPlan:
    """Everything a launch with one argument key needs, on one device."""

    kernel: Any                  # numba's compiled _Kernel
    function: Any                # its cuda.core Kernel, loaded on this launcher's device
    types: tuple[Any, ...]       # Numba types of the arguments
    is_array: tuple[bool, ...]
    proven: bool = False         # a fast launch has succeeded


@functools.lru_cache(maxsize=1024)
def _launch_config(grid: Dim3, block: Dim3) -> Any:
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=grid, block=block, shmem_size=0)


class NumbaLauncher:
    """Launches Numba kernels on one CUDA device, taking ``array_type`` (CuPy's ndarray) arrays
    on the fast path. Thread-safe. Callers make the device current (``with
    cupy.cuda.Device(ordinal)``) around :meth:`launch`."""

    def __init__(self, array_type: type) -> None:
        from cuda.core import Stream, launch

        self._array_type = array_type
        self._cuda_launch = launch
        self._stream_from_handle = Stream.from_handle
        # (id(dispatcher), key) -> (dispatcher, plan or None = Numba's own launch). Holding the
        # dispatcher keeps its id from being reused while the entry exists.
        self._plans: dict[tuple[int, ArgumentKey], tuple[Any, _FastPlan | None]] = {}
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def launch(self, dispatcher: Any, dims: LaunchDims, args: Sequence[Any],
               stream_pointer: int) -> float:
        """Launch ``dispatcher`` (a ``@cuda.jit`` kernel) on the stream ``stream_pointer`` (0: the
        default stream); return the seconds spent compiling (or loading from Numba's disk cache)
        in this call."""
        key = argument_key(args, self._array_type)
        if key is None:
            return self._launch_numba(dispatcher, dims, args, stream_pointer)
        entry = self._plans.get((id(dispatcher), key))
        if entry is None:
            seconds = self._launch_numba(dispatcher, dims, args, stream_pointer)
            plan = self._build_plan(dispatcher, args)
            with self._lock:
                self._plans[(id(dispatcher), key)] = (dispatcher, plan)
            return seconds
        plan = entry[1]
        if plan is None:
            return self._launch_numba(dispatcher, dims, args, stream_pointer)
        if plan.proven:
            self._launch_fast(plan, dims, args, stream_pointer)
            return 0.0
        try:
            self._launch_fast(plan, dims, args, stream_pointer)
        except _MARSHALLING_FAILURES as error:
            self._give_up(dispatcher, key, error)
            return self._launch_numba(dispatcher, dims, args, stream_pointer)
        plan.proven = True
        return 0.0

    def _launch_fast(self, plan: _FastPlan, dims: LaunchDims, args: Sequence[Any],
                     stream_pointer: int) -> None:
        parameters: list[Any] = []
        kept_alive: list[Any] = []
        for is_array, numba_type, value in zip(plan.is_array, plan.types, args):
            if is_array:
                parameters.extend(array_parameters(value))
            else:
                plan.kernel._prepare_args(numba_type, value, 0, kept_alive, parameters)
        self._cuda_launch(self._stream(stream_pointer), _launch_config(dims.grid, dims.block),
                          plan.function, *parameters)

    def _launch_numba(self, dispatcher: Any, dims: LaunchDims, args: Sequence[Any],
                      stream_pointer: int) -> float:
        """Numba's own launch; returns its duration when it compiled, else 0.0."""
        compiled_before = len(dispatcher.overloads)
        started = time.perf_counter()
        stream = self._stream(stream_pointer) if stream_pointer else 0
        dispatcher[dims.grid, dims.block, stream](*args)
        elapsed = time.perf_counter() - started
        return elapsed if len(dispatcher.overloads) > compiled_before else 0.0

    def _build_plan(self, dispatcher: Any, args: Sequence[Any]) -> _FastPlan | None:
        from numba.core import types

        if getattr(dispatcher, "_launch_config_sensitive", False):
            return None
        try:
            numba_types = tuple(dispatcher.typeof_pyval(value) for value in args)
            kernel = dispatcher.overloads.get(numba_types)
            if kernel is None:
                if not dispatcher._can_compile:  # eager signatures: Numba converted the arguments
                    return None
                kernel = dispatcher.compile(numba_types)
            if kernel.debug or kernel.cooperative or kernel.extensions or \
                    getattr(kernel, "launch_config_sensitive", False):
                return None
            kernel.bind()
            function = kernel._codelibrary.get_cufunc().kernel
        except AttributeError as error:
            logger.warning("fast kernel launch unavailable for %s (%s); using Numba's launch",
                           getattr(dispatcher, "__name__", dispatcher), error)
            return None
        return _FastPlan(kernel, function, numba_types,
                         tuple(isinstance(t, types.Array) for t in numba_types))

    def _give_up(self, dispatcher: Any, key: ArgumentKey, error: Exception) -> None:
        logger.warning("fast kernel launch of %s failed (%s: %s); using Numba's launch",
                       getattr(dispatcher, "__name__", dispatcher), type(error).__name__, error)
        with self._lock:
            self._plans[(id(dispatcher), key)] = (dispatcher, None)

    def _stream(self, pointer: int) -> Any:
        stream = self._streams.get(pointer)
        if stream is None:
            stream = self._streams.setdefault(pointer, self._stream_from_handle(pointer))
        return stream
