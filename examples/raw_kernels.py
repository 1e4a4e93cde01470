"""Raw CUDA kernels with @veda.gpu_kernel, and the CUDABackend device API.

    python examples/raw_kernels.py [--quick]

Kernels launch with a configuration chosen for them, or an explicit one; `outputs=` names the
arrays copied back. Without a GPU they run in Numba's CUDA simulator (slow: the sizes are
then small) or through their `cpu=` implementation. Every result is checked against NumPy.
"""

import sys
import warnings

import numpy as np
from numba import cuda

import vedart as veda
from vedart.backends import get_backend

QUICK = "--quick" in sys.argv
runtime = veda.get_runtime()
no_gpu_reason = (runtime.gpu.unavailable_reason if runtime.gpu is not None
                 else "GPU disabled by config")
N = 1 << 22 if runtime.gpu and not QUICK else 2048   # the simulator runs a thread at a time
if runtime.gpu:
    print(f"kernels run on the GPU; {N:,} elements")
else:
    print(f"kernels run in the simulator or on the CPU ({no_gpu_reason}); "
          f"{N:,} elements")
warnings.simplefilter("ignore", veda.SimulatorWarning)   # said once above instead


@veda.gpu_kernel
@cuda.jit
def saxpy(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = alpha * x[i] + y[i]


@veda.gpu_kernel(outputs=("out",), cpu=lambda image, out: np.sqrt(image, out=out))
@cuda.jit
def square_root_2d(image, out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = image[i, j] ** 0.5


rng = np.random.default_rng()
x = rng.random(N, dtype=np.float32)
y = rng.random(N, dtype=np.float32)

out = np.empty_like(x)
saxpy(np.float32(2.0), x, y, out)                 # automatic: one thread per element of `out`
np.testing.assert_allclose(out, 2 * x + y, rtol=1e-6)

out_explicit = np.empty_like(x)
threads = 256
saxpy[(N + threads - 1) // threads, threads](np.float32(2.0), x, y, out_explicit)
np.testing.assert_array_equal(out_explicit, out)

side = int(np.sqrt(N))
image = rng.random((side, side), dtype=np.float32)
root = np.empty_like(image)
square_root_2d(image, root)                        # 2-D launch; only `out` is copied back
np.testing.assert_allclose(root, np.sqrt(image), rtol=1e-6)
print(f"saxpy and square_root_2d match NumPy; registered: {sorted(veda.get_runtime().kernels)}")

# The device API: the runtime's device, or the CPU backend where there is none.
backend = get_backend()
print(f"backend {backend.name}: {backend.device_name}, compute capability "
      f"{backend.compute_capability}")
free, total = backend.get_memory_info()
print(f"memory: {free / 1e9:.1f} GB free of {total / 1e9:.1f} GB")
x_device, y_device = backend.to_device(x), backend.to_device(y)
out_device = backend.allocate(x.shape, dtype=np.float32)
backend.launch_kernel(saxpy, (N + threads - 1) // threads, threads,
                      np.float32(2.0), x_device, y_device, out_device)
backend.synchronize()
np.testing.assert_allclose(backend.to_host(out_device), 2 * x + y, rtol=1e-6)

veda.report()
print("all results match NumPy")
