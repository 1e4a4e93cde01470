"""vedart: run existing NumPy code on the GPU when it pays, and say why.

This module is the whole public API; everything else is an implementation detail.
"""

from vedart._version import __version__
from vedart.config import Config, ConfigBuilder
from vedart.errors import (
    ConfigError,
    CUDADriverError,
    DeviceError,
    GPUUnavailableError,
    KernelLaunchError,
    OffloadError,
    OffloadWarning,
    ParIterError,
    SchedulerUnavailableError,
    SimulatorWarning,
    VedaError,
)
from vedart.gpu.devices import DeviceInfo
from vedart.kernels.registry import get_kernel, gpu_kernel
from vedart.lifecycle import get_runtime, init, shutdown
from vedart.offload.cost import Decision
from vedart.offload.decorator import gpu
from vedart.offload.force import force
from vedart.offload.results import to_host
from vedart.parallel.par_iter import ParIter, par_iter
from vedart.runtime import Runtime, empty_cache, report

__all__ = [
    "Config",
    "ConfigBuilder",
    "ConfigError",
    "CUDADriverError",
    "Decision",
    "DeviceError",
    "DeviceInfo",
    "GPUUnavailableError",
    "KernelLaunchError",
    "OffloadError",
    "OffloadWarning",
    "ParIter",
    "ParIterError",
    "Runtime",
    "SchedulerUnavailableError",
    "SimulatorWarning",
    "VedaError",
    "__version__",
    "empty_cache",
    "force",
    "get_kernel",
    "get_runtime",
    "gpu",
    "gpu_kernel",
    "init",
    "par_iter",
    "report",
    "shutdown",
    "to_host",
]
