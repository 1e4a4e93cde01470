"""The runtime's scheduler: one worker pool shared by every par_iter pipeline, and the ordered,
bounded, automatically chunked execution of a stage on it.

Contracts:
- A stage keeps at most ``window`` tasks in flight and reads its upstream only to fill that
  window, so an endless or huge source is consumed lazily with bounded memory.
- Results come back in input order whatever order the tasks finish in.
- A thread waiting for a task nobody has started runs it itself, so a pipeline started inside
  a worker (nested par_iter) never waits on a pool that is busy waiting on it.
- ``shutdown()`` cancels queued tasks, stops the GPU lanes and joins the workers; a pipeline
  still running then raises ParIterError.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError
from contextvars import copy_context
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

from vedart.errors import ParIterError
from vedart.parallel.batch import Batch, Reader, Stage
from vedart.tasks import Task, TaskThreads

R = TypeVar("R")


class Lanes(Protocol):
    """Execution resources the scheduler owns beside its workers (GPU lanes)."""

    def shutdown(self) -> None: ...


L = TypeVar("L", bound=Lanes)


class Pending(Protocol):
    """Work in flight that makes one batch: a :class:`Task`, or a Dask task's handle."""

    def cancel(self) -> Any: ...


P = TypeVar("P", bound=Pending)

TARGET_TASK_SECONDS = 0.002  # long enough to amortise a task's ~20 us, short enough to cancel fast
MAX_CHUNK = 8192             # items per task, which also bounds memory per task
WINDOW_PER_THREAD = 2        # tasks in flight per worker: one running, one ready


class Scheduler:
    """A pool of ``threads`` daemon worker threads taking :class:`Task` objects in FIFO order,
    plus the GPU lanes, created on first use by ``gpu_map`` (:meth:`lanes`)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._closed = False
        self._lanes: dict[str, Lanes] = {}
        self._workers = TaskThreads(threads, "vedart-worker")

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, task: Task[R]) -> Task[R]:
        """Queue ``task`` for the workers (cancelled at once when the scheduler is shut down)."""
        return self._workers.submit(task)

    def idle_workers(self) -> int:
        """Workers waiting for work that no queued task will take (a snapshot)."""
        return self._workers.idle()

    def lanes(self, kind: str, create: Callable[[], L]) -> L:
        """The lanes of ``kind`` ("threads": the GPU lanes of this process; "processes": one
        worker process per device), made by ``create()`` on first use and shut down with the
        scheduler; ParIterError after shutdown."""
        with self._lock:
            if self._closed:
                raise shut_down_error()
            if kind in self._lanes:
                return cast(L, self._lanes[kind])
        created = create()  # outside the lock: worker processes take seconds to start
        with self._lock:
            if self._closed or kind in self._lanes:  # shut down, or made by another thread
                kept = None if self._closed else self._lanes[kind]
            else:
                kept = self._lanes[kind] = created
        if kept is not created:
            created.shutdown()
            if kept is None:
                raise shut_down_error()
        return cast(L, kept)

    def shutdown(self) -> None:
        """Cancel queued tasks, stop the GPU lanes, let running tasks finish and join the
        workers (all but the calling thread, when a task shuts its own runtime down).
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lanes = list(self._lanes.values())
        self._workers.close(cancel_queued=True)
        for each in lanes:
            each.shutdown()
        self._workers.join()


def shut_down_error() -> ParIterError:
    return ParIterError("par_iter cancelled: the runtime's scheduler was shut down "
                        "(veda.shutdown() or veda.init() during the pipeline)")


def wait_for(task: Task[R]) -> R:
    """The task's result; ParIterError when shutdown cancelled it."""
    try:
        return task.result()
    except CancelledError:
        raise shut_down_error() from None


def in_context(work: Callable[..., R], *args: Any) -> Callable[[], R]:
    """``work(*args)`` bound to a copy of the caller's context, so ``veda.force`` blocks and
    other context variables around a pipeline apply on the thread that runs it."""
    return partial(copy_context().run, work, *args)


class ChunkPolicy:
    """How many items one task gets: the user's ``par_iter(chunk_size=N)``, or, automatically,
    enough for about ``target_seconds`` of work by the latest measured seconds per item
    (starting at 1, so costly items never wait behind each other in one task)."""

    def __init__(self, fixed: int | None, target_seconds: float = TARGET_TASK_SECONDS) -> None:
        self._fixed = fixed
        self._target_seconds = target_seconds
        self.size = 1 if fixed is None else fixed
        # Whether ``size`` is known: fixed, or from a measured task.
        self.sized = fixed is not None

    def observe(self, items: int, seconds: float) -> None:
        """Account a task of ``items`` items that took ``seconds`` (called from workers; a
        lost update between concurrent callers only delays the adjustment)."""
        if self._fixed is not None or items == 0:
            return
        self.sized = True
        per_item = seconds / items
        self.size = MAX_CHUNK if per_item <= 0 else max(1, min(MAX_CHUNK,
                                                              int(self._target_seconds / per_item)))


class WindowedReader(Stage, Generic[P]):
    """A stage that computes ahead elsewhere: up to ``window`` tasks in flight (of type
    ``P``), each making one output batch, delivered in the order they were pushed.

    A ParIterError from upstream (the source failed) is raised only after the batches read
    before it have been delivered. ``close()`` cancels the tasks not yet started; running ones
    finish and their results are dropped.
    """

    def __init__(self, upstream: Reader, window: int) -> None:
        super().__init__(upstream)
        self._window = window
        self._tasks: deque[P] = deque()
        self._ended = False
        self._deferred: ParIterError | None = None

    def _next_batch(self, limit: int | None) -> Batch | None:
        if not self._ended:
            try:
                self._fill()
            except ParIterError as error:
                self._deferred, self._ended = error, True
        if not self._tasks:
            if self._deferred is not None:
                raise self._deferred
            return None
        return self._await(self._tasks.popleft())

    @abstractmethod
    def _await(self, task: P) -> Batch:
        """The batch of the oldest task in flight, once it is done."""

    @abstractmethod
    def _fill(self) -> None:
        """Read upstream and :meth:`_push` tasks while :meth:`_has_room`; set ``_ended`` when
        upstream is exhausted."""

    def _has_room(self) -> bool:
        return len(self._tasks) < self._window

    def _push(self, task: P) -> None:
        self._tasks.append(task)

    def close(self) -> None:
        self._ended = True
        while self._tasks:
            self._tasks.popleft().cancel()
        super().close()


class ItemwiseReader(WindowedReader[Task[Batch]]):
    """A windowed stage that takes its upstream one item at a time: :meth:`_dispatch` gets
    each (pushing tasks as it sees fit) while there is room, upstream being read
    ``chunks.size`` items at a time; :meth:`_upstream_ended` runs once when it is
    exhausted."""

    def __init__(self, upstream: Reader, window: int, chunks: ChunkPolicy) -> None:
        super().__init__(upstream, window)
        self._chunks = chunks
        self._inbox = Batch([], [])
        self._inbox_position = 0

    def _await(self, task: Task[Batch]) -> Batch:
        return wait_for(task)

    def _fill(self) -> None:
        while self._has_room():
            if self._inbox_position == len(self._inbox):
                batch = self._upstream.read(self._chunks.size)
                if batch is None:
                    self._ended = True
                    self._upstream_ended()
                    return
                self._inbox, self._inbox_position = batch, 0
            position = self._inbox_position
            self._inbox_position += 1
            self._dispatch(self._inbox.items[position], self._inbox.origins[position])

    @abstractmethod
    def _dispatch(self, item: Any, origin: int) -> None:
        """Take one item (an ItemFailure for one that failed upstream) with source index
        ``origin``."""

    def _upstream_ended(self) -> None:
        """Called once when upstream is exhausted (nothing by default)."""


class BatchwiseReader(WindowedReader[P]):
    """A windowed stage that reads upstream ``chunks.size`` items at a time and starts one
    task per batch (:meth:`_start`)."""

    def __init__(self, upstream: Reader, window: int, chunks: ChunkPolicy) -> None:
        super().__init__(upstream, window)
        self._chunks = chunks

    def _fill(self) -> None:
        while self._has_room():
            batch = self._upstream.read(self._chunks.size)
            if batch is None:
                self._ended = True
                return
            self._push(self._start(batch))

    @abstractmethod
    def _start(self, batch: Batch) -> P:
        """The task in flight computing ``batch``'s output."""


class ParallelReader(BatchwiseReader[Task[Batch]]):
    """Runs ``work`` (a Batch -> Batch function) over upstream batches on the worker pool,
    ``chunks.size`` items per task."""

    def __init__(self, upstream: Reader, work: Callable[[Batch], Batch], scheduler: Scheduler,
                 chunks: ChunkPolicy) -> None:
        super().__init__(upstream, WINDOW_PER_THREAD * scheduler.threads, chunks)
        self._work = work
        self._scheduler = scheduler

    def _start(self, batch: Batch) -> Task[Batch]:
        return self._scheduler.submit(Task(in_context(_timed, self._work, batch, self._chunks)))

    def _await(self, task: Task[Batch]) -> Batch:
        return wait_for(task)


def _timed(work: Callable[[Batch], Batch], batch: Batch, chunks: ChunkPolicy) -> Batch:
    started = time.perf_counter()
    result = work(batch)
    chunks.observe(len(batch), time.perf_counter() - started)
    return result
