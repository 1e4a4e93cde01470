"""``bench par_iter``: the seed guide's "process many matrices" shape through ``gpu_map``, and
the scheduler's overhead on tiny items.

Targets (issue: par_iter pipelines), as ratios measured in one run:
- 64 float32 1000x1000 matrices, ``f(M) = (M @ M.T).sum(axis=0)``:
  ``par_iter(mats).gpu_map(f).collect()`` >= 1.5x faster than a sequential hand-written CuPy
  loop and >= 4x faster than the NumPy loop; with 4x the items, two GPUs >= 1.7x one GPU;
- ``par_iter(range(1_000_000)).map(lambda x: x * 2).sum()`` within 3x of
  ``sum(map(lambda x: x * 2, range(1_000_000)))`` (pure Python: GIL-bound, this is overhead).
Every GPU result is checked against NumPy's before any time is reported. The runtimes use the
static rule, so every matrix goes to a GPU lane: what is measured is the lanes, not the
adaptive model's exploration.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import vedart as veda
from vedart.bench.harness import median_seconds
from vedart.parallel.par_iter import par_iter

MATRICES, SIZE, MULTI_GPU_FACTOR = 64, 1000, 4
MAP_SUM_ITEMS = 1_000_000
TARGETS = {"over_cupy": 1.5, "over_numpy": 4.0, "two_gpus": 1.7, "map_sum_max": 3.0}
RTOL_FLOAT32 = 1e-4  # 1000-term float32 dot products summed 1000 times, cuBLAS vs CPU BLAS


def process(M: np.ndarray) -> np.ndarray:
    return (M @ M.T).sum(axis=0)


def _double(x: int) -> int:
    return x * 2


def _matrices(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((size, size), dtype=np.float32) for _ in range(count)]


def _assert_equal_to_numpy(results: list[np.ndarray], matrices: list[np.ndarray]) -> None:
    assert len(results) == len(matrices)
    for result, matrix in zip(results, matrices):
        expected = process(matrix)
        assert type(result) is np.ndarray and result.dtype == expected.dtype, type(result)
        np.testing.assert_allclose(result, expected, rtol=RTOL_FLOAT32)


def _gpu_map_seconds(wrapped: Any, matrices: list[np.ndarray], repeats: int) -> float:
    """Median seconds of the pipeline, after checking its results (which also warms it up)."""
    _assert_equal_to_numpy(par_iter(matrices).gpu_map(wrapped).collect(), matrices)
    return median_seconds(lambda: par_iter(matrices).gpu_map(wrapped).collect(),
                          repeats=repeats, warmup=0)


def _placements(runtime: veda.Runtime) -> dict[str, int]:
    """Items per path and device over every gpu_map run so far, e.g. ``{"gpu:0": 640}``."""
    counts: dict[str, int] = {}
    for (_, path, device), count in runtime.telemetry.placement_counts().items():
        where = path if device is None else f"{path}:{device}"
        counts[where] = counts.get(where, 0) + count
    return counts


def run(quick: bool, matrices: int = MATRICES, size: int = SIZE,
        map_sum_items: int = MAP_SUM_ITEMS) -> dict[str, Any]:
    repeats = 5 if quick else 11
    runtime = veda.init(veda.Config.builder().cost_model("static").build())
    mats = _matrices(matrices, size, seed=42)
    result: dict[str, Any] = {"suite": "par_iter", "matrices": matrices, "shape": [size, size],
                              "dtype": "float32", "targets": TARGETS, "samples": repeats,
                              "map_sum_items": map_sum_items, "threads": runtime.config.threads}
    result["builtin_map_sum_s"] = median_seconds(
        lambda: sum(map(_double, range(map_sum_items))), repeats=repeats)
    result["par_iter_map_sum_s"] = median_seconds(
        lambda: par_iter(range(map_sum_items)).map(_double).sum(), repeats=repeats)
    result["map_sum_ratio"] = result["par_iter_map_sum_s"] / result["builtin_map_sum_s"]
    result["numpy_s"] = median_seconds(lambda: [process(M) for M in mats], repeats=repeats)
    if not runtime.gpu:
        result.update(device_name=None, note="no GPU: GPU columns n/a")
        veda.shutdown()
        return result
    import cupy

    def cupy_loop() -> list[np.ndarray]:
        results = []
        for M in mats:
            on_device = cupy.asarray(M)
            results.append((on_device @ on_device.T).sum(axis=0).get())
        return results

    _assert_equal_to_numpy(cupy_loop(), mats)
    wrapped = veda.gpu(process)
    result["decision"] = wrapped.explain(mats[0]).reason  # type: ignore[attr-defined]
    # Interleaved so drift (clocks, other tenants) affects both alike.
    _assert_equal_to_numpy(par_iter(mats).gpu_map(wrapped).collect(), mats)
    cupy_samples, vedart_samples = [], []
    for _ in range(repeats):
        cupy_samples.append(median_seconds(cupy_loop, repeats=1, warmup=0))
        vedart_samples.append(median_seconds(
            lambda: par_iter(mats).gpu_map(wrapped).collect(), repeats=1, warmup=0))
    cupy_s, vedart_s = float(np.median(cupy_samples)), float(np.median(vedart_samples))
    result.update({
        "device_name": runtime.gpu.devices[0].name, "devices": len(runtime.gpu.devices),
        "cupy_loop_s": cupy_s, "par_iter_gpu_s": vedart_s,
        "speedup_over_cupy": cupy_s / vedart_s, "speedup_over_numpy": result["numpy_s"] / vedart_s,
        "placements": _placements(runtime),
    })
    if len(runtime.gpu.devices) >= 2:
        many = _matrices(matrices * MULTI_GPU_FACTOR, size, seed=7)
        veda.init(veda.Config.builder().devices([0]).cost_model("static").build())
        one_s = _gpu_map_seconds(wrapped, many, repeats)
        veda.init(veda.Config.builder().devices([0, 1]).cost_model("static").build())
        two_s = _gpu_map_seconds(wrapped, many, repeats)
        result.update(one_gpu_s=one_s, two_gpus_s=two_s, two_gpu_speedup=one_s / two_s,
                      two_gpu_placements=_placements(veda.get_runtime()))
    veda.shutdown()
    return result


def _verdict(value: float | None, target: float, at_least: bool = True) -> str:
    if value is None:
        return "n/a"
    met = value >= target if at_least else value <= target
    return f"{value:.2f}x (target {'>=' if at_least else '<='} {target}) " + \
        ("ok" if met else "MISSED")


def format_table(result: dict[str, Any]) -> str:
    lines = [f"map(x * 2).sum() over {result['map_sum_items']:,} ints: builtin "
             f"{result['builtin_map_sum_s'] * 1e3:.1f} ms, par_iter "
             f"{result['par_iter_map_sum_s'] * 1e3:.1f} ms, ratio "
             + _verdict(result["map_sum_ratio"], TARGETS["map_sum_max"], at_least=False),
             f"{result['matrices']} float32 {result['shape'][0]}x{result['shape'][1]}, "
             f"(M @ M.T).sum(axis=0): NumPy loop {result['numpy_s'] * 1e3:.1f} ms"]
    if "cupy_loop_s" not in result:
        lines.append(result["note"])
        return "\n".join(lines)
    lines += [f"sequential CuPy loop {result['cupy_loop_s'] * 1e3:.1f} ms, "
              f"par_iter(...).gpu_map(f) {result['par_iter_gpu_s'] * 1e3:.1f} ms",
              "speedup over CuPy loop: " + _verdict(result["speedup_over_cupy"],
                                                    TARGETS["over_cupy"]),
              "speedup over NumPy loop: " + _verdict(result["speedup_over_numpy"],
                                                     TARGETS["over_numpy"]),
              f"placements: {result['placements']}; decision: {result['decision']}"]
    if "two_gpu_speedup" in result:
        lines.append(f"{result['matrices'] * MULTI_GPU_FACTOR} matrices: one GPU "
                     f"{result['one_gpu_s'] * 1e3:.1f} ms, two GPUs "
                     f"{result['two_gpus_s'] * 1e3:.1f} ms, speedup "
                     + _verdict(result["two_gpu_speedup"], TARGETS["two_gpus"]))
    else:
        lines.append("two GPUs: n/a (one device)")
    return "\n".join(lines)
