"""Running a ``@cuda.jit`` kernel in Numba's CUDA simulator, with the real ``numba.cuda`` loaded.

Numba chooses between its driver and its simulator once, from ``NUMBA_ENABLE_CUDASIM`` at the
first ``import numba.cuda`` -- which user code has done before vedart decides anything. The
simulator's kernel machinery (``numba.cuda.simulator.kernel.FakeCUDAKernel``) does not need that
switch: it runs the kernel's Python function once per simulated thread, with the ``cuda`` module
in the function's globals swapped for a fake one. What it lacks, we add here:

* ``@cuda.jit(device=True)`` functions the kernel calls are real dispatchers, which cannot be
  called from Python; while a kernel runs, each one reachable from its globals or closure
  (transitively) is swapped for a simulator stand-in.
* The simulator runs one kernel at a time (it asserts so); a process-wide lock serialises
  launches from many threads.
* A process forked while another thread simulated a kernel inherits the simulator's state of
  that kernel (its swapped globals, its running-kernel marker), which no thread of the child
  will undo: there every launch raises ``GPUUnavailableError`` saying so, instead of waiting
  for ever for the lock or running with that kernel's state. The globals of that kernel's
  module keep the simulator's stand-ins (for ``cuda`` and its device functions) in the child.

Kernels must reach CUDA through the ``numba.cuda`` module object (``cuda.grid(1)``, as Numba's
documentation does); names imported from it (``from numba.cuda import grid``) are not swapped.
Array arguments are NumPy arrays, written in place.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from vedart.backends.dims import LaunchDims
from vedart.errors import GPUUnavailableError
from vedart.locks import renew_in_child

_one_kernel_at_a_time = threading.Lock()
renew_in_child(sys.modules[__name__], "_one_kernel_at_a_time")
_simulating = False  # a kernel is running in the simulator (set holding the lock)
_forked_mid_kernel = False  # this process was forked while a kernel was simulated


def _after_fork_in_child() -> None:
    global _forked_mid_kernel
    _forked_mid_kernel = _forked_mid_kernel or _simulating


os.register_at_fork(after_in_child=_after_fork_in_child)


def python_function(kernel: Any) -> Callable[..., Any]:
    """The Python function behind a Numba kernel (``py_func``), or ``kernel`` itself."""
    return getattr(kernel, "py_func", kernel)


def simulate(kernel: Any, dims: LaunchDims, args: Sequence[Any]) -> None:
    """Run ``kernel`` (a ``@cuda.jit`` dispatcher or its Python function) over ``dims`` in the
    simulator; NumPy array arguments are modified in place, as the kernel writes them."""
    global _simulating
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    # Wrapped as simulator device arrays, NumPy arrays are written in place rather than copied
    # per argument, so an array passed twice is one array, as it is on a GPU.
    wrapped: dict[int, Any] = {}
    for value in args:
        if isinstance(value, np.ndarray) and value.ndim > 0 and id(value) not in wrapped:
            wrapped[id(value)] = FakeCUDAArray(value)
    device_args = [wrapped.get(id(value), value) for value in args]
    function = python_function(kernel)
    with _one_kernel_at_a_time:
        if _forked_mid_kernel:
            raise GPUUnavailableError(
                f"cannot simulate {getattr(function, '__qualname__', function)}: this process "
                "was forked while another thread simulated a kernel, whose state in Numba's "
                "simulator no thread here will undo; fork before launching kernels, or start "
                "child processes with multiprocessing's 'spawn' or 'forkserver'")
        _simulating = True
        try:
            with _simulated_device_functions(function):
                FakeCUDAKernel(function, device=False)[dims.grid, dims.block](*device_args)
        finally:
            _simulating = False


class _Slot:
    """One place a function finds a name: an entry of its globals or a cell of its closure."""

    def __init__(self, namespace: dict[str, Any] | None, key: str, cell: Any = None) -> None:
        self.namespace, self.key, self.cell = namespace, key, cell

    def get(self) -> Any:
        if self.namespace is not None:
            return self.namespace[self.key]
        try:
            return self.cell.cell_contents
        except ValueError:  # an empty cell (a name assigned later in the enclosing function)
            return None

    def set(self, value: Any) -> None:
        if self.namespace is not None:
            self.namespace[self.key] = value
        else:
            self.cell.cell_contents = value


def _slots(function: Callable[..., Any]) -> Iterator[_Slot]:
    namespace = getattr(function, "__globals__", {})
    for name in list(namespace):
        yield _Slot(namespace, name)
    for cell in getattr(function, "__closure__", None) or ():
        yield _Slot(None, "", cell)


def _is_device_function(value: Any) -> bool:
    options = getattr(value, "targetoptions", None)
    return isinstance(options, dict) and bool(options.get("device")) and hasattr(value, "py_func")


@contextmanager
def _simulated_device_functions(kernel_function: Callable[..., Any]) -> Iterator[None]:
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    swapped: list[tuple[_Slot, Any]] = []
    stand_ins: dict[int, Any] = {}
    pending = [kernel_function]
    try:
        while pending:
            for slot in _slots(pending.pop()):
                value = slot.get()
                if not _is_device_function(value):
                    continue
                if id(value) not in stand_ins:
                    stand_ins[id(value)] = FakeCUDAKernel(value.py_func, device=True)
                    pending.append(value.py_func)
                swapped.append((slot, value))
                slot.set(stand_ins[id(value)])
        yield
    finally:
        for slot, original in reversed(swapped):
            slot.set(original)
