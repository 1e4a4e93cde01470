"""@gpu_kernel without a GPU: registration, launch-configuration math, validation errors,
copy-back rules, cpu= and the Numba CUDA simulator (with the real numba.cuda imported and no
NUMBA_ENABLE_CUDASIM), and the GPU route's decisions through a stand-in backend."""

from __future__ import annotations

import ctypes
import gc
import threading
import types
import warnings
import weakref
from typing import Any

import cupy
import numpy as np
import pytest
from cupy.cuda.memory import MemoryPointer, UnownedMemory
from fakes import FakeProbe
from numba import cuda, float32

import vedart as veda
from vedart.backends.cpu import CPUBackend
from vedart.backends.dims import CUDA_LIMITS, LaunchDims, LaunchLimits
from vedart.backends.numba_launch import argument_key, array_parameters
from vedart.errors import (
    ConfigError,
    GPUUnavailableError,
    KernelLaunchError,
    SimulatorWarning,
)
from vedart.kernels import registry
from vedart.kernels.autotune import Autotuner, size_bucket
from vedart.kernels.launch_config import auto_dims, split_threads
from vedart.kernels.registry import KERNELS, KernelHandle, get_kernel, gpu_kernel

NO_GPU = "CUDA driver not found"


# --- kernels (module level, as users write them) --------------------------------------------

@gpu_kernel(threads_per_block=32)
@cuda.jit
def add_kernel(a, b, result):  # type: ignore[no-untyped-def]
    """The seed guide's kernel."""
    idx = cuda.grid(1)
    if idx < result.size:
        result[idx] = a[idx] + b[idx]


@gpu_kernel(threads_per_block=32)
@cuda.jit
def scale_2d(a, factor, out):  # type: ignore[no-untyped-def]
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] * factor


@cuda.jit
def writes_both(a, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + 1
        a[i] = -1


@cuda.jit(device=True)
def squared(x):  # type: ignore[no-untyped-def]
    return x * x


@cuda.jit(device=True)
def squared_plus_one(x):  # type: ignore[no-untyped-def]
    return squared(x) + 1  # a device function calling another


@gpu_kernel(threads_per_block=16)
@cuda.jit
def block_sums(a, sums):  # type: ignore[no-untyped-def]
    """Shared memory, syncthreads, an atomic and nested device functions."""
    tile = cuda.shared.array(16, dtype=float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = squared_plus_one(a[i]) if i < a.size else 0
    cuda.syncthreads()
    if t == 0:
        total = 0.0
        for k in range(16):
            total += tile[k]
        cuda.atomic.add(sums, 0, total)


@gpu_kernel
@cuda.jit
def lookup_probe(x):  # type: ignore[no-untyped-def]
    """A kernel whose name no other test module uses (the registry is process-wide)."""


def fresh(**options: Any) -> KernelHandle:
    """A new handle of writes_both (its qualified name is shared; each test gets its own)."""
    return gpu_kernel(threads_per_block=32, **options)(writes_both)


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng().random(shape).astype(dtype)


def device_array(shape: tuple[int, ...], device: int = 0, dtype: Any = np.float32,
                 order: str = "C") -> Any:
    """A real cupy.ndarray over memory that is never touched (no CUDA driver is needed)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    memory = UnownedMemory(0x7F0000000000 + device * 2**32, nbytes, None, device_id=device)
    return cupy.ndarray(shape, dtype, MemoryPointer(memory, 0), order=order)


@pytest.fixture(autouse=True)
def no_gpu() -> None:
    veda.init(device_probe=FakeProbe(reason=NO_GPU))
    warnings.simplefilter("ignore", SimulatorWarning)


class RecordingBackend(CPUBackend):
    """A stand-in CUDA device: records launches; runs those on NumPy arrays in the simulator
    (its device arrays are NumPy copies); reports 0.5 s of compilation on its first launch."""

    def __init__(self, ordinal: int) -> None:
        super().__init__()
        self.ordinal = ordinal
        self.launches: list[tuple[LaunchDims, list[type]]] = []

    @property
    def device_id(self) -> int:
        return self.ordinal

    @property
    def launch_limits(self) -> LaunchLimits:
        return LaunchLimits(device=f"device {self.ordinal} (Fake GPU {self.ordinal})")

    def launch(self, kernel: Any, dims: LaunchDims, args: Any) -> float:
        self.launches.append((dims, [type(value) for value in args]))
        if not any(isinstance(value, cupy.ndarray) for value in args):
            super().launch(kernel, dims, args)
        return 0.5 if len(self.launches) == 1 else 0.0


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict[int, RecordingBackend]:
    """A runtime with two (fake) GPUs; kernels launch on RecordingBackends."""
    veda.init(device_probe=FakeProbe(count=2))
    backends: dict[int, RecordingBackend] = {}
    monkeypatch.setattr(registry, "cuda_backend",
                        lambda ordinal: backends.setdefault(ordinal, RecordingBackend(ordinal)))
    return backends


# --- registration and lookup ----------------------------------------------------------------

def test_registration_and_lookup() -> None:
    assert isinstance(lookup_probe, KernelHandle)
    assert get_kernel("lookup_probe") is lookup_probe
    assert get_kernel("test_kernels.lookup_probe") is lookup_probe
    assert get_kernel("test_kernels.add_kernel") is add_kernel
    runtime = veda.get_runtime()
    assert runtime.kernels is KERNELS
    assert runtime.kernels["lookup_probe"] is lookup_probe
    assert "lookup_probe" in list(runtime.kernels) and len(runtime.kernels) >= 4


def test_registry_survives_reinit_and_shutdown() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    veda.shutdown()
    assert get_kernel("lookup_probe") is lookup_probe
    assert veda.get_runtime().kernels["test_kernels.block_sums"] is block_sums


def _make_scale(factor: float) -> KernelHandle:
    @gpu_kernel
    @cuda.jit
    def scale(a, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a[i] * factor

    return scale


def _make_other_scale() -> KernelHandle:
    @gpu_kernel
    @cuda.jit
    def scale(a, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a[i]

    return scale


def test_clashing_names_are_qualified() -> None:
    first, second = _make_scale(2.0), _make_other_scale()
    assert "scale" not in list(KERNELS)
    assert first.qualified_name in list(KERNELS) and second.qualified_name in list(KERNELS)
    assert get_kernel("test_kernels._make_scale.<locals>.scale") is first
    with pytest.raises(KeyError) as error:
        get_kernel("scale")
    assert error.value.args[0] == (
        "kernel name 'scale' is ambiguous; use one of "
        "['test_kernels._make_other_scale.<locals>.scale', "
        "'test_kernels._make_scale.<locals>.scale']")


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(KeyError) as error:
        get_kernel("nope")
    message = error.value.args[0]
    assert message.startswith("no kernel named 'nope'; registered: [")
    assert "'lookup_probe'" in message


def test_redecorating_replaces_and_handles_are_held_weakly() -> None:
    first = _make_scale(2.0)
    second = _make_scale(3.0)
    assert get_kernel(first.qualified_name) is second
    name = second.qualified_name
    del first, second
    gc.collect()
    assert name not in list(KERNELS)


# --- decorator forms and options ------------------------------------------------------------

def test_forms_and_metadata() -> None:
    bare = gpu_kernel(writes_both)
    empty = gpu_kernel()(writes_both)
    assert bare.options == empty.options == registry.KernelOptions()
    assert bare.dispatcher is writes_both and bare.__wrapped__ is writes_both
    assert add_kernel.__name__ == "add_kernel" and add_kernel.__doc__ == "The seed guide's kernel."
    assert add_kernel.parameters.names == ("a", "b", "result")
    assert repr(add_kernel) == "<gpu_kernel test_kernels.add_kernel('a', 'b', 'result')>"


def test_only_kernels_can_be_registered() -> None:
    with pytest.raises(TypeError, match="not a @cuda.jit kernel"):
        gpu_kernel(lambda a: None)
    with pytest.raises(TypeError, match=r"a device function \(@cuda.jit\(device=True\)\)"):
        gpu_kernel(squared)
    with pytest.raises(TypeError, match="not a @cuda.jit kernel"):
        gpu_kernel(add_kernel)

    def star(*arrays):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(TypeError, match=r"kernel parameters must be positional; got \(\*arrays\)"):
        gpu_kernel(cuda.jit(star))


def test_threads_per_block_takes_a_numpy_integer() -> None:
    kernel = gpu_kernel(threads_per_block=np.int64(64))(writes_both)
    assert kernel.options.threads_per_block == 64 and type(kernel.options.threads_per_block) is int
    assert gpu_kernel(autotune=np.True_)(writes_both).options.autotune is True


@pytest.mark.parametrize(("options", "message"), [
    ({"threads_per_block": 0}, "threads_per_block: got 0; allowed: an int from 1 to 1024"),
    ({"threads_per_block": 2048}, "threads_per_block: got 2048; allowed: an int from 1 to 1024"),
    ({"threads_per_block": True}, "threads_per_block: got True; allowed: an int from 1 to 1024"),
    ({"size_from": 3}, "size_from: got 3; allowed: None or a parameter name"),
    ({"size_from": "b"}, "size_from: got 'b'; allowed: a parameter of writes_both ['a', 'out']"),
    ({"outputs": "out"}, "outputs: got 'out'; allowed: None (every NumPy array argument) or a "
                         "tuple of parameter names"),
    ({"outputs": ("out", "c")}, "outputs: got 'c'; allowed: a parameter of writes_both "
                                "['a', 'out']"),
    ({"cpu": 3}, "cpu: got 3; allowed: None or a function taking the kernel's arguments"),
    ({"autotune": "yes"}, "autotune: got 'yes'; allowed: True or False"),
])
def test_bad_options_raise_config_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        gpu_kernel(**options)(writes_both)
    assert str(error.value) == message


# --- launch-configuration math --------------------------------------------------------------

@pytest.mark.parametrize(("threads", "parts", "factors"), [
    (256, 1, (256,)), (256, 2, (16, 16)), (512, 2, (16, 32)), (1024, 2, (32, 32)),
    (128, 2, (8, 16)), (96, 2, (8, 12)), (97, 2, (1, 97)), (1024, 3, (8, 8, 16)),
    (256, 3, (4, 8, 8)), (1, 3, (1, 1, 1)),
])
def test_split_threads(threads: int, parts: int, factors: tuple[int, ...]) -> None:
    assert split_threads(threads, parts) == factors


@pytest.mark.parametrize(("shape", "threads", "grid", "block"), [
    ((1000,), 256, (4, 1, 1), (256, 1, 1)),
    ((1024,), 256, (4, 1, 1), (256, 1, 1)),
    ((1,), 256, (1, 1, 1), (256, 1, 1)),
    ((), 128, (1, 1, 1), (128, 1, 1)),
    ((100, 37), 256, (7, 3, 1), (16, 16, 1)),
    ((4000, 3000), 512, (250, 94, 1), (16, 32, 1)),
    ((10, 20, 30), 1024, (2, 3, 2), (8, 8, 16)),
    # Past 65535 blocks along y or z: the block leans that way, launching the fewest threads.
    ((2, 1_100_000), 256, (2, 4297, 1), (1, 256, 1)),
    ((3, 2, 4_000_000), 256, (2, 1, 62500), (2, 2, 64)),
    ((20_000_000, 2), 256, (1250000, 1, 1), (16, 16, 1)),  # x takes 2**31 - 1 blocks
    ((3, 2, 5_000_000), 256, (1, 1, 625000), (4, 8, 8)),  # no split fits: the device refuses
])
def test_auto_dims(shape: tuple[int, ...], threads: int, grid: tuple[int, ...],
                   block: tuple[int, ...]) -> None:
    assert auto_dims(shape, threads) == LaunchDims(grid, block)  # type: ignore[arg-type]


# --- running in the simulator: values, dtypes, copy-back -----------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_seed_kernel_agrees_with_numpy(dtype: Any) -> None:
    a, b = (rand(70) * 100).astype(dtype), (rand(70) * 100).astype(dtype)
    a_before, b_before = a.copy(), b.copy()
    result = np.zeros(70, dtype=dtype)
    assert add_kernel(a, b, result) is None
    np.testing.assert_array_equal(result, a + b)
    assert result.dtype == dtype
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_explicit_configuration_1d_and_2d() -> None:
    a, b, result = rand(40), rand(40), np.zeros(40, np.float32)
    add_kernel[2, 32](a, b, result)
    np.testing.assert_array_equal(result, a + b)
    m, out = rand(5, 7), np.zeros((5, 7), np.float32)
    scale_2d[(1, 1), (8, 8)](m, np.float32(3.0), out)
    np.testing.assert_allclose(out, m * np.float32(3.0))


def test_automatic_configuration_2d_covers_every_element() -> None:
    m, out = rand(9, 13), np.zeros((9, 13), np.float32)
    scale_2d(m, 2.5, out)  # 32 threads a block: 4 x 8 blocks, a (3, 2) grid
    np.testing.assert_allclose(out, m * 2.5)


def test_partial_configuration_leaves_the_rest_untouched() -> None:
    a, b, result = rand(64), rand(64), np.full(64, -7, np.float32)
    add_kernel[1, 16](a, b, result)
    np.testing.assert_array_equal(result[:16], (a + b)[:16])
    np.testing.assert_array_equal(result[16:], -7)


def test_every_numpy_array_is_copied_back_by_default() -> None:
    a, out = rand(20), np.zeros(20, np.float32)
    expected = a + 1
    fresh()(a, out)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(a, -1)


def test_outputs_restricts_copy_back() -> None:
    a, out = rand(20), np.zeros(20, np.float32)
    a_before = a.copy()
    fresh(outputs=("out",))(a, out)
    np.testing.assert_array_equal(out, a_before + 1)
    np.testing.assert_array_equal(a, a_before)
    fresh(outputs=())(a, out := np.zeros(20, np.float32))
    np.testing.assert_array_equal(out, 0)


def test_outputs_given_as_a_generator_are_all_kept() -> None:
    a, out = rand(20), np.zeros(20, np.float32)
    a_before = a.copy()
    handle = fresh(outputs=(name for name in ["out"]))
    assert handle.options.outputs == ("out",)
    handle(a, out)
    np.testing.assert_array_equal(out, a_before + 1)
    np.testing.assert_array_equal(a, a_before)


def test_read_only_inputs_are_not_copied_back() -> None:
    a = np.broadcast_to(np.float32(2.0), (20,))
    out = np.zeros(20, np.float32)
    fresh()(a, out)
    np.testing.assert_array_equal(out, 3.0)


def test_copy_back_into_strided_views_and_other_byte_orders() -> None:
    base = np.full(40, 9.0, np.float32)
    view = base[::2]
    a = rand(20).astype(">f4")
    fresh(outputs=("out",))(a, view)
    np.testing.assert_array_equal(base[::2], a.astype(np.float32) + 1)
    np.testing.assert_array_equal(base[1::2], 9.0)


def test_an_array_passed_twice_stays_one_array() -> None:
    for outputs in (None, ("out",)):
        x = rand(20)
        fresh(outputs=outputs)(x, x)  # out[i] = a[i] + 1, then a[i] = -1: the same memory
        np.testing.assert_array_equal(x, -1)


def test_scalars_pass_through() -> None:
    m, out = rand(3, 4), np.zeros((3, 4), np.float32)
    for factor in (2, 2.5, np.float32(0.5), True):
        scale_2d(m, factor, out)
        np.testing.assert_allclose(out, m * np.float32(factor))


def test_shared_memory_syncthreads_atomics_and_device_functions() -> None:
    a = rand(40)
    sums = np.zeros(1, np.float32)
    block_sums(a, sums)
    np.testing.assert_allclose(sums[0], np.sum(a * a + 1), rtol=1e-5)
    assert globals()["squared_plus_one"] is squared_plus_one  # restored after the launch
    assert squared_plus_one.py_func.__globals__["squared"] is squared


def test_device_functions_from_a_closure() -> None:
    @cuda.jit(device=True)
    def offset(x):  # type: ignore[no-untyped-def]
        return squared(x) + 10

    @gpu_kernel(threads_per_block=32)
    @cuda.jit
    def apply(a, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = offset(a[i])

    a, out = rand(10), np.zeros(10, np.float32)
    apply(a, out)
    np.testing.assert_allclose(out, a * a + 10, rtol=1e-6)


def test_concurrent_simulated_launches_are_serialised_and_correct() -> None:
    failures: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                a, b, result = rand(20), rand(20), np.zeros(20, np.float32)
                add_kernel(a, b, result)
                np.testing.assert_array_equal(result, a + b)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_simulator_warns_once_per_kernel(caplog: pytest.LogCaptureFixture) -> None:
    kernel = fresh()
    warnings.simplefilter("always", SimulatorWarning)
    message = (f"writes_both: no GPU: {NO_GPU}; running in Numba's CUDA simulator (correct, "
               f"but slow); give @gpu_kernel a cpu= implementation to run on the CPU instead")
    with pytest.warns(SimulatorWarning) as caught:
        kernel(rand(4), np.zeros(4, np.float32))
    assert [str(w.message) for w in caught] == [message]
    assert caught[0].filename == __file__
    assert message in caplog.messages
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        kernel(rand(4), np.zeros(4, np.float32))


def test_gpu_disabled_by_config_runs_in_the_simulator() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    warnings.simplefilter("always", SimulatorWarning)
    with pytest.warns(SimulatorWarning, match="writes_both: GPU disabled by config; running"):
        fresh()(rand(4), out := np.zeros(4, np.float32))
    assert np.all(out >= 1)


def test_autotune_without_a_gpu_launches_as_configured() -> None:
    a, out = rand(20), np.zeros(20, np.float32)
    expected = a + 1
    fresh(autotune=True)(a, out)
    np.testing.assert_array_equal(out, expected)


# --- cpu= and fallback="raise" --------------------------------------------------------------

def add_on_cpu(a: np.ndarray, b: np.ndarray, result: np.ndarray) -> None:
    np.add(a, b, out=result)
    a[:] = 0  # not an output: discarded, as a kernel's write would be


def test_cpu_implementation_runs_without_a_gpu() -> None:
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    a, b, result = rand(1000), rand(1000), np.zeros(1000, np.float32)
    a_before = a.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        kernel(a, b, result)
    np.testing.assert_array_equal(result, a_before + b)
    np.testing.assert_array_equal(a, a_before)


def test_cpu_failure_leaves_the_callers_arrays_untouched() -> None:
    def half_then_fail(a: np.ndarray, b: np.ndarray, result: np.ndarray) -> None:
        result[:5] = 1
        raise ArithmeticError("boom")

    kernel = gpu_kernel(cpu=half_then_fail)(add_kernel.dispatcher)
    result = np.zeros(10, np.float32)
    with pytest.raises(ArithmeticError, match="boom"):
        kernel(rand(10), rand(10), result)
    np.testing.assert_array_equal(result, 0)


def test_fallback_raise_without_cpu_raises_gpu_unavailable() -> None:
    veda.init(veda.Config.builder().fallback("raise").build(),
              device_probe=FakeProbe(reason=NO_GPU))
    result = np.zeros(4, np.float32)
    with pytest.raises(GPUUnavailableError) as error:
        add_kernel(rand(4), rand(4), result)
    assert str(error.value) == (f"add_kernel: no GPU: {NO_GPU}; fallback='raise' and the "
                                f"kernel has no cpu= implementation")
    assert isinstance(error.value, RuntimeError)
    gpu_kernel(cpu=add_on_cpu)(add_kernel.dispatcher)(np.ones(4), np.ones(4), result)
    np.testing.assert_array_equal(result, 2)


# --- validation: KernelLaunchError before any work -----------------------------------------

@pytest.mark.parametrize(("configuration", "message"), [
    ((0, 32), "add_kernel: grid: got 0; allowed: sizes >= 1 (an int >= 1 or a tuple of 1 to 3 "
              "ints >= 1)"),
    ((2, -32), "add_kernel: block: got -32; allowed: sizes >= 1 (an int >= 1 or a tuple of 1 "
               "to 3 ints >= 1)"),
    (((2, 0), 32), "add_kernel: grid: got (2, 0); allowed: sizes >= 1 (an int >= 1 or a tuple "
                   "of 1 to 3 ints >= 1)"),
    (("2", 32), "add_kernel: grid: got '2'; allowed: an int >= 1 or a tuple of 1 to 3 ints >= 1"),
    ((2, (1, 2, 3, 4)), "add_kernel: block: got (1, 2, 3, 4); allowed: an int >= 1 or a tuple "
                        "of 1 to 3 ints >= 1"),
    ((2, 1.5), "add_kernel: block: got 1.5; allowed: an int >= 1 or a tuple of 1 to 3 ints >= 1"),
    (4, "add_kernel[...]: got 4; allowed: kernel[grid, block]"),
    ((1, 2, 3), "add_kernel[...]: got (1, 2, 3); allowed: kernel[grid, block]"),
])
def test_malformed_configurations(configuration: Any, message: str) -> None:
    with pytest.raises(KernelLaunchError) as error:
        add_kernel[configuration]
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(("grid", "block", "message"), [
    (1, (32, 64), "add_kernel: block: got (32, 64) = 2048 threads; allowed: at most 1024 "
                  "threads per block on CUDA devices"),
    (1, 1025, "add_kernel: block: got (1025,) = 1025 threads; allowed: at most 1024 threads per "
              "block on CUDA devices"),
    (1, (1, 1, 128), "add_kernel: block: got (1, 1, 128); allowed: at most (1024, 1024, 64) per "
                     "dimension (x, y, z) on CUDA devices"),
    ((1, 70000), 32, "add_kernel: grid: got (1, 70000); allowed: at most (2147483647, 65535, "
                     "65535) per dimension (x, y, z) on CUDA devices"),
])
def test_configurations_beyond_the_device_limits(grid: Any, block: Any, message: str) -> None:
    result = np.zeros(4, np.float32)
    with pytest.raises(KernelLaunchError) as error:
        add_kernel[grid, block](np.ones(4), np.ones(4), result)
    assert str(error.value) == message
    np.testing.assert_array_equal(result, 0)


def test_wrong_argument_count() -> None:
    with pytest.raises(KernelLaunchError) as error:
        add_kernel(np.ones(4), np.ones(4))
    assert str(error.value) == "add_kernel: got 2 arguments; allowed: exactly 3 (a, b, result)"
    with pytest.raises(KernelLaunchError, match="got 4 arguments"):
        add_kernel[1, 32](np.ones(4), np.ones(4), np.ones(4), np.ones(4))


def test_output_that_is_not_an_array() -> None:
    kernel = gpu_kernel(outputs=("result",), threads_per_block=32)(add_kernel.dispatcher)
    with pytest.raises(KernelLaunchError) as error:
        kernel(np.ones(4), np.ones(4), 3.0)
    assert str(error.value) == ("add_kernel: output 'result': got float 3.0; allowed: a NumPy "
                                "or device array")


def test_read_only_named_output() -> None:
    with pytest.raises(KernelLaunchError) as error:
        fresh(outputs=("out",))(np.ones(4, np.float32), np.broadcast_to(np.float32(0), (4,)))
    assert str(error.value) == ("writes_both: output 'out' is a read-only NumPy array; "
                                "allowed: a writable array")


@pytest.mark.parametrize(("bad", "message"), [
    (np.array([object()] * 4), "add_kernel: argument 'a': dtype object is not supported; "
                               "allowed: bool, int, uint, float or complex dtypes"),
    (np.array(["2026-11-22"] * 4, dtype="datetime64[D]"),
     "add_kernel: argument 'a': dtype datetime64[D] is not supported; allowed: bool, int, "
     "uint, float or complex dtypes"),
    (np.ma.array(np.ones(4)), "add_kernel: argument 'a': got MaskedArray (an ndarray "
                              "subclass); allowed: a NumPy ndarray or a device array"),
])
def test_unsupported_arrays(bad: np.ndarray, message: str) -> None:
    with pytest.raises(KernelLaunchError) as error:
        add_kernel(bad, np.ones(4), np.zeros(4))
    assert str(error.value) == message


def test_sizing_problems() -> None:
    with pytest.raises(KernelLaunchError) as error:
        gpu_kernel(size_from="a")(writes_both)(5, np.zeros(4))
    assert str(error.value) == "writes_both: size_from 'a': got int 5; allowed: an array"
    with pytest.raises(KernelLaunchError) as error:
        fresh()(1.0, 2.0)
    assert str(error.value) == ("writes_both: no array argument to size the launch; allowed: an "
                                "array argument, size_from=, or an explicit kernel[grid, block]")
    with pytest.raises(KernelLaunchError) as error:
        fresh()(np.zeros(0), np.zeros((0, 3)))
    assert str(error.value) == ("writes_both: array 'a' has shape (0,) (0 elements) to size the "
                                "launch; allowed: at least one element, or an explicit "
                                "kernel[grid, block]")
    with pytest.raises(KernelLaunchError) as error:
        fresh()(np.zeros(4), np.zeros((1, 2, 2, 2)))
    assert str(error.value) == ("writes_both: array 'out' has 4 dimensions to size the launch; "
                                "allowed: 0 to 3, or an explicit kernel[grid, block]")


class ForeignDeviceArray:
    """Any object with __cuda_array_interface__ (a PyTorch tensor, a Numba device array)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_device_arrays_are_refused_where_kernels_run_on_the_cpu() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    with pytest.raises(KernelLaunchError) as error:
        add_kernel(np.ones(4), ForeignDeviceArray(), np.zeros(4))
    assert str(error.value) == ("add_kernel: argument 'b': got a device array "
                                "(ForeignDeviceArray) but this call runs on the CPU (GPU disabled "
                                "by config); allowed: NumPy arrays and scalars")


# --- the GPU route, through a stand-in backend ----------------------------------------------

def test_gpu_route_sizes_from_the_largest_array_or_size_from(
        fake_gpu: dict[int, RecordingBackend]) -> None:
    a, b, result = rand(1000), rand(1000), np.zeros(1000, np.float32)
    gpu_kernel(add_kernel.dispatcher)(a, b, result)
    np.testing.assert_allclose(result, a + b)
    sized = gpu_kernel(size_from="out", threads_per_block=128)(writes_both)
    sized(device_array((5000,)), device_array((300,)))
    assert [dims for dims, _ in fake_gpu[0].launches] == [
        LaunchDims((4, 1, 1), (256, 1, 1)), LaunchDims((3, 1, 1), (128, 1, 1))]


def test_gpu_route_moves_numpy_arrays_and_passes_device_arrays(
        fake_gpu: dict[int, RecordingBackend]) -> None:
    add_kernel(device_array((64,)), rand(64), device_array((64,)))
    assert fake_gpu[0].launches == [(LaunchDims((2, 1, 1), (32, 1, 1)),
                                     [cupy.ndarray, np.ndarray, cupy.ndarray])]


def test_gpu_route_launches_on_the_device_arrays_device(
        fake_gpu: dict[int, RecordingBackend]) -> None:
    add_kernel[1, 32](device_array((8,), device=1), 2.0, device_array((8,), device=1))
    assert list(fake_gpu) == [1]
    veda.init(veda.Config.builder().devices([1]).build(), device_probe=FakeProbe(count=2))
    add_kernel(rand(8), rand(8), np.zeros(8, np.float32))
    assert len(fake_gpu[1].launches) == 2 and 0 not in fake_gpu


def test_arrays_on_different_devices(fake_gpu: dict[int, RecordingBackend]) -> None:
    result = np.zeros(8, np.float32)
    with pytest.raises(KernelLaunchError) as error:
        add_kernel(device_array((8,), device=0), device_array((8,), device=1), result)
    assert str(error.value) == ("add_kernel: arrays on different devices: 'a' on device 0, 'b' "
                                "on device 1; allowed: every device array on one device")
    assert fake_gpu == {}


def test_gpu_route_checks_the_devices_limits(fake_gpu: dict[int, RecordingBackend]) -> None:
    with pytest.raises(KernelLaunchError) as error:
        add_kernel[1, 2048](device_array((8,)), device_array((8,)), device_array((8,)))
    assert str(error.value).endswith("at most 1024 threads per block on device 0 (Fake GPU 0)")
    assert fake_gpu[0].launches == []


def test_telemetry_counts_launches_without_a_gpu_by_path() -> None:
    for _ in range(2):
        fresh()(rand(4), np.zeros(4, np.float32))
    gpu_kernel(cpu=lambda a, out: None)(writes_both)(rand(4), np.zeros(4, np.float32))
    telemetry = veda.get_runtime().telemetry
    [row] = telemetry.snapshot()["kernels"]
    assert (row["launches"], row["simulator_launches"], row["cpu_launches"]) == (3, 2, 1)
    assert row["compiles"] == 0 and row["mean_kernel_seconds"] is None
    lines = telemetry.report().splitlines()
    assert lines[0] == "no @gpu calls recorded" and lines[2].startswith("kernel ")
    assert lines[4].split() == ["test_kernels.writes_both", "3", "0", "2", "1", "0.000", "-"]


def test_telemetry_on_the_gpu_route(fake_gpu: dict[int, RecordingBackend]) -> None:
    kernel = fresh()
    for _ in range(3):
        kernel(device_array((8,)), device_array((8,)))
    [row] = veda.get_runtime().telemetry.snapshot()["kernels"]
    assert row == {"kernel": "test_kernels.writes_both", "launches": 3, "gpu_launches": 3,
                   "simulator_launches": 0, "cpu_launches": 0, "compiles": 1,
                   "compile_seconds": 0.5, "timed_launches": 0, "mean_kernel_seconds": None}


def test_no_kernel_telemetry_when_telemetry_is_off() -> None:
    veda.init(veda.Config.builder().telemetry(False).build(), device_probe=FakeProbe(reason=NO_GPU))
    fresh()(rand(4), np.zeros(4, np.float32))
    assert veda.get_runtime().telemetry.snapshot()["kernels"] == []


# --- a CUDA context lost by one launch, met by others ----------------------------------------

REAL_CUDA_BACKEND = registry.cuda_backend  # before any test replaces it
LOST = "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered"


class CudaAPIError(Exception):
    """Numba's driver error, as the classification sees it."""


CudaAPIError.__module__ = "numba.cuda.cudadrv.driver"


def kernel_rows() -> dict[str, Any]:
    [row] = veda.get_runtime().telemetry.snapshot()["kernels"]
    return row


def test_a_launch_whose_own_kernel_loses_the_context_raises_and_later_ones_run_on_the_cpu(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)

    def loses_it(kernel: Any, dims: LaunchDims, args: Any) -> float:
        raise CudaAPIError(f"[700] Call to cuLaunchKernel results in {LOST}")

    monkeypatch.setattr(registry, "cuda_backend", lambda ordinal: types.SimpleNamespace(
        launch=loses_it, launch_limits=LaunchLimits(), to_device=np.copy, device_id=ordinal))
    result = np.zeros(8, np.float32)
    with pytest.raises(CudaAPIError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        kernel(rand(8), rand(8), result)
    np.testing.assert_array_equal(result, 0)
    reason = veda.get_runtime().gpu.unavailable_reason
    assert reason.startswith("CudaAPIError: [700]") and "(in kernel " in reason
    a, b = rand(8), rand(8)
    kernel(a, b, result)
    np.testing.assert_array_equal(result, a + b)
    assert (kernel_rows()["gpu_launches"], kernel_rows()["cpu_launches"]) == (0, 1)


def test_a_launch_that_finds_the_gpu_lost_after_it_read_its_route_runs_on_the_cpu(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    kernel(rand(8), rand(8), np.zeros(8, np.float32))  # the route: the (fake) GPU

    def lost_meanwhile(ordinal: int) -> Any:  # another thread's launch loses the context
        veda.get_runtime().gpu.disable(f"CudaAPIError: {LOST} (in kernel another)")
        return REAL_CUDA_BACKEND(ordinal)  # which raises GPUUnavailableError now

    monkeypatch.setattr(registry, "cuda_backend", lost_meanwhile)
    a, b, result = rand(8), rand(8), np.zeros(8, np.float32)
    kernel(a, b, result)
    np.testing.assert_array_equal(result, a + b)
    assert len(fake_gpu[0].launches) == 1
    assert (kernel_rows()["gpu_launches"], kernel_rows()["cpu_launches"]) == (1, 1)


def test_a_launch_that_meets_a_context_another_launch_lost_runs_on_the_cpu(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    first = f"CudaAPIError: {LOST} (in kernel another)"

    class MeetsALostContext(RecordingBackend):
        def launch(self, kernel: Any, dims: LaunchDims, args: Any) -> float:
            veda.get_runtime().gpu.disable(first)  # lost by another thread a moment ago
            raise CudaAPIError(f"[700] Call to cuLaunchKernel results in {LOST}")

    monkeypatch.setattr(registry, "cuda_backend", MeetsALostContext)
    a, b, result = rand(8), rand(8), np.zeros(8, np.float32)
    kernel(a, b, result)
    np.testing.assert_array_equal(result, a + b)
    assert veda.get_runtime().gpu.unavailable_reason == first
    assert (kernel_rows()["gpu_launches"], kernel_rows()["cpu_launches"]) == (0, 1)
    with pytest.raises(KernelLaunchError, match=r"this call runs on the CPU \(no GPU: Cuda"):
        kernel(device_array((8,)), device_array((8,)), device_array((8,)))


def test_a_gpu_lookup_failure_of_a_current_route_raises_at_once(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[int] = []

    def unavailable(ordinal: int) -> Any:  # the GPU is not lost: nothing to route around
        lookups.append(ordinal)
        raise GPUUnavailableError("CUDA backend unavailable: no NVRTC")

    monkeypatch.setattr(registry, "cuda_backend", unavailable)
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    result = np.zeros(8, np.float32)
    with pytest.raises(GPUUnavailableError, match="no NVRTC"):
        kernel(rand(8), rand(8), result)
    assert lookups == [0] and veda.get_runtime().gpu.is_available()
    np.testing.assert_array_equal(result, 0)


class MeetsALostContext(RecordingBackend):
    """A device whose launches meet a CUDA context another thread's launch lost a moment
    before (it disables the GPU first, as that launch did)."""

    def launch(self, kernel: Any, dims: LaunchDims, args: Any) -> float:
        veda.get_runtime().gpu.disable(f"CudaAPIError: {LOST} (in kernel another)")
        raise CudaAPIError(f"[700] Call to cuLaunchKernel results in {LOST}")


def test_a_rerouted_launch_leaves_no_cycle_holding_its_failed_attempt(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    met: list[weakref.ref[BaseException]] = []

    class Recorded(MeetsALostContext):
        def launch(self, kernel: Any, dims: LaunchDims, args: Any) -> float:
            try:
                return super().launch(kernel, dims, args)
            except CudaAPIError as error:
                met.append(weakref.ref(error))
                raise

    monkeypatch.setattr(registry, "cuda_backend", Recorded)
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    gc.disable()  # the failed attempt's device copies must go with the call, not at a collection
    try:
        kernel(rand(8), rand(8), np.zeros(8, np.float32))
        assert met and met[0]() is None
    finally:
        gc.enable()


def test_a_launch_given_device_arrays_raises_what_it_met(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "cuda_backend", MeetsALostContext)
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    with pytest.raises(CudaAPIError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):  # it may have written
        kernel(device_array((8,)), device_array((8,)), device_array((8,)))  # to them


def test_a_rerouted_launch_that_fails_names_what_sent_it_off_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    veda.init(veda.Config.builder().fallback("raise").build(), device_probe=FakeProbe(count=2))
    monkeypatch.setattr(registry, "cuda_backend", MeetsALostContext)
    result = np.zeros(8, np.float32)
    with pytest.raises(GPUUnavailableError, match="fallback='raise'") as error:
        fresh()(rand(8), result)
    assert isinstance(error.value.__context__, CudaAPIError)
    np.testing.assert_array_equal(result, 0)


def test_a_launch_is_routed_anew_once_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    veda.init(device_probe=FakeProbe(count=2))
    replaced: list[veda.Runtime] = []

    class LostThenReplaced(MeetsALostContext):
        def launch(self, kernel: Any, dims: LaunchDims, args: Any) -> float:
            if replaced:
                return super().launch(kernel, dims, args)
            veda.get_runtime().gpu.disable(f"CudaAPIError: {LOST} (in kernel another)")
            replaced.append(veda.init(device_probe=FakeProbe(count=2)))  # a new one, with a GPU
            raise CudaAPIError(f"[700] Call to cuLaunchKernel results in {LOST}")

    monkeypatch.setattr(registry, "cuda_backend", LostThenReplaced)
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    result = np.zeros(8, np.float32)
    with pytest.raises(CudaAPIError, match="CUDA_ERROR_ILLEGAL_ADDRESS") as error:
        kernel(rand(8), rand(8), result)  # the new runtime's GPU route met a lost context too
    assert isinstance(error.value.__context__, CudaAPIError) and error.value.__context__ is not \
        error.value
    assert not replaced[0].gpu.is_available()
    np.testing.assert_array_equal(result, 0)


def test_a_launch_that_finds_the_gpu_gone_twice_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    veda.init(device_probe=FakeProbe(count=2))
    lookups: list[int] = []

    def replaced_meanwhile(ordinal: int) -> Any:  # each lookup finds another runtime installed
        lookups.append(ordinal)
        veda.init(device_probe=FakeProbe(count=2))
        raise GPUUnavailableError(f"no GPU: lookup {len(lookups)}")

    monkeypatch.setattr(registry, "cuda_backend", replaced_meanwhile)
    kernel = gpu_kernel(cpu=add_on_cpu, outputs=("result",))(add_kernel.dispatcher)
    with pytest.raises(GPUUnavailableError, match="lookup 2") as error:
        kernel(rand(8), rand(8), np.zeros(8, np.float32))
    assert lookups == [0, 0] and str(error.value.__context__) == "no GPU: lookup 1"


def test_a_rerouted_failure_keeps_a_context_of_its_own(
        fake_gpu: dict[int, RecordingBackend], monkeypatch: pytest.MonkeyPatch) -> None:
    def fails_in_its_handler(a: np.ndarray, b: np.ndarray, result: np.ndarray) -> None:
        try:
            {}["missing"]
        except KeyError:
            raise ArithmeticError("cpu= failed") from None

    monkeypatch.setattr(registry, "cuda_backend", MeetsALostContext)
    kernel = gpu_kernel(cpu=fails_in_its_handler)(add_kernel.dispatcher)
    with pytest.raises(ArithmeticError, match="cpu= failed") as error:
        kernel(rand(8), rand(8), np.zeros(8, np.float32))
    assert isinstance(error.value.__context__, KeyError)


# --- the fast launch path's pieces (no driver needed) ---------------------------------------

def test_argument_key_covers_cupy_arrays_and_plain_scalars() -> None:
    c = device_array((4, 6))
    f = device_array((4, 6), order="F")
    key = argument_key((c, f, c[:, ::2], 3, 2.5, True, 1j, np.float32(1), np.int8(2)),
                       cupy.ndarray)
    assert key == ((np.dtype(np.float32), 2, True, False), (np.dtype(np.float32), 2, False, True),
                   (np.dtype(np.float32), 2, False, False), int, float, bool, complex,
                   np.float32, np.int8)
    for uncovered in (2**63, (1, 2), np.ones(3), ForeignDeviceArray(), np.datetime64(1, "D")):
        assert argument_key((c, uncovered), cupy.ndarray) is None


@pytest.mark.parametrize("view", ["c", "f", "strided", "0d"])
def test_array_parameters_match_numbas_own_marshalling(view: str) -> None:
    from numba.cuda.cudadrv.devicearray import (
        _StridedLayoutShim,
        _StridedMemoryViewShim,
    )
    from numba.cuda.dispatcher import _Kernel

    base = device_array((6, 8), dtype=np.float64)
    array = {"c": base, "f": device_array((6, 8), order="F"), "strided": base[1::2, ::3],
             "0d": base[2, 3]}[view]

    class NumbaSeesDeviceMemory:
        __cuda_memory__ = True
        _strided_memory_view_shim = _StridedMemoryViewShim(
            ptr=array.data.ptr, shape=array.shape, dtype=array.dtype, size=array.size,
            _layout=_StridedLayoutShim(strides_in_bytes=array.strides,
                                       is_contiguous_c=array._c_contiguous,
                                       is_contiguous_f=array._f_contiguous,
                                       is_contiguous_any=False))

    from numba.core import types as numba_types

    expected: list[Any] = []
    array_type = numba_types.Array(numba_types.float64, array.ndim, "A")
    _Kernel._prepare_args(types.SimpleNamespace(extensions=[]), array_type,
                          NumbaSeesDeviceMemory(), 0, [], expected)
    assert list(array_parameters(array)) == expected


class StandInKernel:
    """Numba's compiled kernel, as the launcher sees it (scalars marshalled by Numba's code)."""

    from numba.cuda.dispatcher import _Kernel

    _prepare_args = _Kernel._prepare_args
    extensions: list[Any] = []
    cooperative = launch_config_sensitive = False

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.bound = False
        self._codelibrary = types.SimpleNamespace(
            get_cufunc=lambda: types.SimpleNamespace(kernel="device function"))

    def bind(self) -> None:
        self.bound = True


class StandInDispatcher:
    """A @cuda.jit dispatcher: Numba's own launch records the call and compiles per types."""

    __name__ = "stand_in"
    _can_compile = True

    def __init__(self, debug: bool = False) -> None:
        self.debug = debug
        self.overloads: dict[tuple[Any, ...], StandInKernel] = {}
        self.numba_launches: list[tuple[Any, ...]] = []

    def typeof_pyval(self, value: Any) -> Any:
        from numba.core import types as numba_types
        from numba.np.numpy_support import from_dtype

        if isinstance(value, cupy.ndarray):
            layout = "C" if value._c_contiguous else "F" if value._f_contiguous else "A"
            return numba_types.Array(from_dtype(value.dtype), value.ndim, layout)
        import numba

        return numba.typeof(value)

    def compile(self, argument_types: tuple[Any, ...]) -> StandInKernel:
        return self.overloads.setdefault(argument_types, StandInKernel(self.debug))

    def __getitem__(self, configuration: tuple[Any, ...]) -> Any:
        def launch(*args: Any) -> None:
            self.numba_launches.append(configuration)
            self.compile(tuple(self.typeof_pyval(value) for value in args))
        return launch


@pytest.fixture
def launcher() -> Any:
    from vedart.backends.numba_launch import NumbaLauncher

    launcher = NumbaLauncher(cupy.ndarray)
    launcher.fast_launches = []  # type: ignore[attr-defined]
    launcher._cuda_launch = lambda *call: launcher.fast_launches.append(call)  # type: ignore
    launcher._stream_from_handle = lambda pointer: f"stream {pointer:#x}"  # type: ignore
    return launcher


def test_launcher_takes_numbas_launch_first_then_the_fast_path(launcher: Any) -> None:
    dispatcher = StandInDispatcher()
    dims = LaunchDims((2, 1, 1), (32, 1, 1))
    array = device_array((64,))
    args = (array, np.float32(2.5), 3)
    assert launcher.launch(dispatcher, dims, args, 0) > 0  # compiled in Numba's launch
    assert dispatcher.numba_launches == [((2, 1, 1), (32, 1, 1), 0)]
    assert launcher.launch(dispatcher, dims, args, 0x55) == 0.0
    assert launcher.launch(dispatcher, dims, args, 0x55) == 0.0
    assert len(dispatcher.numba_launches) == 1
    [kernel] = dispatcher.overloads.values()
    assert kernel.bound
    stream, config, function, *parameters = launcher.fast_launches[0]
    assert (stream, function) == ("stream 0x55", "device function")
    assert (config.grid, config.block, config.shmem_size) == ((2, 1, 1), (32, 1, 1), 0)
    assert parameters[:7] == list(array_parameters(array))
    scalar, integer = parameters[7:]
    assert isinstance(scalar, ctypes.c_float) and isinstance(integer, ctypes.c_int64)
    assert (scalar.value, integer.value) == (2.5, 3)
    assert len(launcher.fast_launches) == 2


def test_launcher_leaves_uncovered_calls_to_numba(launcher: Any) -> None:
    dims = LaunchDims((1, 1, 1), (32, 1, 1))
    dispatcher = StandInDispatcher()
    for _ in range(2):
        launcher.launch(dispatcher, dims, (device_array((8,)), (1, 2)), 0)  # a tuple
    debug = StandInDispatcher(debug=True)
    for _ in range(2):
        launcher.launch(debug, dims, (device_array((8,)),), 0)
    assert len(dispatcher.numba_launches) == len(debug.numba_launches) == 2
    assert launcher.fast_launches == []


def test_launcher_falls_back_when_the_first_fast_launch_fails(
        launcher: Any, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*call: Any) -> None:
        raise TypeError("unsupported kernel argument")

    launcher._cuda_launch = refuse
    dispatcher = StandInDispatcher()
    dims = LaunchDims((1, 1, 1), (32, 1, 1))
    for _ in range(3):
        assert launcher.launch(dispatcher, dims, (device_array((8,)),), 0) >= 0
    assert len(dispatcher.numba_launches) == 3
    assert caplog.messages == ["fast kernel launch of stand_in failed (TypeError: unsupported "
                               "kernel argument); using Numba's launch"]


def test_autotuner_keeps_the_fastest_per_device_and_bucket() -> None:
    tuner = Autotuner("k", writes_both)
    timings = {128: 3.0, 256: 1.0, 512: 1.0, 1024: 2.0}
    measured: list[int] = []

    def seconds_for(threads: int) -> float:
        measured.append(threads)
        return timings[threads]

    assert tuner.best(0, (1, 20)) is None
    assert tuner.tune(0, (1, 20), [128, 256, 512, 1024], seconds_for) == 256
    assert measured == [128, 256, 512, 1024]
    assert tuner.best(0, (1, 20)) == 256 and tuner.best(1, (1, 20)) is None
    assert size_bucket((1000,)) == (1, 10) and size_bucket((1024,)) == (1, 11)
    assert size_bucket((100, 37)) == (2, 12)


def test_device_limits_default_to_cuda_limits() -> None:
    assert CUDA_LIMITS.max_threads_per_block == 1024
    assert CUDA_LIMITS.check("k", LaunchDims((2**31 - 1, 65535, 65535), (1024, 1, 1)))


# --- the launch-overhead benchmark ------------------------------------------------------------

def test_benchmark_reports_not_available_without_a_gpu() -> None:
    from vedart.bench import kernels as bench

    result = bench.run(quick=True)
    assert result["device_name"] is None
    assert result["note"].startswith("no GPU (") and result["note"].endswith("): n/a")
    assert bench.format_table(result).splitlines()[1] == result["note"]


def test_benchmark_table() -> None:
    from vedart.bench import kernels as bench

    medians = {"numba_device_arrays": 30.0, "numba_cupy": 135.0, "backend_launch_kernel": 20.0,
               "vedart_explicit": 22.0, "vedart_auto": 25.5}
    table = bench.format_table({"elements": 32768, "threads_per_block": 256,
                                "calls_per_sample": 1000, "us_per_launch": medians,
                                "overhead_us": -4.5, "target_us": 20.0, "meets_target": True,
                                "speedup_over_numba_cupy": 135 / 25.5})
    assert table.splitlines()[1:] == [
        "  Numba launch, Numba device arrays (raw)              30.0",
        "  Numba launch, CuPy arrays                           135.0",
        "  CUDABackend.launch_kernel, CuPy arrays               20.0",
        "  @gpu_kernel kernel[grid, block], CuPy arrays         22.0",
        "  @gpu_kernel kernel(...), CuPy arrays                 25.5",
        "@gpu_kernel over the raw Numba launch: -4.5 us (target <= 20 us) ok; 5.3x faster than "
        "Numba on CuPy arrays"]
