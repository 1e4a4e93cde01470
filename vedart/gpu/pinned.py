"""A pool of page-locked (pinned) host memory, capped by ``Config.pinned_memory_limit``.

Blocks are allocated with ``cudaHostAlloc(..., portable)`` (usable from every device), rounded
to a size class, and reused. A block is handed out either as a staging buffer (held by the
transfer engine) or as an ordinary ``numpy.ndarray`` whose memory returns to the pool when
the array and every view of it have been garbage-collected.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

MIB = 2**20
_SMALL_CLASS = 64 * 1024  # blocks below 2 MiB round up to a power of two from here
_LARGE_STEP = 2 * MIB     # blocks from 2 MiB round up to a multiple of this
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation (CuPy names no constant for it)


def size_class(nbytes: int) -> int:
    """The block size that serves a request of ``nbytes`` (>= 1)."""
    if nbytes >= _LARGE_STEP:
        return -(-nbytes // _LARGE_STEP) * _LARGE_STEP
    size = _SMALL_CLASS
    while size < nbytes:
        size *= 2
    return size


class PinnedPool:
    """Pinned host blocks by size class, with ``used`` (handed out) + ``cached`` (free, kept)
    never above ``limit`` bytes. Thread-safe. ``allocate(size)`` returns a block object with
    ``ptr`` and ``size`` (default: ``cupy.cuda.PinnedMemory``, freed when dropped), or raises
    MemoryError when the system has no pinned memory to give."""

    def __init__(self, limit: int, allocate: Callable[[int], Any] | None = None) -> None:
        self.limit = limit
        self._allocate = _allocate if allocate is None else allocate
        # Re-entrant: a collection run while take() holds it can free a pinned array, whose
        # block then comes back through give_back() on the same thread (both reach a size's
        # list through setdefault, so neither replaces a list the other has filled).
        self._lock = threading.RLock()
        self._free: dict[int, list[Any]] = {}
        self.used_bytes = 0
        self.cached_bytes = 0
        self._closed = False

    def take(self, nbytes: int) -> Any | None:
        """A pinned block (an object with ``ptr`` and ``size``) of at least ``nbytes``, or None
        when it would exceed the limit even after dropping cached blocks, when the system has
        no pinned memory to give even then (callers fall back to pageable memory), or once
        the pool is closed."""
        size = size_class(nbytes)
        with self._lock:
            if self._closed:
                return None
            free = self._free.setdefault(size, [])
            if free:
                self.cached_bytes -= size
                self.used_bytes += size
                return free.pop()
            if self.used_bytes + self.cached_bytes + size > self.limit:
                self._drop_cached_locked()
                if self.used_bytes + size > self.limit:
                    return None
            self.used_bytes += size
        try:
            try:
                return self._allocate(size)
            except MemoryError:  # the system's pinned memory, not the limit: free ours, retry
                self.empty_cache()
                return self._allocate(size)
        except BaseException as error:  # an interrupt too: the block was never handed out
            with self._lock:
                self.used_bytes -= size
            if isinstance(error, MemoryError):
                return None
            raise

    def give_back(self, block: Any) -> None:
        """Return a block from :meth:`take` to the cache, or free it once the pool is closed
        (arrays handed out before can outlive it)."""
        with self._lock:
            self.used_bytes -= block.size
            if not self._closed:
                self.cached_bytes += block.size
                self._free.setdefault(block.size, []).append(block)

    def array(self, shape: tuple[int, ...], dtype: np.dtype, order: str = "C") -> np.ndarray | None:
        """An uninitialised ndarray in pinned memory (None past the limit); its block returns to
        the pool when the array and all its views are gone."""
        nbytes = math.prod(shape) * dtype.itemsize
        block = self.take(max(nbytes, 1))
        if block is None:
            return None
        raw = _returning_bytes(block.size).from_address(block.ptr)
        raw.returns_to = (self, block)
        flat = np.frombuffer(raw, dtype=np.uint8, count=nbytes)
        return flat.view(dtype).reshape(shape, order=order)  # type: ignore[call-overload]

    def empty_cache(self) -> None:
        """Free every cached (not handed out) block."""
        with self._lock:
            self._drop_cached_locked()

    def close(self) -> None:
        """Free every cached block; from now on :meth:`take` gives none and blocks given back
        are freed."""
        with self._lock:
            self._closed = True
            self._drop_cached_locked()

    def _drop_cached_locked(self) -> None:
        self._free.clear()  # PinnedMemory frees its block when the last reference goes
        self.cached_bytes = 0


_RETURNING_TYPES: dict[int, type] = {}  # block size -> its _returning_bytes type


def _returning_bytes(size: int) -> type:
    """A ``ctypes.c_char * size`` type whose objects, once collected, give back the block in
    their ``returns_to`` (pool, block): an array's last view going returns the memory. Cheaper
    than a ``weakref.finalize`` per array (2.7 against 3.8 us to hand out and return one on the
    development machine, 2026-11-23). One type per block size class, made on first use."""
    kind = _RETURNING_TYPES.get(size)
    if kind is None:
        kind = _RETURNING_TYPES[size] = type(f"PinnedBytes{size}", (ctypes.c_char * size,),
                                             {"__del__": _give_back})
    return kind


def _give_back(raw: Any) -> None:
    pool, block = raw.returns_to
    if ctypes.addressof(raw) == block.ptr:  # not a copy of the holder (which owns its bytes)
        pool.give_back(block)


def _allocate(size: int) -> Any:
    import cupy

    try:
        return cupy.cuda.PinnedMemory(size, cupy.cuda.runtime.hostAllocPortable)
    except cupy.cuda.runtime.CUDARuntimeError as error:
        if error.status == CUDA_ERROR_MEMORY_ALLOCATION:
            raise MemoryError(f"no pinned memory for {size} bytes: {error}") from error
        raise
