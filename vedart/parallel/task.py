""":class:`Task`: a unit of scheduled work that runs at most once and can be cancelled while
still queued."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Generic, TypeVar

R = TypeVar("R")

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
        self._finished = threading.Event()
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
            self._finished.set()

    def cancel(self) -> bool:
        """Cancel the task if it has not started; True when it will never run."""
        with self._lock:
            if self._state == _QUEUED:
                self._state = _CANCELLED
                self._work = None  # type: ignore[assignment]
                self._finished.set()
            return self._state == _CANCELLED

    def wait(self, timeout: float) -> bool:
        """Whether the task finished (or was cancelled) within ``timeout`` seconds; never runs
        it here."""
        return self._finished.wait(timeout)

    def result(self) -> R:
        """Wait for the value (running the task here if helpable and still queued); re-raise
        its exception; CancelledError when it was cancelled."""
        if self._helpable and self.claim():
            self.run()
        self._finished.wait()
        if self._state == _CANCELLED:
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
