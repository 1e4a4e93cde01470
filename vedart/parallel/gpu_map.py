"""The ``gpu_map`` stage: each item goes through the @gpu machinery, on a GPU lane or a CPU worker.

Per item, in input order, on the thread that drives the pipeline:
1. ``wrapper.plan_call(item)`` under ``prefer_device(least loaded device)`` makes the @gpu
   decision (``force=`` and ``veda.force`` blocks apply as they do to a direct call). While
   an item the adaptive model is exploring with (its size not settled yet) has not finished,
   no further item is decided: the model decides the next one knowing its time, as it
   decides a direct call after the previous one returned. Deciding ahead would send a whole
   window of items down a path the model has not measured yet (with a plain function, its
   first call of a size runs on the CPU: a window of 48 matrices, on the CPU). A settled
   size's re-checks hold nothing up: their GPU items run in the lanes like the others, where
   waiting for each drained them (H100, 2026-11-25: 46 ms a pipeline of 64 matrices, against
   25 ms under the static rule); while one of their CPU items runs, the next items are
   decided under ``rechecks_deferred`` (the settled path, untimed; the re-check goes on
   after it). No timed item starts beside a timed CPU item (all cores in NumPy's BLAS),
   which would time that item's interference as much as its own: one decided meanwhile (a
   new size's exploration) waits for it, and a timed CPU item waits for the timed items on
   the lanes (a CPU-settled size's re-check times the GPU first).
2. CPU: the item joins a batch of consecutive CPU items, run on the worker pool
   ``chunk_size`` items per task: through the wrapper (its fast path), or, when the adaptive
   model chose the CPU, as the decided call itself (so a re-check of the CPU runs there and is
   learned from, instead of being decided afresh on the worker).
3. GPU: the item is admitted to the decided device within its in-flight bound; its mid-size
   inputs are copied into pinned memory on the transfer engine's staging threads; then the
   device's lane thread launches it on one of its streams and lands it (see
   :mod:`vedart.parallel.gpu_lanes` and ``PlannedCall``). When the device is full and a CPU
   worker is idle, an item the :class:`HybridRating` rates faster on the CPU than in the
   lane runs on that worker instead (never an item the model is timing).
Every item's placement is recorded in ``runtime.telemetry`` (``placements()``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from contextlib import nullcontext
from contextvars import copy_context
from dataclasses import dataclass, field
from functools import partial
from types import MethodType
from typing import TYPE_CHECKING, Any, Protocol, cast

from vedart.errors import ConfigError
from vedart.offload.adaptive import rechecks_deferred, size_bucket
from vedart.offload.cost import Decision
from vedart.offload.decorator import gpu, is_gpu_wrapper, rewrapped
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


def offloaded(function: Callable[..., Any], force: str | None) -> GpuFunction:
    """``function`` as a @gpu wrapper (wrapped with ``force=`` unless it already is one)."""
    if not is_gpu_wrapper(function):
        return cast(GpuFunction, gpu(force=force)(function))
    if force is None and isinstance(function, MethodType):
        # A @veda.gpu method bound to an object: the same function, bound, with the same
        # options (a wrapper per pipeline: the call's bookkeeping is by function).
        return cast(GpuFunction, rewrapped(function, function.gpu_options))
    if force is not None:
        raise ConfigError(f"force: got {force!r} for {function.__name__}, which is already "
                          "@veda.gpu; allowed: None (give force= to @veda.gpu, or use a "
                          "veda.force block)")
    return cast(GpuFunction, function)


@dataclass
class _SizeTimes:
    """Seconds measured for items of one size bucket: on CPU workers, and of a lane thread."""

    cpu_seconds: float = 0.0
    cpu_items: int = 0
    lane_seconds: float = 0.0
    lane_items: int = 0
    hybrid_running: int = 0


HYBRID_SAMPLES = 3  # items of a size timed on each side before a CPU worker may take one


class HybridRating:
    """Whether an idle CPU worker should take an item the cost model sends to a full device,
    from this stage's own measurements per size (log2 bucket of the item's host bytes):

    - CPU seconds per item: items of that size run on CPU workers (decided for the CPU, or
      hybrid);
    - lane seconds per item: the time the device's lane thread spent launching and landing
      each item of that size. The lane runs its items one after another, so every item ahead
      of another delays it by about that much.

    An item is taken only when both are measured for its size (``HYBRID_SAMPLES`` items each:
    one CPU item, the model's first call of a size, is no measure of keeping up; on the H100
    it sent one matmul item of 32 to a CPU worker) and the CPU finishes it before
    the lane would: ``cpu x (hybrid items of its size running + 1) < lane``, the lane's time
    per item, counting the hybrid items already sharing the CPU. The lane's items overlap on
    the device (its copies and kernels run while the lane thread works on the next item), so
    the items in flight ahead do not make an item wait their whole lane time each: on the
    H100 (2026-11-24), 1000x1000 float32 matmul items took about 3 ms on a CPU worker and
    0.4 ms of lane time; counting the 16 in flight sent 5 of 32 items to CPU workers, and
    counting two still sent one, each finishing after the lanes. An item of a size never run on the CPU in this stage is
    never taken: a CPU time measured at another size says little about it (a matmul's grows
    faster than its bytes), and a GPU-friendly function then never pays for finding out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, _SizeTimes] = {}

    def _times(self, nbytes: int) -> _SizeTimes:
        bucket = size_bucket(nbytes)
        times = self._sizes.get(bucket)
        if times is None:
            times = self._sizes[bucket] = _SizeTimes()
        return times

    def observe_cpu(self, nbytes: int, seconds: float, hybrid: bool) -> None:
        """Account an item of ``nbytes`` host bytes that took ``seconds`` on a CPU worker
        (``hybrid``: one :meth:`take` counted in)."""
        with self._lock:
            times = self._times(nbytes)
            times.cpu_seconds += seconds
            times.cpu_items += 1
            if hybrid:
                times.hybrid_running -= 1

    def observe_lane(self, nbytes: int, seconds: float) -> None:
        """Account an item of ``nbytes`` host bytes that took ``seconds`` of a lane thread."""
        with self._lock:
            times = self._times(nbytes)
            times.lane_seconds += seconds
            times.lane_items += 1

    def take(self, nbytes: int, in_flight: int) -> bool:
        """Whether an idle worker takes an item of ``nbytes`` host bytes whose device has
        ``in_flight`` items admitted (see the class doc); when it does, the item counts as
        running until :meth:`observe_cpu` accounts it."""
        with self._lock:
            times = self._times(nbytes)
            if min(times.cpu_items, times.lane_items) < HYBRID_SAMPLES:
                return False
            cpu = times.cpu_seconds / times.cpu_items
            lane = times.lane_seconds / times.lane_items
            if cpu * (times.hybrid_running + 1) >= lane:
                return False
            times.hybrid_running += 1
            return True


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
        self._launch_seconds = 0.0  # of the lane thread, in begin()
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
        self._launch_seconds = time.perf_counter() - self._started

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
        landing = time.perf_counter()
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
                                       finished, self._launch_seconds + finished - landing)
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
        self._rating = HybridRating()
        assert runtime.gpu
        self._engine = runtime.gpu.transfers
        self._cpu_items = _CpuItems()
        # The latest item whose time the next decision waits for; the latest item of a
        # settled size's re-check timed on the CPU, which decisions do not wait for but a timed
        # item's start does; the timed items on lanes not known to have finished, which a
        # timed CPU item's start waits for (see the module docstring).
        self._awaited: Task[Batch] | None = None
        self._rechecking: Task[Batch] | None = None
        self._timed_on_lanes: list[Task[Batch]] = []

    def _fill(self) -> None:
        try:
            super()._fill()
        finally:
            self._flush_cpu()

    def _dispatch(self, item: Any, origin: int) -> None:
        if isinstance(item, ItemFailure):
            self._add_cpu(item, origin, 0)
            return
        self._awaited = self._finished(self._awaited)
        lanes = self._lanes.devices[self._device] if self._device is not None \
            else self._lanes.least_loaded()
        if self._rechecking is not None and self._rechecking.wait(0):
            self._rechecking = None
        try:
            with prefer_device(lanes.device), \
                    rechecks_deferred() if self._rechecking is not None else nullcontext():
                call = self._wrapper.plan_call(item)
        except Exception as error:
            self._add_cpu(ItemFailure(origin, self.label, error), origin, 0)
            return
        nbytes, decision = call.host_bytes, call.decision
        timed = decision.model == "adaptive" and decision.timed
        if timed:  # starts beside no timed CPU item, and a timed CPU item beside no timed item
            self._rechecking = self._finished(self._rechecking)
            if decision.path == "cpu":
                for task in self._timed_on_lanes:
                    self._finished(task)
                self._timed_on_lanes.clear()
        if decision.path == "cpu":
            flushed = self._add_cpu(item, origin, nbytes,
                                    call if decision.model == "adaptive" else None)
            if timed:
                task = flushed or self._flush_cpu()
                if decision.exploring:
                    self._awaited = task
                else:
                    self._rechecking = task
            return
        assert decision.device is not None, decision
        lanes = self._lanes.devices.get(decision.device, lanes)  # an input's own device
        self._flush_cpu()
        if not lanes.admit(nbytes, decision.free_bytes, wait=False):
            if not timed and self._hybrid_takes(call, lanes):
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
        if timed:
            self._timed_on_lanes = [task for task in self._timed_on_lanes if not task.wait(0)]
            self._timed_on_lanes.append(work.task)
        if decision.exploring:  # only the adaptive model explores, and it times what it does
            self._awaited = work.task

    @staticmethod
    def _finished(task: Task[Batch] | None) -> None:
        """Wait until ``task`` (if any) has run, and taught the model its time if it was timed;
        one still queued for a CPU worker runs here. None, for the caller to forget it."""
        if task is None:
            return None
        try:
            task.result()  # its own failure is the item's, delivered in order with the rest
        except CancelledError:  # shut down: awaiting the item in order reports it
            pass
        return None

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
                and self._rating.take(call.host_bytes, lanes.in_flight))

    def _add_cpu(self, item: Any, origin: int, nbytes: int, call: LaneCall | None = None
                 ) -> Task[Batch] | None:
        """Collect a CPU item; the task of its batch when that is full and submitted."""
        self._cpu_items.add(item, origin, nbytes, call)
        if len(self._cpu_items.items) >= self._chunks.size:
            return self._flush_cpu()
        return None

    def _flush_cpu(self) -> Task[Batch] | None:
        """Submit the CPU items collected so far as one task (None when there are none)."""
        if not self._cpu_items.items:
            return None
        items, self._cpu_items = self._cpu_items, _CpuItems()
        task = self._scheduler.submit(Task(in_context(self._run_on_cpu, self._wrapper, "cpu",
                                                      items)))
        self._push(task)
        return task

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
            self._rating.observe_cpu(nbytes, finished - started, hybrid=path == "hybrid")
            self._place(Placement(self.label, origin, path, started=started, finished=finished))
            values.append(value)
        if path == "cpu":  # hybrid items are GPU-sized: they would mis-size CPU batches
            self._chunks.observe(len(work.items), time.perf_counter() - started_batch)
        return Batch(values, work.origins, failures)

    def observe_lane_item(self, nbytes: int, lane: Lane, origin: int, started: float,
                          finished: float, lane_seconds: float) -> None:
        """Account a GPU item a lane finished between ``started`` and ``finished``, having
        spent ``lane_seconds`` of the lane thread on it (rating and placement)."""
        self._rating.observe_lane(nbytes, lane_seconds)
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

