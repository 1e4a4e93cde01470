"""The singular-matrix checks of ``solve`` and ``inv`` kept for the call's landing
(vedart.offload.linalg_status), and the attempt again with CuPy's checks when one failed. Host
arrays stand in for device ones (``FakeDeviceArray``), NumPy's solve for cuSOLVER's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fakes import FakeDeviceArray, FakeProbe

import vedart as veda
from vedart.offload import decorator, linalg_status
from vedart.offload.linalg_status import StatusCheckFailed, pending_statuses

cupy = pytest.importorskip("cupy")


def device(host: np.ndarray) -> FakeDeviceArray:
    return FakeDeviceArray.of(host)


@pytest.fixture
def factored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """``cupy.ndarray`` is FakeDeviceArray, and ``factor_and_solve`` NumPy's solve in place,
    keeping a status of 1 for a singular matrix and 0 otherwise; returns the (a, b) it got."""
    monkeypatch.setattr(cupy, "ndarray", FakeDeviceArray)
    monkeypatch.setattr(cupy, "eye", lambda n, dtype, order: device(np.eye(n, dtype=dtype)).copy(
        order=order))
    monkeypatch.setattr(cupy, "concatenate", lambda arrays: device(np.concatenate(arrays)))
    seen: list[tuple[Any, ...]] = []

    def solve_in_place(a: Any, b: Any, statuses: list[Any]) -> None:
        seen.append((a.dtype, b.dtype, a.flags.f_contiguous, b.flags.f_contiguous))
        singular = np.linalg.matrix_rank(a) < a.shape[0]
        linalg_status.keep(statuses, device(np.array([int(singular)], dtype=np.int32)))
        if not singular:
            b[...] = np.linalg.solve(a, b)

    monkeypatch.setattr(linalg_status, "factor_and_solve", solve_in_place)
    return seen


def raising(*args: Any) -> Any:
    raise AssertionError(f"CuPy's checked function was called with {len(args)} arguments")


@pytest.fixture
def kept() -> Iterator[list[Any]]:
    """A launch's list of kept statuses, set for the test."""
    statuses: list[Any] = []
    token = pending_statuses.set(statuses)
    yield statuses
    pending_statuses.reset(token)


@pytest.mark.parametrize("dtypes", [(np.float64, np.float64), (np.float32, np.float32),
                                    (np.float32, np.float64), (np.complex64, np.float32),
                                    (np.complex128, np.complex64)])
@pytest.mark.parametrize("rhs_shape", [(5,), (5, 3)])
def test_solve_keeps_its_check_and_answers_as_numpy(
        factored: list[tuple[Any, ...]], kept: list[Any], dtypes: tuple[Any, Any],
        rhs_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(3)
    a = (rng.random((5, 5)) + 5 * np.eye(5)).astype(dtypes[0])
    b = rng.random(rhs_shape).astype(dtypes[1])
    a_device, b_device = device(a), device(b)
    got = linalg_status.solve(raising, a_device, b_device)
    expected = np.linalg.solve(a, b)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert factored == [(expected.dtype, expected.dtype, True, True)]  # F-ordered copies
    np.testing.assert_array_equal(a_device, a)  # the caller's arrays are not overwritten
    np.testing.assert_array_equal(b_device, b)
    assert [status.tolist() for status in kept] == [[0]]


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_inv_keeps_its_check_and_answers_as_numpy(
        factored: list[tuple[Any, ...]], kept: list[Any], order: str, dtype: Any) -> None:
    a = (np.random.default_rng(4).random((4, 4)) + 4 * np.eye(4)).astype(dtype)
    a_device = device(a).copy(order=order)
    got = linalg_status.inv(raising, a_device)
    expected = np.linalg.inv(a)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert len(factored) == 1 and factored[0][2:] == (True, True)  # as getrf and getrs take
    np.testing.assert_array_equal(a_device, a)
    assert [status.tolist() for status in kept] == [[0]]


def checked(*args: Any) -> str:
    return "checked"


@pytest.mark.parametrize("arguments", [
    (np.ones((2, 3, 3)), np.ones((2, 3))),      # a stack: CuPy's batched routines
    (np.ones((3, 3), dtype=np.int64), np.ones(3)),  # computed in float64 by CuPy's rules
    (np.eye(3), np.ones(3, dtype=bool)),
    (np.ones((3, 3), dtype=np.float16), np.ones(3)),  # NumPy rejects float16
    (np.ones((0, 0)), np.ones(0)),              # empty
    (np.ones((3, 2)), np.ones(3)),              # not square: CuPy's error
    (np.eye(3), np.ones((3, 0))),               # no right-hand side
    (np.eye(3), np.ones(4)),                    # mismatched: CuPy's error
    (np.eye(3), np.ones((3, 1, 1))),            # b of three dimensions: CuPy's error
], ids=["stack", "int64", "bool-b", "float16", "empty", "not-square", "no-rhs", "mismatch",
        "3-d-b"])
def test_a_solve_getrf_does_not_take_runs_with_cupys_checks(
        factored: list[tuple[Any, ...]], kept: list[Any], arguments: tuple[Any, Any]) -> None:
    assert linalg_status.solve(checked, *(device(value) for value in arguments)) == "checked"
    assert factored == [] and kept == []


@pytest.mark.parametrize("matrix", [np.ones((2, 3, 3)), np.ones((3, 3), dtype=np.int64),
                                    np.ones((3, 3), dtype=np.float16), np.ones((0, 0)),
                                    np.ones((3, 2)), np.ones(3)],
                         ids=["stack", "int64", "float16", "empty", "not-square", "1-d"])
def test_an_inv_getrf_does_not_take_runs_with_cupys_checks(
        factored: list[tuple[Any, ...]], kept: list[Any], matrix: np.ndarray) -> None:
    assert linalg_status.inv(checked, device(matrix)) == "checked"
    assert factored == [] and kept == []


def test_host_arrays_and_calls_outside_a_launch_run_with_cupys_checks(
        factored: list[tuple[Any, ...]]) -> None:
    assert pending_statuses.get() is None
    assert linalg_status.solve(checked, device(np.eye(3)), device(np.ones(3))) == "checked"
    assert linalg_status.inv(checked, device(np.eye(3))) == "checked"
    token = pending_statuses.set([])
    try:
        assert linalg_status.solve(checked, np.eye(3), np.ones(3)) == "checked"
        assert linalg_status.inv(checked, np.eye(3)) == "checked"
    finally:
        pending_statuses.reset(token)
    assert factored == []


def test_a_singular_matrix_is_found_when_the_statuses_are_read(
        factored: list[tuple[Any, ...]], kept: list[Any]) -> None:
    linalg_status.solve(raising, device(np.eye(3)), device(np.ones(3)))
    assert not linalg_status.any_failed(kept, stream=None)
    linalg_status.inv(raising, device(np.ones((3, 3))))  # singular: no exception yet
    assert linalg_status.any_failed(kept, stream=None)


def test_a_loop_of_solves_has_its_statuses_read_every_few_solves(
        factored: list[tuple[Any, ...]], kept: list[Any]) -> None:
    regular = device(np.eye(2))
    for _ in range(3 * linalg_status.CHECK_EVERY):
        linalg_status.inv(raising, regular)
        assert len(kept) < linalg_status.CHECK_EVERY  # read, and dropped


def test_a_loop_of_solves_stops_within_a_few_solves_of_a_singular_matrix(
        factored: list[tuple[Any, ...]], kept: list[Any]) -> None:
    """A loop whose condition a singular matrix's result never meets still ends: NumPy's
    LinAlgError, and the failure is kept for the landing."""
    x, solves = device(np.ones(2)), 0
    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
        while not np.abs(x).max() < 1e-6:  # NaN: never
            x = linalg_status.solve(raising, device(np.ones((2, 2))), x)
            x[...] = np.nan  # what the singular factorisation leaves
            solves += 1
    assert solves == linalg_status.CHECK_EVERY - 1  # the next one raised
    assert linalg_status.any_failed(kept, stream=None)


# --- the attempt again with CuPy's checks ------------------------------------------------------

@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A faked one-device runtime whose GPU attempts record ``keep_statuses`` and answer
    ``2 * x``; landing raises StatusCheckFailed for an attempt that kept its statuses."""
    veda.init(veda.Config.builder().cost_model("static").build(), device_probe=FakeProbe())
    kept_flags: list[bool] = []

    def launch(self: Any, device: int, args: Any, kwargs: Any, uploads: bool = True,
               keep_statuses: bool = True) -> Any:
        kept_flags.append(keep_statuses)
        if not keep_statuses and args[0][0] < 0:  # CuPy's own check raising
            raise np.linalg.LinAlgError("Error reported by getrf in cuSOLVER. devInfo = [2].")
        return decorator._Launch(device, None, None, args, kwargs, 2 * args[0], 0.0, 0.0, [],
                                 ["kept"] if keep_statuses else None)

    def land(self: Any, launch: Any, reason: str, bytes_to_device: int, args: Any,
             kwargs: Any) -> Any:
        if launch.statuses:
            raise StatusCheckFailed(self.name)
        return launch.result, decorator.CallRecord(self.name, "gpu", reason, 0, 0, 0, 0.0, 0.0,
                                                   0.0, 0.0)

    monkeypatch.setattr(decorator._Offload, "launch", launch)
    monkeypatch.setattr(decorator._Offload, "land", land)
    return kept_flags


def test_a_failed_kept_check_is_attempted_again_with_cupys_checks(attempts: list[bool]) -> None:
    doubled = veda.gpu(force="gpu")(lambda x: 2 * x)
    x = np.random.default_rng(5).random(100)
    np.testing.assert_array_equal(doubled(x), 2 * x)
    assert attempts == [True, False]
    stats = veda.get_runtime().telemetry.recent()[-1]
    assert stats.path == "gpu"


def test_cupys_check_raising_on_the_attempt_again_reruns_on_the_cpu(
        attempts: list[bool]) -> None:
    def solve_all_ones(x: np.ndarray) -> Any:
        return np.linalg.solve(np.ones((2, 2)), x[:2])

    with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):  # NumPy's, on the CPU
        veda.gpu(force="gpu")(solve_all_ones)(-np.random.default_rng(6).random(10))
    assert attempts == [True, False]


def test_a_failed_kept_check_of_a_call_in_phases_is_attempted_again(
        attempts: list[bool]) -> None:
    """A lane runs a call in phases (launch, then land): the attempt again happens at landing."""
    doubled = veda.gpu(force="gpu")(lambda x: 2 * x)
    x = np.random.default_rng(7).random(50)
    call = doubled.plan_call(x)
    call.launch()
    assert attempts == [True]
    np.testing.assert_array_equal(call.land(), 2 * x)
    assert attempts == [True, False]
