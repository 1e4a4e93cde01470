"""Backends: the device API of the CUDABackend seed.

``CUDABackend(device_id=0)`` is one CUDA device; ``CPUBackend()`` is the host, running kernels
in Numba's CUDA simulator. ``get_backend(device_id)`` returns the CUDA backend when CUDA is
usable and the CPU backend otherwise, so code written for one runs on the other.
"""

from __future__ import annotations

from vedart._logging import logger
from vedart.backends.base import Backend
from vedart.backends.cpu import CPUBackend
from vedart.backends.cuda import CUDABackend
from vedart.errors import GPUUnavailableError


def get_backend(device_id: int = 0) -> Backend:
    """A new CUDABackend for ``device_id`` when CUDA is usable, else a CPUBackend (the reason is
    logged at info level). DeviceError for an ordinal that is not a visible device."""
    try:
        return CUDABackend(device_id=device_id)
    except GPUUnavailableError as error:
        logger.info("%s; using the CPU backend", error)
        return CPUBackend()


__all__ = ["Backend", "CPUBackend", "CUDABackend", "get_backend"]
