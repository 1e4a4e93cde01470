"""A user's own NumPy library, as GPU tests and ``bench helpers`` call it: a class whose
methods make arrays, a helper that builds a matrix, and small functions calling each other."""

from __future__ import annotations

from typing import Any

import numpy as np


class WeightedLeastSquares:
    """Weighted least squares with an intercept: ``fit`` solves (X'WX) b = X'Wy."""

    def __init__(self) -> None:
        self.coef: Any = None

    def _design(self, x: Any) -> Any:
        return np.hstack([np.ones((x.shape[0], 1)), x])

    def fit(self, x: Any, y: Any, w: Any) -> WeightedLeastSquares:
        design = self._design(x)
        weighted = design.T @ np.diag(w)
        self.coef = np.linalg.solve(weighted @ design, weighted @ y)
        return self

    def predict(self, x: Any) -> Any:
        predictions = np.empty(x.shape[0])  # filled in place, as code written for NumPy does
        predictions[:] = self._design(x) @ self.coef
        return predictions


def dft_matrix(n: int) -> Any:
    k = np.arange(n)
    return np.exp(-2j * np.pi * np.outer(k, k) / n)


def naive_dft(x: Any) -> Any:
    return dft_matrix(len(x)) @ x


def centre(x: Any) -> Any:
    return x - x.mean(axis=0)


def covariance(x: Any) -> Any:
    centred = centre(x)
    return centred.T @ centred / (len(x) - 1)


def correlation(x: Any) -> Any:
    scale = np.sqrt(np.diag(covariance(x)))
    return covariance(x) / np.outer(scale, scale)


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
