"""The process-wide :class:`Runtime` and its lifecycle: ``init``, ``get_runtime``, ``shutdown``.

One runtime is current at a time. ``init`` replaces it (the old one is closed after the new
one is installed, so concurrent callers always find a working runtime); ``get_runtime``
creates it from defaults and ``VEDART_*`` variables on first use. All three are thread-safe.
"""

from __future__ import annotations

import threading

from vedart._logging import apply_log_level, logger
from vedart.config import Config
from vedart.gpu.context import GPUContext
from vedart.gpu.devices import DeviceProbe


class Runtime:
    """Owns the configuration and the resources built from it.

    ``gpu`` is a :class:`GPUContext` (falsy when no GPU is usable, with the reason), or
    ``None`` when the configuration disables the GPU.
    """

    def __init__(self, config: Config, *, device_probe: DeviceProbe | None = None) -> None:
        self.config = config
        apply_log_level(config.log_level)
        self.gpu: GPUContext | None = GPUContext(config, device_probe) if config.gpu else None
        self._closed = False
        if self.gpu is not None and not self.gpu.is_available():
            logger.info("GPU unavailable: %s; @gpu functions run on the CPU",
                        self.gpu.unavailable_reason)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the runtime's pools and device handles. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.gpu is not None:
            self.gpu.close()


_lock = threading.Lock()
_current: Runtime | None = None


def init(config: Config | None = None, *, device_probe: DeviceProbe | None = None) -> Runtime:
    """Install a new runtime built from ``config`` (default: defaults + ``VEDART_*``), closing
    the previous one. ``device_probe`` replaces CUDA/NVML discovery (tests, custom setups)."""
    global _current
    runtime = Runtime(Config.builder().build() if config is None else config,
                      device_probe=device_probe)
    with _lock:
        previous, _current = _current, runtime
    if previous is not None:
        previous.close()
    return runtime


def get_runtime() -> Runtime:
    """The current runtime, created from defaults and ``VEDART_*`` variables on first use."""
    global _current
    runtime = _current
    if runtime is not None:
        return runtime
    with _lock:
        if _current is None:
            _current = Runtime(Config.builder().build())
        return _current


def shutdown() -> None:
    """Close the current runtime; the next ``get_runtime`` creates a fresh one. Idempotent."""
    global _current
    with _lock:
        previous, _current = _current, None
    if previous is not None:
        previous.close()
