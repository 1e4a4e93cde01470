"""Launch dimensions: normalising ``grid`` / ``block`` values and checking them against a
device's limits, with errors that name the kernel, the value and what is allowed.

Both backends and @gpu_kernel validate through here, so a bad configuration fails the same way
on a GPU, in the simulator and on a CPU.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from vedart.errors import KernelLaunchError

Dim3 = tuple[int, int, int]
_ALLOWED_DIMS = "an int >= 1 or a tuple of 1 to 3 ints >= 1"


@dataclass(frozen=True)
class LaunchDims:
    """A normalised launch configuration: blocks per grid and threads per block, as (x, y, z)."""

    grid: Dim3
    block: Dim3

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)


@dataclass(frozen=True)
class LaunchLimits:
    """What one device accepts. The defaults are CUDA's limits for every compute capability
    since 2.0 (what the simulator enforces); ``device`` names the device in messages."""

    max_threads_per_block: int = 1024
    max_block: Dim3 = (1024, 1024, 64)
    max_grid: Dim3 = (2**31 - 1, 65535, 65535)
    device: str = "CUDA devices"

    def check(self, kernel: str, dims: LaunchDims) -> LaunchDims:
        """``dims`` when this device can launch it, else KernelLaunchError naming the limit."""
        (bx, by, bz), (gx, gy, gz) = dims.block, dims.grid
        most_block, most_grid = self.max_block, self.max_grid
        if bx * by * bz <= self.max_threads_per_block and bx <= most_block[0] and \
                by <= most_block[1] and bz <= most_block[2] and gx <= most_grid[0] and \
                gy <= most_grid[1] and gz <= most_grid[2]:  # every launch pays this test
            return dims
        threads = dims.threads_per_block
        if threads > self.max_threads_per_block:
            raise KernelLaunchError(
                f"{kernel}: block: got {_shown(dims.block)} = {threads} threads; allowed: at most "
                f"{self.max_threads_per_block} threads per block on {self.device}")
        for what, value, limit in (("block", dims.block, self.max_block),
                                   ("grid", dims.grid, self.max_grid)):
            if any(size > most for size, most in zip(value, limit)):
                raise KernelLaunchError(
                    f"{kernel}: {what}: got {_shown(value)}; allowed: at most {limit} per "
                    f"dimension (x, y, z) on {self.device}")
        return dims


CUDA_LIMITS = LaunchLimits()


def as_dim3(kernel: str, what: str, value: Any) -> Dim3:
    """``value`` (an int or a tuple/list of 1 to 3 ints, each >= 1) as an (x, y, z) triple;
    ``what`` ("grid" or "block") names it in the KernelLaunchError raised otherwise."""
    sizes = (value,) if isinstance(value, numbers.Integral) else value
    if not isinstance(sizes, (tuple, list)) or not 1 <= len(sizes) <= 3 or not all(
            isinstance(size, numbers.Integral) and not isinstance(size, bool) for size in sizes):
        raise KernelLaunchError(f"{kernel}: {what}: got {value!r}; allowed: {_ALLOWED_DIMS}")
    if any(size < 1 for size in sizes):
        raise KernelLaunchError(f"{kernel}: {what}: got {value!r}; allowed: sizes >= 1 "
                                f"({_ALLOWED_DIMS})")
    padded = [int(size) for size in sizes] + [1] * (3 - len(sizes))
    return padded[0], padded[1], padded[2]


def launch_dims(kernel: str, grid: Any, block: Any) -> LaunchDims:
    """Normalised ``grid`` and ``block`` (see :func:`as_dim3`); limits are checked separately,
    per device, with :meth:`LaunchLimits.check`."""
    return LaunchDims(as_dim3(kernel, "grid", grid), as_dim3(kernel, "block", block))


def _shown(dims: Dim3) -> tuple[int, ...]:
    """``dims`` without trailing 1s, as a user would write it: (256,) rather than (256, 1, 1)."""
    end = 3
    while end > 1 and dims[end - 1] == 1:
        end -= 1
    return dims[:end]
