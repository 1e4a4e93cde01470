"""par_iter pipelines: map, filter and gpu_map stages, a progress bar, and failed items.

    python examples/pipelines.py [--quick]

Stages run in parallel and results come back in input order. gpu_map decides each item as a
@veda.gpu call would: GPU items go to the device's lanes, the others to CPU threads.
"""

import sys

import numpy as np

import vedart as veda

QUICK = "--quick" in sys.argv
COUNT, SIDE = (24, 128) if QUICK else (256, 1024)


def load(seed):
    """A stand-in for reading one sample from disk: a random matrix, or a corrupt record."""
    if seed % 10 == 7:
        raise ValueError(f"record {seed} is corrupt")
    return np.random.default_rng(seed).random((SIDE, SIDE), dtype=np.float32)


def gram_column_sums(matrix):
    return (matrix @ matrix.T).sum(axis=0)


# map -> filter -> gpu_map, skipping the records that fail to load.
results = (veda.par_iter(range(COUNT))
           .map(load)
           .filter(lambda matrix: matrix[0, 0] < 0.5)
           .gpu_map(gram_column_sums)
           .collect(errors="skip", progress=True))

kept = []
for seed in range(COUNT):
    try:
        matrix = load(seed)
    except ValueError:
        continue
    if matrix[0, 0] < 0.5:
        kept.append(gram_column_sums(matrix))
assert len(results) == len(kept)
for got, expected in zip(results, kept):
    np.testing.assert_allclose(got, expected, rtol=1e-4)
print(f"{len(results)} of {COUNT} records processed, in input order")

# errors="return": each failed item's exception in its place; errors="raise" (the default)
# raises ParIterError naming the first failed item and its stage.
outcomes = veda.par_iter(range(10)).map(load).map(lambda m: float(m.sum())).collect(
    errors="return")
print("item 7:", repr(outcomes[7]))
assert isinstance(outcomes[7], ValueError)
try:
    veda.par_iter(range(10)).map(load).collect()
except veda.ParIterError as error:
    print(f"raised: {error}")
    assert error.index == 7

# Reductions, as the builtins give them.
doubled = veda.par_iter(range(100_000)).map(lambda n: n * 2).sum()
assert doubled == sum(n * 2 for n in range(100_000))

runtime = veda.get_runtime()
no_gpu_reason = (runtime.gpu.unavailable_reason if runtime.gpu is not None
                 else "GPU disabled by config")
counts = runtime.telemetry.placement_counts()
if counts:
    for (stage, path, device), items in sorted(counts.items(), key=str):
        on_device = f" (device {device})" if device is not None else ""
        print(f"{stage}: {items} item(s) on {path}{on_device}")
else:
    print(f"gpu_map ran as a CPU map: no GPU ({no_gpu_reason})")
veda.report()
print("all results match NumPy")
