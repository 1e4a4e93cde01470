"""@gpu_kernel and vedart.backends on a real GPU (``pytest -m gpu``): the seed's kernels agree
with NumPy on NumPy and CuPy arrays, the fast launch path over many argument layouts, copy-back
rules, streams, telemetry, autotuning, the on-disk cache, and every usage example of the
CUDABackend seed (basic computation, launch_kernel, memory info, kernel caching, multi-GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cupy
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import cuda, float32

import vedart as veda
from vedart.backends import CUDABackend, get_backend
from vedart.errors import KernelLaunchError
from vedart.kernels.autotune import CANDIDATES
from vedart.kernels.registry import KernelHandle, gpu_kernel

pytestmark = pytest.mark.gpu


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return (np.random.default_rng().random(shape) * 100).astype(dtype)


def kernel_stats(handle: KernelHandle) -> dict[str, Any]:
    rows = veda.get_runtime().telemetry.snapshot()["kernels"]
    return next(row for row in rows if row["kernel"] == handle.qualified_name)


def two_gpus() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() >= 2
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver: every test here is skipped anyway
        return False


# --- kernels ----------------------------------------------------------------------------------

@gpu_kernel
@cuda.jit
def add_kernel(a, b, result):  # type: ignore[no-untyped-def]
    idx = cuda.grid(1)
    if idx < result.size:
        result[idx] = a[idx] + b[idx]


@cuda.jit
def vector_add(a, b, c):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < len(c):
        c[i] = a[i] + b[i]


@gpu_kernel
@cuda.jit
def scale_2d(a, factor, out):  # type: ignore[no-untyped-def]
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] * factor


@gpu_kernel(size_from="dst")
@cuda.jit
def affine_2d(src, dst):  # type: ignore[no-untyped-def]
    i, j = cuda.grid(2)
    if i < dst.shape[0] and j < dst.shape[1]:
        dst[i, j] = src[i, j] * 2 + 1


@cuda.jit
def writes_both(a, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + 1
        a[i] = -1


@cuda.jit(device=True)
def squared_plus_one(x):  # type: ignore[no-untyped-def]
    return x * x + 1


@gpu_kernel(threads_per_block=128)
@cuda.jit
def block_sums(a, sums):  # type: ignore[no-untyped-def]
    tile = cuda.shared.array(128, dtype=float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = squared_plus_one(a[i]) if i < a.size else 0
    cuda.syncthreads()
    if t == 0:
        total = float32(0)
        for k in range(128):
            total += tile[k]
        cuda.atomic.add(sums, 0, total)


def fresh_increment(**options: Any) -> KernelHandle:
    """A new kernel (new dispatcher: compiles on its first call) adding 1 to every element."""
    @gpu_kernel(**options)
    @cuda.jit
    def increment(x):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 1

    return increment


# --- the seed's vector_add and a 2-D kernel agree with NumPy ---------------------------------

def test_seed_kernel_on_numpy_arrays_copies_back() -> None:
    n = 1_000_003
    a, b = rand(n), rand(n)
    a_before, b_before = a.copy(), b.copy()
    result = np.zeros(n, np.float32)
    add_kernel(a, b, result)
    np.testing.assert_array_equal(result, a + b)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_seed_kernel_on_cupy_arrays_in_place() -> None:
    a, b = cupy.asarray(rand(100_000)), cupy.asarray(rand(100_000))
    result = cupy.zeros(100_000, cupy.float32)
    for _ in range(3):  # first call compiles through Numba, the others take the fast path
        result.fill(0)
        add_kernel(a, b, result)
        cupy.testing.assert_array_equal(result, a + b)


def test_explicit_configuration() -> None:
    n = 5000
    a, b = rand(n), rand(n)
    result = np.zeros(n, np.float32)
    blocks = (n + 255) // 256
    add_kernel[blocks, 256](a, b, result)
    np.testing.assert_array_equal(result, a + b)
    ca, cb, cr = cupy.asarray(a), cupy.asarray(b), cupy.zeros(n, cupy.float32)
    add_kernel[(blocks,), (256,)](ca, cb, cr)
    cupy.testing.assert_array_equal(cr, ca + cb)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_2d_kernel_agrees_with_numpy(dtype: Any) -> None:
    m = rand(300, 517, dtype=dtype)
    out = np.zeros_like(m)
    scale_2d(m, 3.0, out)
    np.testing.assert_allclose(out, m * 3.0, rtol=1e-6)
    cm, cout = cupy.asarray(m), cupy.zeros_like(cupy.asarray(m))
    for _ in range(2):
        scale_2d(cm, 3.0, cout)
        np.testing.assert_allclose(cout.get(), m * 3.0, rtol=1e-6)


_layouts = st.sampled_from(["C", "F", "rows", "cols"])


def _view(array: Any, layout: str) -> Any:
    """``array`` (C order) as the named layout, keeping its shape where it can."""
    if layout == "F":
        return cupy.asfortranarray(array)
    if layout == "rows":
        return cupy.concatenate([array, array])[::2]
    if layout == "cols":
        return cupy.concatenate([array, array], axis=1)[:, ::2]
    return array


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                         HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 70), cols=st.integers(1, 70),
       dtype=st.sampled_from([np.float32, np.float64, np.int32]),
       src_layout=_layouts, dst_layout=_layouts)
def test_fast_path_over_argument_layouts_agrees_with_cupy(
        rows: int, cols: int, dtype: Any, src_layout: str, dst_layout: str) -> None:
    src = _view(cupy.asarray(rand(rows, cols, dtype=dtype)), src_layout)
    dst = _view(cupy.zeros((rows, cols), dtype), dst_layout)
    for _ in range(2):  # the second launch with this argument key is a fast one
        dst.fill(0)
        affine_2d(src, dst)
        cupy.testing.assert_array_equal(dst, src * 2 + 1)


@pytest.mark.parametrize("factor", [2, 2.5, np.float32(0.5), np.float64(1.5), True])
def test_scalars_pass_through(factor: Any) -> None:
    m = cupy.asarray(rand(40, 50))
    out = cupy.zeros_like(m)
    for _ in range(2):
        scale_2d(m, factor, out)
        np.testing.assert_allclose(out.get(), m.get() * np.float32(factor), rtol=1e-6)


# --- copy-back rules, devices, streams --------------------------------------------------------

def test_outputs_restricts_copy_back() -> None:
    a, out = rand(1000), np.zeros(1000, np.float32)
    a_before = a.copy()
    gpu_kernel(outputs=("out",))(writes_both)(a, out)
    np.testing.assert_array_equal(out, a_before + 1)
    np.testing.assert_array_equal(a, a_before)
    gpu_kernel(writes_both)(a, out)
    np.testing.assert_array_equal(a, -1)


def test_an_array_passed_twice_stays_one_array() -> None:
    x = rand(1000)
    gpu_kernel(writes_both)(x, x)
    np.testing.assert_array_equal(x, -1)


def test_shared_memory_atomics_and_device_functions() -> None:
    a = rand(10_000) / 100
    sums = np.zeros(1, np.float32)
    block_sums(a, sums)
    np.testing.assert_allclose(sums[0], np.sum(a.astype(np.float64) ** 2 + 1), rtol=1e-4)


def test_other_cuda_array_interface_arrays_pass_zero_copy() -> None:
    a, b = rand(1000), rand(1000)
    out = cuda.device_array(1000, dtype=np.float32)  # a Numba device array
    add_kernel(cuda.to_device(a), cuda.to_device(b), out)
    np.testing.assert_array_equal(out.copy_to_host(), a + b)


def test_launches_follow_cupys_current_stream() -> None:
    with cupy.cuda.Stream(non_blocking=True) as stream:
        for _ in range(3):
            a = cupy.arange(1_000_000, dtype=cupy.float32)  # made on this stream just before
            result = cupy.empty_like(a)
            add_kernel(a, a, result)
            total = int(result.astype(cupy.float64).sum())  # after the kernel, on this stream
            assert total == 1_000_000 * 999_999  # sum of 2 * i, exact in float64
        stream.synchronize()


def test_block_beyond_the_devices_limit() -> None:
    name = veda.get_runtime().gpu.devices[0].name  # type: ignore[union-attr]
    with pytest.raises(KernelLaunchError) as error:
        add_kernel[1, (64, 32)](rand(4), rand(4), np.zeros(4, np.float32))
    assert str(error.value) == (f"add_kernel: block: got (64, 32) = 2048 threads; allowed: at "
                                f"most 1024 threads per block on device 0 ({name})")


@pytest.mark.skipif(not two_gpus(), reason="needs 2 GPUs")
def test_kernels_run_on_their_arrays_device_and_refuse_mixed_devices() -> None:
    with cupy.cuda.Device(1):
        a, b = cupy.asarray(rand(1000)), cupy.asarray(rand(1000))
        result = cupy.zeros(1000, cupy.float32)
    add_kernel(a, b, result)
    assert result.device.id == 1
    with cupy.cuda.Device(1):
        cupy.testing.assert_array_equal(result, a + b)
    with pytest.raises(KernelLaunchError, match="arrays on different devices: 'a' on device 1, "
                                                "'b' on device 0"):
        add_kernel(a, cupy.asarray(rand(1000)), result)


# --- telemetry, autotuning, on-disk cache -----------------------------------------------------

def test_first_call_compile_time_and_launch_counts() -> None:
    kernel = fresh_increment()
    x = cupy.zeros(1000, cupy.float32)
    for _ in range(3):
        kernel(x)
    cupy.testing.assert_array_equal(x, 3)
    stats = kernel_stats(kernel)
    assert (stats["gpu_launches"], stats["compiles"]) == (3, 1)
    assert stats["compile_seconds"] > 0
    assert stats["mean_kernel_seconds"] is None


def test_profiling_times_kernels_with_cuda_events() -> None:
    veda.init(veda.Config.builder().profiling(True).build())
    kernel = fresh_increment()
    x = cupy.zeros(1 << 20, cupy.float32)
    for _ in range(3):
        kernel(x)
    stats = kernel_stats(kernel)
    assert stats["timed_launches"] == 2  # the compiling launch is not timed
    assert 0 < stats["mean_kernel_seconds"] < 1


def test_autotune_keeps_results_correct_for_accumulating_kernels() -> None:
    kernel = fresh_increment(autotune=True)
    x = np.zeros(1 << 20, np.float32)
    kernel(x)
    np.testing.assert_array_equal(x, 1)  # the timed trials ran on scratch copies
    kernel(x)
    np.testing.assert_array_equal(x, 2)
    best = kernel._autotuner.best(0, (1, (1 << 20).bit_length()))
    assert best in CANDIDATES
    stats = kernel_stats(kernel)
    assert stats["compiles"] == 1 and stats["compile_seconds"] > 0  # compiled while tuning


def test_on_disk_cache_across_processes(tmp_path: Path) -> None:
    (tmp_path / "cached_kernels.py").write_text(textwrap.dedent("""
        from numba import cuda

        @cuda.jit(cache=True)
        def double(x):
            i = cuda.grid(1)
            if i < x.size:
                x[i] *= 2
    """))
    (tmp_path / "run.py").write_text(textwrap.dedent("""
        import json
        import numpy as np
        from cached_kernels import double
        from vedart.kernels.registry import gpu_kernel

        x = np.arange(10, dtype=np.float32)
        gpu_kernel(double)(x)
        assert (x == 2 * np.arange(10)).all()
        stats = double.stats
        print(json.dumps({"hits": sum(stats.cache_hits.values()),
                          "misses": sum(stats.cache_misses.values())}))
    """))
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
                       PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))

    def run() -> dict[str, int]:
        done = subprocess.run([sys.executable, str(tmp_path / "run.py")], env=environment,
                              capture_output=True, text=True, check=True, cwd=tmp_path)
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run() == {"hits": 0, "misses": 1}
    assert run() == {"hits": 1, "misses": 0}


# --- the CUDABackend seed's usage examples ----------------------------------------------------

def test_backend_properties_come_from_discovery(gpu_runtime: veda.Runtime) -> None:
    assert CUDABackend.check_available() is True
    backend = CUDABackend(device_id=0)
    device = gpu_runtime.gpu.devices[0]  # type: ignore[union-attr]
    assert (backend.name, backend.is_available, backend.device_id) == ("cuda", True, 0)
    assert backend.device_name == device.name
    assert backend.compute_capability == device.compute_capability
    assert backend.launch_limits.max_threads_per_block == 1024
    assert isinstance(get_backend(), CUDABackend)


def test_seed_basic_gpu_computation() -> None:
    backend = CUDABackend(device_id=0)
    a = np.random.randn(1000).astype(np.float32)
    b = np.random.randn(1000).astype(np.float32)
    a_gpu, b_gpu = backend.to_device(a), backend.to_device(b)
    c_gpu = backend.allocate((1000,), dtype=np.float32)
    assert isinstance(c_gpu, cupy.ndarray) and not c_gpu.any()
    c_gpu = a_gpu + b_gpu
    result = backend.to_host(c_gpu)
    assert type(result) is np.ndarray
    np.testing.assert_array_equal(result, a + b)


def test_seed_kernel_with_launch_kernel() -> None:
    backend = CUDABackend()
    a, b = rand(1000), rand(1000)
    a_gpu, b_gpu = backend.to_device(a), backend.to_device(b)
    c_gpu = backend.allocate(a.shape)
    threads_per_block = 256
    blocks = (len(a) + threads_per_block - 1) // threads_per_block
    for _ in range(2):
        backend.launch_kernel(vector_add, (blocks,), (threads_per_block,), a_gpu, b_gpu, c_gpu)
    backend.synchronize()
    np.testing.assert_array_equal(backend.to_host(c_gpu), a + b)


def test_seed_memory_management() -> None:
    backend = CUDABackend()
    free, total = backend.get_memory_info()
    assert 0 < free <= total
    max_elements = free // 4
    arr = backend.allocate((min(max_elements, 1_000_000),), dtype=np.float32)
    assert arr.shape == (1_000_000,) and arr.dtype == np.float32


def my_func(x):  # type: ignore[no-untyped-def]
    cuda.grid(1)


def test_seed_kernel_caching() -> None:
    backend = CUDABackend(enable_caching=True)
    kernel = backend.compile_kernel(my_func, (np.float32,))
    assert backend.compile_kernel(my_func, (np.float32,)) is kernel
    backend.launch_kernel(kernel, 1, 32, np.float32(1))
    compiled = backend.compile_kernel(vector_add, (cuda.float32[:],) * 3)
    a = backend.to_device(rand(100))
    c = backend.allocate((100,))
    backend.launch_kernel(compiled, 1, 128, a, a, c)
    np.testing.assert_array_equal(backend.to_host(c), 2 * backend.to_host(a))
    uncached = CUDABackend(enable_caching=False)
    assert uncached.compile_kernel(my_func, (np.float32,)) is not \
        uncached.compile_kernel(my_func, (np.float32,))


def test_to_host_takes_other_cuda_array_interface_arrays() -> None:
    data = rand(100)
    np.testing.assert_array_equal(CUDABackend().to_host(cuda.to_device(data)), data)


@pytest.mark.skipif(not two_gpus(), reason="needs 2 GPUs")
def test_seed_multi_gpu_backends_allocate_on_their_devices() -> None:
    backend_0 = CUDABackend(device_id=0)
    backend_1 = CUDABackend(device_id=1)
    assert backend_0.device_name and backend_1.device_name
    data_gpu0 = backend_0.allocate((1000,))
    data_gpu1 = backend_1.allocate((1000,))
    assert (data_gpu0.device.id, data_gpu1.device.id) == (0, 1)
    a = backend_1.to_device(rand(1000))
    assert a.device.id == 1
    backend_1.launch_kernel(vector_add, 4, 256, a, a, data_gpu1)
    backend_1.synchronize()
    np.testing.assert_array_equal(backend_1.to_host(data_gpu1), 2 * backend_1.to_host(a))


# In a process of its own: an illegal memory access leaves the CUDA context unusable.
KERNEL_LOSES_THE_CONTEXT = r"""
import json, os
import numpy as np
from numba import cuda
import vedart as veda

runtime = veda.init()


def double_on_cpu(x, out):
    np.multiply(x, 2, out=out)


@veda.gpu_kernel(cpu=double_on_cpu)
@cuda.jit
def double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * 2


@veda.gpu_kernel
@cuda.jit
def writes_far_away(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i + (1 << 40)] = 1.0  # no bounds check on the device: an illegal address


x = np.random.default_rng().random(1000)
before = np.empty_like(x)
double(x, before)
try:
    writes_far_away(x.copy())
    raised = None
except Exception as error:
    raised = type(error).__name__ + ": " + str(error)
after = np.empty_like(x)
double(x, after)  # launched on the GPU before: now where a missing GPU sends it
offloaded = veda.gpu(force="gpu")(lambda a: a * 2)
result = offloaded(x)
name = offloaded.display_name
kernels = {row["kernel"]: row for row in runtime.telemetry.snapshot()["kernels"]}
print(json.dumps({
    "raised": raised, "unavailable": runtime.gpu.unavailable_reason,
    "before": bool(np.array_equal(before, x * 2)), "after": bool(np.array_equal(after, x * 2)),
    "result": bool(np.array_equal(result, x * 2)),
    "last": runtime.telemetry.function(name).last_decision(),
    "double": {key: value for key, value in kernels[double.qualified_name].items()
               if key.endswith("_launches") and key != "timed_launches"}}), flush=True)
os._exit(0)  # CuPy's own teardown in a lost context is not what this test is about
"""


def test_a_kernel_that_loses_the_cuda_context_sends_later_kernels_and_calls_to_the_cpu(
        fresh_process: Any) -> None:
    finished = fresh_process(KERNEL_LOSES_THE_CONTEXT, 300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    seen = json.loads(finished.stdout.strip().splitlines()[-1])
    assert seen["raised"] is not None and ("IllegalAddress" in seen["raised"]
                                           or "ILLEGAL_ADDRESS" in seen["raised"]), seen
    assert "(in kernel __main__.writes_far_away); the CUDA context is lost for this process" \
        in (seen["unavailable"] or ""), seen
    assert seen["before"] and seen["after"] and seen["result"], seen
    path, reason = seen["last"]
    assert path == "cpu" and "in kernel __main__.writes_far_away" in reason, seen
    assert seen["double"] == {"gpu_launches": 1, "cpu_launches": 1, "simulator_launches": 0}, \
        seen
