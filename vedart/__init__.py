"""vedart: run existing NumPy code on the GPU when it pays, and say why.

This module is the whole public API; everything else is an implementation detail.
"""

from vedart._version import __version__
from vedart.config import Config, ConfigBuilder
from vedart.errors import ConfigError, DeviceError, GPUUnavailableError, VedaError
from vedart.gpu.devices import DeviceInfo
from vedart.runtime import Runtime, get_runtime, init, shutdown

__all__ = [
    "Config",
    "ConfigBuilder",
    "ConfigError",
    "DeviceError",
    "DeviceInfo",
    "GPUUnavailableError",
    "Runtime",
    "VedaError",
    "__version__",
    "get_runtime",
    "init",
    "shutdown",
]
