"""The current runtime: ``init``, ``get_runtime``, ``shutdown``, and the accessor lower layers use.

One runtime is current at a time. ``init`` replaces it: the old one is closed first (so what it
holds, the adaptive profile, the device pool settings, is saved and released before the new one
reads or sets them), then the new one is built and installed. ``get_runtime`` creates a runtime from defaults and ``VEDART_*`` variables on first use. All
three are thread-safe. The Runtime
class lives in the layer above (``vedart.runtime``) and registers itself as the factory here,
so the offload and kernel layers can reach the runtime without importing upward.

A process forked while a runtime is current (``multiprocessing`` with the fork start method)
inherits none of its threads and, once CUDA has been started, cannot use CUDA. In the child the
parent's runtime is set aside, never used or closed there (closing it would stop the parent's
device worker processes and free what the parent still uses), and the first ``get_runtime``
builds a fresh one from the parent's configuration: new worker threads, lanes and staging
threads, and, when the parent had a usable GPU, a GPU context that says
:data:`FORKED_CHILD_REASON`, so ``@gpu`` calls run on the CPU with that reason.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vedart.config import Config
from vedart.errors import ConfigError
from vedart.locks import renew_in_child

if TYPE_CHECKING:
    from vedart.runtime import Runtime

_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_lock")
current: Runtime | None = None  # read directly by hot paths; replaced only under _lock
_factory: Callable[..., Runtime] | None = None

FORKED_CHILD_REASON = "CUDA unusable in a forked child process"
_gpu_started = False  # a runtime with a usable GPU was built in this process (or its parent)
_forked_after_gpu = False  # this process was forked after that: CUDA cannot be used here
_inherited: Config | None = None  # in a forked child: the configuration of the parent's runtime
_set_aside: list[Runtime] = []  # the parent's runtime as forked: kept, never used or closed


def register_factory(factory: Callable[..., Runtime]) -> None:
    global _factory
    _factory = factory


def _build(config: Config, device_probe: Any) -> Runtime:
    global _gpu_started
    assert _factory is not None, "vedart.runtime registers the Runtime factory at import"
    runtime = _factory(config, device_probe=device_probe)
    _gpu_started = _gpu_started or bool(runtime.gpu)
    return runtime


def cuda_unusable_here() -> bool:
    """Whether this process was forked after a runtime with a usable GPU was built (in it or
    in a process it was forked from): CUDA cannot be used, and GPU contexts say
    :data:`FORKED_CHILD_REASON` without probing."""
    return _forked_after_gpu


def _after_fork_in_child() -> None:
    global current, _inherited, _forked_after_gpu
    _forked_after_gpu = _gpu_started
    if current is not None:
        _set_aside.append(current)
        _inherited, current = current.config, None


os.register_at_fork(after_in_child=_after_fork_in_child)


def init(config: Config | None = None, *, device_probe: Any = None) -> Runtime:
    """Close the current runtime and install a new one built from ``config`` (default: defaults
    + ``VEDART_*``); ConfigError, the current runtime left running, when ``config`` is not a
    Config. If building fails (a ConfigError for an absent device, say), the error
    propagates and the next ``get_runtime`` builds a default runtime. ``device_probe`` (a
    :class:`vedart.gpu.devices.DeviceProbe`) replaces CUDA/NVML discovery, for tests and
    custom setups.

    Closing happens outside the lock: the old runtime's workers may still call
    ``get_runtime`` while it joins them. A runtime another thread created in the meantime is
    closed when the new one is installed."""
    global current, _inherited
    config = Config.builder().build() if config is None else config
    if not isinstance(config, Config):  # before the current runtime is closed
        hint = " (call .build() on the builder)" if hasattr(config, "build") else ""
        raise ConfigError(f"config: got {config!r}; allowed: a vedart.Config or None{hint}")
    with _lock:
        previous, current, _inherited = current, None, None
    if previous is not None:
        previous.close()
    runtime = _build(config, device_probe)
    with _lock:
        interim, current = current, runtime
    if interim is not None:
        interim.close()
    return runtime


def get_runtime() -> Runtime:
    """The current runtime, created on first use from defaults and ``VEDART_*`` variables (in a
    forked child, from the configuration of the parent's runtime)."""
    global current, _inherited
    runtime = current
    if runtime is not None:
        return runtime
    with _lock:
        if current is None:
            config = Config.builder().build() if _inherited is None else _inherited
            current, _inherited = _build(config, None), None
        return current


def shutdown() -> None:
    """Close the current runtime; the next ``get_runtime`` creates a fresh one. Idempotent."""
    global current, _inherited
    with _lock:
        previous, current, _inherited = current, None, None
    if previous is not None:
        previous.close()
