"""Module-level functions for tests/test_device_workers.py: a device worker process imports a
gpu_map's function by reference, so these live in a module of their own."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import vedart as veda


def scaled_sum(item: dict[str, Any]) -> tuple[Any, str]:
    """A nested item in, a tuple out (the array of a dict, a label passed through)."""
    return item["x"].sum(axis=0) * item["scale"], item["label"]


def fails_on_seven(x: np.ndarray) -> np.ndarray:
    if int(x[0]) == 7:
        raise ArithmeticError("item seven")
    return x * 2


def exits_the_worker(x: np.ndarray) -> np.ndarray:
    if int(x[0]) == 3:
        os._exit(3)  # a worker dying mid-pipeline
    return x


@veda.gpu(force="cpu")
def forced_cpu_pid(x: np.ndarray) -> int:
    """The process that ran the item (a module-level @veda.gpu function travels as itself)."""
    return os.getpid()


class NeedsTwoArguments(Exception):
    """An exception that pickles but cannot be loaded again (its __init__ takes two)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def raises_unloadable(x: np.ndarray) -> np.ndarray:
    raise NeedsTwoArguments("item", str(int(x[0])))


def returns_a_lock(x: np.ndarray) -> Any:
    import threading

    return threading.Lock()  # cannot be pickled back


def pid_of_item(x: np.ndarray) -> int:
    return os.getpid()


def sleeps(x: np.ndarray) -> np.ndarray:
    import time

    time.sleep(0.05)
    return x


def clips_in_place(x: np.ndarray) -> np.ndarray:
    np.clip(x, 0.0, 0.5, out=x)
    return x
