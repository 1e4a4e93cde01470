"""The current runtime: ``init``, ``get_runtime``, ``shutdown``, and the accessor lower layers use.

One runtime is current at a time. ``init`` replaces it: the old one is closed first (so what it
holds, the adaptive profile, the device pool settings, is saved and released before the new one
reads or sets them), then the new one is built and installed. ``get_runtime`` creates a runtime from defaults and ``VEDART_*`` variables on first use. All
three are thread-safe. The Runtime
class lives in the layer above (``vedart.runtime``) and registers itself as the factory here,
so the offload and kernel layers can reach the runtime without importing upward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vedart.config import Config

if TYPE_CHECKING:
    from vedart.runtime import Runtime

_lock = threading.Lock()
current: Runtime | None = None  # read directly by hot paths; replaced only under _lock
_factory: Callable[..., Runtime] | None = None


def register_factory(factory: Callable[..., Runtime]) -> None:
    global _factory
    _factory = factory


def _build(config: Config, device_probe: Any) -> Runtime:
    assert _factory is not None, "vedart.runtime registers the Runtime factory at import"
    return _factory(config, device_probe=device_probe)


def init(config: Config | None = None, *, device_probe: Any = None) -> Runtime:
    """Close the current runtime and install a new one built from ``config`` (default: defaults
    + ``VEDART_*``). If building fails (a ConfigError for an absent device, say), the error
    propagates and the next ``get_runtime`` builds a default runtime. ``device_probe`` (a
    :class:`vedart.gpu.devices.DeviceProbe`) replaces CUDA/NVML discovery, for tests and
    custom setups.

    Closing happens outside the lock: the old runtime's workers may still call
    ``get_runtime`` while it joins them. A runtime another thread created in the meantime is
    closed when the new one is installed."""
    global current
    config = Config.builder().build() if config is None else config
    with _lock:
        previous, current = current, None
    if previous is not None:
        previous.close()
    runtime = _build(config, device_probe)
    with _lock:
        interim, current = current, runtime
    if interim is not None:
        interim.close()
    return runtime


def get_runtime() -> Runtime:
    """The current runtime, created from defaults and ``VEDART_*`` variables on first use."""
    global current
    runtime = current
    if runtime is not None:
        return runtime
    with _lock:
        if current is None:
            current = _build(Config.builder().build(), None)
        return current


def shutdown() -> None:
    """Close the current runtime; the next ``get_runtime`` creates a fresh one. Idempotent."""
    global current
    with _lock:
        previous, current = current, None
    if previous is not None:
        previous.close()
