""":class:`Task`: a unit of work that runs at most once and can be cancelled while still queued;
:class:`TaskThreads`: daemon threads that run queued tasks in FIFO order (the scheduler's
workers and the transfer engine's staging threads).

Both are lean on purpose: a one-GPU ``gpu_map`` hands every item to a staging thread and a
lane through them, and all of its threads' Python runs under one interpreter lock, so each
microsecond spent here adds to every item. Submitting 20,000 no-op tasks to 8 threads and
waiting for each took 11-17 us per task through ``concurrent.futures.ThreadPoolExecutor`` and
2-3 us through these on the development machine (2026-11-23).
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Generic, TypeVar

R = TypeVar("R")
T = TypeVar("T")

_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class Task(Generic[R]):
    """Work that is queued until one thread claims it, then runs once.

    Whoever claims first runs it: a worker taking it from a queue or, when ``helpable``, the
    thread waiting for its result. That second case is what makes nested pipelines safe: a
    worker waiting for a sub-pipeline's task that no free worker has started runs it itself
    instead of blocking. GPU lane tasks are not helpable (they must run on their lane).
    """

    __slots__ = ("_work", "_helpable", "_lock", "_state", "_finished", "_value", "_error")

    def __init__(self, work: Callable[[], R], *, helpable: bool = True) -> None:
        self._work = work
        self._helpable = helpable
        self._lock = threading.Lock()
        self._state = _QUEUED
        # Held until the task is done or cancelled: a waiter acquires and releases it. A bare
        # lock, not a threading.Event (a Condition and a deque, 20x dearer to make).
        self._finished = threading.Lock()
        self._finished.acquire()
        self._value: R | None = None
        self._error: BaseException | None = None

    @classmethod
    def completed(cls, value: R) -> Task[R]:
        """A task that is already done with ``value``."""
        task: Task[R] = cls(lambda: value)
        task.claim()
        task.run()
        return task

    @classmethod
    def cancelled(cls) -> Task[R]:
        """A task that was cancelled before it ran (its result raises CancelledError)."""
        task: Task[R] = cls(lambda: None)  # type: ignore[arg-type,return-value]
        task.cancel()
        return task

    def claim(self) -> bool:
        """Take the task for running; False when it was claimed or cancelled before."""
        with self._lock:
            if self._state != _QUEUED:
                return False
            self._state = _RUNNING
            return True

    def run(self) -> None:
        """Run the claimed task, keeping its value or exception for :meth:`result`."""
        try:
            self._value = self._work()
        except BaseException as error:  # re-raised in the thread that waits for the result
            self._error = error
        finally:
            self._state = _DONE
            self._work = None  # type: ignore[assignment]  # drop the closure and its items
            self._finished.release()

    def cancel(self) -> bool:
        """Cancel the task if it has not started; True when it will never run."""
        with self._lock:
            if self._state == _QUEUED:
                self._state = _CANCELLED
                self._work = None  # type: ignore[assignment]
                self._finished.release()
            return self._state == _CANCELLED

    def is_cancelled(self) -> bool:
        """Whether the task was cancelled before it ran."""
        return self._state == _CANCELLED

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the task finished (or was cancelled), waiting at most ``timeout`` seconds
        (None: until it has; zero or less: not at all); never runs it here."""
        if self._state >= _DONE:
            return True
        if timeout is None:
            with self._finished:  # released again even if the wait is interrupted
                return True
        if timeout <= 0 or not self._finished.acquire(timeout=timeout):
            return self._state >= _DONE
        self._finished.release()  # for the next waiter
        return True

    def result(self) -> R:
        """Wait for the value (running the task here if helpable and still queued); re-raise
        its exception; CancelledError when it was cancelled."""
        if self._helpable and self.claim():
            self.run()
        self.wait()
        if self.is_cancelled():
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class TaskThreads:
    """``count`` daemon threads named ``{name}-0``, ``{name}-1``, ... that take submitted tasks
    in FIFO order and run those still unclaimed. Thread-safe.

    With ``finish_at_exit``, interpreter exit waits for the queued tasks before any ``atexit``
    handler runs, as it does for ``concurrent.futures`` threads: staging work must not be
    copying into pinned or shared memory while exit handlers free it."""

    def __init__(self, count: int, name: str, *, finish_at_exit: bool = False) -> None:
        self._queue: queue.SimpleQueue[Task[object] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{number}",
                                          daemon=True) for number in range(count)]
        for thread in self._threads:
            thread.start()
        if finish_at_exit:
            at_thread_exit(self._finish)

    def _finish(self) -> None:
        self.close(cancel_queued=False)
        self.join()

    def submit(self, task: Task[R]) -> Task[R]:
        """Queue ``task`` and return it (cancelled at once after :meth:`close`)."""
        with self._lock:
            if not self._closed:
                self._queue.put(task)  # type: ignore[arg-type]
                return task
        task.cancel()
        return task

    def idle(self) -> int:
        """Threads waiting for work that no queued task will take (a snapshot)."""
        with self._lock:
            return max(self._idle - self._queue.qsize(), 0)

    def close(self, *, cancel_queued: bool) -> None:
        """Take no more tasks; cancel the queued ones when ``cancel_queued``, else let the
        threads run them first. Idempotent; :meth:`join` waits for the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if cancel_queued:
                for task in drain(self._queue):
                    if task is not None:
                        task.cancel()
            for _ in self._threads:
                self._queue.put(None)

    def join(self) -> None:
        """Wait for the threads to stop (all but the calling one, when a task closes the pool
        it runs on) after :meth:`close`."""
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            task = self._queue.get()
            with self._lock:
                self._idle -= 1
            if task is None:
                return
            if task.claim():
                task.run()
            # Its value (or its error's traceback, the items of the batch it failed in) is the
            # waiter's to keep: not this thread's until its next task.
            del task


def drain(source: queue.SimpleQueue[T]) -> list[T]:
    """Everything ``source`` holds now, taken without waiting (for cancelling queued work)."""
    taken: list[T] = []
    while True:
        try:
            taken.append(source.get_nowait())
        except queue.Empty:
            return taken


def at_thread_exit(callback: Callable[[], None]) -> None:
    """Call ``callback`` at interpreter exit before ``atexit`` handlers: through the hook
    ``concurrent.futures`` uses (CPython 3.9+), else as an ``atexit`` handler."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(callback)
        return
    try:
        register(callback)
    except RuntimeError:  # the interpreter is already shutting down
        pass
