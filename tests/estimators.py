"""A user's own NumPy library, as the GPU tests of reach call it (with
:mod:`vedart.bench.workloads`): estimator classes whose methods make arrays, a base class
reached through ``super()``, a class with ``__slots__``, and a helper that cannot run on the
device."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from vedart.bench import workloads


class WeightedLeastSquares(workloads.WeightedLeastSquares):
    """The bench's estimator, its predictions filled in place as code written for NumPy does
    (``np.empty``, then ``[:] =``): without reach that fails on the device."""

    def predict(self, x: Any) -> Any:
        predictions = np.empty(x.shape[0])
        predictions[:] = self.design(x) @ self.coef
        return predictions


def byte_total(x: Any) -> int:
    """Reads its argument's bytes through the buffer protocol, which only host arrays have:
    on the device it cannot work."""
    return int(np.frombuffer(memoryview(np.ascontiguousarray(x)), dtype=np.uint8).sum())


class Standardiser:
    """A base class whose ``__init__`` makes arrays, as estimator bases do."""

    def __init__(self, features: int) -> None:
        self.mean = np.zeros(features)
        self.scale = np.ones(features)

    def fit(self, x: Any) -> Standardiser:
        self.mean = self.mean + x.mean(axis=0)  # the arrays __init__ made, in use
        self.scale = self.scale * x.std(axis=0)
        return self


class Whitener(Standardiser):
    """Reaches its base's ``__init__`` and ``fit`` through ``super()``."""

    def __init__(self, features: int) -> None:
        super().__init__(features)
        self.rotation = np.eye(features)

    def fit(self, x: Any) -> Whitener:
        super().fit(x)
        centred = (x - self.mean) / self.scale
        _, vectors = np.linalg.eigh(centred.T @ centred / len(x))
        self.rotation = vectors
        return self


class Summary:
    """Holds its arrays in slots: its objects have no ``__dict__``."""

    __slots__ = ("low", "high")

    def __init__(self, x: Any) -> None:
        self.low = np.min(x, axis=0) + np.zeros(x.shape[1])
        self.high = np.max(x, axis=0)


@dataclasses.dataclass(frozen=True, order=True)
class Penalty:
    """A dataclass of settings, compared with a default made at import (outside any call)."""

    strength: float = 1.0

    def ridge(self, features: int) -> Any:
        return np.eye(features) * self.strength


NO_PENALTY = Penalty(0.0)


def ridge_fit(x: Any, y: Any, strength: float) -> Any:
    """A ridge fit whose penalty is skipped when it equals the default made at import."""
    penalty = Penalty(strength)
    gram = x.T @ x
    if penalty != NO_PENALTY and penalty > NO_PENALTY:
        gram = gram + penalty.ridge(x.shape[1])
    return np.linalg.solve(gram, x.T @ y)
