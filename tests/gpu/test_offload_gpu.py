"""@veda.gpu on the real GPU: the seed guide's snippets, substitution, fallback, mutation,
and a property test comparing the GPU path with the CPU path (``pytest -m gpu``)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vedart as veda
from vedart.demo import monte_carlo_pi, train_step  # the seed guide's snippets

pytestmark = pytest.mark.gpu


def last(func: Any) -> tuple[str, str]:
    """The last decision of ``func``: a @gpu wrapper, or a function a test wrapped in turn."""
    name = getattr(func, "display_name", f"{func.__module__}.{func.__qualname__}")
    decision = veda.get_runtime().telemetry.function(name).last_decision()
    assert decision is not None
    return decision


def assert_same(gpu_value: Any, cpu_value: Any, rtol: float = 1e-7, atol: float = 0.0) -> None:
    """Same type, same dtype, same values within tolerance, recursively through tuples."""
    assert type(gpu_value) is type(cpu_value), (type(gpu_value), type(cpu_value))
    if isinstance(cpu_value, (tuple, list)):
        assert len(gpu_value) == len(cpu_value)
        for g, c in zip(gpu_value, cpu_value):
            assert_same(g, c, rtol, atol)
        return
    assert np.asarray(gpu_value).dtype == np.asarray(cpu_value).dtype
    np.testing.assert_allclose(gpu_value, cpu_value, rtol=rtol, atol=atol)


# --- the seed guide's snippets --------------------------------------------------------------

@veda.gpu
def matrix_multiply(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Automatically uses GPU if beneficial."""
    return A @ B


@veda.gpu
def vector_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


@veda.gpu
def efficient_operation(X: np.ndarray) -> np.ndarray:
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    normalized = (X - mean) / std
    return normalized @ normalized.T


@veda.gpu
def apply_filter(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    from scipy.ndimage import convolve

    return convolve(image, kernel)


def test_matrix_multiply_small_runs_on_cpu_large_on_gpu() -> None:
    rng = np.random.default_rng()
    small = rng.random((10, 10)), rng.random((10, 10))
    assert_same(matrix_multiply(*small), small[0] @ small[1])
    assert last(matrix_multiply) == ("cpu", "below threshold: 1.6 KB < 1.0 MB")
    large = rng.random((5000, 5000)), rng.random((5000, 5000))
    assert_same(matrix_multiply(*large), matrix_multiply.__wrapped__(*large), rtol=1e-10)
    path, reason = last(matrix_multiply)
    # The device with the most free memory: on a fresh two-GPU host, device 1.
    assert path == "gpu" and re.match(r"400\.0 MB >= threshold 1\.0 MB; device \d+ has ", reason)


def test_vector_add_small_and_large() -> None:
    assert_same(vector_add(np.array([1, 2, 3]), np.array([4, 5, 6])), np.array([5, 7, 9]))
    assert last(vector_add)[0] == "cpu"
    rng = np.random.default_rng()
    a, b = rng.integers(-1000, 1000, 2_000_000), rng.integers(-1000, 1000, 2_000_000)
    assert_same(vector_add(a, b), a + b)
    assert last(vector_add)[0] == "gpu"


def test_efficient_operation() -> None:
    X = np.random.default_rng().random((2000, 500))
    assert_same(efficient_operation(X), efficient_operation.__wrapped__(X), rtol=1e-9, atol=1e-9)
    assert last(efficient_operation)[0] == "gpu"


def test_train_step_returns_numpy_scalar_and_array() -> None:
    rng = np.random.default_rng()
    X, y, w = rng.random((20000, 100)), rng.random(20000), rng.random(100)
    gpu_loss, gpu_grad = train_step(X, y, w)
    assert last(train_step)[0] == "gpu"
    cpu_loss, cpu_grad = train_step.__wrapped__(X, y, w)
    assert type(gpu_loss) is np.float64
    assert_same((gpu_loss, gpu_grad), (cpu_loss, cpu_grad), rtol=1e-9)


def test_monte_carlo_pi_draws_on_the_gpu() -> None:
    with veda.force("gpu"):  # the demo's function learns its path; here it is made to draw
        estimate = monte_carlo_pi(10_000_000)
    assert last(monte_carlo_pi) == ("gpu", 'forced by veda.force("gpu")')
    assert type(estimate) is type(monte_carlo_pi.__wrapped__(1000)) is np.float64
    assert abs(estimate - np.pi) < 0.005


def test_apply_filter_uses_cupyx_scipy() -> None:
    from scipy.ndimage import convolve

    rng = np.random.default_rng()
    image, kernel = rng.random((1024, 1024)).astype(np.float32), rng.random((5, 5)).astype(np.float32)
    assert_same(apply_filter(image, kernel), convolve(image, kernel), rtol=1e-5, atol=1e-5)
    assert last(apply_filter)[0] == "gpu"


# --- decisions, fallback, mutation ------------------------------------------------------------

def test_api_cupy_lacks_falls_back_with_the_reason() -> None:
    @veda.gpu(force="gpu")
    def percentile(x: np.ndarray) -> Any:
        return np.nanpercentile(x, 50)

    x = np.random.default_rng().random(1000)
    with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
        assert_same(percentile(x), np.nanpercentile(x, 50))
    path, reason = last(percentile)
    assert path == "fallback" and "no implementation found for 'numpy.nanpercentile'" in reason


def test_missing_ufunc_falls_back() -> None:
    @veda.gpu(force="gpu")
    def spacing(x: np.ndarray) -> np.ndarray:
        return np.spacing(x)

    x = np.random.default_rng().random(100)
    with pytest.warns(veda.OffloadWarning):
        assert_same(spacing(x), np.spacing(x))
    assert last(spacing)[0] == "fallback"


def test_what_cupy_arrays_cannot_do_falls_back_to_the_cpu_answer() -> None:
    """A method CuPy's arrays lack, raised in the user's own frame, and an array of strings,
    which CuPy cannot hold: both work on the CPU, so both re-run there."""
    @veda.gpu(force="gpu")
    def padded(x: np.ndarray) -> np.ndarray:
        y = x.copy()
        y.resize(x.size + 3, refcheck=False)
        return y

    @veda.gpu(force="gpu")
    def labelled(x: np.ndarray) -> np.ndarray:
        return np.array(["low", "high"])[(x > 0.5).astype(np.int64)]

    x = np.random.default_rng(17).random(1000)
    for function in (padded, labelled):
        with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
            result = function(x)
        expected = function.__wrapped__(x)
        assert type(result) is np.ndarray and result.dtype == expected.dtype
        np.testing.assert_array_equal(result, expected)
        assert last(function)[0] == "fallback"


def test_linalg_results_have_numpys_named_tuple_types_on_the_gpu() -> None:
    @veda.gpu(force="gpu")
    def spectrum(m: np.ndarray) -> Any:
        return np.linalg.eigh(m).eigenvalues, np.linalg.svd(m), np.linalg.slogdet(m)

    m = np.random.default_rng(19).random((64, 64))
    m = m + m.T
    gpu_values, gpu_svd, gpu_slogdet = spectrum(m)
    assert last(spectrum)[0] == "gpu"
    cpu_values, cpu_svd, cpu_slogdet = spectrum.__wrapped__(m)
    assert type(gpu_svd) is type(cpu_svd) and type(gpu_slogdet) is type(cpu_slogdet)
    assert_same(gpu_values, cpu_values, rtol=1e-10, atol=1e-10)
    assert_same(gpu_svd.S, cpu_svd.S, rtol=1e-10, atol=1e-10)
    assert_same(gpu_slogdet.logabsdet, cpu_slogdet.logabsdet, rtol=1e-10)
    assert gpu_slogdet.sign == cpu_slogdet.sign


def well_conditioned(n: int, dtype: Any, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.random((n, n)) + n * np.eye(n)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.random((n, n))
    return a.astype(dtype)


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64),
                                    (np.complex64, np.complex64),
                                    (np.complex128, np.complex128), (np.float32, np.float64),
                                    (np.complex64, np.float32), (np.int64, np.float64)])
def test_solve_and_inv_equal_numpys_in_every_layout(dtypes: tuple[Any, Any]) -> None:
    """One matrix in C and F order and as a strided view, one and several right-hand sides,
    mixed dtypes, and an integer matrix (CuPy's own checked functions)."""
    @veda.gpu(force="gpu", fallback="raise")
    def solved(a: np.ndarray, b: np.ndarray) -> Any:
        return (np.linalg.solve(a, b), np.linalg.solve(a, b[:, 0]), np.linalg.solve(a.T, b),
                np.linalg.solve(a[::2, ::2], b[::2, 1]), np.linalg.inv(a), np.linalg.inv(a.T),
                np.linalg.inv(a[::2, ::2]))

    a = well_conditioned(40, np.float64, 23).round(1) * 10 if dtypes[0] is np.int64 else \
        well_conditioned(40, dtypes[0], 23)
    a = a.astype(dtypes[0])
    b = np.random.default_rng(24).random((40, 3)).astype(dtypes[1])
    got, expected = solved(a, b), solved.__wrapped__(a, b)
    assert last(solved)[0] == "gpu"
    single = np.float32 in dtypes or np.complex64 in dtypes
    assert_same(got, expected, rtol=1e-4 if single else 1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
def test_a_singular_matrix_to_solve_or_inv_raises_linalg_error(dtype: type) -> None:
    """With ``fallback="raise"`` the GPU's LinAlgError comes as OffloadError (also where the
    system has solutions: every division by the zero pivot one of a zero), and NumPy's own
    error reaches a caller on the default fallback."""
    def solved(a: np.ndarray, b: np.ndarray) -> Any:
        return np.linalg.solve(a, b), np.linalg.solve(a, b[:, 0]), np.linalg.inv(a)

    def inverse(a: np.ndarray) -> Any:
        return np.linalg.inv(a)

    b = np.random.default_rng(25).random((40, 3)).astype(dtype)
    singular = well_conditioned(40, dtype, 26)
    singular[:, 7] = 0  # LU meets an exact zero pivot in column 7
    consistent = np.ones((2, 2), dtype)  # b in its range: x = (1, 0) would do, NumPy raises
    for function, arguments in ((solved, (singular, b)), (inverse, (singular,)),
                                (solved, (consistent, np.ones((2, 3), dtype)))):
        with pytest.raises(veda.OffloadError, match="LinAlgError") as raised:  # on the GPU
            veda.gpu(force="gpu", fallback="raise")(function)(*arguments)
        assert isinstance(raised.value.__cause__, np.linalg.LinAlgError)
        with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
            veda.gpu(force="gpu")(function)(*arguments)


@pytest.mark.parametrize("device", [0, 1])
def test_a_singular_matrix_caught_by_the_function_is_caught_as_numpy_catches_it(
        device: int) -> None:
    """A loop of solves whose function catches LinAlgError for one singular matrix answers as
    NumPy does, on the GPU, with ``fallback="raise"``."""
    if device >= len(veda.get_runtime().gpu.devices):  # type: ignore[union-attr]
        pytest.skip("needs 2 GPUs")

    @veda.gpu(force="gpu", fallback="raise", device=device)
    def solve_each(a: np.ndarray, b: np.ndarray) -> Any:
        solutions = []
        for k in range(40):
            try:
                solutions.append(np.linalg.solve(a * (k != 17), b))
            except np.linalg.LinAlgError:
                solutions.append(np.full_like(b, np.nan))
        return np.stack(solutions)

    a, b = well_conditioned(30, np.float64, 27), np.random.default_rng(28).random(30)
    assert_same(solve_each(a, b), solve_each.__wrapped__(a, b), rtol=1e-10)
    assert last(solve_each)[0] == "gpu"
    np.testing.assert_allclose(solve_each(a, 2 * b)[16], 2 * np.linalg.solve(a, b), rtol=1e-10)


def shrink_until_small(a: np.ndarray, x: np.ndarray) -> Any:
    """Solves until the answer is small: for ever on a singular matrix's NaN, where NumPy
    raises at the first solve."""
    steps = 0
    while not np.abs(x).max() < 1e-12:
        x = np.linalg.solve(a, x)
        steps += 1
    return x, steps


def halve_until_small(a: np.ndarray, b: np.ndarray) -> Any:
    """One solve, then a loop without any: for ever on a singular matrix's infinities."""
    x = np.linalg.solve(a, b)
    while np.abs(x).max() > 1:
        x = x / 2
    return x


@pytest.mark.parametrize("function", [shrink_until_small, halve_until_small])
def test_a_loop_on_a_singular_matrixs_result_ends_as_under_numpy(
        function: Callable[..., Any]) -> None:
    """NumPy raises at the singular solve; a loop on what the solve left would never end."""
    a, x = well_conditioned(20, np.float64, 29), 1e3 * np.random.default_rng(30).random(20)
    assert_same(veda.gpu(force="gpu")(function)(a, x), function(a, x), rtol=1e-8, atol=1e-300)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])  # cuSOLVER leaves infinities for x[:2]
    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
        veda.gpu(force="gpu")(function)(singular, x[:2])
    with pytest.raises(veda.OffloadError, match="LinAlgError"):
        veda.gpu(force="gpu", fallback="raise")(function)(singular, x[:2])


solves_seen = 0


def solve_and_count(a: np.ndarray, b: np.ndarray) -> Any:
    """Assigns a module global, so it is not cloned: its ``np.linalg`` calls reach CuPy's
    through NumPy's dispatch."""
    global solves_seen
    solves_seen += 1
    return np.linalg.solve(a, b), np.linalg.inv(a)


def solve_in_a_helper(a: np.ndarray, b: np.ndarray) -> Any:
    return solve_and_count(a, b)


@pytest.mark.parametrize("reach", [True, False])
def test_a_singular_matrix_in_code_run_with_dispatch_alone_raises_as_numpy(reach: bool) -> None:
    """Code the substitution does not reach gets CuPy's own solve and inv, which by default
    return what cuSOLVER left for a singular matrix; during a GPU call they raise, as NumPy's
    do, and the thread's CuPy error mode is as it was afterwards."""
    import cupyx

    a, b = well_conditioned(40, np.float64, 31), np.random.default_rng(32).random(40)
    solved = veda.gpu(force="gpu", reach=reach)(solve_in_a_helper)
    assert_same(solved(a, b), solve_in_a_helper(a, b), rtol=1e-10)
    assert last(solve_in_a_helper)[0] == "gpu"
    singular = a.copy()
    singular[:, 7] = 0
    with pytest.raises(veda.OffloadError, match="LinAlgError"):
        veda.gpu(force="gpu", fallback="raise", reach=reach)(solve_in_a_helper)(singular, b)
    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
        solved(singular, b)
    assert cupyx.geterr()["linalg"] == "ignore"


def inverse_of(a: np.ndarray) -> Any:
    return np.linalg.inv(a)


def test_a_nan_matrix_cupys_check_rejects_is_answered_as_numpy_answers_it() -> None:
    """CuPy's checked ``inv`` raises for a matrix of NaN, where NumPy returns NaN: the call
    re-runs on the CPU, says why, and answers as NumPy does."""
    nans = np.full((16, 16), np.nan)
    with pytest.warns(veda.OffloadWarning, match="LinAlgError"):
        got = veda.gpu(force="gpu")(inverse_of)(nans)
    assert_same(got, inverse_of(nans))
    assert last(inverse_of)[0] == "fallback"


def test_gpu_map_items_with_a_singular_matrix_answer_as_numpy() -> None:
    @veda.gpu(force="gpu")
    def solve_or_nan(a: np.ndarray) -> Any:
        try:
            return np.linalg.solve(a, np.ones(len(a)))
        except np.linalg.LinAlgError:
            return np.full(len(a), np.nan)

    items = [well_conditioned(64, np.float64, seed) for seed in range(24)]
    items[5][:, 3] = 0
    got = veda.par_iter(items).gpu_map(solve_or_nan).collect()
    for value, item in zip(got, items):
        assert_same(value, solve_or_nan.__wrapped__(item), rtol=1e-10)
    assert np.isnan(got[5]).all() and not np.isnan(got[6]).any()


def test_out_of_memory_falls_back_to_cpu_and_raise_mode_raises() -> None:
    device_bytes = veda.get_runtime().gpu.devices[0].total_memory  # type: ignore[union-attr]
    scratch_bytes = int(device_bytes * 1.1)  # more than the GPU has; lazy (virtual) on the host

    def big_scratch(x: np.ndarray) -> Any:
        scratch = np.empty(scratch_bytes, dtype=np.uint8)
        return x.sum() + scratch.size * 0

    x = np.random.default_rng().random(1000)
    on_gpu = veda.gpu(force="gpu")(big_scratch)
    with pytest.warns(veda.OffloadWarning):
        assert_same(on_gpu(x), x.sum())
    path, reason = last(big_scratch)
    assert path == "fallback" and "OutOfMemoryError" in reason
    with pytest.raises(veda.OffloadError, match="OutOfMemoryError") as caught:
        veda.gpu(force="gpu", fallback="raise")(big_scratch)(x)
    assert type(caught.value.__cause__).__name__ == "OutOfMemoryError"


def test_input_larger_than_free_device_memory_runs_on_cpu() -> None:
    @veda.gpu
    def corner(x: np.ndarray) -> Any:
        return x[0, :5].sum()

    huge = np.broadcast_to(np.float64(1.5), (200_000, 100_000))  # 160 GB logical, no memory
    assert corner(huge) == np.float64(7.5)
    path, reason = last(corner)
    # the device with the most free memory: not always 0 on a machine with two GPUs
    assert path == "cpu" and re.match(r"device \d+ has .* needs 320\.0 GB \(2\.0x inputs\)$",
                                      reason), reason


def test_user_exceptions_rerun_on_the_cpu_and_raise_as_they_would_there() -> None:
    calls = []

    @veda.gpu(force="gpu")
    def checked(x: np.ndarray) -> np.ndarray:
        calls.append(type(x).__module__.split(".")[0])
        if x.shape[0] != 3:
            raise ValueError("need three rows")
        return x

    with pytest.raises(ValueError, match="need three rows") as caught:
        checked(np.random.default_rng().random((4, 2)))
    assert calls == ["cupy", "numpy"]
    assert caught.value.__context__ is None


def test_small_inputs_go_through_pinned_copies_that_return_to_the_pool() -> None:
    import gc

    engine = veda.get_runtime().gpu.transfers  # type: ignore[union-attr]
    copied = []
    pinned_copy = engine._pinned_copy
    engine._pinned_copy = lambda array: copied.append(array.shape) or pinned_copy(array)
    try:
        @veda.gpu(force="gpu")
        def scaled_product(a: np.ndarray, b: np.ndarray, fail: bool = False) -> np.ndarray:
            if fail:
                raise ValueError("asked to fail")
            return (a @ b) * 3.0

        rng = np.random.default_rng()
        a, b = rng.random((60, 70)), np.asfortranarray(rng.random((70, 50)))
        np.testing.assert_allclose(scaled_product(a, b), (a @ b) * 3.0)  # warm: blocks cached
        gc.collect()
        held = engine.pinned.used_bytes
        copied.clear()
        np.testing.assert_allclose(scaled_product(a, b), (a @ b) * 3.0)
        assert veda.get_runtime().telemetry.recent()[-1].path == "gpu"
        assert copied == [(60, 70), (70, 50)]
        with pytest.raises(ValueError, match="asked to fail"):  # the GPU try, then the CPU's
            scaled_product(a, b, True)
        gc.collect()
        assert engine.pinned.used_bytes == held  # every block back, the failed call's too
    finally:
        del engine._pinned_copy


def test_writes_are_copied_back_stated_or_found_in_the_code() -> None:
    def scale_into(a: np.ndarray, out: np.ndarray) -> None:
        out[:] = a * 2
        a[:] = 0  # not stated: found in the code

    rng = np.random.default_rng()
    a, out = rng.random(300_000), rng.random(300_000)
    a_before = a.copy()
    veda.gpu(writes=("out",))(scale_into)(a, out)
    np.testing.assert_array_equal(out, a_before * 2)
    np.testing.assert_array_equal(a, np.zeros_like(a))
    assert last(scale_into)[0] == "gpu"


def centre(x: np.ndarray) -> np.ndarray:
    x -= x.mean(axis=0)
    return x


def zero_the_negatives(x: np.ndarray) -> float:
    x[x < 0] = 0
    return float(x.sum())


def clip_into(x: np.ndarray) -> None:
    np.clip(x, -0.5, 0.5, out=x)


def sort_the_rows(x: np.ndarray) -> np.ndarray:
    x.sort(axis=1)
    return x[:, :3]


def row_by_row(x: np.ndarray) -> None:
    for row in x[:8]:
        row /= np.abs(row).sum()


def rebound_first(x: np.ndarray) -> np.ndarray:
    x = x - x.mean()
    x /= x.std()
    return x


def scale_rows(m: np.ndarray, by: np.ndarray) -> None:
    for _, row in enumerate(m):
        row *= by[: len(row)]


def through_a_helper(x: np.ndarray) -> float:
    scale_rows(np.reshape(x, (-1, 600)), np.linspace(0.5, 1.5, 600))
    return float(x[0, 0])


@pytest.mark.parametrize("func", [centre, zero_the_negatives, clip_into, sort_the_rows,
                                  row_by_row, rebound_first, through_a_helper])
def test_arguments_written_in_place_end_as_numpy_leaves_them(func: Any) -> None:
    """NumPy code that writes into its argument (``x -= x.mean()``) changes the caller's
    array on the CPU: on the GPU path the device copy is copied back, with no ``writes=``,
    and a result that is the argument is the caller's array."""
    x = np.random.default_rng().standard_normal((400, 300))
    expected_x = x.copy()
    expected = func(expected_x)
    result = veda.gpu(force="gpu")(func)(x)
    assert last(func)[0] == "gpu"
    np.testing.assert_allclose(x, expected_x, rtol=1e-12, atol=1e-12)
    if expected is expected_x:
        assert result is x
    elif expected is None:
        assert result is None
    else:
        assert type(result) is type(expected)
        np.testing.assert_allclose(result, expected, rtol=1e-12, atol=1e-12)


def sgd_step(params: list[np.ndarray], grads: list[np.ndarray], lr: float) -> None:
    for p, g in zip(params, grads):
        p -= lr * g


def momentum_step(state: dict[str, Any], grad: np.ndarray) -> np.ndarray:
    state["m"] *= 0.9
    state["m"] += 0.1 * grad
    state["w"] -= 0.01 * state["m"]
    state["steps"] += 1
    return state["w"]


def test_arrays_in_lists_and_dicts_written_in_place_end_as_numpy_leaves_them() -> None:
    rng = np.random.default_rng()
    params = [rng.standard_normal((300, 200)), rng.standard_normal(200)]
    grads = [rng.standard_normal((300, 200)), rng.standard_normal(200)]
    expected = [p.copy() for p in params]
    sgd_step(expected, grads, 0.1)
    originals = list(params)
    veda.gpu(force="gpu")(sgd_step)(params, grads, 0.1)
    assert last(sgd_step)[0] == "gpu"
    assert all(p is original for p, original in zip(params, originals))
    for p, p_expected in zip(params, expected):
        np.testing.assert_allclose(p, p_expected, rtol=1e-12, atol=1e-12)

    grad = rng.standard_normal(50_000)
    state = {"m": rng.standard_normal(50_000), "w": rng.standard_normal(50_000), "steps": 3}
    cpu_state = {key: value.copy() if isinstance(value, np.ndarray) else value
                 for key, value in state.items()}
    w, m = state["w"], state["m"]
    momentum_step(cpu_state, grad)
    result = veda.gpu(force="gpu")(momentum_step)(state, grad)
    assert last(momentum_step)[0] == "gpu"
    assert state["w"] is w and state["m"] is m and result is w and state["steps"] == 4
    np.testing.assert_allclose(w, cpu_state["w"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m, cpu_state["m"], rtol=1e-12, atol=1e-12)


class LeastSquares:
    """A user's class with a decorated method that stores its results on ``self``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.coef: Any = None

    @veda.gpu(force="gpu")
    def fit(self, x: np.ndarray, y: np.ndarray) -> LeastSquares:
        self.coef = np.linalg.lstsq(x, y, rcond=None)[0]
        self.residual = float(np.linalg.norm(x @ self.coef - y))
        self.history = [self.coef.copy(), np.float64(self.residual)]
        return self

    @veda.gpu(force="gpu")
    def largest(self, x: np.ndarray) -> np.ndarray:
        self.largest_ = self.also_largest = x.max(axis=0)
        return self.largest_

    def solve(self, x: np.ndarray, y: np.ndarray) -> None:  # wrapped by the caller
        self.coef = np.linalg.solve(x.T @ x, x.T @ y)

    @veda.gpu(force="gpu")
    def fit_then_fail(self, x: np.ndarray) -> float:
        self.steps += 1  # once, as on the CPU: the re-run starts from the caller's state
        self.coef = x.sum(axis=0)
        return float(np.nanpercentile(x, 50))  # CuPy lacks it: the CPU re-runs the call


def test_attributes_a_method_assigns_to_self_hold_numpy_values_as_on_the_cpu() -> None:
    rng = np.random.default_rng()
    x, y = rng.random((2000, 16)), rng.random(2000)
    model, on_cpu = LeastSquares(3), LeastSquares(3)
    assert model.fit(x, y) is model  # the caller's own object, not a copy
    assert last(LeastSquares.fit)[0] == "gpu"
    LeastSquares.fit.__wrapped__(on_cpu, x, y)
    assert_same(model.coef, on_cpu.coef, rtol=1e-8)
    assert type(model.residual) is float and model.steps == 3
    assert_same(model.history, on_cpu.history, rtol=1e-8)
    largest = model.largest(x)  # one array, held by the result and two attributes
    assert largest is model.largest_ is model.also_largest and type(largest) is np.ndarray
    np.testing.assert_array_equal(largest, x.max(axis=0))
    solve = veda.gpu(force="gpu")(model.solve)  # a bound method: self is no argument
    solve(x, y)
    assert last(solve)[0] == "gpu"
    on_cpu.solve(x, y)
    assert_same(model.coef, on_cpu.coef, rtol=1e-8)


class SlottedScaler:
    """A class with ``__slots__`` (as ``attrs.define`` makes): no ``__dict__`` to watch."""

    __slots__ = ("scale",)

    def __init__(self) -> None:
        self.scale: Any = None

    @veda.gpu(force="gpu")
    def fit(self, x: np.ndarray) -> SlottedScaler:
        self.scale = x.std(axis=0)
        return self


@dataclasses.dataclass
class Scaler:
    """A dataclass estimator: ``fit`` returns the caller's object itself, as on the CPU."""

    scale: Any = None

    @veda.gpu(force="gpu")
    def fit(self, x: np.ndarray) -> Scaler:
        self.scale = x.std(axis=0)
        return self


@pytest.mark.parametrize("estimator", [Scaler, SlottedScaler])
def test_a_method_returning_self_returns_the_callers_object_holding_numpy_values(
        estimator: type[Scaler] | type[SlottedScaler]) -> None:
    x = np.random.default_rng().random((1000, 8))
    scaler = estimator()
    assert scaler.fit(x) is scaler
    assert last(estimator.fit)[0] == "gpu"
    assert type(scaler.scale) is np.ndarray
    np.testing.assert_allclose(scaler.scale, x.std(axis=0), rtol=1e-10)


def test_a_failed_gpu_attempt_leaves_self_as_the_cpu_run_leaves_it() -> None:
    x = np.random.default_rng().random((500, 4))
    model = LeastSquares(3)
    with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
        median = model.fit_then_fail(x)
    assert last(LeastSquares.fit_then_fail)[0] == "fallback"
    assert median == float(np.nanpercentile(x, 50))
    assert type(model.coef) is np.ndarray
    np.testing.assert_array_equal(model.coef, x.sum(axis=0))
    assert model.steps == 4


@veda.gpu(force="gpu")
def descend(state: dict[str, Any], x: np.ndarray, log: list[Any]) -> float:
    """A user's gradient step over a state dict: it rebinds, adds and removes keys, and
    appends to lists the caller holds."""
    grad = x.T @ (x @ state["w"] - state["y"]) / len(x)
    state["w"] = state["w"] - 0.1 * grad
    state["x_seen"] = x
    del state["scratch"]
    loss = float(np.mean((x @ state["w"] - state["y"]) ** 2))
    log.append(loss)
    state["history"].append(state["w"].copy())
    return loss


def test_containers_a_run_changes_end_as_the_cpu_leaves_them() -> None:
    rng = np.random.default_rng()
    x, y, w = rng.random((500, 8)), rng.random(500), rng.random(8)

    def fresh() -> tuple[dict[str, Any], list[Any]]:
        return {"w": w.copy(), "y": y, "scratch": 1, "history": []}, []

    (state, log), (on_cpu, cpu_log) = fresh(), fresh()
    history = state["history"]
    loss = descend(state, x, log)
    assert last(descend)[0] == "gpu"
    cpu_loss = descend.__wrapped__(on_cpu, x, cpu_log)
    assert list(state) == list(on_cpu) == ["w", "y", "history", "x_seen"]
    assert_same(state["w"], on_cpu["w"], rtol=1e-10)
    assert state["x_seen"] is x and state["y"] is y and state["history"] is history
    assert_same(state["history"], on_cpu["history"], rtol=1e-10)
    assert type(loss) is float and log == [loss] and abs(loss - cpu_loss) < 1e-10
    assert rescaled(state) is state  # a copy returned: the caller's dict, as on the CPU
    assert last(rescaled)[0] == "gpu"
    assert_same(state["w"], on_cpu["w"] * 2, rtol=1e-10)


@veda.gpu(force="gpu")
def rescaled(state: dict[str, Any]) -> dict[str, Any]:
    state["w"] = state["w"] * 2
    return state


@veda.gpu(force="gpu")
def count_then_fail(state: dict[str, Any], log: list[Any], x: np.ndarray) -> float:
    state["steps"] += 1
    log.append(x.sum(axis=0))
    return float(np.nanpercentile(x, 50))  # CuPy lacks it: the CPU re-runs the call


class Summary:
    """A user's object holding other objects and a list, which a decorated method fills."""

    def __init__(self) -> None:
        self.stats = types.SimpleNamespace(mean=None)
        self.parts = [types.SimpleNamespace(total=None)]
        self.log: list[Any] = []

    @veda.gpu(force="gpu")
    def summarise(self, x: np.ndarray) -> np.ndarray:
        self.stats.mean = x.mean(axis=0)
        self.parts[0].total = x.sum()
        self.log.append(x.max(axis=0))
        return self.stats.mean


def test_objects_and_lists_inside_arguments_hold_numpy_values_after_a_gpu_run() -> None:
    x = np.random.default_rng().random((1000, 8))
    summary = Summary()
    mean = summary.summarise(x)
    assert last(Summary.summarise)[0] == "gpu"
    assert mean is summary.stats.mean and type(mean) is np.ndarray
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-10)
    assert type(summary.parts[0].total) is np.float64
    assert abs(summary.parts[0].total - x.sum()) < 1e-8 * x.sum()
    assert len(summary.log) == 1 and type(summary.log[0]) is np.ndarray
    np.testing.assert_array_equal(summary.log[0], x.max(axis=0))
    state, log = {"steps": 0, "w": x[0].copy()}, []  # (a view of x would keep it on the CPU)
    with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
        count_then_fail(state, log, x)
    assert last(count_then_fail)[0] == "fallback"
    assert state["steps"] == 1 and len(log) == 1 and type(log[0]) is np.ndarray


@dataclasses.dataclass
class Trainer:
    """Binds what it also returns, and a closure over itself, as fitting code does."""

    losses_: list[Any] = dataclasses.field(default_factory=list)
    best_: Any = None
    predict_: Any = None

    @veda.gpu(force="gpu")
    def fit(self, x: np.ndarray) -> list[Any]:
        losses = [x.sum(axis=0), x.max(axis=0)]
        self.losses_ = losses
        self.best_ = losses[1]
        self.predict_ = lambda y: np.tanh(y) * self.best_
        return losses

    @veda.gpu(force="gpu")
    def trim(self, x: np.ndarray) -> np.ndarray:
        self.best_ = x.max(axis=0)
        return self.best_[2:]


def test_what_a_gpu_run_binds_and_returns_is_one_object_as_on_the_cpu() -> None:
    x = np.random.default_rng().random((1000, 8))
    trainer = Trainer()
    losses = trainer.fit(x)
    assert last(Trainer.fit)[0] == "gpu"
    assert losses is trainer.losses_ and trainer.best_ is losses[1]
    assert type(losses[0]) is np.ndarray
    np.testing.assert_allclose(losses[0], x.sum(axis=0), rtol=1e-10)
    assert trainer.predict_.__closure__[0].cell_contents is trainer  # the caller's, not a copy
    trainer.best_ = np.full(8, 2.0)
    np.testing.assert_allclose(trainer.predict_(x[:3]), np.tanh(x[:3]) * 2.0, rtol=1e-12)
    tail = trainer.trim(x)
    assert last(Trainer.trim)[0] == "gpu" and np.shares_memory(tail, trainer.best_)
    np.testing.assert_array_equal(tail, x.max(axis=0)[2:])


def test_returns_device_keeps_cupy_arrays_and_to_host_converts() -> None:
    import cupy

    x = np.random.default_rng().random((1000, 1000))
    result = veda.gpu(returns="device")(lambda m: (m @ m, m.sum()))(x)
    assert isinstance(result[0], cupy.ndarray)
    host = veda.to_host(result)
    assert type(host[0]) is np.ndarray and type(host[1]) is np.float64
    np.testing.assert_allclose(host[0], x @ x, rtol=1e-10)


def test_cupy_argument_runs_on_its_device_whatever_its_size() -> None:
    import cupy

    with cupy.cuda.Device(0):
        small = cupy.arange(10, dtype=cupy.float32)
    assert_same(vector_add(small, small), np.arange(10, dtype=np.float32) * 2)
    assert last(vector_add) == ("gpu", "input already on device 0")


def test_concurrent_calls_from_threads_are_correct() -> None:
    rng = np.random.default_rng()
    inputs = [rng.random((600, 600)) for _ in range(8)]
    errors: list[BaseException] = []

    def worker(m: np.ndarray) -> None:
        try:
            for _ in range(10):
                np.testing.assert_allclose(matrix_multiply(m, m), m @ m, rtol=1e-10)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(m,)) for m in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert last(matrix_multiply)[0] == "gpu"


def test_numpy_in_other_threads_is_unaffected_while_gpu_calls_run() -> None:
    stop = threading.Event()
    wrong: list[type] = []

    def numpy_user() -> None:
        while not stop.is_set():
            for value in (np.zeros(3), np.random.random(3), np.asarray([1.0])):
                if type(value) is not np.ndarray:
                    wrong.append(type(value))

    @veda.gpu(force="gpu")
    def creates(n: int) -> Any:
        return np.zeros(n) + np.random.random(n)

    thread = threading.Thread(target=numpy_user)
    thread.start()
    try:
        for _ in range(200):
            assert type(creates(1000)) is np.ndarray
    finally:
        stop.set()
        thread.join()
    assert wrong == []
    assert last(creates)[0] == "gpu"


def test_telemetry_records_bytes_and_phases() -> None:
    rng = np.random.default_rng()
    a, b = rng.random((1000, 1000)), rng.random((1000, 1000))
    started = time.perf_counter()
    matrix_multiply(a, b)
    call_seconds = time.perf_counter() - started
    record = veda.get_runtime().telemetry.recent()[-1]
    assert record.path == "gpu" and f"device {record.device} has " in record.reason, record
    assert record.bytes_to_device == 16_000_000 and record.bytes_to_host == 8_000_000
    phases = (record.seconds_to_device, record.seconds_compute, record.seconds_to_host)
    # the phases are consecutive spans within the call
    assert all(seconds > 0 for seconds in phases) and sum(phases) <= call_seconds, phases


def normalised_powers(matrix: np.ndarray, steps: int, whole: bool) -> Any:
    """Device work that outlasts its launch: ``steps`` normalised products."""
    for _ in range(steps):
        matrix = matrix @ matrix
        matrix = matrix / np.abs(matrix).max()
    return matrix if whole else matrix.sum()


@pytest.mark.parametrize("device", [0, 1])
def test_a_small_result_is_copied_back_without_waiting_for_the_device_first(device: int) -> None:
    """On device 1 too, whichever device is current when the call lands (device 0 here)."""
    if device >= len(veda.get_runtime().gpu.devices):  # type: ignore[union-attr]
        pytest.skip("needs 2 GPUs")
    powers = veda.gpu(force="gpu", device=device)(normalised_powers)
    matrix = np.random.default_rng().random((2000, 2000))
    powers(matrix, 2, True)  # warm-up: the clone, cuBLAS
    phases = {}
    for whole in (False, True):  # a 0-d result, then 32 MB
        result = powers(matrix, 60, whole)
        assert np.all(np.isfinite(result)) and np.ndim(result) == (2 if whole else 0)
        record = veda.get_runtime().telemetry.recent()[-1]
        assert record.path == "gpu", record
        phases[whole] = (record.seconds_compute, record.seconds_to_host)
    # A small result's copy waits for the device's work (it counts in seconds_to_host); a
    # large one is waited for apart, so its copy is timed on its own.
    small_compute, small_to_host = phases[False]
    large_compute, large_to_host = phases[True]
    assert small_to_host > small_compute and large_compute > large_to_host, phases


def first_row_of_powers(matrix: np.ndarray, steps: int) -> np.ndarray:
    """4 KB of :func:`normalised_powers`'s result."""
    return normalised_powers(matrix, steps, True)[0, :512]


@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_small_result_of_another_device_is_copied_after_its_work_under_a_callers_stream(
        non_blocking: bool) -> None:
    """A call on device 1 made while the caller has a stream of its own current on device 0:
    CuPy's ``get()`` orders its copy on the current device's stream, so the small result's
    copy is made on device 1's. Each matrix differs, so a result read early (the memory the
    previous call's result was in) cannot pass for the right one."""
    import cupy

    if len(veda.get_runtime().gpu.devices) < 2:  # type: ignore[union-attr]
        pytest.skip("needs 2 GPUs")
    first_rows = veda.gpu(force="gpu", device=1)(first_row_of_powers)
    rng = np.random.default_rng()
    matrices = [rng.random((2000, 2000)) for _ in range(5)]
    # Default streams: each copy is ordered after its work.
    expected = [first_rows(matrix, 40) for matrix in matrices]
    assert all(np.isfinite(row).all() for row in expected)
    with cupy.cuda.Device(0), cupy.cuda.Stream(non_blocking=non_blocking):
        got = [first_rows(matrix, 40) for matrix in matrices]
    records = veda.get_runtime().telemetry.recent()[-len(matrices):]
    assert [record.path for record in records] == ["gpu"] * len(matrices), records[-1]
    for row, expected_row in zip(got, expected):
        np.testing.assert_allclose(row, expected_row, rtol=1e-9)


def blend(a, b=None, /, *rest, weight=0.25, scale=None, **named):  # type: ignore[no-untyped-def]
    """Arrays in every kind of parameter: positional-only, *args, keyword-only, **kwargs."""
    total = a * (1 - weight) + (a if b is None else b) * weight
    for extra in (*rest, *named.values()):
        total = total + extra
    return total if scale is None else total * scale


def test_every_kind_of_parameter_reaches_the_gpu_and_matches_the_cpu() -> None:
    veda.init(veda.Config.builder().cost_model("static").build())
    wrapped = veda.gpu(blend)
    rng = np.random.default_rng()
    arrays = [rng.random(300_000) for _ in range(5)]
    calls = [((arrays[0],), {}),
             ((arrays[0], arrays[1], arrays[2]), {"weight": 0.5}),
             ((arrays[0], arrays[1]), {"scale": arrays[3], "extra": arrays[4]})]
    for args, kwargs in calls:
        result = wrapped(*args, **kwargs)
        assert last(wrapped)[0] == "gpu", last(wrapped)
        assert_same(result, blend(*args, **kwargs))
    small = rng.random(10)
    assert_same(wrapped(small, weight=0.1), blend(small, weight=0.1))
    assert last(wrapped) == ("cpu", "below threshold: 80 B < 1.0 MB")


# --- property: GPU path == CPU path -----------------------------------------------------------

EXPRESSIONS = {
    "add": lambda x: x + x,
    "mul_scalar": lambda x: x * 3,
    "abs": lambda x: np.abs(x),
    "sum": lambda x: x.sum(),
    "mean_axis0": lambda x: x.mean(axis=0),
    "max": lambda x: np.max(x),
    "cumsum": lambda x: np.cumsum(x),
    "sort": lambda x: np.sort(x, axis=-1),
    "where": lambda x: np.where(x > 0, x, 0),
    "maximum": lambda x: np.maximum(x, 1),
    "tuple": lambda x: (x.min(), x.ravel()[::2]),
    "zeros_like_plus": lambda x: np.zeros_like(x) + x,
}
REDUCTIONS = {"sum", "mean_axis0", "cumsum"}
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.complex64]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(sorted(EXPRESSIONS)),
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
    seed=st.integers(0, 2**32 - 1),
)
def test_gpu_path_matches_cpu_path(name: str, dtype: type, shape: tuple[int, ...], seed: int) -> None:
    expression = EXPRESSIONS[name]
    if np.dtype(dtype).kind == "c" and name in ("max", "sort", "where", "maximum", "tuple"):
        return  # ordering of complex numbers: not a like-for-like comparison
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * (rng.standard_normal(shape) * 100).astype(dtype)
    expected = expression(x)
    actual = veda.gpu(force="gpu")(expression)(x)
    tolerance = {"f": 1e-4 if x.dtype.itemsize == 4 else 1e-10, "c": 1e-4}.get(x.dtype.kind, 0)
    # Reductions may cancel; their rounding error scales with the summed magnitudes.
    scale = float(np.abs(x).astype(np.float64).sum()) if name in REDUCTIONS else 100.0
    assert_same(actual, expected, rtol=tolerance, atol=tolerance * scale)


# In a process of its own: an illegal memory access leaves the CUDA context unusable.
LOSES_THE_CONTEXT = r"""
import json, os, warnings
import numpy as np
import cupy
import vedart as veda

veda.init()
double = veda.gpu(force="gpu")(lambda x: x * 2)
x = np.arange(100_000, dtype=np.float64)
assert np.array_equal(double(x), x * 2)
before = veda.get_runtime().telemetry.function(double.display_name).last_decision()
writes_anywhere = cupy.RawKernel(
    'extern "C" __global__ void poke(unsigned long long address) '
    '{ ((float*)address)[threadIdx.x] = 1.0f; }', "poke")
writes_anywhere((1,), (32,), (np.uint64(8),))
try:
    cupy.cuda.runtime.deviceSynchronize()
except Exception as error:
    raw = type(error).__name__ + ": " + str(error)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = double(x)
    second = double(x * 3)
name = double.display_name
print(json.dumps({
    "before": before[0], "raw": raw, "available": veda.get_runtime().gpu.is_available(),
    "first": bool(np.array_equal(first, x * 2)), "second": bool(np.array_equal(second, x * 6)),
    "last": veda.get_runtime().telemetry.function(name).last_decision(),
    "calls": veda.get_runtime().telemetry.function(name).totals()["calls"],
    "warnings": [str(w.message) for w in caught]}))
try:
    veda.shutdown()
    shutdown = "ok"
except Exception as error:
    shutdown = type(error).__name__ + ": " + str(error)
print(json.dumps({"shutdown": shutdown}), flush=True)
os._exit(0)  # CuPy's own teardown in a lost context is not what this test is about
"""


def test_a_lost_cuda_context_sends_every_later_call_to_the_cpu_in_a_fresh_process(
        fresh_process: Callable[[str, float], subprocess.CompletedProcess[str]]) -> None:
    finished = fresh_process(LOSES_THE_CONTEXT, 300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    *_, decisions, shut_down = finished.stdout.strip().splitlines()
    seen = json.loads(decisions)
    assert seen["before"] == "gpu"
    assert seen["raw"].startswith("CUDARuntimeError: cudaErrorIllegalAddress"), seen["raw"]
    assert seen["available"] is False and seen["first"] and seen["second"]
    path, reason = seen["last"]
    assert path == "cpu" and reason.startswith('forced by @gpu(force="gpu") but no GPU: CUDA')
    assert "IllegalAddress" in reason or "ILLEGAL_ADDRESS" in reason, reason
    assert reason.endswith("the CUDA context is lost for this process: restart it to use the GPU")
    assert seen["calls"] == {"cpu": 1, "gpu": 1, "fallback": 1}
    assert any("the CUDA context is lost; every @gpu call runs on the CPU from now on" in message
               for message in seen["warnings"]), seen["warnings"]
    assert json.loads(shut_down) == {"shutdown": "ok"}  # closing frees nothing, raises nothing
