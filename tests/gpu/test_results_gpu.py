"""What @veda.gpu hands back on the real GPU path: result types and identity, shared memory,
records, NumPy's exceptions and answers where CuPy's differ, and re-runs (``pytest -m gpu``)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import pytest
from test_offload_gpu import last

import vedart as veda

pytestmark = pytest.mark.gpu


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_zero_d_arrays_and_scalars_come_back_as_on_the_cpu() -> None:
    @veda.gpu(force="gpu")
    def kinds(x: np.ndarray, zero_d: np.ndarray) -> tuple[Any, ...]:
        return (x.sum(), np.array(x.sum()), np.zeros(()), zero_d, x.argmax(), x[3],
                np.asarray(x.max()), np.float64(2.0))

    x, zero_d = rng(1).random(1000), np.array(2.5)
    gpu, cpu = kinds(x, zero_d), kinds.__wrapped__(x, zero_d)
    assert last(kinds)[0] == "gpu"
    assert [type(value) for value in gpu] == [type(value) for value in cpu]
    assert [np.ndim(value) for value in gpu] == [np.ndim(value) for value in cpu]
    np.testing.assert_allclose(np.array(gpu, dtype=float), np.array(cpu, dtype=float),
                               rtol=1e-12)


def test_bool_argmax_is_a_numpy_int64() -> None:
    argmax = veda.gpu(force="gpu")(lambda b: b.argmax())
    b = rng(2).random(1000) > 0.5
    assert type(argmax(b)) is type(b.argmax()) and argmax(b) == b.argmax()


def test_a_writes_argument_returned_is_the_callers_own_array() -> None:
    @veda.gpu(force="gpu", writes=("out",))
    def scale(x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out[:] = x * 2
        return out, out[::2]

    x, out = rng(3).random(10_000), np.empty(10_000)
    whole, halves = scale(x, out)
    assert last(scale)[0] == "gpu"
    assert whole is out and np.shares_memory(halves, out)
    np.testing.assert_array_equal(out, x * 2)
    np.testing.assert_array_equal(halves, (x * 2)[::2])

    @veda.gpu(force="gpu", writes=("out",))
    def tail(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        out[:] = x + 1
        return out[1:]  # one array, a view of the writes= argument

    rest = tail(x, out)
    assert last(tail)[0] == "gpu" and np.shares_memory(rest, out)
    np.testing.assert_array_equal(rest, (x + 1)[1:])


def test_results_sharing_memory_share_it_on_the_host() -> None:
    @veda.gpu(force="gpu")
    def views(x: np.ndarray) -> tuple[np.ndarray, ...]:
        y = x * 2
        return y, y[::2], y, y.reshape(100, 100).T

    gpu = views(rng(4).random(10_000))
    assert last(views)[0] == "gpu"
    assert gpu[0] is gpu[2] and np.shares_memory(gpu[0], gpu[1])
    assert np.shares_memory(gpu[0], gpu[3]) and gpu[3].flags.f_contiguous
    gpu[0][0] = -1.0
    assert gpu[1][0] == -1.0 and gpu[3][0, 0] == -1.0


@dataclasses.dataclass
class Fit:
    weights: Any
    loss: Any


class Opaque:
    def __init__(self, coef: Any) -> None:
        self.coef = coef


def test_records_are_converted_and_what_is_left_is_named_once() -> None:
    import cupy

    fit = veda.gpu(force="gpu")(lambda x: Fit(x * 2, x.sum()))
    x = rng(5).random(1000)
    result = fit(x)
    assert type(result.weights) is np.ndarray and type(result.loss) is np.float64
    # Without reach: Opaque, a class of this module, would be a device class whose objects
    # are converted (test_reach_gpu.py); an object of a class vedart does not reach is not.
    opaque = veda.gpu(force="gpu", reach=False)(lambda x: Opaque(x * 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = opaque(x), opaque(x)
    assert isinstance(first.coef, cupy.ndarray) and isinstance(second.coef, cupy.ndarray)
    assert [str(w.message) for w in caught if w.category is veda.OffloadWarning] == [
        f"{opaque.display_name}: returned device arrays vedart does not convert, "
        "handed back as CuPy arrays: result.coef; return them in a tuple, list, dict, dataclass or "
        "SimpleNamespace, or call veda.to_host"]


def test_numpys_errors_where_cupy_is_more_permissive() -> None:
    b = rng(6).random(1000) > 0.5
    cases = [(lambda x: np.percentile(x, 50), b), (lambda x: np.round(x, 1), b),
             (lambda m: np.linalg.eigh(m), np.eye(8, dtype=np.float16)),
             (lambda x: np.fft.rfft2(x), np.ones((8, 8), np.complex64)),
             (lambda x: np.fft.fft2(x), rng(8).random(16)),
             (lambda x: np.fft.irfft2(x), np.ones((), np.complex128)),
             # cuFFT's own error where NumPy finds no data points (2 * (1 - 1)):
             (lambda x: np.fft.irfft(x), np.ones(1, np.complex128)),
             (lambda x: np.fft.hfft(x), rng(10).random((3, 1)))]
    for func, argument in cases:
        with pytest.raises(Exception) as on_cpu:
            func(argument)
        with pytest.raises(type(on_cpu.value), match="^" + __import__("re").escape(
                str(on_cpu.value)) + "$"):
            veda.gpu(force="gpu", fallback="raise")(func)(argument)


def test_ffts_of_float16_give_numpys_values_and_dtypes() -> None:
    """NumPy scales by 1/n rounded to float16 and returns float16 from irfft; CuPy scales
    in float32 and returns float32 (np.fft.ifft of three values: 0.70885 against 0.70903)."""
    x = rng(9).random(3).astype(np.float16)
    for name in ("ifft", "irfft", "hfft", "ifft2"):
        transform = veda.gpu(force="gpu", fallback="raise")(
            lambda x, name=name: getattr(np.fft, name)(x))
        argument = x.reshape(1, 3) if name == "ifft2" else x
        got, expected = transform(argument), getattr(np.fft, name)(argument)
        assert last(transform)[0] == "gpu"
        assert (got.dtype, got.tobytes()) == (expected.dtype, expected.tobytes()), name


def test_histogram_of_int8_counts_as_numpy_does() -> None:
    histogram = veda.gpu(force="gpu")(lambda x: np.histogram(x, bins=8))
    x = rng(7).integers(-128, 128, 100_000).astype(np.int8)
    counts, edges = histogram(x)
    assert last(histogram)[0] == "gpu"
    expected_counts, expected_edges = np.histogram(x, bins=8)
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_array_equal(edges, expected_edges)


def test_what_cupy_raises_for_reruns_on_the_cpu_and_the_signature_stays_there() -> None:
    @veda.gpu
    def clipped(x: np.ndarray) -> np.ndarray:
        return np.clip(x, -5, 5)

    x = rng(8).integers(0, 255, 4_000_000).astype(np.uint8)
    with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
        np.testing.assert_array_equal(clipped(x), np.clip(x, -5, 5))
    assert last(clipped)[0] == "fallback"
    np.testing.assert_array_equal(clipped(x), np.clip(x, -5, 5))
    path, reason = last(clipped)
    assert path == "cpu" and reason.startswith("GPU failed before for arguments |u1:1 (")
    total = veda.gpu(force="gpu")(lambda z: float(z.sum()))
    z = (rng(9).random(100) + 1j * rng(10).random(100)).astype(np.complex128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert total(z) == float(z.sum().real)


def test_idempotent_false_raises_instead_of_rerunning() -> None:
    runs: list[str] = []

    @veda.gpu(force="gpu", idempotent=False)
    def clipped(x: np.ndarray) -> np.ndarray:
        runs.append(type(x).__module__.split(".")[0])
        return np.clip(x, -5, 5)

    with pytest.raises(veda.OffloadError, match=r"idempotent=False") as caught:
        clipped(rng(11).integers(0, 255, 1000).astype(np.uint8))
    assert type(caught.value.__cause__) is OverflowError
    assert runs == ["cupy"]
