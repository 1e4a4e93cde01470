"""A Dask worker's own vedart runtime, built from the client's configuration.

The client registers :class:`RuntimePlugin` on its cluster; each worker process, including one
that joins or restarts later, then installs a runtime from the client's config with what
belongs to the client left out (:func:`worker_config`). Every @veda.gpu call in that process,
in a par_iter task or in the user's own ``client.map`` or ``map_blocks``, uses it: on a
dask-cuda worker, the one GPU the worker sees. :func:`worker_telemetry`, run on the workers by
the client, hands each worker's per-function telemetry to the client's ``veda.report()``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from distributed import Worker
from distributed.diagnostics.plugin import WorkerPlugin

from vedart import lifecycle
from vedart.config import Config
from vedart.gpu.devices import NoDevices
from vedart.parallel.device_workers import StatsFeed, visible_device

PLUGIN_NAME = "vedart-runtime"


# Why a worker of a CPU cluster of the client's host uses no GPU, as its decisions say it.
CPU_CLUSTER_REASON = ("a worker of a CPU Dask cluster of this host (its many workers would each "
                      "take every GPU); a dask-cuda LocalCUDACluster (dask_cluster='cuda') "
                      "gives each worker a GPU of its own")


def worker_config(config: Config, threads: int, own_gpu: bool) -> Config:
    """``config`` for a worker process with ``threads`` task threads: the thread scheduler
    (a worker starts no cluster of its own), no device processes, no progress bars, and, with
    ``own_gpu`` (a dask-cuda worker, which sees every GPU with its own listed first), that
    first GPU only; else every GPU the worker sees."""
    return dataclasses.replace(config, scheduler="threads", dask_address=None,
                               dask_client=None, devices=(0,) if own_gpu else None,
                               device_processes=False, threads=threads, progress=False)


class RuntimePlugin(WorkerPlugin):  # type: ignore[misc]
    """Installs a vedart runtime in each worker at setup and shuts it down at teardown;
    without ``use_gpus`` (the workers of a CPU cluster of the client's host) one that finds no
    GPU, for :data:`CPU_CLUSTER_REASON`: the functions run as written."""

    idempotent = False  # a new client configuration replaces the worker's runtime

    def __init__(self, config: Config, use_gpus: bool = True) -> None:
        self.config = config
        self.use_gpus = use_gpus

    def setup(self, worker: Worker) -> None:
        global _stats
        # dask-cuda's worker plugins import it in each of its workers.
        own_gpu = "dask_cuda" in sys.modules
        runtime = lifecycle.init(worker_config(self.config, worker.state.nthreads, own_gpu),
                                 device_probe=None if self.use_gpus
                                 else NoDevices(CPU_CLUSTER_REASON))
        _stats = StatsFeed(runtime.telemetry)

    def teardown(self, worker: Worker) -> None:
        global _stats
        _stats = None
        lifecycle.shutdown()


_stats: StatsFeed | None = None  # this worker's telemetry since the client last gathered it


def worker_devices() -> list[str]:
    """The GPUs this worker's runtime uses, as "GPU <visible ordinal>: <name>"; [] for none."""
    runtime = lifecycle.current
    if runtime is None or not runtime.gpu:
        return []
    return [f"GPU {visible_device(device.ordinal)}: {device.name}"
            for device in runtime.gpu.devices]


def worker_telemetry() -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """This worker's devices and its per-function telemetry since the last call (the
    differences ``FunctionStats.merge`` adds)."""
    return worker_devices(), [] if _stats is None else _stats.deltas()
