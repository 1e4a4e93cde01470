"""Device discovery and per-device facts, behind one small seam (:class:`DeviceProbe`).

:class:`CudaProbe` asks CuPy which CUDA devices are visible and NVML how much memory is free;
tests and callers with their own discovery pass any object with the same four methods.
Nothing here runs at import: CuPy is imported, and CUDA touched, only when a probe discovers.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from vedart._logging import logger
from vedart.errors import GPUUnavailableError
from vedart.gpu.nvml import NvmlSession, NvmlUnavailable

CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100


@dataclass(frozen=True)
class DeviceInfo:
    """Static facts of one visible CUDA device. ``ordinal`` is the CUDA ordinal (as renumbered
    by ``CUDA_VISIBLE_DEVICES``); ``total_memory`` is in bytes."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    pci_bus_id: str


@dataclass(frozen=True)
class Discovery:
    """What a probe found: the visible devices, or why there are none usable."""

    devices: tuple[DeviceInfo, ...]
    unavailable_reason: str | None = None


class DeviceProbe(Protocol):
    """The seam through which the runtime learns device facts."""

    def discover(self) -> Discovery: ...

    def free_and_total(self, ordinal: int) -> tuple[int, int]:
        """Free and total bytes of device ``ordinal``; cheap enough for every offload decision."""
        ...

    def utilization_percent(self, ordinal: int) -> float: ...

    def close(self) -> None: ...


class NoDevices:
    """A probe that finds no device, for ``reason``: in a process that must not use a GPU its
    host has (the workers of a CPU Dask cluster), every decision then says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def discover(self) -> Discovery:
        return Discovery((), self.reason)

    def free_and_total(self, ordinal: int) -> tuple[int, int]:
        raise GPUUnavailableError(f"no GPU: {self.reason}")

    def utilization_percent(self, ordinal: int) -> float:
        raise GPUUnavailableError(f"no GPU: {self.reason}")

    def close(self) -> None:
        pass


def reason_for_cuda_status(status: int, message: str, environ: Mapping[str, str],
                           driver_loadable: bool) -> str:
    """A user-facing reason for a CUDA runtime error met while counting devices."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if status == CUDA_ERROR_NO_DEVICE:
        if visible is not None:
            return f"disabled by CUDA_VISIBLE_DEVICES={visible!r}"
        return "no CUDA devices"
    if status == CUDA_ERROR_INSUFFICIENT_DRIVER:
        if not driver_loadable:
            return "CUDA driver not found"
        return "CUDA driver is too old for the installed CuPy (cudaErrorInsufficientDriver)"
    return f"CUDA failed to initialise: {message}"


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _pci_bus_id(properties: Mapping[str, Any]) -> str:
    return "{:04x}:{:02x}:{:02x}.0".format(
        properties["pciDomainID"], properties["pciBusID"], properties["pciDeviceID"]
    ).upper()


def _device_info(cupy: Any, ordinal: int) -> DeviceInfo:
    properties = cupy.cuda.runtime.getDeviceProperties(ordinal)
    name = properties["name"]
    return DeviceInfo(
        ordinal=ordinal,
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=(int(properties["major"]), int(properties["minor"])),
        total_memory=int(properties["totalGlobalMem"]),
        pci_bus_id=_pci_bus_id(properties),
    )


def _import_failure(error: Exception) -> str:
    """One line of a failed CuPy import: the original error CuPy's message quotes, else the
    first line of the message, with the exception's type."""
    lines = [line.strip() for line in str(error).splitlines()]
    if "Original error:" in lines[:-1]:
        quoted = lines[lines.index("Original error:") + 1]
        if quoted:
            return quoted
    first = next((line for line in lines if line.strip("=")), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class CudaProbe:
    """Discovery through CuPy, memory and utilisation through NVML (``cudaMemGetInfo`` when
    NVML is missing; utilisation then raises GPUUnavailableError)."""

    def __init__(self) -> None:
        self._cupy: Any = None
        self._nvml: NvmlSession | None = None
        self._nvml_reason = ""
        self._nvml_handles: dict[int, Any] = {}

    def discover(self) -> Discovery:
        try:
            import cupy
        except ModuleNotFoundError as error:
            if error.name == "cupy":
                return Discovery((), "cupy is not installed")
            return Discovery((), f"cupy failed to import: {_import_failure(error)}")
        except Exception as error:  # a broken CuPy install raises many kinds at import
            return Discovery((), f"cupy failed to import: {_import_failure(error)}")
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError as error:
            reason = reason_for_cuda_status(error.status, str(error), os.environ,
                                            _driver_loadable())
            return Discovery((), reason)
        if count == 0:
            return Discovery((), reason_for_cuda_status(CUDA_ERROR_NO_DEVICE, "", os.environ,
                                                        True))
        self._cupy = cupy
        devices = tuple(_device_info(cupy, ordinal) for ordinal in range(count))
        self._open_nvml(devices)
        return Discovery(devices)

    def _open_nvml(self, devices: tuple[DeviceInfo, ...]) -> None:
        try:
            self._nvml = NvmlSession()
        except NvmlUnavailable as error:
            self._nvml_reason = str(error)
            logger.info("NVML unavailable (%s); free memory comes from cudaMemGetInfo", error)
            return
        for device in devices:
            try:
                self._nvml_handles[device.ordinal] = self._nvml.handle_for(device.pci_bus_id)
            except KeyError:
                logger.warning("NVML does not list CUDA device %d at %s", device.ordinal,
                               device.pci_bus_id)

    def free_and_total(self, ordinal: int) -> tuple[int, int]:
        handle = self._nvml_handles.get(ordinal)
        if handle is not None and self._nvml is not None:
            return self._nvml.free_and_total(handle)
        with self._cupy.cuda.Device(ordinal):
            free, total = self._cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def utilization_percent(self, ordinal: int) -> float:
        handle = self._nvml_handles.get(ordinal)
        if self._nvml is None:
            raise GPUUnavailableError(f"GPU utilization needs NVML: {self._nvml_reason}")
        if handle is None:
            raise GPUUnavailableError(f"NVML does not list CUDA device {ordinal}")
        return self._nvml.utilization_percent(handle)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
            self._nvml_handles.clear()
