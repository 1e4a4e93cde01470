"""Device memory as vedart sees it: CuPy's pool per device, its limit, and peak use.

``Config.gpu_memory_fraction`` caps CuPy's default pool on each configured device, so
exceeding it raises CuPy's OutOfMemoryError, which the @gpu fallback turns into a CPU run.
Peak use is tracked by wrapping the pool's allocator (one extra Python call per device
allocation) from runtime creation until the runtime closes, and can be reset.
"""

from __future__ import annotations

import threading
from typing import Any

from vedart._logging import logger

MIB = 2**20


class DeviceMemory:
    """Pool figures, limits and peak tracking for the runtime's devices.

    Figures that cannot be read (CuPy present but no working device, as with a test probe) are
    reported as 0.
    """

    def __init__(self, ordinals: list[int], fraction: float) -> None:
        self._ordinals = ordinals
        self._peak: dict[int, int] = dict.fromkeys(ordinals, 0)
        self._lock = threading.Lock()
        self._previous_allocator: Any = None
        self._pool: Any = None
        try:
            import cupy

            pool = cupy.get_default_memory_pool()
            for ordinal in ordinals:
                with cupy.cuda.Device(ordinal):
                    pool.set_limit(fraction=fraction if fraction < 1.0 else 0)
                    self._peak[ordinal] = pool.used_bytes()
        except Exception as error:  # no usable CUDA behind the probe: nothing to manage
            logger.debug("device pools not managed: %s", error)
            return
        self._pool = pool
        self._previous_allocator = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(self._tracking_malloc)

    def _tracking_malloc(self, size: int) -> Any:
        memory = self._pool.malloc(size)
        used = self._pool.used_bytes()
        device = memory.device_id
        if used > self._peak.get(device, 0):
            self._peak[device] = used
        return memory

    def stats(self, ordinal: int) -> dict[str, float]:
        """``pool_allocated_mb``, ``pool_cached_mb``, ``peak_allocated_mb`` and
        ``fragmentation`` (cached-but-free / reserved, 0..1) of device ``ordinal``."""
        if self._pool is None:
            return {"pool_allocated_mb": 0.0, "pool_cached_mb": 0.0, "peak_allocated_mb": 0.0,
                    "fragmentation": 0.0}
        import cupy

        with cupy.cuda.Device(ordinal):
            used, free, total = (self._pool.used_bytes(), self._pool.free_bytes(),
                                 self._pool.total_bytes())
        return {"pool_allocated_mb": used / MIB, "pool_cached_mb": free / MIB,
                "peak_allocated_mb": max(self._peak.get(ordinal, 0), used) / MIB,
                "fragmentation": free / total if total else 0.0}

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the current use."""
        if self._pool is None:
            return
        import cupy

        for ordinal in self._ordinals:
            with cupy.cuda.Device(ordinal):
                self._peak[ordinal] = self._pool.used_bytes()

    def empty_cache(self) -> None:
        """Release the pool's cached (free) device blocks on every configured device."""
        if self._pool is None:
            return
        import cupy

        for ordinal in self._ordinals:
            with cupy.cuda.Device(ordinal):
                self._pool.free_all_blocks()

    def close(self) -> None:
        """Restore the allocator and lift the limits this object set. Idempotent."""
        if self._pool is None:
            return
        import cupy

        if cupy.cuda.get_allocator() == self._tracking_malloc:
            cupy.cuda.set_allocator(self._previous_allocator)
        for ordinal in self._ordinals:
            with cupy.cuda.Device(ordinal):
                self._pool.set_limit(size=0)
        self._pool = None
