"""The current runtime: ``init``, ``get_runtime``, ``shutdown``, and the accessor lower layers use.

One runtime is current at a time. ``init`` replaces it (the old one is closed after the new one
is installed, so concurrent callers always find a working runtime); ``get_runtime`` creates it
from defaults and ``VEDART_*`` variables on first use. All three are thread-safe. The Runtime
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


def _build(config: Config | None, device_probe: Any) -> Runtime:
    assert _factory is not None, "vedart.runtime registers the Runtime factory at import"
    return _factory(Config.builder().build() if config is None else config,
                    device_probe=device_probe)


def init(config: Config | None = None, *, device_probe: Any = None) -> Runtime:
    """Install a new runtime built from ``config`` (default: defaults + ``VEDART_*``), closing
    the previous one. ``device_probe`` (a :class:`vedart.gpu.devices.DeviceProbe`) replaces
    CUDA/NVML discovery, for tests and custom setups."""
    global current
    runtime = _build(config, device_probe)
    with _lock:
        previous, current = current, runtime
    if previous is not None:
        previous.close()
    return runtime


def get_runtime() -> Runtime:
    """The current runtime, created from defaults and ``VEDART_*`` variables on first use."""
    global current
    runtime = current
    if runtime is not None:
        return runtime
    with _lock:
        if current is None:
            current = _build(None, None)
        return current


def shutdown() -> None:
    """Close the current runtime; the next ``get_runtime`` creates a fresh one. Idempotent."""
    global current
    with _lock:
        previous, current = current, None
    if previous is not None:
        previous.close()
