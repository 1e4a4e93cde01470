"""vedart: run existing NumPy code on the GPU when it pays, and say why.

This module is the whole public API; everything else is an implementation detail.
"""

from vedart._version import __version__
from vedart.config import Config, ConfigBuilder
from vedart.errors import (
    ConfigError,
    DeviceError,
    GPUUnavailableError,
    OffloadError,
    OffloadWarning,
    VedaError,
)
from vedart.gpu.devices import DeviceInfo
from vedart.lifecycle import get_runtime, init, shutdown
from vedart.offload.cost import Decision
from vedart.offload.decorator import gpu
from vedart.offload.force import force
from vedart.offload.results import to_host
from vedart.runtime import Runtime, empty_cache, report

__all__ = [
    "Config",
    "ConfigBuilder",
    "ConfigError",
    "Decision",
    "DeviceError",
    "DeviceInfo",
    "GPUUnavailableError",
    "OffloadError",
    "OffloadWarning",
    "Runtime",
    "VedaError",
    "__version__",
    "empty_cache",
    "force",
    "get_runtime",
    "gpu",
    "init",
    "report",
    "shutdown",
    "to_host",
]
