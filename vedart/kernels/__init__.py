"""Raw Numba CUDA kernels under vedart: ``@gpu_kernel`` handles, the registry, ``get_kernel``.

See docs/kernels.md. Launches go through :mod:`vedart.backends` (the one device code path);
without a GPU a kernel runs its ``cpu=`` implementation or Numba's CUDA simulator.
"""

from vedart.kernels.registry import (
    KERNELS,
    KernelHandle,
    KernelRegistry,
    get_kernel,
    gpu_kernel,
)

__all__ = ["KERNELS", "KernelHandle", "KernelRegistry", "get_kernel", "gpu_kernel"]
