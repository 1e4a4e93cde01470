"""The ``gpu_map`` stage: each item goes through the @gpu machinery, on a GPU lane or a CPU worker.

Per item, in input order, on the thread that drives the pipeline:
1. ``wrapper.plan_call(item)`` under ``prefer_device(least loaded device)`` makes the @gpu
   decision (``force=`` and ``veda.force`` blocks apply as they do to a direct call).
2. CPU: the item joins a batch of consecutive CPU items, run on the worker pool
   ``chunk_size`` items per task: through the wrapper (its fast path), or, when the adaptive
   model chose the CPU, as the decided call itself (so a re-check of the CPU runs there and is
   learned from, instead of being decided afresh on the worker).
3. GPU: the item is admitted to the decided device within its in-flight bound; its mid-size
   inputs are copied into pinned memory on the transfer engine's staging threads; then the
   device's lane thread launches it on one of its streams and lands it (see
   :mod:`vedart.parallel.gpu_lanes` and ``PlannedCall``). When the device is full and a CPU
   worker is idle, an item the :class:`HybridRating` rates competitive runs on that worker
   instead.
Every item's placement is recorded in ``runtime.telemetry`` (``placements()``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import copy_context
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, cast

from vedart.errors import ConfigError
from vedart.offload.cost import Decision
from vedart.offload.decorator import gpu
from vedart.offload.force import forced_path, prefer_device
from vedart.parallel.batch import Batch, ItemFailure, Reader
from vedart.parallel.gpu_lanes import (
    STREAMS_PER_DEVICE,
    CudaBinding,
    DeviceLanes,
    GpuLanes,
    Lane,
)
from vedart.parallel.scheduler import (
    WINDOW_PER_THREAD,
    ChunkPolicy,
    ItemwiseReader,
    Scheduler,
    in_context,
)
from vedart.tasks import Task
from vedart.telemetry import Placement, Telemetry

if TYPE_CHECKING:
    from vedart.gpu.transfer import TransferEngine
    from vedart.runtime import Runtime

PROBE_FACTOR = 2.0  # before measurements, items under this x the threshold are CPU-competitive


class LaneCall(Protocol):
    """One decided call of a @veda.gpu wrapper, run in phases (``PlannedCall``)."""

    decision: Decision
    host_bytes: int  # of the host arrays among its arguments
    device_inputs: bool  # whether any of its arguments is already a device array

    def stages(self, engine: TransferEngine) -> bool: ...

    def stage(self, engine: TransferEngine) -> None: ...

    def launch(self) -> None: ...

    def land(self) -> Any: ...

    def run(self) -> Any: ...


class GpuFunction(Protocol):
    """A @veda.gpu wrapper, as gpu_map uses it."""

    __name__: str
    __wrapped__: Callable[..., Any]

    def __call__(self, *args: Any) -> Any: ...

    def plan_call(self, *args: Any) -> LaneCall: ...


def is_gpu_wrapper(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is already a @veda.gpu wrapper."""
    return hasattr(function, "plan_call") and hasattr(function, "__wrapped__")


def offloaded(function: Callable[..., Any], force: str | None) -> GpuFunction:
    """``function`` as a @gpu wrapper (wrapped with ``force=`` unless it already is one)."""
    if not is_gpu_wrapper(function):
        return cast(GpuFunction, gpu(force=force)(function))
    if force is not None:
        raise ConfigError(f"force: got {force!r} for {function.__name__}, which is already "
                          "@veda.gpu; allowed: None (give force= to @veda.gpu, or use a "
                          "veda.force block)")
    return cast(GpuFunction, function)


class HybridRating:
    """Whether an item the cost model sends to a full GPU would finish as soon on an idle CPU
    worker, from this stage's own measurements.

    Rates are seconds per input byte on each path (GPU: a lane's whole call, transfers
    included). An item is competitive when the CPU rate is at most the GPU rate times the wait
    factor ``1 + in_flight / lanes`` of its device. Until both rates are measured, only items
    smaller than ``PROBE_FACTOR x threshold`` are (near the threshold the CPU is about as
    fast, and running one measures the CPU rate).
    """

    def __init__(self, threshold: int) -> None:
        self._threshold = threshold
        self._lock = threading.Lock()
        self._seconds = {"cpu": 0.0, "gpu": 0.0}
        self._bytes = {"cpu": 0, "gpu": 0}

    def observe(self, path: str, nbytes: int, seconds: float) -> None:
        """Account one item of ``nbytes`` input bytes that took ``seconds`` on ``path``."""
        with self._lock:
            self._seconds[path] += seconds
            self._bytes[path] += nbytes

    def competitive(self, nbytes: int, lanes: DeviceLanes) -> bool:
        with self._lock:
            if not (self._bytes["cpu"] and self._bytes["gpu"]):
                return nbytes < PROBE_FACTOR * self._threshold
            cpu_rate = self._seconds["cpu"] / self._bytes["cpu"]
            gpu_rate = self._seconds["gpu"] / self._bytes["gpu"]
        return cpu_rate <= gpu_rate * (1 + lanes.in_flight / lanes.streams)


@dataclass
class _CpuItems:
    """Consecutive items bound for the CPU, collected into one task."""

    items: list[Any] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    calls: list[LaneCall | None] = field(default_factory=list)  # a decided call to run as is
    failures: dict[int, ItemFailure] = field(default_factory=dict)

    def add(self, item: Any, origin: int, nbytes: int, call: LaneCall | None = None) -> None:
        if isinstance(item, ItemFailure):
            self.failures[len(self.items)] = item
        self.items.append(item)
        self.origins.append(origin)
        self.sizes.append(nbytes)
        self.calls.append(call)


class _LaneItem:
    """A GPU item on its way through a lane (a :class:`LaneWork`): staged ahead on the
    transfer engine's threads, begun and finished by its device's lane thread, in the context
    of the thread that dispatched it. ``task`` delivers its one-item Batch."""

    def __init__(self, reader: GpuMapReader, call: LaneCall, origin: int, nbytes: int,
                 staging: Task[None] | None) -> None:
        self._reader = reader
        self._call: LaneCall | None = call
        self._origin = origin
        self._nbytes = nbytes
        self._staging = staging
        self._context = copy_context()
        self.task: Task[Batch] = Task(partial(self._context.run, self._finish), helpable=False)
        self._lane: Lane | None = None
        self._started = 0.0
        self._begin_error: BaseException | None = None

    def claim(self) -> bool:
        if self.task.claim():
            return True
        self._drop_call()  # cancelled while queued: the lane skips it
        return False

    def cancel(self) -> None:
        self.task.cancel()
        self._drop_call()

    def fail(self, lane: Lane, error: BaseException) -> None:
        if self._call is None:  # finished already
            return
        self._lane, self._begin_error = lane, error
        self._started = self._started or time.perf_counter()
        self.task.run()

    def _drop_call(self) -> None:
        # Until the lane reaches it, its queue holds this item: keep no staged memory meanwhile.
        if self._staging is not None:
            self._staging.cancel()  # not started yet: nothing is copied for it
        self._call = self._staging = None

    def begin(self, lane: Lane) -> None:
        self._lane, self._started = lane, time.perf_counter()
        self._context.run(self._begin)

    def _begin(self) -> None:
        assert self._call is not None and self._lane is not None
        try:
            if self._staging is not None:
                self._staging.result()  # stage() keeps its own failures for land()
            with prefer_device(self._lane.device):  # for @gpu calls nested in the function
                self._call.launch()
        except BaseException as error:  # a lane never dies of an item: land() re-raises it
            self._begin_error = error

    def finish(self) -> None:
        self.task.run()

    def _finish(self) -> Batch:
        call, self._call = self._call, None
        assert call is not None and self._lane is not None
        try:
            if self._begin_error is not None:
                raise self._begin_error
            with prefer_device(self._lane.device):  # a CPU re-run's nested @gpu calls too
                value = call.land()
        except Exception as error:
            value = ItemFailure(self._origin, self._reader.label, error)
        finished = time.perf_counter()
        self._reader.observe_lane_item(self._nbytes, self._lane, self._origin, self._started,
                                       finished)
        return Batch([value], [self._origin], {0: value} if isinstance(value, ItemFailure)
                     else {})


class GpuMapReader(ItemwiseReader):
    """The gpu_map stage on a runtime with a usable GPU (see the module docstring)."""

    def __init__(self, upstream: Reader, wrapper: GpuFunction, label: str,
                 runtime: Runtime, scheduler: Scheduler, lanes: GpuLanes,
                 chunks: ChunkPolicy, device: int | None) -> None:
        lane_capacity = sum(device_lanes.capacity for device_lanes in lanes.devices.values())
        super().__init__(upstream, lane_capacity + WINDOW_PER_THREAD * scheduler.threads,
                         chunks)
        self._wrapper = wrapper
        self.label = label
        self._scheduler = scheduler
        self._lanes = lanes
        self._device = device
        self._telemetry: Telemetry | None = runtime.telemetry if runtime.telemetry.enabled \
            else None
        options = getattr(wrapper, "gpu_options", None)
        self._hybrid_allowed = getattr(options, "force", None) is None
        threshold = getattr(options, "threshold", None)
        self._rating = HybridRating(runtime.config.offload_threshold if threshold is None
                                    else threshold)
        assert runtime.gpu
        self._engine = runtime.gpu.transfers
        self._cpu_items = _CpuItems()

    def _fill(self) -> None:
        try:
            super()._fill()
        finally:
            self._flush_cpu()

    def _dispatch(self, item: Any, origin: int) -> None:
        if isinstance(item, ItemFailure):
            self._add_cpu(item, origin, 0)
            return
        lanes = self._lanes.devices[self._device] if self._device is not None \
            else self._lanes.least_loaded()
        try:
            with prefer_device(lanes.device):
                call = self._wrapper.plan_call(item)
        except Exception as error:
            self._add_cpu(ItemFailure(origin, self.label, error), origin, 0)
            return
        nbytes, decision = call.host_bytes, call.decision
        if decision.path == "cpu":
            self._add_cpu(item, origin, nbytes, call if decision.model == "adaptive" else None)
            return
        assert decision.device is not None, decision
        lanes = self._lanes.devices.get(decision.device, lanes)  # an input's own device
        self._flush_cpu()
        if not lanes.admit(nbytes, decision.free_bytes, wait=False):
            if self._hybrid_takes(call, lanes):
                hybrid = _CpuItems()
                hybrid.add(item, origin, nbytes)
                self._push(self._scheduler.submit(Task(in_context(
                    self._run_on_cpu, self._wrapper.__wrapped__, "hybrid", hybrid))))
                return
            if not lanes.admit(nbytes, decision.free_bytes, wait=True):  # shut down meanwhile
                self._push(Task.cancelled())
                return
        try:
            work = _LaneItem(self, call, origin, nbytes, self._stage(call))
        except BaseException:
            lanes.withdraw(nbytes)
            raise
        lanes.enqueue(work, nbytes)
        self._push(work.task)

    def _stage(self, call: LaneCall) -> Task[None] | None:
        """Start copying the call's mid-size inputs into pinned memory, if it has any."""
        engine = self._engine
        if engine is None or not call.stages(engine):
            return None
        try:
            return engine.submit_staging(partial(call.stage, engine))
        except RuntimeError:  # the engine is closing with its runtime: upload unstaged
            return None

    def _hybrid_takes(self, call: LaneCall, lanes: DeviceLanes) -> bool:
        """Whether an idle CPU worker runs ``call``'s item as written instead; never one with
        device arrays among its inputs, which the function as written would get as they are."""
        return (self._hybrid_allowed and forced_path.get() is None and not call.device_inputs
                and self._scheduler.idle_workers() > 0
                and self._rating.competitive(call.host_bytes, lanes))

    def _add_cpu(self, item: Any, origin: int, nbytes: int, call: LaneCall | None = None) -> None:
        self._cpu_items.add(item, origin, nbytes, call)
        if len(self._cpu_items.items) >= self._chunks.size:
            self._flush_cpu()

    def _flush_cpu(self) -> None:
        if self._cpu_items.items:
            items, self._cpu_items = self._cpu_items, _CpuItems()
            self._push(self._scheduler.submit(Task(in_context(
                self._run_on_cpu, self._wrapper, "cpu", items))))

    def _run_on_cpu(self, function: Callable[[Any], Any], path: str, work: _CpuItems) -> Batch:
        values: list[Any] = []
        failures = dict(work.failures)
        started_batch = time.perf_counter()
        for position, (item, origin, nbytes, call) in enumerate(zip(
                work.items, work.origins, work.sizes, work.calls)):
            if position in failures:
                values.append(item)
                continue
            started = time.perf_counter()
            try:
                value = function(item) if call is None else call.run()
            except Exception as error:
                value = failures[position] = ItemFailure(origin, self.label, error)
            finished = time.perf_counter()
            self._rating.observe("cpu", nbytes, finished - started)
            self._place(Placement(self.label, origin, path, started=started, finished=finished))
            values.append(value)
        if path == "cpu":  # hybrid items are GPU-sized: they would mis-size CPU batches
            self._chunks.observe(len(work.items), time.perf_counter() - started_batch)
        return Batch(values, work.origins, failures)

    def observe_lane_item(self, nbytes: int, lane: Lane, origin: int, started: float,
                          finished: float) -> None:
        """Account a GPU item a lane finished (rating and placement)."""
        self._rating.observe("gpu", nbytes, finished - started)
        self._place(Placement(self.label, origin, "gpu", lane.device, lane.index, started,
                              finished))

    def _place(self, placement: Placement) -> None:
        if self._telemetry is not None:
            self._telemetry.record_placement(placement)


def gpu_lanes_for(runtime: Runtime, scheduler: Scheduler) -> GpuLanes:
    """The scheduler's lanes over the runtime's devices, created on first use."""
    assert runtime.gpu, "gpu lanes need a usable GPU"
    gpu_context = runtime.gpu
    config = runtime.config

    def fits(nbytes: int, free_bytes: int) -> bool:
        return config.memory_headroom * nbytes <= free_bytes * config.gpu_memory_fraction

    return scheduler.lanes("threads", lambda: GpuLanes(
        list(gpu_context.ordinals), STREAMS_PER_DEVICE, CudaBinding(),
        fits))

