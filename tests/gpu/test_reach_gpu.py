"""Substitution that reaches helpers, on the GPU (``pytest -m gpu``): a user's class whose
methods make arrays, a helper-built matrix and a chain of small functions run on the device
when forced, with NumPy's answers; a helper that cannot run there is named in the reason."""

from __future__ import annotations

from typing import Any

import estimators as est
import numpy as np
import pytest

import vedart as veda
from vedart.bench import workloads

pytestmark = pytest.mark.gpu


def fit_predict(x: Any, y: Any, w: Any, x_new: Any) -> Any:
    return est.WeightedLeastSquares().fit(x, y, w).predict(x_new)


def fitted(x: Any, y: Any, w: Any) -> est.WeightedLeastSquares:
    return est.WeightedLeastSquares().fit(x, y, w)


def predictors(x: Any, y: Any, w: Any) -> Any:
    model = est.WeightedLeastSquares().fit(x, y, w)
    centre = x.mean(axis=0)
    return model.predict, lambda x_new: np.tanh(x_new - centre).sum(axis=1) * model.coef.sum()


def transform(x: Any) -> Any:
    return workloads.correlation(x)


def spectrum(x: Any) -> Any:
    return workloads.naive_spectrum(x)


@pytest.fixture
def data() -> tuple[Any, ...]:
    rng = np.random.default_rng()
    x = rng.random((400, 6))
    return x, x @ rng.random(6) + rng.random(400), rng.random(400) + 0.5, rng.random((50, 6))


def test_a_class_made_inside_the_call_computes_on_the_device(data: tuple[Any, ...]) -> None:
    wrapped = veda.gpu(force="gpu")(fit_predict)
    got = wrapped(*data)
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    np.testing.assert_allclose(got, fit_predict(*data), rtol=1e-8)
    assert type(got) is np.ndarray and got.dtype == np.float64
    assert "estimators.WeightedLeastSquares" in wrapped.explain(*data).helpers


def test_an_object_returned_keeps_its_class_and_holds_numpy_arrays(
        data: tuple[Any, ...]) -> None:
    model = veda.gpu(force="gpu")(fitted)(*data[:3])
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    assert type(model) is est.WeightedLeastSquares
    assert type(model.coef) is np.ndarray
    np.testing.assert_allclose(model.coef, fitted(*data[:3]).coef, rtol=1e-8)


def test_functions_the_call_returns_compute_with_numpy_after_it(data: tuple[Any, ...]) -> None:
    predict, squashed = veda.gpu(force="gpu")(predictors)(*data[:3])
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    assert predict.__func__ is est.WeightedLeastSquares.predict
    want_predict, want_squashed = predictors(*data[:3])
    for got, want in ((predict, want_predict), (squashed, want_squashed)):
        on_host = got(data[3])  # NumPy input, after the call: NumPy's answer
        assert type(on_host) is np.ndarray
        np.testing.assert_allclose(on_host, want(data[3]), rtol=1e-8)


@pytest.mark.parametrize("strength", [0.0, 2.5])
def test_a_dataclass_made_in_the_call_compares_with_one_made_outside_as_on_the_cpu(
        data: tuple[Any, ...], strength: float) -> None:
    x, y = data[:2]
    got = veda.gpu(force="gpu")(est.ridge_fit)(x, y, strength)
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    np.testing.assert_allclose(got, est.ridge_fit(x, y, strength), rtol=1e-8)


@pytest.mark.parametrize(("func", "rtol"), [(spectrum, 1e-9), (transform, 1e-7)])
def test_helper_built_matrices_and_chains_compute_on_the_device(func: Any, rtol: float) -> None:
    rng = np.random.default_rng()
    x = rng.random(1024) if func is spectrum else rng.random((500, 8))
    got = veda.gpu(force="gpu")(func)(x)
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    np.testing.assert_allclose(got, func(x), rtol=rtol, atol=1e-9)


def test_without_reach_the_class_cannot_run_on_the_device(data: tuple[Any, ...]) -> None:
    with pytest.warns(veda.OffloadWarning, match="GPU failed"):
        got = veda.gpu(force="gpu", reach=False)(fit_predict)(*data)
    assert veda.get_runtime().telemetry.recent()[-1].path == "fallback"
    np.testing.assert_allclose(got, fit_predict(*data), rtol=1e-10)


def checksum(x: Any) -> Any:
    return est.byte_total(x * 2)


def test_a_helper_that_fails_on_the_device_is_named_in_the_reason() -> None:
    x = np.random.default_rng().random(8)
    with pytest.warns(veda.OffloadWarning, match=r"GPU failed in helper "
                                                 r"estimators\.byte_total \(TypeError"):
        got = veda.gpu(force="gpu")(checksum)(x)
    record = veda.get_runtime().telemetry.recent()[-1]
    assert record.path == "fallback" and "in helper estimators.byte_total" in record.reason
    assert got == checksum(x)


def whitened(x: Any) -> Any:
    model = est.Whitener(x.shape[1]).fit(x)
    return (x - model.mean) / model.scale @ model.rotation


def test_base_class_methods_reached_through_super_compute_on_the_device() -> None:
    x = np.random.default_rng().random((2000, 5))
    got = veda.gpu(force="gpu", fallback="raise")(whitened)(x)
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    # eigenvectors are unique up to sign: compare the whitened data's covariance
    expected = whitened(x)
    assert type(got) is np.ndarray and got.dtype == expected.dtype == np.float64
    np.testing.assert_allclose(got.T @ got, expected.T @ expected, rtol=1e-7, atol=1e-7)


def summary(x: Any) -> est.Summary:
    return est.Summary(x)


def test_an_object_with_slots_comes_back_as_its_class() -> None:
    x = np.random.default_rng().random((300, 4))
    got = veda.gpu(force="gpu", fallback="raise")(summary)(x)
    assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
    assert type(got) is est.Summary
    assert type(got.low) is np.ndarray and type(got.high) is np.ndarray
    np.testing.assert_array_equal(got.low, x.min(axis=0))
    np.testing.assert_array_equal(got.high, x.max(axis=0))
