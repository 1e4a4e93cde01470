"""What a caller gets when the GPU attempt of a @gpu call raises, on a CPU-only machine: the
GPU attempt is replaced by one that raises a chosen exception (devices faked by FakeProbe)."""

from __future__ import annotations

import linecache
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.offload import decorator

MB = 1 << 20


class CupyStyleError(RuntimeError):
    """An exception class defined by CuPy, as the classification sees it."""


CupyStyleError.__module__ = "cupy.cuda.runtime"


class OutOfMemoryError(MemoryError):
    """CuPy's out-of-memory error, as the classification sees it."""


OutOfMemoryError.__module__ = "cupy.cuda.memory"


class CUDARuntimeError(RuntimeError):
    """CuPy's CUDA runtime error, as the classification sees it."""


CUDARuntimeError.__module__ = "cupy_backends.cuda.api.runtime"


@pytest.fixture
def gpu_attempts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """A faked one-device runtime whose GPU attempts raise the exceptions the test appends
    (the last one again once the list runs out); yields that list."""
    veda.init(veda.Config.builder().cost_model("static").build(), device_probe=FakeProbe())
    raised: list[BaseException] = []
    attempts: list[int] = []

    def failing_launch(self: Any, device: int, args: Any, kwargs: Any,
                       uploads: bool = True) -> Any:
        attempts.append(device)
        raise raised[min(len(attempts), len(raised)) - 1]

    failing_launch.attempts = attempts  # type: ignore[attr-defined]
    monkeypatch.setattr(decorator._Offload, "launch", failing_launch)
    yield raised


def rng_array(n: int = MB, seed: int = 7, dtype: Any = np.float64) -> np.ndarray:
    return np.random.default_rng(seed).random(n).astype(dtype)


def last_decision(func: Callable[..., Any]) -> tuple[str, str]:
    stats = veda.get_runtime().telemetry.function(func.display_name)  # type: ignore[attr-defined]
    decision = stats.last_decision()
    assert decision is not None
    return decision


def test_any_exception_on_the_gpu_attempt_reruns_on_the_cpu(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(OverflowError("Python integer -5 out of bounds for uint8"))

    @veda.gpu
    def clipped(x: np.ndarray) -> np.ndarray:
        return np.clip(x, -5, 5)

    x = (rng_array() * 255).astype(np.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = clipped(x)
    np.testing.assert_array_equal(result, np.clip(x, -5, 5))
    assert result.dtype == np.uint8
    assert last_decision(clipped) == (
        "fallback", "GPU failed (OverflowError: Python integer -5 out of bounds for uint8); "
                    "re-ran on CPU")
    assert [w.category for w in caught] == [veda.OffloadWarning]


def test_the_failing_signature_goes_to_the_cpu_next_time_unless_forced(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(TypeError("complex comparison"))
    attempts_before = len(gpu_attempts)

    @veda.gpu
    def total(x: np.ndarray) -> float:
        return float(x.sum())

    x = rng_array()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)
        assert total(x) == pytest.approx(x.sum())
    decision = total.explain(rng_array(seed=8))
    assert decision.path == "cpu"
    assert decision.reason == ("GPU failed before for arguments <f8:1 (TypeError: complex "
                               "comparison); the CPU ran them")
    assert total(rng_array(seed=9)) == pytest.approx(rng_array(seed=9).sum())
    assert last_decision(total)[0] == "cpu"
    assert total.explain(rng_array(dtype=np.float32)).path == "gpu"  # another signature
    with veda.force("gpu"):
        assert total.explain(x).path == "gpu"
    assert len(gpu_attempts) == attempts_before


def test_a_genuine_bug_raises_the_cpus_own_exception_unchained(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(ValueError("matmul: mismatch in core dimension 0 (device wording)"))
    cpu_runs: list[int] = []

    @veda.gpu
    def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        cpu_runs.append(1)
        return a.reshape(8, -1) @ b.reshape(8, -1)

    a, b = rng_array(), rng_array(seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError) as on_gpu_path:
            product(a, b)
    with pytest.raises(ValueError) as without_vedart:
        product.__wrapped__(a, b)
    assert str(on_gpu_path.value) == str(without_vedart.value)
    assert on_gpu_path.value.__context__ is None and on_gpu_path.value.__cause__ is None
    assert caught == []  # nothing ran on the CPU where the GPU had failed
    assert cpu_runs == [1, 1]
    assert product.explain(a, b).path == "gpu"  # the CPU failed too: nothing learned


@pytest.mark.parametrize("device_state", [
    OutOfMemoryError("out of memory allocating 8,388,608 bytes"),
    CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")])
def test_device_state_failures_are_not_remembered(gpu_attempts: list[BaseException],
                                                  device_state: BaseException) -> None:
    gpu_attempts.extend([device_state, NotImplementedError("no device twin")])
    double = veda.gpu(lambda x: x * 2)
    x = rng_array()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)
        np.testing.assert_array_equal(double(x), x * 2)
        assert double.explain(x).path == "gpu"  # the device may be fine next time
        np.testing.assert_array_equal(double(x), x * 2)
    assert double.explain(x).path == "cpu"


CONTEXT_LOST = "cudaErrorIllegalAddress: an illegal memory access was encountered"


def test_a_lost_cuda_context_sends_every_later_call_to_the_cpu(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(CUDARuntimeError(CONTEXT_LOST))
    double, triple = veda.gpu(lambda x: x * 2), veda.gpu(force="gpu")(lambda x: x * 3)
    x = rng_array()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(double(x), x * 2)
    assert any("the CUDA context is lost; every @gpu call runs on the CPU from now on"
               in str(warning.message) for warning in caught)
    gpu = veda.get_runtime().gpu
    assert gpu is not None and not gpu.is_available()
    line = double.__wrapped__.__code__.co_firstlineno
    column = linecache.getline(__file__, line).index("x * 2") + 1  # two lambdas on the line
    expected = (f"no GPU: CUDARuntimeError: {CONTEXT_LOST} (in {__name__}."
                f"{double.__qualname__} (line {line}, column {column})); "
                "the CUDA context is lost for this process: restart "
                "it to use the GPU")
    assert double.explain(x).reason == expected
    np.testing.assert_array_equal(triple(x), x * 3)
    assert last_decision(triple) == ("cpu", f"forced by @gpu(force=\"gpu\") but {expected}")
    assert len(gpu_attempts) == 1 and decorator._Offload.launch.attempts == [0]  # type: ignore


class CudaAPIError(Exception):  # Numba's driver error, raised by its kernel launches
    pass


CudaAPIError.__module__ = "numba.cuda.cudadrv.driver"


class CUDAError(Exception):  # cuda.core's, raised by vedart's fast kernel launch
    pass


CUDAError.__module__ = "cuda.core._utils.cuda_utils"


@pytest.mark.parametrize(("error", "lost"), [
    (CUDARuntimeError(CONTEXT_LOST), True),
    (CudaAPIError("[700] Call to cuLaunchKernel results in CUDA_ERROR_ILLEGAL_ADDRESS"), True),
    (CUDAError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"), True),
    (CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY"), False),
    (CUDAError("CUDA_ERROR_INVALID_VALUE: invalid argument"), False),
    (RuntimeError(CONTEXT_LOST), False),  # not raised by a GPU package
])
def test_the_cuda_errors_of_every_launcher_that_lose_the_context_are_told_apart(
        error: BaseException, lost: bool) -> None:
    from vedart.offload.failures import loses_context

    assert loses_context(error) is lost


def test_a_cuda_error_that_keeps_the_context_keeps_the_gpu(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(CUDARuntimeError("cudaErrorMemoryAllocation: out of memory"))
    double = veda.gpu(lambda x: x * 2)
    x = rng_array()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)
        np.testing.assert_array_equal(double(x), x * 2)
    gpu = veda.get_runtime().gpu
    assert gpu is not None and gpu.is_available()


def test_idempotent_false_raises_offload_error_without_a_cpu_run(
        gpu_attempts: list[BaseException]) -> None:
    gpu_attempts.append(CupyStyleError("cudaErrorIllegalAddress"))
    sent: list[float] = []

    @veda.gpu(idempotent=False, writes=("out",))
    def send(x: np.ndarray, out: np.ndarray) -> None:
        out[:] = x
        sent.append(float(x[0]))

    x, out = rng_array(), rng_array(seed=5)
    before = out.copy()
    with pytest.raises(veda.OffloadError) as caught:
        send(x, out)
    message = str(caught.value)
    assert "GPU execution failed on device 0 (CupyStyleError: cudaErrorIllegalAddress)" in message
    assert "not re-run on the CPU: @gpu(idempotent=False)" in message
    assert caught.value.__cause__ is gpu_attempts[0]
    assert sent == []
    np.testing.assert_array_equal(out, before)


def test_idempotent_false_lets_the_users_own_exception_through(
        gpu_attempts: list[BaseException]) -> None:
    mine = KeyError("the user's own")
    gpu_attempts.append(mine)
    f = veda.gpu(idempotent=False)(lambda x: x)
    with pytest.raises(KeyError) as caught:
        f(rng_array())
    assert caught.value is mine


@pytest.mark.parametrize("value", ["no", 0, None])
def test_idempotent_must_be_a_bool(value: Any) -> None:
    with pytest.raises(veda.ConfigError, match=f"idempotent: got {value!r}; allowed: True or "
                                               "False"):
        veda.gpu(idempotent=value)


@pytest.mark.parametrize("filename", ["cupy/_core/_kernel.pyx",
                                      "/site-packages/cupyx/scipy/ndimage/_filters.py"])
def test_any_exception_raised_inside_cupys_code_is_a_gpu_failure(filename: str) -> None:
    from vedart.offload.failures import is_gpu_failure

    with pytest.raises(OverflowError) as inside_cupy:
        exec(compile("raise OverflowError('Python integer -5 out of bounds for uint8')",
                     filename, "exec"))
    assert is_gpu_failure(inside_cupy.value)
    calls_numpy = compile("import numpy\nnumpy.uint8(-5)", filename, "exec")
    with pytest.raises(OverflowError) as through_cupy:  # NumPy raises, called by CuPy
        exec(calls_numpy)
    assert is_gpu_failure(through_cupy.value)
    with pytest.raises(OverflowError) as users_own:
        raise OverflowError("Python integer -5 out of bounds for uint8")
    assert not is_gpu_failure(users_own.value)


def test_a_linalg_error_is_not_remembered_for_the_signature(
        gpu_attempts: list[BaseException]) -> None:
    """CuPy's linear algebra raises for values (an inverse of NaNs) where NumPy answers: the
    CPU answers that call, and the next call of the same shape still tries the GPU."""
    gpu_attempts.append(np.linalg.LinAlgError("Error reported by getrf in cuSOLVER. devInfo = 1."))
    inverse = veda.gpu(np.linalg.inv)
    nans = np.full((512, 512), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)
        assert np.isnan(inverse(nans)).all()
    assert inverse.explain(nans).path == "gpu"
