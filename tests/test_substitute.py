"""Substitution on a NumPy-only machine: the clone must behave exactly like the original, and
route NumPy names to the device package (here a recording stand-in) without touching anything
shared."""

from __future__ import annotations

import re
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest
import recording_numpy
import sample_module as sm

from vedart.offload.substitute import ModuleMapper, assigns_globals, device_clone

IDENTITY = ModuleMapper({"numpy": "numpy", "scipy": "scipy"})
RECORDING = ModuleMapper({"numpy": "recording_numpy"})


@pytest.fixture(autouse=True)
def _clear_recording() -> None:
    recording_numpy.calls.clear()


@pytest.mark.parametrize(
    ("func", "args", "kwargs"),
    [(sm.uses_module_numpy, (4,), {}), (sm.uses_from_import, (3,), {}),
     (sm.imports_inside, (3,), {}), (sm.nested_lambda, (2,), {}),
     (sm.with_defaults, (3,), {}), (sm.with_defaults, (3, 2.0), {"extra": 1.0}),
     (sm.factorial, (6,), {}), (sm.closure_maker(1.25), (np.arange(3.0),), {}),
     (sm.Scaler(3.0).scale, (np.arange(4.0),), {}), (sm.partial_scale, (2,), {})],
)
def test_identity_clone_behaves_exactly_like_the_original(func, args, kwargs) -> None:  # type: ignore[no-untyped-def]
    expected = func(*args, **kwargs)
    actual = device_clone(func, IDENTITY)(*args, **kwargs)
    assert type(actual) is type(expected)
    np.testing.assert_array_equal(actual, expected)


def test_scipy_import_inside_resolves_on_identity_mapping() -> None:
    rng = np.random.default_rng()
    image, kernel = rng.random((16, 16)), rng.random((3, 3))
    np.testing.assert_array_equal(device_clone(sm.scipy_filter, IDENTITY)(image, kernel),
                                  sm.scipy_filter(image, kernel))


def test_clone_reads_other_globals_live(monkeypatch: pytest.MonkeyPatch) -> None:
    clone = device_clone(sm.uses_module_numpy, IDENTITY)
    monkeypatch.setattr(sm, "SCALE", 10.0)
    np.testing.assert_array_equal(clone(2), np.full(2, 10.0))


def test_module_numpy_names_route_to_the_device_package() -> None:
    device_clone(sm.uses_module_numpy, RECORDING)(3)
    device_clone(sm.uses_from_import, RECORDING)(3)
    device_clone(sm.imports_inside, RECORDING)(3)
    device_clone(sm.nested_lambda, RECORDING)(3)
    device_clone(sm.Scaler(2.0).scale, RECORDING)(np.arange(2.0))
    assert [name for name, _ in recording_numpy.calls] == ["zeros"] * 6


def linalg_results(m: np.ndarray) -> tuple[Any, ...]:
    return np.linalg.eigh(m), np.linalg.svd(m), np.linalg.svd(m, compute_uv=False)


def test_linalg_results_come_back_as_numpys_named_tuples(monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy's eigh and svd return plain tuples; NumPy 2's return named ones
    (``eigh(m).eigenvalues``), so the clone's must too."""
    device, linalg = types.ModuleType("plain_numpy"), types.ModuleType("plain_numpy.linalg")
    linalg.eigh = lambda m: tuple(np.linalg.eigh(m))  # type: ignore[attr-defined]
    linalg.svd = lambda m, compute_uv=True: (  # type: ignore[attr-defined]
        tuple(np.linalg.svd(m)) if compute_uv else np.linalg.svd(m, compute_uv=False))
    device.linalg = linalg  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "plain_numpy", device)
    monkeypatch.setitem(sys.modules, "plain_numpy.linalg", linalg)
    m = np.random.default_rng(18).random((5, 5))
    m = m + m.T
    actual = device_clone(linalg_results, ModuleMapper({"numpy": "plain_numpy"}))(m)
    expected = linalg_results(m)
    assert [type(part) for part in actual] == [type(part) for part in expected]
    np.testing.assert_array_equal(actual[0].eigenvalues, expected[0].eigenvalues)
    np.testing.assert_array_equal(actual[1].S, expected[1].S)
    np.testing.assert_array_equal(actual[2], expected[2])


def test_names_the_device_package_lacks_fall_back_to_numpy() -> None:
    result = device_clone(sm.with_defaults, RECORDING)(2)  # np.ones: not in recording_numpy
    np.testing.assert_array_equal(result, np.full(2, 2.0))
    assert recording_numpy.calls == []


def test_nothing_shared_is_patched_and_other_threads_see_plain_numpy() -> None:
    import builtins
    import sys

    real_import, real_zeros, real_np = builtins.__import__, np.zeros, sys.modules["numpy"]
    clone = device_clone(sm.imports_inside, RECORDING)
    stop = threading.Event()
    other_thread_ids: list[int] = []

    def numpy_user() -> None:
        other_thread_ids.append(threading.get_ident())
        while not stop.is_set():
            import numpy

            assert type(numpy.zeros(2)) is np.ndarray

    thread = threading.Thread(target=numpy_user)
    thread.start()
    try:
        for _ in range(300):
            clone(2)
    finally:
        stop.set()
        thread.join()
    assert builtins.__import__ is real_import and np.zeros is real_zeros
    assert sys.modules["numpy"] is real_np
    assert len(recording_numpy.calls) == 600
    assert {ident for _, ident in recording_numpy.calls} == {threading.get_ident()}
    assert other_thread_ids[0] != threading.get_ident()


def test_functions_assigning_globals_are_not_cloned_so_assignments_reach_the_module() -> None:
    assert assigns_globals(sm.bump_counter)
    assert not assigns_globals(sm.uses_module_numpy)
    clone = device_clone(sm.bump_counter, RECORDING)
    assert clone is sm.bump_counter
    before = sm.counter
    clone()
    assert sm.counter == before + 1


def test_other_callables_are_returned_unchanged() -> None:
    assert device_clone(np.sum, RECORDING) is np.sum


def test_clone_keeps_identity_metadata() -> None:
    clone = device_clone(sm.with_defaults, IDENTITY)
    assert clone.__name__ == "with_defaults" and clone.__qualname__ == "with_defaults"
    assert clone.__kwdefaults__ == {"extra": 0.5} and clone.__defaults__ == (1.5,)


def rounded(x: np.ndarray) -> Any:
    return np.round(x, 1)


def median_of(x: np.ndarray) -> Any:
    return np.percentile(x, 50)


def eigenvalues(m: np.ndarray) -> Any:
    return np.linalg.eigh(m).eigenvalues


def half_spectrum(x: np.ndarray) -> Any:
    return np.fft.rfft2(x)


def counts(x: np.ndarray) -> Any:
    return np.histogram(x, bins=8)


@pytest.fixture
def permissive(monkeypatch: pytest.MonkeyPatch) -> ModuleMapper:
    """A device package that computes whatever it is given (as CuPy does for these) and
    records the dtypes it was called with."""
    seen: list[tuple[str, np.dtype[Any]]] = []

    def accepting(name: str) -> Any:
        def compute(x: Any, *args: Any, **kwargs: Any) -> str:
            seen.append((name, x.dtype))
            return f"{name} computed"
        return compute

    device = types.ModuleType("permissive_numpy")
    linalg, fft = types.ModuleType("permissive_numpy.linalg"), types.ModuleType(
        "permissive_numpy.fft")
    device.round, device.percentile, device.histogram = (  # type: ignore[attr-defined]
        accepting("round"), accepting("percentile"), accepting("histogram"))
    linalg.eigh = lambda m: (accepting("eigh")(m), None)  # type: ignore[attr-defined]
    fft.rfft2 = accepting("rfft2")  # type: ignore[attr-defined]
    fft.ifft, fft.irfft = accepting("ifft"), accepting("irfft")  # type: ignore[attr-defined]
    fft.hfft = accepting("hfft")  # type: ignore[attr-defined]
    device.asarray = np.asarray  # type: ignore[attr-defined]
    device.linalg, device.fft, device.seen = linalg, fft, seen  # type: ignore[attr-defined]
    for module in (device, linalg, fft):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return ModuleMapper({"numpy": "permissive_numpy"})


@pytest.mark.parametrize(("func", "rejected", "accepted"), [
    (rounded, np.array([True, False]), np.array([0.25, 1.5])),
    (median_of, np.array([True, False, True]), np.array([3, 1, 2], dtype=np.int8)),
    (eigenvalues, np.eye(2, dtype=np.float16), np.eye(2, dtype=np.float32)),
    (half_spectrum, np.ones((2, 2), dtype=np.complex64), np.ones((2, 2), dtype=np.float32)),
    (half_spectrum, np.ones(4, dtype=np.float32), np.ones((2, 4), dtype=np.float32)),
    (half_spectrum, np.ones((), dtype=np.float32), np.ones((2, 4), dtype=np.float32)),
])
def test_inputs_numpy_rejects_raise_numpys_own_error_before_device_work(
        permissive: ModuleMapper, func: Any, rejected: np.ndarray, accepted: np.ndarray) -> None:
    with pytest.raises(Exception) as on_numpy:
        func(rejected)
    with pytest.raises(type(on_numpy.value)) as on_device:
        device_clone(func, permissive)(rejected)
    assert str(on_device.value) == str(on_numpy.value)
    seen = sys.modules["permissive_numpy"].seen  # type: ignore[attr-defined]
    assert seen == []
    device_clone(func, permissive)(accepted)
    assert [dtype for _, dtype in seen] == [accepted.dtype]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int64, np.bool_])
def test_histogram_of_integers_is_counted_on_float64_samples(
        permissive: ModuleMapper, dtype: Any) -> None:
    device_clone(counts, permissive)(np.arange(5).astype(dtype))
    device_clone(counts, permissive)(np.arange(5, dtype=np.float32))
    assert sys.modules["permissive_numpy"].seen == [  # type: ignore[attr-defined]
        ("histogram", np.dtype(np.float64)), ("histogram", np.dtype(np.float32))]


def percentile_30(x: np.ndarray, axis: int | None) -> Any:
    return np.percentile(x, 30, axis=axis)


@pytest.mark.parametrize(("shape", "axis"), [((0,), None), ((3, 0, 5, 4), None), ((3, 0), 0),
                                             ((3, 0), 1), ((0, 3), 1)])
def test_percentile_of_an_empty_array_is_numpys_answer_without_device_work(
        permissive: ModuleMapper, shape: tuple[int, ...], axis: int | None) -> None:
    """CuPy's percentile of an empty array read out of bounds on the H100."""
    x = np.empty(shape, dtype=">u8")
    try:
        expected: Any = np.percentile(x, 30, axis=axis)
    except IndexError as error:
        with pytest.raises(IndexError, match=re.escape(str(error))):
            device_clone(percentile_30, permissive)(x, axis)
    else:
        got = device_clone(percentile_30, permissive)(x, axis)
        assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    assert sys.modules["permissive_numpy"].seen == []  # type: ignore[attr-defined]
    device_clone(percentile_30, permissive)(np.ones(3), None)
    assert sys.modules["permissive_numpy"].seen == [  # type: ignore[attr-defined]
        ("percentile", np.dtype(np.float64))]


@pytest.mark.parametrize("name", ["ifft", "irfft"])
def test_ffts_of_float16_are_numpys_answer_without_device_work(
        permissive: ModuleMapper, name: str) -> None:
    """NumPy scales a float16 input's FFT by a factor rounded to float16, and its irfft is
    float16; CuPy computes in float32."""
    def transform(x: np.ndarray) -> Any:
        return getattr(np.fft, name)(x)

    x = np.random.default_rng(5).random(3).astype(np.float16)
    got, expected = device_clone(transform, permissive)(x), transform(x)
    assert (got.dtype, got.tobytes()) == (expected.dtype, expected.tobytes())
    assert sys.modules["permissive_numpy"].seen == []  # type: ignore[attr-defined]
    assert device_clone(transform, permissive)(x.astype(np.float32)) == f"{name} computed"


def test_ffts_of_an_empty_input_are_numpys_answer_without_device_work(
        permissive: ModuleMapper) -> None:
    """CuPy's irfft of a (0, 1) array gave an empty array where NumPy finds no data points."""
    def transform(x: np.ndarray) -> Any:
        return np.fft.irfft(x)

    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        device_clone(transform, permissive)(np.ones((0, 1), dtype=bool))
    got, expected = device_clone(transform, permissive)(np.ones((0, 3))), transform(np.ones((0, 3)))
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    assert sys.modules["permissive_numpy"].seen == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["irfft", "hfft"])
def test_an_inverse_real_fft_without_output_points_is_numpys_error_without_device_work(
        permissive: ModuleMapper, name: str) -> None:
    """By default these make 2 * (m - 1) points along an axis of length m: for m = 1 NumPy
    raises ValueError, where cuFFT failed with its own error (and the call re-ran on the CPU
    with a warning)."""
    def transform(x: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        return getattr(np.fft, name)(x, *args, **kwargs)

    clone = device_clone(transform, permissive)
    for x, args, kwargs in ((np.ones(1), (), {}), (np.ones((3, 1)), (), {}),
                            (np.ones((1, 3)), (), {"axis": 0}),
                            (np.ones((1, 3)), (None, np.int64(0)), {})):
        with pytest.raises(ValueError, match="Invalid number of FFT data points"):
            clone(x, *args, **kwargs)
    assert sys.modules["permissive_numpy"].seen == []  # type: ignore[attr-defined]
    assert clone(np.ones(1), 4) == clone(np.ones((1, 3))) == f"{name} computed"


@pytest.fixture
def linalg_modes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """CuPy's ``inv``, ``solve``, ``norm`` and ``det`` replaced by functions that record
    (name, CuPy's linalg error mode) and return their first argument."""
    cupy = pytest.importorskip("cupy")
    import cupyx

    modes: list[tuple[str, str]] = []

    def recording(name: str) -> Any:
        def function(m: Any, *args: Any, **kwargs: Any) -> Any:
            modes.append((name, cupyx._ufunc_config.get_config_linalg()))
            return m
        return function

    for name in ("inv", "solve", "norm", "det"):
        monkeypatch.setattr(cupy.linalg, name, recording(name))
    return modes


def test_cupy_linalg_runs_raising_what_cusolver_reports(
        linalg_modes: list[tuple[str, str]]) -> None:
    """NumPy raises LinAlgError for a singular matrix; CuPy only when told to. Functions that
    read no cuSOLVER status run without CuPy's error state (it costs some 8 us a call);
    ``solve`` and ``inv`` of host arrays (standing in here) run CuPy's checked function."""
    import cupyx

    def linear_algebra(m: np.ndarray, stacked: np.ndarray) -> Any:
        np.linalg.inv(m)
        np.linalg.inv(stacked)
        np.linalg.solve(m, m[0])
        np.linalg.norm(m)
        np.linalg.norm(m, axis=0)
        np.linalg.norm(m, "fro")
        np.linalg.norm(m, 2)
        np.linalg.norm(m, ord="nuc")
        return np.linalg.det(m)

    device_clone(linear_algebra, ModuleMapper({"numpy": "cupy"}))(np.eye(2), np.ones((2, 2, 2)))
    assert linalg_modes == [("inv", "raise"), ("inv", "raise"), ("solve", "raise"),
                            ("norm", "ignore"), ("norm", "ignore"), ("norm", "ignore"),
                            ("norm", "raise"), ("norm", "raise"), ("det", "ignore")]
    assert cupyx._ufunc_config.get_config_linalg() == "ignore"  # only inside the call


def solve_or_none(m: np.ndarray) -> Any:
    try:
        return np.linalg.solve(m, m[0])
    except np.linalg.LinAlgError:
        return None


def test_a_function_catches_linalg_error_in_its_clone_as_under_numpy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Classes of cupy.linalg are not wrapped as its functions are: ``except
    np.linalg.LinAlgError`` catches CuPy's error (it raised TypeError, a class expected)."""
    cupy = pytest.importorskip("cupy")

    def singular(a: Any, b: Any) -> Any:
        raise np.linalg.LinAlgError("Error reported by getrf in cuSOLVER. devInfo = [2].")

    monkeypatch.setattr(cupy.linalg, "solve", singular)
    clone = device_clone(solve_or_none, ModuleMapper({"numpy": "cupy"}))
    assert clone(np.ones((3, 3))) is None


def test_an_empty_input_of_a_rejected_dtype_raises_what_numpy_raises_for_its_size() -> None:
    func = lambda x: np.fft.rfft(x)  # noqa: E731
    empty = np.array([], dtype=np.complex64)
    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        func(empty)
    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        device_clone(func, IDENTITY)(empty)


def test_a_reduction_without_identity_of_an_empty_input_raises_numpys_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lenient = types.ModuleType("lenient_numpy")  # as CuPy: an empty reduction gives an empty
    lenient.max = lambda x, axis=None, **kwargs: np.zeros(x.shape[1:])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lenient_numpy", lenient)
    mapper = ModuleMapper({"numpy": "lenient_numpy"})
    func = lambda x: np.max(x, axis=0)  # noqa: E731
    with pytest.raises(ValueError, match="zero-size array"):
        device_clone(func, mapper)(np.zeros((0, 0, 2), dtype=np.complex128))
    assert device_clone(func, mapper)(np.ones((3, 2))).shape == (2,)


def test_clone_reads_builtins_and_later_module_globals_as_the_function_does() -> None:
    """A name the module does not bind is the clone's builtin, looked up without raising a
    KeyError (which made a loop step calling builtins 30% slower); a module global bound after
    the clone was made shadows it, as it does for the function."""
    module = types.ModuleType("shadowing_module")
    exec("def count(items):\n    return len(items)\n", module.__dict__)
    clone = device_clone(module.count, IDENTITY)
    assert clone([1, 2, 3]) == 3
    assert clone.__globals__.__missing__("len") is len
    module.len = lambda items: -1
    assert clone([1, 2, 3]) == module.count([1, 2, 3]) == -1
