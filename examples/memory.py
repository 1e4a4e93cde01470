"""Watch and limit GPU memory: get_memory_stats, gpu_memory_fraction, empty_cache.

    python examples/memory.py [--quick]

A runtime whose device pool may take only a small share of the GPU: a call that needs more
runs out of device memory and vedart re-runs it on the CPU, with the reason. Without a GPU
the script says so and checks the CPU results alone.
"""

import sys
import warnings

import numpy as np

import vedart as veda

QUICK = "--quick" in sys.argv
FRACTION = 0.02

runtime = veda.init(veda.Config.builder().gpu_memory_fraction(FRACTION).build())
no_gpu_reason = (runtime.gpu.unavailable_reason if runtime.gpu is not None
                 else "GPU disabled by config")


def show(label):
    if runtime.gpu:
        stats = runtime.gpu.get_memory_stats()
        print(f"{label:28} device used {stats['used_mb']:9.1f} MiB of {stats['total_mb']:.0f}; "
              f"pool {stats['pool_allocated_mb']:7.1f} in use, {stats['pool_cached_mb']:7.1f} "
              f"cached, peak {stats['peak_allocated_mb']:7.1f}; "
              f"pinned {stats['pinned_used_mb']:.1f}")
    else:
        print(f"{label:28} no GPU ({no_gpu_reason}): no device memory to show")


@veda.gpu
def outer_sum(a, b):
    return (a[:, np.newaxis] + b[np.newaxis, :]).sum(axis=1)


rng = np.random.default_rng()
show("start")
small = rng.random(2_000 if QUICK else 10_000)   # 80 KB of arguments, an 800 MB temporary
np.testing.assert_allclose(outer_sum(small, small), small * len(small) + small.sum())
show("after a call")

# A call whose temporary (n x n float64) exceeds the pool's cap on the device, sent to the GPU
# whatever the cost model would say.
cap_bytes = FRACTION * (runtime.gpu.device().total_memory if runtime.gpu else 0)
n = 4_000 if QUICK or not runtime.gpu else int(np.sqrt(cap_bytes / 8)) + 2_000
large = rng.random(n)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", veda.OffloadWarning)
    with veda.force("gpu"):
        result = outer_sum(large, large)
np.testing.assert_allclose(result, large * n + large.sum())
for warning in caught:
    print("warning:", warning.message)
print("last decision:", veda.get_runtime().telemetry.snapshot()["functions"][-1]["last_reason"])
show("after the large call")

veda.empty_cache()
show("after veda.empty_cache()")
if runtime.gpu:
    print(f"device utilisation: {runtime.gpu.get_utilization():.0f}%")
veda.report()
print("all results match NumPy")
