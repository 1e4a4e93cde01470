"""par_iter's gpu_map on the real GPU (``pytest -m gpu``): results equal the CPU path, each lane
runs on its own stream and the lanes overlap in time, two GPUs share the items, a plain
GPU-friendly function on the default configuration runs every item on a lane once learned,
the benchmark runs and checks its results."""

from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any

import numpy as np
import pytest

import vedart as veda
from vedart.bench import par_iter as bench
from vedart.parallel.gpu_lanes import STREAMS_PER_DEVICE
from vedart.parallel.par_iter import par_iter

pytestmark = pytest.mark.gpu

RTOL_FLOAT32 = 1e-4


def matrices(count: int, size: int = 1000, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((size, size), dtype=np.float32) for _ in range(count)]


def process(M: np.ndarray) -> np.ndarray:
    return (M @ M.T).sum(axis=0)


def placements(runtime: veda.Runtime) -> dict[tuple[str, int | None], int]:
    counts: dict[tuple[str, int | None], int] = {}
    for (_, path, device), count in runtime.telemetry.placement_counts().items():
        counts[path, device] = counts.get((path, device), 0) + count
    return counts


def assert_same(gpu_values: list[Any], cpu_values: list[Any]) -> None:
    assert len(gpu_values) == len(cpu_values)
    for gpu_value, cpu_value in zip(gpu_values, cpu_values):
        assert type(gpu_value) is type(cpu_value) and gpu_value.dtype == cpu_value.dtype
        np.testing.assert_allclose(gpu_value, cpu_value, rtol=RTOL_FLOAT32)


def test_gpu_map_results_equal_the_cpu_path(gpu_runtime: veda.Runtime) -> None:
    mats = matrices(16)
    # One device, so the items run in this process, where the per-call statistics read below
    # are kept (over several devices they stay in the worker processes).
    device = gpu_runtime.gpu.devices[0].ordinal
    assert_same(par_iter(mats).gpu_map(process, device=device).collect(),
                [process(M) for M in mats])
    counts = placements(gpu_runtime)
    assert {path for path, _ in counts} == {"gpu"} and sum(counts.values()) == 16
    stats = gpu_runtime.telemetry.function(f"{__name__}.process").as_dict()
    assert stats["gpu_calls"] == 16 and stats["fallback_calls"] == 0


def halve_in_place(M: np.ndarray) -> float:
    M *= 0.5
    return float(M[0].sum())


def test_items_the_function_writes_into_end_as_on_the_cpu(gpu_runtime: veda.Runtime) -> None:
    """Over every device (items of a function that writes into them stay in this process,
    whose arrays they are)."""
    mats = matrices(12, 300, seed=3)
    expected = [M.copy() for M in mats]
    sums = [halve_in_place(M) for M in expected]
    got = par_iter(mats).gpu_map(halve_in_place, force="gpu").collect()
    np.testing.assert_allclose(got, sums, rtol=RTOL_FLOAT32)
    for M, M_expected in zip(mats, expected):
        np.testing.assert_array_equal(M, M_expected)
    assert {path for path, _ in placements(gpu_runtime)} == {"gpu"}


def test_items_already_on_the_device_run_there_and_come_back_as_numpy(
        gpu_runtime: veda.Runtime) -> None:
    """Device-array items are never handed to idle CPU workers (which would run the function
    as written on CuPy arrays), however full the lanes are."""
    import cupy

    device = gpu_runtime.gpu.devices[0].ordinal
    with cupy.cuda.Device(device):
        items = [cupy.asarray(M) for M in matrices(48, size=400, seed=3)]
    results = par_iter(items).gpu_map(process, device=device).collect()
    assert_same(results, [process(cupy.asnumpy(M)) for M in items])
    counts = placements(gpu_runtime)
    assert counts == {("gpu", device): 48}


def test_mixed_sizes_split_between_lanes_and_workers(gpu_runtime: veda.Runtime) -> None:
    rng = np.random.default_rng(1)
    mixed = [rng.random((1000 if i % 2 else 50, 1000 if i % 2 else 50), dtype=np.float32)
             for i in range(20)]
    assert_same(par_iter(mixed).gpu_map(process).collect(), [process(M) for M in mixed])
    counts = placements(gpu_runtime)
    assert counts[("cpu", None)] == 10  # the small ones, below the threshold
    assert sum(count for (path, _), count in counts.items() if path != "cpu") == 10


def test_each_lane_uses_its_own_stream_and_lanes_overlap(gpu_runtime: veda.Runtime) -> None:
    import cupy

    streams: set[int] = set()
    lock = threading.Lock()

    def process_and_note_stream(M: Any) -> Any:
        with lock:
            streams.add(cupy.cuda.get_current_stream().ptr)
        return (M @ M.T).sum(axis=0)

    mats = matrices(32, seed=2)
    device = gpu_runtime.gpu.devices[0].ordinal
    assert_same(par_iter(mats).gpu_map(process_and_note_stream, device=device).collect(),
                [process(M) for M in mats])
    assert len(streams) == STREAMS_PER_DEVICE  # the lane's own streams, never the default one
    spans = {lane: [(p.started, p.finished) for p in gpu_runtime.telemetry.placements()
                    if p.lane == lane] for lane in range(STREAMS_PER_DEVICE)}
    assert all(spans.values()), spans
    overlap = max(min(a_end, b_end) - max(a_start, b_start)
                  for (a_start, a_end), (b_start, b_end)
                  in itertools.product(spans[0], spans[1]))
    assert overlap > 0, "items on the two streams were never in flight at the same time"


def test_an_item_that_leaves_another_stream_current_does_not_move_the_next(
        gpu_runtime: veda.Runtime) -> None:
    import cupy

    from vedart.parallel.gpu_lanes import current_lane

    on_lane_stream: list[bool] = []

    def process_and_leave_a_stream(M: Any) -> Any:
        lane = current_lane()
        assert lane is not None
        on_lane_stream.append(cupy.cuda.get_current_stream() == lane.stream)
        result = (M @ M.T).sum(axis=0)
        cupy.cuda.Stream(non_blocking=True).use()  # left current, as careless user code might
        return result

    mats = matrices(12, seed=4)
    device = gpu_runtime.gpu.devices[0].ordinal
    assert_same(par_iter(mats).gpu_map(process_and_leave_a_stream, device=device).collect(),
                [process(M) for M in mats])
    assert on_lane_stream == [True] * 12


def test_lane_items_fall_back_raise_and_release_their_staging(
        gpu_runtime: veda.Runtime) -> None:
    import gc

    pinned = gpu_runtime.gpu.transfers.pinned
    used_before = pinned.used_bytes

    def median_of_rows(M: Any) -> Any:  # CuPy has no nanpercentile: every GPU run fails
        return np.nanpercentile(M, 50, axis=1)

    mats = matrices(6, seed=4)
    with pytest.warns(veda.OffloadWarning, match="re-ran on CPU"):
        values = par_iter(mats).gpu_map(median_of_rows).collect()
    assert_same(values, [median_of_rows(M) for M in mats])
    stats = gpu_runtime.telemetry.function(
        f"{__name__}.{median_of_rows.__qualname__}").as_dict()
    # Once an item has failed on the GPU and re-run on the CPU, later items of that signature
    # are decided for the CPU (items decided before that still try the GPU).
    assert stats["gpu_calls"] == 0 and stats["fallback_calls"] >= 1
    assert stats["fallback_calls"] + stats["cpu_calls"] == 6
    assert "re-ran on CPU" in stats["last_reason"] or stats["last_reason"].startswith(
        "GPU failed before for arguments <f4:2 (")

    def fail_on_item_two(M: Any) -> Any:
        if float(M[0, 0]) == float(mats[2][0, 0]):
            raise ArithmeticError("item two")
        return (M @ M.T).sum(axis=0)

    pipeline = par_iter(mats).gpu_map(fail_on_item_two)
    with pytest.raises(veda.ParIterError) as caught:
        pipeline.collect()
    assert caught.value.index == 2 and isinstance(caught.value.__cause__, ArithmeticError)
    returned = pipeline.collect(errors="return")
    assert isinstance(returned[2], ArithmeticError)
    assert_same([v for i, v in enumerate(returned) if i != 2],
                [process(M) for i, M in enumerate(mats) if i != 2])
    del values, returned, caught  # a kept exception's frames would hold the staged inputs
    gc.collect()
    assert pinned.used_bytes == used_before  # staged copies went back to the pool


def test_two_gpus_both_take_items(gpu_runtime: veda.Runtime) -> None:
    if len(gpu_runtime.gpu.devices) < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {len(gpu_runtime.gpu.devices)}")
    runtime = veda.init(veda.Config.builder().devices([0, 1]).cost_model("static").build())
    mats = matrices(64, seed=3)
    assert_same(par_iter(mats).gpu_map(process).collect(), [process(M) for M in mats])
    counts = placements(runtime)
    assert set(counts) == {("gpu", 0), ("gpu", 1)} and sum(counts.values()) == 64
    assert min(counts.values()) >= 8, counts
    workers = runtime.scheduler.lanes("processes", lambda: None)  # one process per device ran them
    assert workers.unavailable is None and [w.ordinal for w in workers.workers] == [0, 1]
    stats = runtime.telemetry.function(f"{__name__}.process").as_dict()  # the workers' calls
    assert stats["gpu_calls"] == 64 and stats["fallback_calls"] == 0
    assert stats["bytes_to_device"] == 64 * mats[0].nbytes
    in_process = veda.init(veda.Config.builder().devices([0, 1]).cost_model("static")
                           .device_processes(False).build())
    assert_same(par_iter(mats).gpu_map(process).collect(), [process(M) for M in mats])
    assert set(placements(in_process)) == {("gpu", 0), ("gpu", 1)}
    assert "processes" not in in_process.scheduler._lanes


class Scaled:
    """A @veda.gpu method, for gpu_map to take bound to an object."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    @veda.gpu
    def column_sums(self, M: np.ndarray) -> np.ndarray:
        return process(M) * self.factor


def test_two_gpus_take_a_bound_gpu_method_with_its_object(gpu_runtime: veda.Runtime) -> None:
    # A device worker gets the bound method pickled, which loads as the class's @gpu wrapper
    # bound to the object again: it must run the function on the object, not wrap it twice.
    if len(gpu_runtime.gpu.devices) < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {len(gpu_runtime.gpu.devices)}")
    runtime = veda.init(veda.Config.builder().devices([0, 1]).cost_model("static").build())
    mats = matrices(32, seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sums = par_iter(mats).gpu_map(Scaled(3.0).column_sums).collect()
    # A worker that cannot load the function says so and leaves the items to this process.
    assert [str(w.message) for w in caught if w.category is veda.OffloadWarning] == []
    assert_same(sums, [process(M) * np.float32(3.0) for M in mats])
    assert set(placements(runtime)) == {("gpu", 0), ("gpu", 1)}
    workers = runtime.scheduler.lanes("processes", lambda: None)
    assert workers.unavailable is None and [w.ordinal for w in workers.workers] == [0, 1]


def sum_and_device(x: Any) -> tuple[Any, int]:
    import cupy

    return x.sum(), cupy.cuda.runtime.getDevice()


def test_an_input_on_a_device_the_runtime_does_not_use_is_computed_there(
        gpu_runtime: veda.Runtime) -> None:
    # Its decision names the input's device; the lane that takes it is device 0's.
    if len(gpu_runtime.gpu.devices) < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {len(gpu_runtime.gpu.devices)}")
    import cupy

    veda.init(veda.Config.builder().devices([0]).cost_model("static").build())
    with cupy.cuda.Device(1):
        inputs = [cupy.arange(10, dtype=cupy.float32) + i for i in range(6)]
    wrapped = veda.gpu(sum_and_device)
    expected = [(45.0 + 10 * i, 1) for i in range(6)]
    assert [(float(total), device) for total, device in
            par_iter(inputs).gpu_map(wrapped).collect()] == expected
    total, device = wrapped(inputs[2])  # a direct call, device 0 current
    assert (float(total), device) == expected[2]


def products(M: np.ndarray) -> np.ndarray:
    """Eight 1000x1000 float32 products per matrix: tens of milliseconds on the CPU, well under
    one on the GPU."""
    product = M
    for _ in range(8):
        product = (product @ M.T) / M.shape[0]
    return product.sum(axis=0)


def test_gpu_map_on_defaults_places_every_item_of_a_gpu_friendly_function_on_a_lane() -> None:
    """A plain function on the default configuration (the adaptive model, a fresh profile):
    the first pipeline explores it without sending a window of items to the CPU, the next
    places every item on a GPU lane. ``device=`` keeps the lanes, and the model they consult,
    in this process where a machine has several GPUs."""
    runtime = veda.init()
    assert runtime.gpu and runtime.cost_model is not None
    device = runtime.gpu.devices[0].ordinal
    first, second = matrices(32, seed=5), matrices(32, seed=6)
    assert_same(par_iter(first).gpu_map(products, device=device).collect(),
                [products(M) for M in first])
    explored = placements(runtime)
    # The model's first call of the size, and at most one re-check of the CPU (two calls).
    assert explored.get(("cpu", None), 0) <= 3 and ("hybrid", None) not in explored, explored
    assert_same(par_iter(second).gpu_map(products, device=device).collect(),
                [products(M) for M in second])
    settled = placements(runtime)
    assert settled[("gpu", device)] - explored[("gpu", device)] == 32, (explored, settled)
    assert sum(settled.values()) - sum(explored.values()) == 32
    reason = veda.gpu(products).explain(second[0]).reason  # type: ignore[attr-defined]
    assert reason.startswith("adaptive: gpu "), reason


def test_benchmark_checks_results_and_reports_ratios() -> None:
    result = bench.run(quick=True, matrices=16)
    assert result["cupy_loop_s"] > 0 and result["par_iter_gpu_s"] > 0
    assert result["speedup_over_cupy"] == result["cupy_loop_s"] / result["par_iter_gpu_s"]
    assert result["speedup_over_numpy"] == \
        result["numpy_s"] / result["par_iter_gpu_beside_numpy_s"]
    assert result["static_par_iter_gpu_s"] > 0
    assert result["defaults_over_forced"] == \
        result["par_iter_gpu_beside_forced_s"] / result["forced_par_iter_gpu_s"]
    assert sum(result["placements"].values()) >= 16 * (1 + 1 + 5)  # checked, warm-up, timed
    table = bench.format_table(result)
    assert "speedup over CuPy loop" in table and "static rule" in table
    assert f"on defaults, {result['defaults_over_forced']:.2f}x" in table
