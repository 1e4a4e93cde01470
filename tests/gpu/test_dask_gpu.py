"""par_iter on a one-GPU dask-cuda LocalCUDACluster (``pytest -m gpu``, skipped without
dask-cuda): gpu_map results equal NumPy's, the worker's calls run on its GPU and its telemetry
reaches the client's report, and @veda.gpu works inside the user's own Dask tasks."""

from __future__ import annotations

import io

import numpy as np
import pytest
from dask_functions import scaled_column_sums

import vedart as veda
from vedart.bench.par_iter import process

pytestmark = pytest.mark.gpu
pytest.importorskip("dask_cuda")

RTOL_FLOAT32 = 1e-4  # 1000-term float32 dot products summed 1000 times, cuBLAS vs CPU BLAS


def gpu_map_equals_numpy(count: int, seed: int) -> list[np.ndarray]:
    """``count`` float32 1000x1000 matrices through gpu_map(process) on the current runtime,
    each result checked against NumPy's; the matrices."""
    rng = np.random.default_rng(seed)
    matrices = [rng.random((1000, 1000), dtype=np.float32) for _ in range(count)]
    results = veda.par_iter(matrices).gpu_map(process).collect()
    assert len(results) == len(matrices)
    for result, matrix in zip(results, matrices):
        expected = process(matrix)
        assert type(result) is np.ndarray and result.dtype == expected.dtype == np.float32
        np.testing.assert_allclose(result, expected, rtol=RTOL_FLOAT32)
    return matrices


def test_gpu_map_on_a_local_cuda_cluster_equals_numpy_and_reports_the_gpu() -> None:
    runtime = veda.init(veda.Config.builder().scheduler("dask").devices([0])
                        .cost_model("static").build())
    assert runtime.dask is not None
    assert type(runtime.dask.cluster).__name__ == "LocalCUDACluster"  # "auto" with dask-cuda
    workers = runtime.dask.describe()["workers"]
    assert len(workers) == 1 and len(workers[0]["gpus"]) == 1, workers
    assert workers[0]["gpus"][0].startswith("GPU 0: "), workers

    matrices = gpu_map_equals_numpy(count=16, seed=11)

    own = runtime.dask.client.submit(scaled_column_sums, matrices[0]).result()
    np.testing.assert_allclose(own, (matrices[0] * 2.0).sum(axis=0), rtol=RTOL_FLOAT32)

    printed = io.StringIO()
    veda.report(file=printed)  # gathers the worker's telemetry first
    rows = runtime.telemetry.snapshot()["workers"]
    by_function = {row["function"].rsplit(".", 1)[-1]: row for row in rows}
    assert by_function["process"]["gpu_calls"] == 16, rows
    assert by_function["scaled_column_sums"]["gpu_calls"] == 1, rows
    assert all("(GPU 0: " in row["worker"] for row in rows), rows
    assert "(GPU 0: " in printed.getvalue()


def test_gpu_map_on_a_two_worker_local_cuda_cluster_uses_both_gpus() -> None:
    runtime = veda.init(veda.Config.builder().build())
    if runtime.gpu is None or len(runtime.gpu.devices) < 2:
        pytest.skip("needs 2 GPUs")
    runtime = veda.init(veda.Config.builder().scheduler("dask").devices([0, 1])
                        .cost_model("static").build())
    assert runtime.dask is not None
    workers = runtime.dask.describe()["workers"]
    assert sorted(len(worker["gpus"]) for worker in workers) == [1, 1], workers

    matrices = gpu_map_equals_numpy(count=64, seed=12)

    veda.report(file=io.StringIO())  # gathers the workers' telemetry
    rows = runtime.telemetry.snapshot()["workers"]
    gpu_calls = {row["worker"]: row["gpu_calls"] for row in rows}
    assert sum(gpu_calls.values()) == len(matrices), rows
    devices = sorted(worker.rsplit("(GPU ", 1)[1][0] for worker, calls in gpu_calls.items()
                     if calls > 0)
    assert devices == ["0", "1"], rows


def test_the_bench_records_the_gpu_calls_of_both_workers_of_a_two_gpu_cluster() -> None:
    from vedart.bench import dask as bench

    runtime = veda.init(veda.Config.builder().build())
    if runtime.gpu is None or len(runtime.gpu.devices) < 2:
        pytest.skip("needs 2 GPUs")
    # One round of each ends on the thread scheduler's runtime, which has no workers.
    row = bench._gpu_map(repeats=1, matrices=64, devices=[0, 1], cost_model="static")
    assert row["gpus"] == 2 and row["threads_s"] > 0 and row["dask_s"] > 0, row
    calls = row["worker_gpu_calls"]
    assert sum(calls.values()) == 64, calls
    assert sorted(worker.rsplit("(GPU ", 1)[1][0] for worker, count in calls.items()
                  if count > 0) == ["0", "1"], calls
