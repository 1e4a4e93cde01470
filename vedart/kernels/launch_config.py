"""Automatic launch configuration: one thread per element of the sizing array.

An array of ``ndim`` 1, 2 or 3 gets a launch of the same dimensionality, so a kernel indexing
with ``cuda.grid(ndim)`` covers every element: block ``(bx, by, bz)`` with ``bx * by * bz ==
threads_per_block``, as square as ``threads_per_block``'s divisors allow (256 -> 16 x 16,
512 -> 16 x 32, 1024 -> 8 x 8 x 16), and ``grid[d] = ceil(shape[d] / block[d])``. Dimension
``d`` of the array maps to ``cuda.grid``'s component ``d`` (x, y, z), as in ``i, j =
cuda.grid(2); out[i, j]``. Where that grid would pass CUDA's limit along y or z (65535 blocks),
the block gives more of its threads to that dimension (a (2, 1_100_000) array: block 1 x 256
rather than 16 x 16), the fewest threads launched among the splits that fit.
"""

from __future__ import annotations

import functools
import math

from vedart.backends.dims import CUDA_LIMITS, LaunchDims

MAX_AUTO_DIMENSIONS = 3


def split_threads(threads: int, parts: int) -> tuple[int, ...]:
    """``threads`` as ``parts`` factors whose product is ``threads``, smallest first, each the
    largest divisor not above the remaining geometric share (so as equal as divisors allow)."""
    factors = []
    remaining = threads
    for left in range(parts, 1, -1):
        share = round(remaining ** (1 / left), 9)
        factor = max(d for d in range(1, math.floor(share) + 1) if remaining % d == 0)
        factors.append(factor)
        remaining //= factor
    factors.append(remaining)
    return tuple(factors)


@functools.lru_cache(maxsize=1024)
def auto_dims(shape: tuple[int, ...], threads_per_block: int) -> LaunchDims:
    """The launch covering every element of an array of ``shape`` (1 to 3 dimensions, no
    zero extent; a 0-d array counts as one element) with ``threads_per_block`` threads a block."""
    extents = shape or (1,)
    block = split_threads(threads_per_block, len(extents))
    if not _fits(extents, block):
        fitting = [split for split in _splits(threads_per_block, len(extents))
                   if _fits(extents, split)]
        if fitting:  # else the square split, which the device's check refuses by name
            block = min(fitting, key=lambda split: math.prod(_grid(extents, split)))
    pad = (1,) * (3 - len(extents))
    return LaunchDims(grid=(_grid(extents, block) + pad)[:3],  # type: ignore[arg-type]
                      block=(block + pad)[:3])


def _grid(extents: tuple[int, ...], block: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(-(-extent // size) for extent, size in zip(extents, block))


def _fits(extents: tuple[int, ...], block: tuple[int, ...]) -> bool:
    """Whether ``block`` and its grid over ``extents`` are within CUDA's limits."""
    return all(size <= most for size, most in zip(block, CUDA_LIMITS.max_block)) and all(
        blocks <= most for blocks, most in zip(_grid(extents, block), CUDA_LIMITS.max_grid))


def _splits(threads: int, parts: int) -> list[tuple[int, ...]]:
    """Every way of writing ``threads`` as ``parts`` ordered factors."""
    if parts == 1:
        return [(threads,)]
    return [(factor, *rest) for factor in range(1, threads + 1) if threads % factor == 0
            for rest in _splits(threads // factor, parts - 1)]
