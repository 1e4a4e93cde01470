"""Module-level functions for tests/test_dask.py: Dask workers import them by reference."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

import vedart as veda


def square(x: int) -> int:
    return x * x


def is_even(x: int) -> bool:
    return x % 2 == 0


def repeat_twice(x: int) -> list[int]:
    return [x, x]


def with_pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


def slow_identity(x: int) -> int:
    time.sleep(0.01)
    return x


def fails_on_seven(x: int) -> int:
    if x == 7:
        raise ArithmeticError("item seven")
    return x


@veda.gpu
def scaled_column_sums(matrix: np.ndarray) -> np.ndarray:
    return (matrix * 2.0).sum(axis=0)


def worker_gpu_decision() -> tuple[bool, str]:
    """Whether this worker's vedart runtime may use a GPU (``Config.gpu``), and the reason a
    @gpu call on a large array gives there."""
    from vedart import lifecycle

    runtime = lifecycle.current
    assert runtime is not None
    return runtime.config.gpu, scaled_column_sums.explain(np.ones((1000, 1000))).reason


def worker_threshold() -> int:
    """The offload threshold of the calling process's vedart runtime."""
    return veda.get_runtime().config.offload_threshold


def returns_a_generator(x: int) -> Any:
    return (value for value in range(x))


def same_array(matrix: np.ndarray) -> np.ndarray:
    """The item itself: in a worker, a view of the memory the item arrived in."""
    return matrix


def held_total(holder: Any) -> float:
    """The sum of the ``matrix`` attribute of ``holder`` (an object of any class)."""
    return float(holder.matrix.sum())


def overwrite_late_unless_first(values: np.ndarray) -> int:
    """Fails at once on an item starting with 0; else writes over its item after a second, as
    a task cancelled meanwhile still does on its worker."""
    if values[0] == 0:
        raise ValueError("the first item fails at once")
    time.sleep(1.0)
    values[:] = -1.0
    return 0


def slow_total(values: np.ndarray) -> float:
    time.sleep(1.5)
    return float(values.sum())


def half_second_identity(x: int) -> int:
    time.sleep(0.5)
    return x


def short_identity(x: int) -> int:
    """Quicker than a result wait's poll (POLL_S)."""
    time.sleep(0.02)
    return x


class TwoArgumentError(Exception):
    """Pickles (as its one message) but does not load back: ``__init__`` wants two."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def fails_on_three_with_an_error_that_does_not_load(x: int) -> int:
    if x == 3:
        raise TwoArgumentError("item three", 3)
    return x


def pair_up(x: int) -> list[tuple[int, int]]:
    return [(x, 0), (x, 1)]


def fails_on_one_zero(pair: tuple[int, int]) -> tuple[int, int]:
    if pair == (1, 0):
        raise ValueError("the pair (1, 0)")
    return pair


class DoesNotLoad:
    """Pickles as a call that fails when the pickle is loaded."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return int, ("not a number",)


def interrupts_on_three(x: int) -> int:
    """``x``; KeyboardInterrupt on 3 (as a Ctrl-C inside the function would)."""
    if x == 3:
        raise KeyboardInterrupt("stop at 3")
    return x


def exits_on_three(x: int) -> int:
    """``x``; SystemExit on 3 (a ``sys.exit()`` inside the function)."""
    if x == 3:
        raise SystemExit("stop at 3")
    return x


def same_unless_none(item: Any) -> Any:
    """The item itself; ValueError for None."""
    if item is None:
        raise ValueError("no item")
    return item


def big_endian_arrays(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A strided big-endian int array, a big-endian timedelta array of ``n`` values and its
    Fortran-ordered 2-D form, made in the worker (arrays NumPy pickles in band)."""
    return (np.arange(2 * n, dtype=">i4")[::2], np.arange(n).astype(">m8[s]"),
            np.arange(2 * n).reshape(2, n).astype(">m8[s]").T)
