"""``bench dask``: par_iter on Dask distributed against the in-process thread scheduler.

Targets (issue: par_iter on Dask), as ratios measured in one run, the two schedulers timed in
interleaved rounds after a warm-up (each round installs its runtime untimed):
- a GIL-bound pure-Python map, 2,000 items of about 2 ms each, on an embedded LocalCluster of 8
  single-threaded worker processes: >= 5x faster than the thread scheduler (threads share one
  interpreter lock; processes do not);
- ``gpu_map`` of a plain function, ``f(M) = (M @ M.T).sum(axis=0)``, over 64 float32
  1000x1000 matrices on a one-GPU dask-cuda LocalCUDACluster, both schedulers on the default
  configuration (each worker's adaptive model learns where the function runs): at most 1.5x
  the thread scheduler's time (the price of sending every matrix to another process). A second
  row runs both under the static rule, which sends every matrix to the GPU from the start.
  Results are checked against NumPy's first; the rows are skipped, with the reason, without a
  GPU or dask-cuda;
- with two GPUs, the same on the default configuration over 4x the matrices on a two-worker
  LocalCUDACluster against the thread scheduler over both devices, and the GPU calls each
  worker made in one more pipeline after the rounds (no target: the figure the two-GPU
  validation asks for).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from typing import Any

import vedart as veda
from vedart.bench.harness import interleaved_medians
from vedart.bench.par_iter import MATRICES, MULTI_GPU_FACTOR, SIZE, _assert_equal_to_numpy, _matrices, process
from vedart.parallel.dask_scheduler import embedded_cluster, require
from vedart.parallel.par_iter import par_iter

PYTHON_ITEMS, PYTHON_ITEM_S, PYTHON_WORKERS = 2000, 0.002, 8
TARGETS = {"python_speedup": 5.0, "gpu_map_max_ratio": 1.5}
WARM_MATRICES = 4  # an untimed pipeline after each runtime change warms the worker's runtime


def spin(rounds: int) -> int:
    """Pure-Python work that holds the interpreter lock throughout."""
    total = 0
    for value in range(rounds):
        total += value * value % 7
    return total


def _rounds_for(seconds: float) -> int:
    probe = 100_000
    started = time.perf_counter()
    spin(probe)
    return max(1, int(probe * seconds / (time.perf_counter() - started)))


@contextmanager
def _client(config: veda.Config, gpus: int) -> Iterator[Any]:
    """A client of the embedded cluster ``config`` describes, closed with its cluster."""
    distributed = require("distributed")
    with embedded_cluster(config, gpus) as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


def _interleaved(runs: dict[str, Callable[[], Any]], configs: dict[str, veda.Config],
                 repeats: int, warm: Callable[[], Any] | None = None) -> dict[str, float]:
    def installer(config: veda.Config) -> Callable[[], None]:
        def install() -> None:
            veda.init(config)
            if warm is not None:
                warm()

        return install

    return interleaved_medians(runs, repeats=repeats,
                               setup={name: installer(config) for name, config in configs.items()})


def _python_map(repeats: int, items: int, workers: int) -> dict[str, Any]:
    rounds = _rounds_for(PYTHON_ITEM_S)
    work = [rounds] * items
    expected = [spin(rounds)] * items
    cluster = veda.Config.builder().scheduler("dask").dask_cluster("cpu") \
        .dask_workers(workers).build()
    with _client(cluster, gpus=0) as client:
        configs = {"threads": veda.Config.builder().build(),
                   "dask": veda.Config.builder().scheduler("dask").dask_client(client).build()}
        for config in configs.values():
            veda.init(config)
            assert par_iter(work).map(spin).collect() == expected
        seconds = _interleaved({name: lambda: par_iter(work).map(spin).collect()
                                for name in configs}, configs, repeats)
    veda.shutdown()
    return {"items": items, "item_ms": PYTHON_ITEM_S * 1e3, "workers": workers,
            "threads": veda.Config.builder().build().threads,
            "threads_s": seconds["threads"], "dask_s": seconds["dask"],
            "speedup": seconds["threads"] / seconds["dask"]}


def _usable_gpus() -> tuple[int, str | None, str | None]:
    """How many GPUs the default runtime sees, the first one's name (None: none), and why the
    GPU rows cannot run (None: they can)."""
    runtime = veda.init(veda.Config.builder().build())
    gpus = len(runtime.gpu.devices) if runtime.gpu else 0
    name = runtime.gpu.devices[0].name if runtime.gpu else None
    reason = None if runtime.gpu else \
        f"no GPU ({runtime.gpu.unavailable_reason if runtime.gpu is not None else 'disabled'})"
    veda.shutdown()
    if reason is None and find_spec("dask_cuda") is None:
        reason = "dask-cuda not installed (pip install 'vedart[dask-cuda]')"
    return gpus, name, reason


def _gpu_map(repeats: int, matrices: int, devices: list[int],
             cost_model: str | None = None) -> dict[str, Any]:
    """gpu_map over ``matrices`` on a LocalCUDACluster of one worker per device in
    ``devices`` against the thread scheduler over the same devices, both with ``cost_model``
    (None: the default configuration's)."""
    mats = _matrices(matrices, SIZE, seed=42)
    cluster = veda.Config.builder().scheduler("dask").dask_cluster("cuda").devices(devices) \
        .build()

    def builder() -> veda.ConfigBuilder:
        return veda.Config.builder() if cost_model is None else \
            veda.Config.builder().cost_model(cost_model)

    with _client(cluster, gpus=len(devices)) as client:
        configs = {"threads": builder().devices(devices).build(),
                   "dask": builder().scheduler("dask").dask_client(client).build()}
        for config in configs.values():
            veda.init(config)
            _assert_equal_to_numpy(par_iter(mats).gpu_map(process).collect(), mats)
        seconds = _interleaved(
            {name: lambda: par_iter(mats).gpu_map(process).collect() for name in configs},
            configs, repeats, warm=lambda: par_iter(mats[:WARM_MATRICES]).gpu_map(process)
            .collect())
        # The rounds end on either runtime, and each install gives the workers fresh ones:
        # the calls per worker are those of one more pipeline on the Dask runtime.
        runtime = veda.init(configs["dask"])
        device = runtime.gpu
        par_iter(mats).gpu_map(process).collect()
        veda.report(file=io.StringIO())  # gathers the workers' telemetry
        worker_gpu_calls: dict[str, int] = {}
        for row in runtime.telemetry.snapshot()["workers"]:
            worker_gpu_calls[row["worker"]] = worker_gpu_calls.get(row["worker"], 0) \
                + row["gpu_calls"]
    veda.shutdown()
    return {"matrices": matrices, "shape": [SIZE, SIZE], "dtype": "float32",
            "cost_model": cost_model or "default", "gpus": len(devices),
            "device_name": device.devices[0].name if device else None,
            "threads_s": seconds["threads"], "dask_s": seconds["dask"],
            "ratio": seconds["dask"] / seconds["threads"], "worker_gpu_calls": worker_gpu_calls}


def run(quick: bool, items: int = PYTHON_ITEMS, workers: int = PYTHON_WORKERS,
        matrices: int = MATRICES) -> dict[str, Any]:
    repeats = 3 if quick else 7
    result: dict[str, Any] = {"suite": "dask", "targets": TARGETS, "samples": repeats,
                              "python_map": _python_map(repeats, items, workers)}
    gpus, device_name, reason = _usable_gpus()
    if reason is not None:  # the header still names a GPU that is there
        result.update(device_name=device_name, gpu_map=None, static_gpu_map=None, gpu_note=reason)
        return result
    result["gpu_map"] = _gpu_map(repeats, matrices, [0])
    result["static_gpu_map"] = _gpu_map(repeats, matrices, [0], cost_model="static")
    result["device_name"] = result["gpu_map"]["device_name"]
    if gpus >= 2:
        result["two_gpu_map"] = _gpu_map(repeats, matrices * MULTI_GPU_FACTOR, [0, 1])
    return result


def format_table(result: dict[str, Any]) -> str:
    python = result["python_map"]
    speedup_met = python["speedup"] >= TARGETS["python_speedup"]
    lines = [f"GIL-bound map, {python['items']:,} items of {python['item_ms']:.0f} ms: threads "
             f"({python['threads']}) {python['threads_s']:.2f} s, Dask "
             f"({python['workers']} worker processes) {python['dask_s']:.2f} s, speedup "
             f"{python['speedup']:.2f}x (target >= {TARGETS['python_speedup']}) "
             + ("ok" if speedup_met else "MISSED")]
    gpu = result["gpu_map"]
    if gpu is None:
        lines.append(f"gpu_map on a LocalCUDACluster: skipped: {result['gpu_note']}")
        return "\n".join(lines)
    ratio_met = gpu["ratio"] <= TARGETS["gpu_map_max_ratio"]
    lines.append(_gpu_line(gpu) + f" (target <= {TARGETS['gpu_map_max_ratio']}) "
                 + ("ok" if ratio_met else "MISSED"))
    lines.append(_gpu_line(result["static_gpu_map"]))
    two = result.get("two_gpu_map")
    lines.append("two GPUs: n/a (one device)" if two is None
                 else _gpu_line(two) + "; GPU calls per worker in one more pipeline: "
                 f"{two['worker_gpu_calls']}")
    return "\n".join(lines)


def _gpu_line(row: dict[str, Any]) -> str:
    gpus = "one-GPU" if row["gpus"] == 1 else f"{row['gpus']}-GPU"
    return (f"{row['cost_model']} config, gpu_map over {row['matrices']} float32 "
            f"{row['shape'][0]}x{row['shape'][1]} (results equal NumPy's): threads "
            f"{row['threads_s'] * 1e3:.1f} ms, {gpus} LocalCUDACluster "
            f"{row['dask_s'] * 1e3:.1f} ms, ratio {row['ratio']:.2f}x")
