"""GPUContext (``runtime.gpu``): which devices the runtime uses, whether it can, and their state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from vedart import lifecycle
from vedart._logging import logger
from vedart.config import Config
from vedart.errors import ConfigError, DeviceError, GPUUnavailableError
from vedart.gpu.devices import CudaProbe, DeviceInfo, DeviceProbe, Discovery
from vedart.gpu.memory import DeviceMemory
from vedart.gpu.transfer import TransferEngine

if TYPE_CHECKING:
    from vedart.backends.cuda import CUDABackend

MIB = 2**20
DISABLED_BY_CONFIG = "GPU disabled by config"  # the reason when Config.gpu is False


FREE_MEMORY_MAX_AGE_S = 0.01  # a decision may reuse a free-memory reading this young
# ... or this young when it needs at most 1/FREE_MEMORY_SLACK of what the reading found free:
# a query 10 ms or more after the last took 100 us (H100 80GB HBM3, 2026-11-24, a settled
# monte_carlo_pi call between NumPy calls), a quarter of the call's copies and compute.
FREE_MEMORY_SLACK_AGE_S = 1.0
FREE_MEMORY_SLACK = 100


class GPUContext:
    """The runtime's view of its GPUs.

    Truthy exactly when a GPU is usable, so ``if runtime.gpu:`` reads naturally.
    ``devices`` lists the configured devices (``Config.devices``, default all visible);
    querying a device that is not among them raises DeviceError, and querying any device
    while none is usable raises GPUUnavailableError with :attr:`unavailable_reason` (in a
    process forked after CUDA was started, ``lifecycle.FORKED_CHILD_REASON``, without probing).
    Memory figures are in MiB (2**20 bytes), as nvidia-smi reports them.
    """

    backend = "cupy"

    def __init__(self, config: Config, probe: DeviceProbe | None,
                 backend_factory: Callable[[int], CUDABackend]) -> None:
        self._probe: DeviceProbe = CudaProbe() if probe is None else probe
        discovery = (Discovery((), lifecycle.FORKED_CHILD_REASON)
                     if lifecycle.cuda_unusable_here() else self._probe.discover())
        self.unavailable_reason: str | None = discovery.unavailable_reason
        try:
            self.devices: list[DeviceInfo] = _configured(list(discovery.devices), config.devices)
        except ConfigError:
            self._probe.close()
            raise
        self._by_ordinal = {device.ordinal: device for device in self.devices}
        self.ordinals: tuple[int, ...] = tuple(self._by_ordinal)  # of ``devices``, in order
        self.transfers: TransferEngine | None = None
        self.memory: DeviceMemory | None = None
        self._backend_factory = backend_factory  # CUDABackend: the device API is a layer up
        self._backends: dict[int, CUDABackend] = {}
        self._backends_lock = threading.Lock()
        self._free_readings: dict[int, tuple[int, float]] = {}  # ordinal -> (bytes, when)
        self._context_lost = False  # set by disable(): CUDA can do nothing more here
        self._lost_lock = threading.Lock()
        if self.is_available():
            self.transfers = TransferEngine(config.pinned_memory_limit)
            # Loading the compiled staging loop and making a staging ring now, in the
            # background, lets the first large transfer use them rather than copy direct at a
            # third of the speed or less, or wait for pinned slots. Every device's: calls go
            # to the device with the most free memory, on two H200 (2026-11-27) device 1, whose
            # first copies went direct at 0.45-0.98x cupy.asarray. Devices injected through a
            # probe (tests) may have no driver behind them: nothing is made for those.
            if probe is None:
                for ordinal in self.ordinals:
                    self.transfers.prepare(ordinal)
            self.memory = DeviceMemory(list(self.ordinals),
                                       config.gpu_memory_fraction)

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def is_available(self) -> bool:
        return self.unavailable_reason is None

    def disable(self, reason: str) -> bool:
        """Make the GPU unusable for the rest of this runtime, for ``reason``: the process's
        CUDA context is lost (a CUDA error that every later CUDA call repeats). Every later
        @gpu decision runs on the CPU and says ``no GPU: <reason>``; :meth:`close` no longer
        raises CUDA's errors. Only the first reason is kept: every later CUDA call meets the same
        error and only repeats it. Returns whether this call disabled it (False: an earlier
        one had)."""
        with self._lost_lock:
            if self._context_lost:
                return False
            self._context_lost = True
            self.unavailable_reason = reason
            return True

    def __bool__(self) -> bool:
        return self.is_available()

    def device(self, ordinal: int | None = None) -> DeviceInfo:
        """The configured device ``ordinal`` (None: the first configured device)."""
        if not self.is_available():
            raise GPUUnavailableError(f"no GPU: {self.unavailable_reason}")
        if ordinal is None:
            return self.devices[0]
        try:
            return self._by_ordinal[ordinal]
        except (KeyError, TypeError):
            raise DeviceError(
                f"device: got {ordinal!r}; allowed: one of the runtime's CUDA ordinals "
                f"{sorted(self._by_ordinal)}"
            ) from None

    def device_backend(self, ordinal: int | None = None) -> CUDABackend:
        """The :class:`~vedart.backends.CUDABackend` of configured device ``ordinal`` (None: the
        first), created on first use and shared by everything the runtime launches there
        (``@gpu_kernel`` included), so compiled kernels are cached once per device."""
        info = self.device(ordinal)
        with self._backends_lock:
            backend = self._backends.get(info.ordinal)
            if backend is None:
                backend = self._backends[info.ordinal] = self._backend_factory(info.ordinal)
            return backend

    def free_memory(self, ordinal: int, needed: float | None = None) -> int:
        """Free bytes on device ``ordinal`` (NVML; the cost model's query), read at most
        ``FREE_MEMORY_MAX_AGE_S`` ago, or ``FREE_MEMORY_SLACK_AGE_S`` ago for a caller that
        ``needed`` at most 1/``FREE_MEMORY_SLACK`` of that reading: the query is a large share
        of a small GPU call's overhead."""
        now = time.monotonic()
        reading = self._free_readings.get(ordinal)
        if reading is not None:
            age = now - reading[1]
            if age < FREE_MEMORY_MAX_AGE_S or (needed is not None and age < FREE_MEMORY_SLACK_AGE_S
                                               and needed * FREE_MEMORY_SLACK <= reading[0]):
                return reading[0]
        free = self._probe.free_and_total(ordinal)[0]
        self._free_readings[ordinal] = (free, now)
        return free

    def get_memory_stats(self, device: int | None = None) -> dict[str, float]:
        """Memory of ``device`` (None: the first configured), in MiB unless noted:
        ``used_mb``, ``free_mb``, ``total_mb`` (the whole device, NVML);
        ``pool_allocated_mb``, ``pool_cached_mb``, ``peak_allocated_mb`` (CuPy's pool on this
        device; peak since runtime creation or :meth:`reset_peak_memory`), ``fragmentation``
        (cached-but-free / reserved, 0..1); ``pinned_used_mb``, ``pinned_cached_mb`` (vedart's
        page-locked host memory, all devices)."""
        info = self.device(device)
        free, total = self._probe.free_and_total(info.ordinal)
        assert self.memory is not None and self.transfers is not None
        return {
            "used_mb": max(total - free, 0) / MIB,
            "free_mb": free / MIB,
            "total_mb": total / MIB,
            **self.memory.stats(info.ordinal),
            **self.transfers.stats(),
        }

    def reset_peak_memory(self) -> None:
        """Restart ``peak_allocated_mb`` tracking from the current pool use."""
        if self.memory is not None:
            self.memory.reset_peak()

    def empty_cache(self) -> None:
        """Free cached device-pool blocks, idle staging buffers and cached pinned blocks.
        Memory held by live arrays is untouched."""
        if self.memory is not None and self.transfers is not None:
            self.memory.empty_cache()
            self.transfers.empty_cache()

    def get_utilization(self, device: int | None = None) -> float:
        """Percent of the last sample period the device was busy, in [0, 100], from NVML."""
        info = self.device(device)
        return min(max(self._probe.utilization_percent(info.ordinal), 0.0), 100.0)

    def close(self) -> None:
        """Release staging threads and buffers, pool settings and NVML. Idempotent. After
        :meth:`disable`, CUDA's errors while releasing are not raised: nothing can be freed
        in a lost context, and CUDA releases it all when the process ends."""
        for part in (self.transfers, self.memory):
            if part is None:
                continue
            try:
                part.close()
            except Exception:
                if not self._context_lost:
                    raise
                logger.debug("closing %s in a lost CUDA context", type(part).__name__,
                             exc_info=True)
        self._probe.close()


def _configured(visible: list[DeviceInfo], wanted: tuple[int, ...] | None) -> list[DeviceInfo]:
    if wanted is None or not visible:
        return visible
    present = {device.ordinal for device in visible}
    missing = [ordinal for ordinal in wanted if ordinal not in present]
    if missing:
        raise ConfigError(
            f"devices: got {list(wanted)}; allowed: visible CUDA ordinals {sorted(present)} "
            f"(not present: {missing})"
        )
    return [device for device in visible if device.ordinal in wanted]
