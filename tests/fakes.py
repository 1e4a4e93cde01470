"""Device facts for CPU-only tests, injected through the runtime's DeviceProbe seam."""

from __future__ import annotations

from typing import Any

import numpy as np

from vedart.gpu.devices import CudaProbe, DeviceInfo, Discovery

GIB = 10**9


def make_device(ordinal: int, total: int = 80 * GIB) -> DeviceInfo:
    return DeviceInfo(ordinal=ordinal, name=f"Fake GPU {ordinal}", compute_capability=(9, 0),
                      total_memory=total, pci_bus_id=f"0000:{0x10 + ordinal:02X}:00.0")


class FakeProbe:
    """A probe reporting ``count`` devices (or none, with ``reason``) and settable free memory."""

    def __init__(self, count: int = 1, *, reason: str | None = None,
                 free: int = 70 * GIB, total: int = 80 * GIB, utilization: float = 12.5) -> None:
        self.devices = tuple(make_device(i, total) for i in range(count))
        self.reason = reason
        self.free = {device.ordinal: free for device in self.devices}
        self.total = total
        self.utilization = utilization
        self.memory_queries = 0
        self.closed = False

    def discover(self) -> Discovery:
        if self.reason is not None:
            return Discovery((), self.reason)
        return Discovery(self.devices)

    def free_and_total(self, ordinal: int) -> tuple[int, int]:
        self.memory_queries += 1
        return self.free[ordinal], self.total

    def utilization_percent(self, ordinal: int) -> float:
        return self.utilization

    def close(self) -> None:
        self.closed = True


def gpu_unavailable_reason() -> str | None:
    """Why no real CUDA GPU is usable here, or None when one is (real discovery)."""
    probe = CudaProbe()
    try:
        return probe.discover().unavailable_reason
    finally:
        probe.close()


class FakePointer:
    """A device address as CuPy's ``MemoryPointer`` has it: ``ptr``, and ``+ offset``."""

    def __init__(self, owner: np.ndarray, ptr: int) -> None:
        self.owner = owner  # the C-contiguous array that owns the memory
        self.ptr = ptr

    def __add__(self, offset: int) -> FakePointer:
        return FakePointer(self.owner, self.ptr + offset)


class FakeDeviceArray(np.ndarray):
    """Host memory standing in for a CuPy array where results come back: views share memory
    as CuPy's do, ``data.ptr`` is the first element's address, ``get()`` copies to a NumPy
    array, and ``FakeDeviceArray(shape, dtype=, memptr=)`` makes an array at an address."""

    def __new__(cls, shape: tuple[int, ...], dtype: Any = float,
                memptr: FakePointer | None = None) -> FakeDeviceArray:
        if memptr is None:
            return np.ndarray.__new__(cls, shape, dtype)
        raw = memptr.owner.reshape(-1).view(np.uint8)
        return np.ndarray.__new__(cls, shape, dtype, buffer=raw,
                                  offset=memptr.ptr - memptr.owner.ctypes.data)

    @staticmethod
    def of(host: np.ndarray) -> FakeDeviceArray:
        """A device copy of ``host`` (C order)."""
        return np.array(host, order="C", copy=True).view(FakeDeviceArray)

    @property
    def data(self) -> FakePointer:  # type: ignore[override]
        owner: np.ndarray = self
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        return FakePointer(owner, self.__array_interface__["data"][0])

    def get(self) -> np.ndarray:
        return np.array(self.view(np.ndarray), copy=True, order="K")
