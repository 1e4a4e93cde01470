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
        self._tracking_malloc: Any = None
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
        # A runtime replacing another is created before the old one closes: restore to what
        # was there before any vedart runtime, never to another runtime's tracker.
        previous = cupy.cuda.get_allocator()
        self._previous_allocator = getattr(previous, "vedart_previous", previous)
        peak, lock = self._peak, self._lock

        def tracking_malloc(size: int) -> Any:
            memory = pool.malloc(size)
            with lock:  # check and set as one step, or a thread that read less lowers the peak
                used = pool.used_bytes()
                if used > peak.get(memory.device_id, 0):
                    peak[memory.device_id] = used
            return memory

        tracking_malloc.vedart_previous = self._previous_allocator  # type: ignore[attr-defined]
        self._tracking_malloc = tracking_malloc
        cupy.cuda.set_allocator(tracking_malloc)

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
            with cupy.cuda.Device(ordinal), self._lock:
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
        """Restore the allocator and lift the pool limits, unless a newer runtime has taken them
        over (the pool is process-wide; the newest runtime owns its settings). Idempotent."""
        if self._pool is None:
            return
        import cupy

        if cupy.cuda.get_allocator() is self._tracking_malloc:
            cupy.cuda.set_allocator(self._previous_allocator)
            for ordinal in self._ordinals:
                with cupy.cuda.Device(ordinal):
                    self._pool.set_limit(size=0)
        self._pool = None
