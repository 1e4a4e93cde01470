"""The singular-matrix check of ``solve`` and ``inv`` made with one read of cuSOLVER's status
(vedart.offload.linalg_status): which inputs take it, what it answers, and CuPy's checked
function for the rest. Host arrays stand in for device ones (``FakeDeviceArray``), NumPy's
solve for cuSOLVER's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fakes import FakeDeviceArray

from vedart.offload import linalg_status

cupy = pytest.importorskip("cupy")


def device(host: np.ndarray) -> FakeDeviceArray:
    return FakeDeviceArray.of(host)


@pytest.fixture
def factored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """``cupy.ndarray`` is FakeDeviceArray, and ``factor_and_solve`` NumPy's solve in place,
    answering False for a singular matrix; returns what it got: (dtype of a, dtype of b,
    whether each is F-contiguous)."""
    monkeypatch.setattr(cupy, "ndarray", FakeDeviceArray)
    monkeypatch.setattr(cupy, "eye", lambda n, dtype, order: device(np.eye(n, dtype=dtype)).copy(
        order=order))
    seen: list[tuple[Any, ...]] = []

    def solve_in_place(a: Any, b: Any) -> bool:
        seen.append((a.dtype, b.dtype, a.flags.f_contiguous, b.flags.f_contiguous))
        if np.linalg.matrix_rank(a) < a.shape[0]:
            return False
        b[...] = np.linalg.solve(a, b)
        return True

    monkeypatch.setattr(linalg_status, "factor_and_solve", solve_in_place)
    return seen


def raising(*args: Any) -> Any:
    raise AssertionError(f"CuPy's checked function was called with {len(args)} arguments")


@pytest.mark.parametrize("dtypes", [(np.float64, np.float64), (np.float32, np.float32),
                                    (np.float32, np.float64), (np.complex64, np.float32),
                                    (np.complex128, np.complex64)])
@pytest.mark.parametrize("rhs_shape", [(5,), (5, 3)])
def test_solve_is_checked_once_and_answers_as_numpy(
        factored: list[tuple[Any, ...]], dtypes: tuple[Any, Any],
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


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_inv_is_checked_once_and_answers_as_numpy(
        factored: list[tuple[Any, ...]], order: str, dtype: Any) -> None:
    a = (np.random.default_rng(4).random((4, 4)) + 4 * np.eye(4)).astype(dtype)
    a_device = device(a).copy(order=order)
    got = linalg_status.inv(raising, a_device)
    expected = np.linalg.inv(a)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert len(factored) == 1 and factored[0][2:] == (True, True)  # as getrf and getrs take
    np.testing.assert_array_equal(a_device, a)


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
        factored: list[tuple[Any, ...]], arguments: tuple[Any, Any]) -> None:
    assert linalg_status.solve(checked, *(device(value) for value in arguments)) == "checked"
    assert factored == []


@pytest.mark.parametrize("matrix", [np.ones((2, 3, 3)), np.ones((3, 3), dtype=np.int64),
                                    np.ones((3, 3), dtype=np.float16), np.ones((0, 0)),
                                    np.ones((3, 2)), np.ones(3)],
                         ids=["stack", "int64", "float16", "empty", "not-square", "1-d"])
def test_an_inv_getrf_does_not_take_runs_with_cupys_checks(
        factored: list[tuple[Any, ...]], matrix: np.ndarray) -> None:
    assert linalg_status.inv(checked, device(matrix)) == "checked"
    assert factored == []


def test_host_arrays_run_with_cupys_checks(factored: list[tuple[Any, ...]]) -> None:
    assert linalg_status.solve(checked, np.eye(3), np.ones(3)) == "checked"
    assert linalg_status.inv(checked, np.eye(3)) == "checked"
    assert factored == []


@pytest.mark.parametrize("call", [lambda m: linalg_status.solve(checked, m, device(np.ones(3))),
                                  lambda m: linalg_status.inv(checked, m)],
                         ids=["solve", "inv"])
def test_a_singular_matrix_runs_cupys_checked_function(
        factored: list[tuple[Any, ...]], call: Any) -> None:
    """Which raises CuPy's LinAlgError (here: answers "checked") where NumPy raises."""
    singular = np.ones((3, 3))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.inv(singular)
    assert call(device(singular)) == "checked"
    assert len(factored) == 1


def test_raise_errors_here_sets_cupys_own_mode_on_this_thread_and_restores_it() -> None:
    import threading

    import cupyx

    assert cupyx.geterr()["linalg"] == "ignore"
    seen_elsewhere: list[str] = []
    modes, previous = linalg_status.raise_errors_here()
    try:
        assert previous == "ignore"
        assert cupyx.geterr()["linalg"] == "raise"  # what CuPy's checks read
        other = threading.Thread(target=lambda: seen_elsewhere.append(cupyx.geterr()["linalg"]))
        other.start()
        other.join()
        assert seen_elsewhere == ["ignore"]  # another thread's CuPy code is untouched
        assert linalg_status.raise_errors_here() == (modes, "raise")  # nested: the mode it found
        assert cupyx.geterr()["linalg"] == "raise"
    finally:
        modes.linalg = previous
    assert cupyx.geterr()["linalg"] == "ignore"
    with cupyx.errstate(linalg="ignore"):  # a caller's own mode is overridden, then put back
        modes, previous = linalg_status.raise_errors_here()
        assert cupyx.geterr()["linalg"] == "raise"
        modes.linalg = previous
        assert cupyx.geterr()["linalg"] == "ignore"


def test_cloned_linalg_enters_errstate_only_where_the_thread_does_not_raise_already(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone's ``np.linalg.eigh`` inside a GPU call (mode set by raise_errors_here) runs as it
    is; on a thread the function started itself, inside ``cupyx.errstate(linalg="raise")``."""
    import contextlib
    import threading

    import cupyx

    from vedart.offload.substitute import _raising_linalg_errors

    entered: list[str] = []
    real_errstate = cupyx.errstate

    @contextlib.contextmanager
    def recording_errstate(**modes: str) -> Any:
        entered.append(modes["linalg"])
        with real_errstate(**modes):
            yield

    monkeypatch.setattr(cupyx, "errstate", recording_errstate)
    modes_seen: list[str] = []
    eigh = _raising_linalg_errors(lambda m: modes_seen.append(cupyx.geterr()["linalg"]), "eigh")
    modes, previous = linalg_status.raise_errors_here()
    try:
        assert linalg_status.raises_here()
        eigh(None)
        assert entered == [] and modes_seen == ["raise"]
        started = threading.Thread(target=lambda: (modes_seen.append(
            str(linalg_status.raises_here())), eigh(None)))
        started.start()
        started.join()
    finally:
        modes.linalg = previous
    assert entered == ["raise"] and modes_seen == ["raise", "False", "raise"]
    assert not linalg_status.raises_here()
