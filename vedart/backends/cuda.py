"""CUDABackend: one CUDA device through CuPy (memory, transfers) and Numba (kernels).

Device facts come from the runtime's discovery (:class:`vedart.gpu.devices.CudaProbe`), host
<-> device copies from :mod:`vedart.gpu.transfer`, and launches from
:class:`~vedart.backends.numba_launch.NumbaLauncher`: the one device code path @gpu_kernel uses
too. Every method works on this backend's device whatever device is current in the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from vedart._logging import logger
from vedart.backends.base import Backend, numba_argument_types
from vedart.backends.dims import LaunchDims, LaunchLimits
from vedart.backends.numba_launch import NumbaLauncher
from vedart.backends.simulator import python_function
from vedart.config import whole_number
from vedart.errors import DeviceError, GPUUnavailableError
from vedart.gpu import transfer
from vedart.gpu.devices import CudaProbe, DeviceInfo, Discovery

_NO_CACHE_LOCATOR = "cannot cache function"  # Numba's message for functions without a source file


def _discover() -> Discovery:
    probe = CudaProbe()
    try:
        return probe.discover()
    finally:
        probe.close()


class CUDABackend(Backend):
    """NVIDIA CUDA device ``device_id`` (a CUDA ordinal). Thread-safe.

    Raises GPUUnavailableError (a RuntimeError) with the discovery's reason when CUDA is not
    usable, and DeviceError when ``device_id`` is not a visible device. ``enable_caching`` keeps
    compiled kernels in memory per (function, signature) and on disk (Numba's ``cache=True``)
    where Numba can locate the function's source file.
    """

    def __init__(self, *, device_id: int = 0, enable_caching: bool = True) -> None:
        try:
            ordinal = whole_number(device_id)  # a NumPy integer too
        except TypeError:
            ordinal = -1
        if ordinal < 0:
            raise DeviceError(f"device_id: got {device_id!r}; allowed: a CUDA ordinal >= 0")
        device_id = ordinal
        discovery = _discover()
        if discovery.unavailable_reason is not None:
            raise GPUUnavailableError(f"CUDA backend unavailable: {discovery.unavailable_reason}")
        ordinals = [device.ordinal for device in discovery.devices]
        if device_id not in ordinals:
            raise DeviceError(f"device_id: got {device_id}; allowed: a visible CUDA ordinal "
                              f"{ordinals}")
        import cupy

        self._cupy = cupy
        self._info: DeviceInfo = discovery.devices[ordinals.index(device_id)]
        self._enable_caching = enable_caching
        self._compiled: dict[tuple[Any, tuple[Any, ...]], Any] = {}
        self._compile_lock = threading.Lock()
        self._launcher = NumbaLauncher(cupy.ndarray)
        with cupy.cuda.Device(device_id):
            properties = cupy.cuda.runtime.getDeviceProperties(device_id)
        self._limits = LaunchLimits(
            max_threads_per_block=int(properties["maxThreadsPerBlock"]),
            max_block=_dim3(properties["maxThreadsDim"]),
            max_grid=_dim3(properties["maxGridSize"]),
            device=f"device {device_id} ({self._info.name})")

    @classmethod
    def check_available(cls) -> bool:
        return _discover().unavailable_reason is None

    @property
    def name(self) -> str:
        return "cuda"

    @property
    def device_id(self) -> int:
        return self._info.ordinal

    @property
    def device_name(self) -> str:
        return self._info.name

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self._info.compute_capability

    @property
    def launch_limits(self) -> LaunchLimits:
        return self._limits

    def _device(self) -> Any:
        return self._cupy.cuda.Device(self._info.ordinal)

    def compile_kernel(self, func: Any, signature: tuple[Any, ...]) -> Any:
        """A ``@cuda.jit`` kernel of ``func`` compiled now, on this device, for ``signature``."""
        from numba import cuda

        key = (python_function(func), numba_argument_types(signature))
        with self._compile_lock:
            kernel = self._compiled.get(key) if self._enable_caching else None
            if kernel is None:
                with self._device():
                    kernel = self._jit(cuda, *key)
                if self._enable_caching:
                    self._compiled[key] = kernel
        return kernel

    def _jit(self, cuda: Any, function: Any, argument_types: tuple[Any, ...]) -> Any:
        if not self._enable_caching:
            return cuda.jit(argument_types)(function)
        try:
            return cuda.jit(argument_types, cache=True)(function)
        except RuntimeError as error:
            if not str(error).startswith(_NO_CACHE_LOCATOR):
                raise
            logger.info("%s: not cached on disk (%s)", function.__qualname__, error)
            return cuda.jit(argument_types)(function)

    def allocate(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        with self._device():
            return self._cupy.zeros(shape, dtype=dtype)

    def to_device(self, data: np.ndarray) -> Any:
        if not isinstance(data, np.ndarray):
            raise TypeError(f"to_device: got {type(data).__name__}; allowed: a NumPy ndarray")
        with self._device():
            return transfer.to_device(data)

    def to_host(self, data: Any) -> np.ndarray:
        """A NumPy copy of ``data``: a CuPy array or any ``__cuda_array_interface__`` array."""
        if not isinstance(data, self._cupy.ndarray):
            if not hasattr(data, "__cuda_array_interface__"):
                raise TypeError(f"to_host: got {type(data).__name__}; allowed: a CuPy array or "
                                f"another __cuda_array_interface__ array")
            data = self._cupy.asarray(data)
        with data.device:
            return transfer.to_host(data)

    def synchronize(self) -> None:
        self._device().synchronize()

    def get_memory_info(self) -> tuple[int, int]:
        with self._device():
            free, total = self._cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def launch(self, kernel: Any, dims: LaunchDims, args: Sequence[Any]) -> float:
        """Launch the ``@cuda.jit`` ``kernel`` on this device, on CuPy's current stream."""
        with self._device():
            return self._launcher.launch(kernel, dims, args,
                                         self._cupy.cuda.get_current_stream().ptr)


def _dim3(values: Sequence[int]) -> tuple[int, int, int]:
    return int(values[0]), int(values[1]), int(values[2])
