"""User code for ``bench helpers``, written as a NumPy user writes a library of their own: a
class-based estimator whose methods make arrays, a matrix built by a helper, and small
functions calling each other. Nothing here knows about vedart or CuPy; ``bench helpers`` ports
this very module to CuPy by hand (its source with ``import cupy as np``) for the baseline."""

from __future__ import annotations

from typing import Any

import numpy as np


class WeightedLeastSquares:
    """Weighted least squares with an intercept: ``fit`` solves (X'WX) b = X'Wy."""

    def __init__(self) -> None:
        self.coef: Any = None

    def design(self, x: Any) -> Any:
        return np.hstack([np.ones((x.shape[0], 1), dtype=x.dtype), x])

    def fit(self, x: Any, y: Any, w: Any) -> WeightedLeastSquares:
        design = self.design(x)
        weighted = design.T @ np.diag(w)
        self.coef = np.linalg.solve(weighted @ design, weighted @ y)
        return self

    def predict(self, x: Any) -> Any:
        return self.design(x) @ self.coef


def fit_and_predict(x: Any, y: Any, w: Any, x_new: Any) -> Any:
    return WeightedLeastSquares().fit(x, y, w).predict(x_new)


def dft_matrix(n: int) -> Any:
    k = np.arange(n)
    return np.exp(-2j * np.pi * np.outer(k, k) / n)


def naive_spectrum(x: Any) -> Any:
    """|DFT(x)| the O(N^2) way: a matrix from a helper, times the signal."""
    return np.abs(dft_matrix(len(x)) @ x)


def centre(x: Any) -> Any:
    return x - x.mean(axis=0)


def covariance(x: Any) -> Any:
    centred = centre(x)
    return centred.T @ centred / (len(x) - 1)


def correlation(x: Any) -> Any:
    cov = covariance(x)
    scale = np.sqrt(np.diag(cov))
    return cov / np.outer(scale, scale)
