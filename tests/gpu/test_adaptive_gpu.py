"""The adaptive cost model, the default, on the real GPU: after warm-up it settles on the path
that is measurably faster for a float64 sum and for a large FFT (``pytest -m gpu``). The
profile file is the default one, under the test's own cache directory (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

import vedart as veda
from vedart.bench.harness import median_seconds
from vedart.offload.adaptive import EXPLORE_TRIES

pytestmark = pytest.mark.gpu
WARMUP = 2 * EXPLORE_TRIES + 2


@pytest.fixture()
def adaptive_runtime() -> veda.Runtime:
    runtime = veda.init(veda.Config.builder().build())  # the default configuration
    assert runtime.gpu and runtime.cost_model is not None
    return runtime


def settle(func: object, x: np.ndarray) -> veda.Decision:
    for _ in range(WARMUP):
        func(x)  # type: ignore[operator]
    return func.explain(x)  # type: ignore[attr-defined]


def faster_path(func: object, x: np.ndarray) -> str | None:
    """The path measurably faster end to end (median of 5), or None within 25% of each other."""
    times = {}
    for path in ("cpu", "gpu"):
        with veda.force(path):
            times[path] = median_seconds(lambda: func(x), repeats=5)  # type: ignore[operator]
    ratio = times["cpu"] / times["gpu"]
    return None if 0.8 < ratio < 1.25 else ("gpu" if ratio > 1 else "cpu")


@pytest.mark.parametrize("case", ["sum_float64_32MB", "fft_float32_64MB"])
def test_settles_on_the_measurably_faster_path(adaptive_runtime: veda.Runtime, case: str) -> None:
    rng = np.random.default_rng()
    if case == "sum_float64_32MB":
        func, x = veda.gpu(lambda a: a.sum()), rng.random(4 * 2**20)
    else:
        func, x = veda.gpu(lambda a: np.fft.fft(a)), rng.random(16 * 2**20).astype(np.float32)
    decision = settle(func, x)
    assert decision.model == "adaptive" and "samples)" in decision.reason, decision
    expected = faster_path(func, x)
    assert expected in (None, decision.path), (decision, expected)
    reference = func.__wrapped__(x)
    # float32 FFTs (cuFFT vs pocketfft) differ by a few ulp of the largest component, the DC
    # term (~8e6 here): 0.27 at one of 16M bins on 2026-11-23, against atol 0.1 before.
    np.testing.assert_allclose(func(x), reference, rtol=1e-3,
                               atol=1e-6 * np.abs(reference).max())


def test_profile_survives_a_new_runtime() -> None:
    config = veda.Config.builder().build()
    veda.init(config)
    spectrum = veda.gpu(lambda x: np.fft.fft(x))
    x = np.random.default_rng().random(16 * 2**20).astype(np.float32)
    settle(spectrum, x)
    veda.init(config)  # closes (and saves) the first runtime
    assert "exploring" not in spectrum.explain(x).reason
