"""The :class:`Runtime`: owns the configuration and everything built from it."""

from __future__ import annotations

import atexit
import sys
import threading
import weakref
from pathlib import Path
from typing import Protocol, TextIO

from vedart import lifecycle
from vedart._logging import apply_log_level, logger
from vedart.backends.cuda import CUDABackend
from vedart.config import Config
from vedart.gpu.context import DISABLED_BY_CONFIG, GPUContext
from vedart.gpu.devices import DeviceProbe
from vedart.kernels.registry import KERNELS, KernelRegistry
from vedart.offload.adaptive import CALIBRATION_FIELDS, AdaptiveModel
from vedart.offload.profile import ProfileFile, default_profile_path
from vedart.parallel.dask_scheduler import DaskCluster
from vedart.parallel.scheduler import Scheduler, shut_down_error
from vedart.telemetry import Telemetry


class Stoppable(Protocol):
    """A pipeline stage running work of its own beside the runtime's pools (async_map's event
    loop)."""

    def stop(self) -> None:
        """The runtime shut down: cancel the work not delivered yet, so that the pipeline
        raises ParIterError as one waiting for the workers does."""


class Runtime:
    """Owns the configuration and the resources built from it.

    ``gpu`` is a :class:`GPUContext` (falsy when no GPU is usable, with the reason), or
    ``None`` when the configuration disables the GPU. ``telemetry`` records @gpu calls;
    ``cost_model`` is the adaptive model (None under the static rule). ``kernels`` is the
    process-wide @gpu_kernel registry (name -> handle), the same for every runtime because
    kernels are registered when decorated, before or across runtimes. ``dask`` is the Dask
    cluster par_iter runs on under ``scheduler="dask"`` (started here, closed by
    :meth:`close`), else None.
    """

    def __init__(self, config: Config, *, device_probe: DeviceProbe | None = None) -> None:
        self.config = config
        apply_log_level(config.log_level)
        self.telemetry = Telemetry(enabled=config.telemetry)
        self.kernels: KernelRegistry = KERNELS
        self.gpu: GPUContext | None = GPUContext(
            config, device_probe, lambda ordinal: CUDABackend(device_id=ordinal)) \
            if config.gpu else None
        self.cost_model: AdaptiveModel | None = None
        if config.cost_model == "adaptive":
            gpu_name = self.gpu.devices[0].name if self.gpu else None
            path = Path(config.profile_path) if config.profile_path else \
                default_profile_path(gpu_name)
            self.cost_model = AdaptiveModel(ProfileFile(path, gpu_name, CALIBRATION_FIELDS))
        self._closed = False
        self._scheduler: Scheduler | None = None
        self._scheduler_lock = threading.Lock()
        self._stages: weakref.WeakSet[Stoppable] = weakref.WeakSet()
        if self.gpu is not None and not self.gpu.is_available():
            logger.info("GPU unavailable: %s; @gpu functions run on the CPU",
                        self.gpu.unavailable_reason)
        self.dask: DaskCluster | None = None
        if config.scheduler == "dask":
            try:
                self.dask = DaskCluster.start(config, len(self.gpu.devices) if self.gpu else 0)
            except BaseException:
                if self.gpu is not None:
                    self.gpu.close()
                raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def gpu_unavailable_reason(self) -> str | None:
        """Why no GPU is usable ("GPU disabled by config", "CUDA driver not found", ...), or
        None when one is: ``runtime.gpu`` is None when the config disables the GPU."""
        if self.gpu is None:
            return DISABLED_BY_CONFIG
        return self.gpu.unavailable_reason

    @property
    def scheduler(self) -> Scheduler:
        """The worker pool shared by every par_iter pipeline (``config.threads`` workers),
        created on first use and shut down by :meth:`close`."""
        with self._scheduler_lock:
            if self._scheduler is None:
                if self._closed:
                    raise shut_down_error()
                self._scheduler = Scheduler(self.config.threads)
            return self._scheduler

    def attach(self, stage: Stoppable) -> None:
        """Stop ``stage`` when the runtime closes (held weakly); ParIterError once closed."""
        with self._scheduler_lock:
            if self._closed:
                raise shut_down_error()
            self._stages.add(stage)

    def close(self) -> None:
        """Release the runtime's pools and device handles, stopping the pipeline stages that
        run work of their own. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._scheduler_lock:
            scheduler = self._scheduler
            stages = list(self._stages)
        for stage in stages:
            try:
                stage.stop()
            except Exception as error:  # noqa: BLE001  # the rest of the shutdown must run
                logger.warning("could not stop a pipeline stage at shutdown: %s", error)
        if scheduler is not None:
            scheduler.shutdown()
        if self.dask is not None:
            self.dask.close()
        if self.cost_model is not None:
            self.cost_model.save()
        if self.gpu is not None:
            self.gpu.close()


lifecycle.register_factory(Runtime)


def _save_learning_at_exit() -> None:
    """At interpreter exit, write what the current runtime's cost model learned since its
    last save (a program need not call ``veda.shutdown()`` for the next one to start from
    it)."""
    runtime = lifecycle.current
    if runtime is not None and runtime.cost_model is not None:
        runtime.cost_model.save()


atexit.register(_save_learning_at_exit)


def empty_cache() -> None:
    """Free cached device-pool blocks and vedart's cached pinned host memory (the current
    runtime's); arrays still referenced keep their memory."""
    gpu = lifecycle.get_runtime().gpu
    if gpu:
        gpu.empty_cache()


def report(file: TextIO | None = None) -> None:
    """Print the current runtime's per-function @gpu table (calls by path, mean phase times,
    bytes moved, last decision and its reason), with the Dask workers' calls gathered first."""
    runtime = lifecycle.get_runtime()
    if runtime.dask is not None and runtime.telemetry.enabled:
        runtime.dask.gather_telemetry(runtime.telemetry)
    print(runtime.telemetry.report(), file=sys.stdout if file is None else file)
