"""The :class:`Backend` interface: the device API of the CUDABackend seed.

A backend is bound to one device for its whole life. Arrays it returns live on that device
(CuPy arrays for CUDA, NumPy arrays for the CPU). Kernels are ``@cuda.jit`` kernels; a launch
is validated (:mod:`vedart.backends.dims`) before anything runs and raises KernelLaunchError
for a configuration the device cannot take.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from vedart.backends.dims import LaunchDims, LaunchLimits, launch_dims
from vedart.errors import ConfigError

KERNEL_DTYPE_KINDS = "biufc"  # NumPy dtype kinds that CuPy arrays and Numba kernels both take


class Backend(ABC):
    """A compute device: memory, transfers, kernel compilation and launches."""

    @classmethod
    @abstractmethod
    def check_available(cls) -> bool:
        """Whether this kind of backend can be created here."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The backend's kind: "cuda" or "cpu"."""

    @property
    def is_available(self) -> bool:
        """Whether the backend can run work (always True for a constructed backend: one that
        cannot raises at construction)."""
        return True

    @property
    @abstractmethod
    def device_id(self) -> int:
        """The device ordinal this backend is bound to."""

    @property
    @abstractmethod
    def device_name(self) -> str:
        """The device's name, as the driver (or the operating system) reports it."""

    @property
    @abstractmethod
    def compute_capability(self) -> tuple[int, int]:
        """CUDA compute capability (major, minor); (0, 0) for a device that is not a GPU."""

    @property
    @abstractmethod
    def launch_limits(self) -> LaunchLimits:
        """The largest launch configuration the device accepts."""

    @abstractmethod
    def compile_kernel(self, func: Any, signature: tuple[Any, ...]) -> Any:
        """A kernel for ``func`` (a Python function written as a CUDA kernel, or a
        ``@cuda.jit`` kernel) compiled for ``signature`` (argument types: NumPy dtypes or Numba
        types). With caching enabled the same (function, signature) returns the same kernel."""

    @abstractmethod
    def allocate(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A zero-filled array of ``shape`` and ``dtype`` on the device."""

    @abstractmethod
    def to_device(self, data: np.ndarray) -> Any:
        """A copy of the NumPy array ``data`` on the device (``data`` is never modified)."""

    @abstractmethod
    def to_host(self, data: Any) -> np.ndarray:
        """A NumPy copy of the device array ``data``."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until all work submitted to the device has finished."""

    @abstractmethod
    def get_memory_info(self) -> tuple[int, int]:
        """(free bytes, total bytes) of the device's memory."""

    @abstractmethod
    def launch(self, kernel: Any, dims: LaunchDims, args: Sequence[Any]) -> float:
        """Launch ``kernel`` over ``dims`` (already checked against :attr:`launch_limits`) with
        ``args``; return the seconds this call spent compiling (0.0 once the kernel is compiled
        for these argument types). Asynchronous where the device is."""

    def launch_kernel(self, kernel: Any, grid: Any, block: Any, *args: Any) -> None:
        """Launch ``kernel`` (a ``@cuda.jit`` kernel, or a @gpu_kernel handle: its Numba kernel)
        with an explicit configuration: ``grid`` blocks of ``block`` threads (ints or tuples of 1
        to 3 ints), the arguments as given. Raises KernelLaunchError, before launching, for a
        configuration the device cannot take."""
        kernel = getattr(kernel, "dispatcher", kernel)
        name = getattr(kernel, "__name__", type(kernel).__name__)
        self.launch(kernel, self.launch_limits.check(name, launch_dims(name, grid, block)), args)


def numba_argument_types(signature: Any) -> tuple[Any, ...]:
    """``signature`` (a tuple of NumPy dtypes / scalar types or Numba types) as Numba types;
    ConfigError naming the entry otherwise."""
    from numba.core import types
    from numba.np.numpy_support import from_dtype

    if not isinstance(signature, tuple):
        raise ConfigError(f"signature: got {signature!r}; allowed: a tuple of argument types "
                          f"(NumPy dtypes or Numba types)")
    converted = []
    for entry in signature:
        if isinstance(entry, types.Type):
            converted.append(entry)
            continue
        try:
            dtype = np.dtype(entry)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in KERNEL_DTYPE_KINDS:
            raise ConfigError(f"signature: entry {entry!r} is not a kernel argument type; "
                              f"allowed: bool, int, uint, float or complex NumPy dtypes, or "
                              f"Numba types such as numba.float32[:]")
        converted.append(from_dtype(dtype))
    return tuple(converted)
