"""Functions defined at module level, as users write them, for substitution tests."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy import zeros as module_zeros

SCALE = 2.0
counter = 0


def uses_module_numpy(n: int) -> Any:
    return np.zeros(n) + SCALE


def uses_from_import(n: int) -> Any:
    return module_zeros(n)


def imports_inside(n: int) -> Any:
    import numpy as np2
    from numpy import zeros

    return np2.zeros(n) + zeros(n)


def nested_lambda(n: int) -> Any:
    make = lambda k: np.zeros(k)  # noqa: E731 - the nested-code case
    return make(n)


def with_defaults(n: int, fill: float = 1.5, *, extra: float = 0.5) -> Any:
    return np.ones(n) * fill + extra


def closure_maker(offset: float) -> Any:
    def inner(x: np.ndarray) -> Any:
        return x + offset

    return inner


def factorial(n: int) -> int:
    return 1 if n <= 1 else n * factorial(n - 1)


def bump_counter() -> int:
    global counter
    counter += 1
    return counter


def scipy_filter(image: np.ndarray, kernel: np.ndarray) -> Any:
    from scipy.ndimage import convolve

    return convolve(image, kernel)


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def scale(self, x: np.ndarray) -> Any:
        return np.zeros(x.shape) + x * self.factor


partial_scale = functools.partial(with_defaults, fill=3.0)
