"""``bench kernels``: what a @gpu_kernel launch on CuPy arrays costs over a raw Numba launch.

One tiny kernel (``out[i] = a[i] + b[i]`` over 32,768 float32, 128 blocks of 256 threads), so
launch overhead dominates. Each sample is ``calls`` launches and one device synchronisation,
divided by ``calls``; variants are interleaved sample by sample and reported as medians, after
warm-up (compilation, and the first launch per argument types, happen before timing):

* Numba's own launch on Numba device arrays -- the raw Numba launch, the baseline;
* Numba's own launch on CuPy arrays (135 us per launch on an H100 before this suite existed);
* ``CUDABackend.launch_kernel`` on CuPy arrays;
* ``kernel[grid, block](...)`` and ``kernel(...)`` of a @gpu_kernel on CuPy arrays.

Target (issue: @gpu_kernel): ``kernel(...)`` on CuPy arrays at most 20 us over the raw Numba
launch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import vedart as veda
from vedart.backends import CUDABackend
from vedart.kernels.registry import gpu_kernel

try:
    from numba import cuda
except ImportError:  # no Numba: the suite reports n/a
    cuda = None  # type: ignore[assignment]

TARGET_US = 20.0
ELEMENTS = 128 * 256
THREADS_PER_BLOCK = 256
VARIANTS = {
    "numba_device_arrays": "Numba launch, Numba device arrays (raw)",
    "numba_cupy": "Numba launch, CuPy arrays",
    "backend_launch_kernel": "CUDABackend.launch_kernel, CuPy arrays",
    "vedart_explicit": "@gpu_kernel kernel[grid, block], CuPy arrays",
    "vedart_auto": "@gpu_kernel kernel(...), CuPy arrays",
}


def _vector_add(a, b, out):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


def _sample_us(launch: Callable[[], None], synchronize: Callable[[], None], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        launch()
    synchronize()
    return (time.perf_counter() - started) / calls * 1e6


def run(quick: bool) -> dict[str, Any]:
    calls, repeats = (200, 11) if quick else (1000, 31)
    runtime = veda.init(veda.Config.builder().build())
    result: dict[str, Any] = {"suite": "kernels", "target_us": TARGET_US, "elements": ELEMENTS,
                              "threads_per_block": THREADS_PER_BLOCK, "calls_per_sample": calls,
                              "samples": repeats}
    if not runtime.gpu or cuda is None:
        reason = "numba is not installed" if cuda is None else runtime.gpu_unavailable_reason
        result.update(device_name=None, note=f"no GPU ({reason}): n/a")
        veda.shutdown()
        return result
    import cupy

    kernel = cuda.jit(_vector_add)
    handle = gpu_kernel(threads_per_block=THREADS_PER_BLOCK)(kernel)
    backend = CUDABackend(device_id=runtime.gpu.devices[0].ordinal)
    rng = np.random.default_rng(7)
    a_host = rng.random(ELEMENTS).astype(np.float32)
    b_host = rng.random(ELEMENTS).astype(np.float32)
    a, b, out = cupy.asarray(a_host), cupy.asarray(b_host), cupy.zeros(ELEMENTS, np.float32)
    numba_a, numba_b = cuda.to_device(a_host), cuda.to_device(b_host)
    numba_out = cuda.device_array(ELEMENTS, np.float32)
    grid = ELEMENTS // THREADS_PER_BLOCK
    configured = kernel[grid, THREADS_PER_BLOCK]
    launches: dict[str, Callable[[], None]] = {
        "numba_device_arrays": lambda: configured(numba_a, numba_b, numba_out),
        "numba_cupy": lambda: configured(a, b, out),
        "backend_launch_kernel": lambda: backend.launch_kernel(kernel, grid, THREADS_PER_BLOCK,
                                                               a, b, out),
        "vedart_explicit": lambda: handle[grid, THREADS_PER_BLOCK](a, b, out),
        "vedart_auto": lambda: handle(a, b, out),
    }
    synchronize = cupy.cuda.Device(backend.device_id).synchronize
    for launch in launches.values():
        _sample_us(launch, synchronize, 20)
    samples: dict[str, list[float]] = {name: [] for name in launches}
    for _ in range(repeats):
        for name, launch in launches.items():
            samples[name].append(_sample_us(launch, synchronize, calls))
    np.testing.assert_array_equal(out.get(), a_host + b_host)
    np.testing.assert_array_equal(numba_out.copy_to_host(), a_host + b_host)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    overhead = medians["vedart_auto"] - medians["numba_device_arrays"]
    result.update(device_name=backend.device_name, us_per_launch=medians, samples_us=samples,
                  overhead_us=overhead, meets_target=overhead <= TARGET_US,
                  speedup_over_numba_cupy=medians["numba_cupy"] / medians["vedart_auto"])
    veda.shutdown()
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [(f"kernel launch overhead: {result['elements']} float32 elements, "
              f"{result['elements'] // result['threads_per_block']} x "
              f"{result['threads_per_block']} threads; median us per launch "
              f"({result['calls_per_sample']} launches + sync per sample)")]
    if "us_per_launch" not in result:
        lines.append(result["note"])
        return "\n".join(lines)
    for name, label in VARIANTS.items():
        lines.append(f"  {label:<48} {result['us_per_launch'][name]:>8.1f}")
    lines.append(f"@gpu_kernel over the raw Numba launch: {result['overhead_us']:+.1f} us "
                 f"(target <= {result['target_us']:.0f} us) "
                 f"{'ok' if result['meets_target'] else 'MISSED'}; "
                 f"{result['speedup_over_numba_cupy']:.1f}x faster than Numba on CuPy arrays")
    return "\n".join(lines)
