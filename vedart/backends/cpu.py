"""CPUBackend: the Backend API on host memory, kernels run in Numba's CUDA simulator.

Code written against :class:`~vedart.backends.cuda.CUDABackend` runs unchanged here (the seed's
"falls back to CPUBackend"): "device" arrays are NumPy arrays, transfers are copies (so the
caller's arrays are as independent of device arrays as they are on a GPU), and a launched
``@cuda.jit`` kernel runs in the simulator -- correct, and orders of magnitude slower.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import psutil

from vedart.backends.base import Backend, numba_argument_types
from vedart.backends.dims import CUDA_LIMITS, LaunchDims, LaunchLimits
from vedart.backends.simulator import python_function, simulate
from vedart.locks import renew_in_child


class CPUBackend(Backend):
    """The host as a device (ordinal 0). Thread-safe; simulated launches run one at a time."""

    def __init__(self, *, enable_caching: bool = True) -> None:
        self._enable_caching = enable_caching
        self._kernels: dict[tuple[Any, tuple[Any, ...]], Any] = {}
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    @classmethod
    def check_available(cls) -> bool:
        return True

    @property
    def name(self) -> str:
        return "cpu"

    @property
    def device_id(self) -> int:
        return 0

    @property
    def device_name(self) -> str:
        return platform.processor() or platform.machine() or "CPU"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (0, 0)

    @property
    def launch_limits(self) -> LaunchLimits:
        return CUDA_LIMITS

    def compile_kernel(self, func: Any, signature: tuple[Any, ...]) -> Any:
        """A ``@cuda.jit`` kernel for ``func``, left uncompiled: the simulator runs its Python
        function. ``signature`` is validated as on a GPU."""
        from numba import cuda

        key = (python_function(func), numba_argument_types(signature))
        with self._lock:
            kernel = self._kernels.get(key) if self._enable_caching else None
            if kernel is None:
                kernel = cuda.jit(key[0])
                if self._enable_caching:
                    self._kernels[key] = kernel
        return kernel

    def allocate(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def to_device(self, data: np.ndarray) -> np.ndarray:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"to_device: got {type(data).__name__}; allowed: a NumPy ndarray")
        return data.copy()

    def to_host(self, data: Any) -> np.ndarray:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"to_host: got {type(data).__name__}; allowed: a NumPy ndarray "
                            f"(the CPU backend's device arrays)")
        return data.copy()

    def synchronize(self) -> None:
        """Nothing to wait for: CPU work is synchronous."""

    def get_memory_info(self) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def launch(self, kernel: Any, dims: LaunchDims, args: Sequence[Any]) -> float:
        simulate(kernel, dims, args)
        return 0.0
