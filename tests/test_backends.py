"""vedart.backends without a GPU: CUDABackend refuses with the discovery's reason, get_backend
falls back to CPUBackend, and CPUBackend runs the CUDABackend seed's examples (kernels in
Numba's CUDA simulator)."""

from __future__ import annotations

import warnings
from typing import Any

import numba
import numpy as np
import psutil
import pytest
from fakes import gpu_unavailable_reason
from numba import cuda

from vedart.backends import Backend, CPUBackend, CUDABackend, get_backend
from vedart.backends.dims import CUDA_LIMITS
from vedart.errors import (
    ConfigError,
    DeviceError,
    GPUUnavailableError,
    KernelLaunchError,
)

without_cuda = pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a CUDA GPU is usable here")


@cuda.jit
def vector_add(a, b, c):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < len(c):
        c[i] = a[i] + b[i]


@without_cuda
def test_cuda_backend_without_cuda_raises_with_the_gpu_unavailable_reason() -> None:
    with pytest.raises(GPUUnavailableError) as error:
        CUDABackend(device_id=0)
    assert str(error.value) == f"CUDA backend unavailable: {gpu_unavailable_reason()}"
    assert isinstance(error.value, RuntimeError)
    assert CUDABackend.check_available() is False


@without_cuda
def test_cuda_backend_takes_a_numpy_integer_device_id() -> None:
    # Past the argument check: a NumPy ordinal reaches discovery as an int does.
    with pytest.raises(GPUUnavailableError):
        CUDABackend(device_id=np.int64(0))


@pytest.mark.parametrize("device_id", [-1, np.int32(-2), 1.0, True, "0"])
def test_cuda_backend_rejects_a_malformed_device_id_first(device_id: Any) -> None:
    with pytest.raises(DeviceError) as error:
        CUDABackend(device_id=device_id)
    assert str(error.value) == f"device_id: got {device_id!r}; allowed: a CUDA ordinal >= 0"


@without_cuda
def test_get_backend_falls_back_to_the_cpu_backend() -> None:
    backend = get_backend()
    assert isinstance(backend, CPUBackend) and isinstance(backend, Backend)
    assert isinstance(get_backend(device_id=3), CPUBackend)


def test_backend_is_abstract() -> None:
    with pytest.raises(TypeError):
        Backend()  # type: ignore[abstract]


def test_cpu_backend_properties() -> None:
    backend = CPUBackend()
    assert CPUBackend.check_available() is True
    assert (backend.name, backend.is_available, backend.device_id) == ("cpu", True, 0)
    assert isinstance(backend.device_name, str) and backend.device_name
    assert backend.compute_capability == (0, 0)
    assert backend.launch_limits == CUDA_LIMITS


def test_cpu_backend_memory() -> None:
    backend = CPUBackend()
    assert backend.allocate((3, 4)).dtype == np.float32
    allocated = backend.allocate((1000,), dtype=np.int16)
    assert allocated.shape == (1000,) and allocated.dtype == np.int16 and not allocated.any()
    data = np.random.default_rng().random(10)
    on_device = backend.to_device(data)
    on_device[0] = -1.0
    assert data[0] != -1.0
    back = backend.to_host(on_device)
    assert type(back) is np.ndarray and back is not on_device
    np.testing.assert_array_equal(back, on_device)
    free, total = backend.get_memory_info()
    assert 0 < free <= total == psutil.virtual_memory().total
    assert backend.synchronize() is None


def test_cpu_backend_transfers_need_ndarrays() -> None:
    backend = CPUBackend()
    with pytest.raises(TypeError, match="to_device: got list; allowed: a NumPy ndarray"):
        backend.to_device([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="to_host: got int"):
        backend.to_host(3)


@without_cuda
def test_seed_basic_computation_runs_on_the_fallback_backend() -> None:
    backend = get_backend(device_id=0)
    a = np.random.randn(1000).astype(np.float32)
    b = np.random.randn(1000).astype(np.float32)
    a_gpu, b_gpu = backend.to_device(a), backend.to_device(b)
    c_gpu = backend.allocate((1000,), dtype=np.float32)
    c_gpu = a_gpu + b_gpu
    np.testing.assert_array_equal(backend.to_host(c_gpu), a + b)


@without_cuda
def test_seed_kernel_launch_runs_in_the_simulator() -> None:
    backend = get_backend()
    a = np.random.default_rng().random(100).astype(np.float32)
    b = np.random.default_rng().random(100).astype(np.float32)
    a_gpu, b_gpu = backend.to_device(a), backend.to_device(b)
    c_gpu = backend.allocate(a.shape)
    threads_per_block = 32
    blocks = (len(a) + threads_per_block - 1) // threads_per_block
    backend.launch_kernel(vector_add, (blocks,), (threads_per_block,), a_gpu, b_gpu, c_gpu)
    backend.synchronize()
    result = backend.to_host(c_gpu)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, a + b)


@without_cuda
def test_seed_memory_management() -> None:
    backend = get_backend()
    free, _total = backend.get_memory_info()
    max_elements = free // 4
    arr = backend.allocate((min(max_elements, 1_000_000),), dtype=np.float32)
    assert arr.shape == (1_000_000,)


def my_func(x):  # type: ignore[no-untyped-def]
    cuda.grid(1)


def test_seed_kernel_caching() -> None:
    backend = CPUBackend(enable_caching=True)
    kernel = backend.compile_kernel(my_func, (np.float32,))
    assert backend.compile_kernel(my_func, (np.float32,)) is kernel
    assert backend.compile_kernel(my_func, (numba.float32,)) is kernel
    assert backend.compile_kernel(my_func, (np.float64,)) is not kernel
    assert CPUBackend(enable_caching=False).compile_kernel(my_func, (np.float32,)) is not \
        CPUBackend(enable_caching=False).compile_kernel(my_func, (np.float32,))
    compiled = backend.compile_kernel(vector_add, (numba.float32[:],) * 3)
    data = np.arange(8, dtype=np.float32)
    out = backend.allocate((8,))
    backend.launch_kernel(compiled, 1, 8, data, data, out)
    np.testing.assert_array_equal(out, 2 * data)


@pytest.mark.parametrize(("signature", "message"), [
    (np.float32, "signature: got <class 'numpy.float32'>; allowed: a tuple of argument types "
                 "(NumPy dtypes or Numba types)"),
    (("floaty",), "signature: entry 'floaty' is not a kernel argument type; allowed: bool, int, "
                  "uint, float or complex NumPy dtypes, or Numba types such as numba.float32[:]"),
    ((object,), "signature: entry <class 'object'> is not a kernel argument type; allowed: bool, "
                "int, uint, float or complex NumPy dtypes, or Numba types such as "
                "numba.float32[:]"),
])
def test_compile_kernel_validates_the_signature(signature: Any, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        CPUBackend().compile_kernel(my_func, signature)
    assert str(error.value) == message


def test_launch_kernel_validates_before_launching() -> None:
    backend = CPUBackend()
    out = np.zeros(4, np.float32)
    with pytest.raises(KernelLaunchError) as error:
        backend.launch_kernel(vector_add, 1, (64, 32), out, out, out)
    assert str(error.value) == ("vector_add: block: got (64, 32) = 2048 threads; allowed: at "
                                "most 1024 threads per block on CUDA devices")
    with pytest.raises(KernelLaunchError, match="vector_add: grid: got 0"):
        backend.launch_kernel(vector_add, 0, 32, out, out, out)


def test_launch_kernel_writes_arrays_in_place_without_copies() -> None:
    data = np.arange(1, 9, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CPUBackend().launch_kernel(vector_add, 1, 8, data, data, data)
    np.testing.assert_array_equal(data, 2 * np.arange(1, 9))


def test_launch_kernel_takes_a_gpu_kernel_handle() -> None:
    from vedart.kernels.registry import gpu_kernel

    handle = gpu_kernel(cuda.jit(vector_add.py_func))
    data = np.arange(8, dtype=np.float32)
    out = np.zeros(8, np.float32)
    CPUBackend().launch_kernel(handle, 1, 8, data, data, out)
    np.testing.assert_array_equal(out, 2 * data)
