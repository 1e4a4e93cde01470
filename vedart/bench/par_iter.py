"""``bench par_iter``: the seed guide's "process many matrices" shape through ``gpu_map``, and
the scheduler's overhead on tiny items.

Targets (issue: par_iter pipelines), as ratios measured in one run:
- 64 float32 1000x1000 matrices, ``f(M) = (M @ M.T).sum(axis=0)`` written as a plain function,
  on the default configuration (the adaptive cost model): ``par_iter(mats).gpu_map(f)
  .collect()`` >= 1.5x faster than a sequential hand-written CuPy loop and >= 4x faster than
  the NumPy loop, each ratio from the pipeline and that baseline timed in turn (after one
  untimed run each, and a first pipeline whose results are checked while the model learns
  ``f``), as the static row below is timed with its CuPy loop; with 4x the items,
  on the same configuration, two GPUs (``gpu_map(f)``: one device worker process each) >= 1.8x
  one GPU (``gpu_map(f, device=0)``), the two timed in turn; beside it, the per-item cost of
  the device-worker path, read from a run of many small items;
- ``par_iter(range(1_000_000)).map(lambda x: x * 2).sum()`` within 3x of
  ``sum(map(lambda x: x * 2, range(1_000_000)))`` (pure Python: GIL-bound, this is overhead).
A second row times a ``@veda.gpu`` wrapper under the static rule (every matrix on a GPU lane,
no model), interleaved with the CuPy loop again: the lanes alone. What the cost model costs a
pipeline on defaults is read in one process: the default pipeline timed in turn with the same
pipeline of ``f`` forced to the GPU (``@veda.gpu(force="gpu")``: no model, no re-checks). Every GPU result is checked
against NumPy's before any time is reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import vedart as veda
from vedart.bench.harness import interleaved_medians, median_seconds, wait_for_staging_loop
from vedart.parallel.par_iter import par_iter

MATRICES, SIZE, MULTI_GPU_FACTOR = 64, 1000, 4
MAP_SUM_ITEMS = 1_000_000
TARGETS = {"over_cupy": 1.5, "over_numpy": 4.0, "two_gpus": 1.8, "map_sum_max": 3.0}
SMALL_ITEMS, SMALL_ITEM_FLOATS = 2048, 1024  # the device-worker path's per-item cost
RTOL_FLOAT32 = 1e-4  # 1000-term float32 dot products summed 1000 times, cuBLAS vs CPU BLAS


def process(M: np.ndarray) -> np.ndarray:
    return (M @ M.T).sum(axis=0)


def _double(x: int) -> int:
    return x * 2


def add_one(values: np.ndarray) -> np.ndarray:
    return values + 1


def _matrices(count: int, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((size, size), dtype=np.float32) for _ in range(count)]


def _assert_equal_to_numpy(results: list[np.ndarray], matrices: list[np.ndarray]) -> None:
    assert len(results) == len(matrices)
    for result, matrix in zip(results, matrices):
        expected = process(matrix)
        assert type(result) is np.ndarray and result.dtype == expected.dtype, type(result)
        np.testing.assert_allclose(result, expected, rtol=RTOL_FLOAT32)


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
    runtime = veda.init()
    # As every suite does: until the staging loop is loaded, the thread loading it shares the
    # interpreter with what is timed. In a machine's first process Numba compiles it (5.6 s,
    # against 0.8 s from its cache later): one that did not wait read 122.6 ms for the CuPy
    # loop and 78.1 ms for the default pipeline in its first six rounds, against 46.1 ms and
    # 31.4 ms in the next process, which waited (H100 and H200, 2026-11-27).
    wait_for_staging_loop(runtime)
    mats = _matrices(matrices, size, seed=42)
    result: dict[str, Any] = {"suite": "par_iter", "matrices": matrices, "shape": [size, size],
                              "dtype": "float32", "targets": TARGETS, "samples": repeats,
                              "map_sum_items": map_sum_items, "threads": runtime.config.threads}
    result["builtin_map_sum_s"] = median_seconds(
        lambda: sum(map(_double, range(map_sum_items))), repeats=repeats)
    result["par_iter_map_sum_s"] = median_seconds(
        lambda: par_iter(range(map_sum_items)).map(_double).sum(), repeats=repeats)
    result["map_sum_ratio"] = result["par_iter_map_sum_s"] / result["builtin_map_sum_s"]

    def numpy_loop() -> list[np.ndarray]:
        return [process(M) for M in mats]

    if not runtime.gpu:
        result["numpy_s"] = median_seconds(numpy_loop, repeats=repeats)
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

    def plain_pipeline() -> list[np.ndarray]:  # as a user writes it: a plain function
        return par_iter(mats).gpu_map(process).collect()

    forced = veda.gpu(process, force="gpu")

    def forced_pipeline() -> list[np.ndarray]:  # every item on a lane, no model: its cost
        return par_iter(mats).gpu_map(forced).collect()

    sync = cupy.cuda.runtime.deviceSynchronize
    _assert_equal_to_numpy(cupy_loop(), mats)
    _assert_equal_to_numpy(plain_pipeline(), mats)  # the model learns process meanwhile
    # Interleaved so drift (clocks, other tenants) affects both alike. One rotation of all
    # three weighed on this row alone: a pipeline right after the NumPy loop (BLAS on every
    # core) took 29-41 ms against 24-26 ms back to back (H100, 2026-11-25), and the static row
    # is timed beside the CuPy loop only.
    times = interleaved_medians({"cupy": cupy_loop, "vedart": plain_pipeline}, repeats=repeats,
                                synchronize={"cupy": sync, "vedart": sync})
    beside_numpy = interleaved_medians({"numpy": numpy_loop, "vedart": plain_pipeline},
                                       repeats=repeats, synchronize={"vedart": sync})
    placements = _placements(runtime)  # of the default pipelines alone
    _assert_equal_to_numpy(forced_pipeline(), mats)
    beside_forced = interleaved_medians({"vedart": plain_pipeline, "forced": forced_pipeline},
                                        repeats=repeats,
                                        synchronize={"vedart": sync, "forced": sync})
    result.update({
        "device_name": runtime.gpu.devices[0].name, "devices": len(runtime.gpu.devices),
        "numpy_s": beside_numpy["numpy"], "cupy_loop_s": times["cupy"],
        "par_iter_gpu_s": times["vedart"],
        "par_iter_gpu_beside_numpy_s": beside_numpy["vedart"],
        "speedup_over_cupy": times["cupy"] / times["vedart"],
        "speedup_over_numpy": beside_numpy["numpy"] / beside_numpy["vedart"],
        "par_iter_gpu_beside_forced_s": beside_forced["vedart"],
        "forced_par_iter_gpu_s": beside_forced["forced"],
        "defaults_over_forced": beside_forced["vedart"] / beside_forced["forced"],
        "decision": veda.gpu(process).explain(mats[0]).reason,  # type: ignore[attr-defined]
        "placements": placements,
    })
    runtime = veda.init(veda.Config.builder().cost_model("static").build())
    wait_for_staging_loop(runtime)
    wrapped = veda.gpu(process)
    _assert_equal_to_numpy(par_iter(mats).gpu_map(wrapped).collect(), mats)
    times = interleaved_medians(
        {"cupy": cupy_loop, "vedart": lambda: par_iter(mats).gpu_map(wrapped).collect()},
        repeats=repeats, synchronize={"cupy": sync, "vedart": sync})
    result.update(static_cupy_loop_s=times["cupy"], static_par_iter_gpu_s=times["vedart"],
                  static_speedup_over_cupy=times["cupy"] / times["vedart"],
                  static_placements=_placements(runtime))
    if len(runtime.gpu.devices) >= 2:
        result.update(_two_gpus(matrices * MULTI_GPU_FACTOR, size, repeats))
    veda.shutdown()
    return result


def _two_gpus(count: int, size: int, repeats: int) -> dict[str, Any]:
    """``count`` matrices on device 0 alone against every device, on the default
    configuration with the plain function, timed in turn; then the device-worker path's
    seconds per item over many small items (an upper bound of what the parent spends on one)."""
    runtime = veda.init()
    wait_for_staging_loop(runtime)
    many = _matrices(count, size, seed=7)

    def one_gpu() -> list[np.ndarray]:
        return par_iter(many).gpu_map(process, device=0).collect()

    def every_gpu() -> list[np.ndarray]:
        return par_iter(many).gpu_map(process).collect()

    _assert_equal_to_numpy(one_gpu(), many)  # each path's model learns process meanwhile
    _assert_equal_to_numpy(every_gpu(), many)
    times = interleaved_medians({"one": one_gpu, "two": every_gpu}, repeats=repeats)
    placements = _placements(runtime)
    rng = np.random.default_rng(3)
    small = [rng.random(SMALL_ITEM_FLOATS, dtype=np.float32) for _ in range(SMALL_ITEMS)]
    for got, values in zip(par_iter(small).gpu_map(add_one).collect(), small):
        np.testing.assert_array_equal(got, values + 1)
    small_s = median_seconds(lambda: par_iter(small).gpu_map(add_one).collect(),
                             repeats=repeats, warmup=0)
    return {"two_gpu_matrices": count, "one_gpu_s": times["one"], "two_gpus_s": times["two"],
            "two_gpu_speedup": times["one"] / times["two"],
            "two_gpu_placements": placements,
            "device_worker_item_s": small_s / SMALL_ITEMS}


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
    lines += [f"default configuration, plain f: sequential CuPy loop "
              f"{result['cupy_loop_s'] * 1e3:.1f} ms, par_iter(...).gpu_map(f) "
              f"{result['par_iter_gpu_s'] * 1e3:.1f} ms",
              "speedup over CuPy loop: " + _verdict(result["speedup_over_cupy"],
                                                    TARGETS["over_cupy"]),
              "speedup over NumPy loop: " + _verdict(result["speedup_over_numpy"],
                                                     TARGETS["over_numpy"])
              + f" (par_iter {result['par_iter_gpu_beside_numpy_s'] * 1e3:.1f} ms beside it)",
              f"placements: {result['placements']}; decision: {result['decision']}",
              (f"the same pipeline with f forced to the GPU (no cost model), in turn with it: "
               f"{result['forced_par_iter_gpu_s'] * 1e3:.1f} ms against "
               f"{result['par_iter_gpu_beside_forced_s'] * 1e3:.1f} ms on defaults, "
               f"{result['defaults_over_forced']:.2f}x"),
              f"static rule, @veda.gpu f: sequential CuPy loop "
              f"{result['static_cupy_loop_s'] * 1e3:.1f} ms, par_iter(...).gpu_map(f) "
              f"{result['static_par_iter_gpu_s'] * 1e3:.1f} ms, "
              f"{result['static_speedup_over_cupy']:.2f}x; placements: "
              f"{result['static_placements']}"]
    if "two_gpu_speedup" in result:
        lines += [f"default configuration, plain f, {result['two_gpu_matrices']} matrices: one "
                  f"GPU {result['one_gpu_s'] * 1e3:.1f} ms, two GPUs "
                  f"{result['two_gpus_s'] * 1e3:.1f} ms, speedup "
                  + _verdict(result["two_gpu_speedup"], TARGETS["two_gpus"]),
                  f"placements: {result['two_gpu_placements']}; device-worker path over "
                  f"{SMALL_ITEMS} items of {SMALL_ITEM_FLOATS} float32: "
                  f"{result['device_worker_item_s'] * 1e6:.0f} us per item"]
    else:
        lines.append("two GPUs: n/a (one device)")
    return "\n".join(lines)
