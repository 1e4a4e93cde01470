"""Several GPUs: one function per device, and a gpu_map spread over every device.

    python examples/multi_gpu.py [--quick]

With two or more GPUs, `@veda.gpu(device=d)` pins a function to device d and a gpu_map
spreads its items over all devices (one worker process each). With one GPU, or none, the same
script runs on what there is and says so. The gpu_map function is defined in a module of its
own (examples/_multi_gpu_work.py): worker processes import it by name.
"""

import sys
from pathlib import Path

import numpy as np

import vedart as veda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _multi_gpu_work import column_sums_of_gram  # noqa: E402  (importable by the workers)

QUICK = "--quick" in sys.argv
COUNT, SIDE = (16, 128) if QUICK else (256, 1024)

runtime = veda.get_runtime()
no_gpu_reason = (runtime.gpu.unavailable_reason if runtime.gpu is not None
                 else "GPU disabled by config")
devices = list(runtime.gpu.ordinals) if runtime.gpu else []
if len(devices) >= 2:
    names = ", ".join(f"{d.ordinal}: {d.name}" for d in runtime.gpu.devices)
    print(f"{len(devices)} GPUs: {names}")
elif devices:
    print(f"one GPU ({runtime.gpu.devices[0].name}): everything runs on device 0")
else:
    print(f"no GPU ({no_gpu_reason}): everything runs on the CPU")

rng = np.random.default_rng()
x = rng.random(4_000_000)
for device in devices[:2] or [0]:
    @veda.gpu(device=device)
    def scaled(values):
        return values * 2 + 1

    np.testing.assert_allclose(scaled(x), x * 2 + 1)
    decision = scaled.explain(x)
    print(f"@veda.gpu(device={device}): {decision.path} on device {decision.device} "
          f"({decision.reason})")

matrices = [rng.random((SIDE, SIDE), dtype=np.float32) for _ in range(COUNT)]
results = veda.par_iter(matrices).gpu_map(column_sums_of_gram).collect()
for got, matrix in zip(results, matrices):
    np.testing.assert_allclose(got, (matrix @ matrix.T).sum(axis=0), rtol=1e-4)
by_device = {}
for (stage, path, device), items in runtime.telemetry.placement_counts().items():
    by_device[f"{path} {device}"] = by_device.get(f"{path} {device}", 0) + items
print(f"gpu_map over {COUNT} matrices, items by path and device: {by_device or 'CPU threads only'}")
veda.report()
print("all results match NumPy")
