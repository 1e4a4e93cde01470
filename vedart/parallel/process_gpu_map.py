"""The ``gpu_map`` stage over device worker processes (:mod:`vedart.parallel.device_workers`):
used when a gpu_map spans several devices, ``Config.device_processes`` is on, no
``veda.force`` block is active and the function can travel by reference.

Per item, in input order, on the thread that drives the pipeline: pickle it apart from its
array buffers, reserve ring space on the worker with the fewest items in flight (waiting for
space when every ring is full), and hand the copy into the ring and the send to the transfer
engine's staging threads. The worker's own gpu_map decides and runs the item on its device
and sends the outcome back; the item's task completes then, its placement recorded. An item
too large for a ring, or one a worker could not load (it does not pickle, or its class lives in
the caller's ``__main__``), runs in this process through the @gpu wrapper. Closing the stage
settles every item reserved and not yet handed to a send (an interrupt between the two), so
none holds back the worker's later messages.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

from vedart.errors import OffloadError
from vedart.parallel.batch import Batch, ItemFailure, Reader
from vedart.parallel.device_workers import (
    DeviceWorker,
    DeviceWorkers,
    Outcome,
    encode_for_worker,
    payload_bytes,
)
from vedart.parallel.scheduler import ChunkPolicy, ItemwiseReader, in_context, wait_for
from vedart.tasks import Task
from vedart.telemetry import Placement

if TYPE_CHECKING:
    from vedart.parallel.gpu_map import GpuFunction
    from vedart.runtime import Runtime

ITEMS_PER_DEVICE = 64  # tasks in flight per worker (each also bounded by its ring)
# Waiting this long for the oldest item flushes the workers: a worker whose gpu_map reads ahead
# for more items than this stage has sent would otherwise never finish the ones it holds.
STALL_S = 0.05  # 4 flushes a run of 256 matrices at 5 ms, 2 at 50 ms (H200x2, 2026-11-23)


class _Slot:
    """Where an item's outcome lands before its task turns it into a batch."""

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome: Outcome | None = None


class ProcessGpuMapReader(ItemwiseReader):
    """The gpu_map stage on device worker processes (see the module docstring)."""

    def __init__(self, upstream: Reader, wrapper: GpuFunction, label: str, runtime: Runtime,
                 workers: DeviceWorkers, payload: bytes, chunks: ChunkPolicy) -> None:
        """OffloadError when a worker cannot load the function (the caller runs the stage
        in-process instead)."""
        super().__init__(upstream, ITEMS_PER_DEVICE * len(workers.workers), chunks)
        self._wrapper = wrapper
        self.label = label
        self._workers = workers
        self._scheduler = runtime.scheduler
        assert runtime.gpu and runtime.gpu.transfers is not None
        self._engine = runtime.gpu.transfers
        self._telemetry = runtime.telemetry if runtime.telemetry.enabled else None
        self._closed = False
        for worker in workers.workers:
            problem = worker.begin(payload)
            if problem is not None:
                raise OffloadError(f"device {worker.ordinal}'s worker process cannot load "
                                   f"{label}'s function: {problem}")

    def _upstream_ended(self) -> None:
        self._flush()  # the workers finish what they hold

    def _dispatch(self, item: Any, origin: int) -> None:
        if isinstance(item, ItemFailure):
            self._push(Task.completed(Batch([item], [origin], {0: item})))
            return
        encoded = encode_for_worker(item)
        nbytes = 0 if encoded is None else payload_bytes(encoded[1])
        worker = self._workers.least_loaded()
        # Here: an item a worker could not load, every worker broken, or too large for a ring.
        if encoded is None or worker is None or not worker.fits(nbytes):
            self._push(self._scheduler.submit(Task(in_context(self._run_here, item, origin))))
            return
        meta, buffers = encoded
        slot = _Slot()
        task: Task[Batch] = Task(partial(self._landed, slot, origin, worker), helpable=False)

        def deliver(outcome: Outcome) -> None:
            slot.outcome = outcome
            if task.claim():  # not cancelled meanwhile
                task.run()

        try:
            seq, offset = worker.reserve(nbytes, deliver)
        except Exception as error:  # a broken worker
            self._push(Task.completed(self._failed(origin, error)))
            return
        send = partial(worker.send, seq, offset, meta, buffers)
        try:
            try:
                self._engine.submit_staging(send)
            except RuntimeError:  # the engine is closing with its runtime: copy here
                send()
        except BaseException as error:  # never leave a reserved item unsent: it blocks the rest
            worker.abandon(seq, error)
            raise
        self._push(task)

    def _landed(self, slot: _Slot, origin: int, worker: DeviceWorker) -> Batch:
        outcome = slot.outcome
        assert outcome is not None
        if self._telemetry is not None and outcome.where is not None:
            path, lane, started, finished = outcome.where
            self._telemetry.record_placement(Placement(
                self.label, origin, path, worker.ordinal if path == "gpu" else None, lane,
                started, finished))
        if outcome.ok:
            return Batch([outcome.value], [origin])
        return self._failed(origin, outcome.value)

    def _failed(self, origin: int, error: BaseException) -> Batch:
        failure = ItemFailure(origin, self.label, error)
        return Batch([failure], [origin], {0: failure})

    def _run_here(self, item: Any, origin: int) -> Batch:
        started = time.perf_counter()
        try:
            call = self._wrapper.plan_call(item)
            value = call.run()
        except Exception as error:
            return self._failed(origin, error)
        if self._telemetry is not None:
            decision = call.decision
            self._telemetry.record_placement(Placement(
                self.label, origin, decision.path, decision.device, None, started,
                time.perf_counter()))
        return Batch([value], [origin])

    def _await(self, task: Task[Batch]) -> Batch:
        if not task.wait(STALL_S):
            self._flush()
        return wait_for(task)

    def _flush(self) -> None:
        for worker in self._workers.workers:
            worker.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            super().close()
            dropped = OffloadError("cancelled: the pipeline was closed")
            for worker in self._workers.workers:  # items left after an early close are dropped
                worker.abandon_unsent(dropped)
                worker.cancel()
            if self._telemetry is not None:  # the workers' calls, for veda.report() here
                for worker in self._workers.workers:
                    for name, delta in worker.stats():
                        self._telemetry.function(name).merge(delta)
        finally:
            self._workers.release()
