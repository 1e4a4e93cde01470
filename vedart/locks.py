"""Locks that a forked child gets back unlocked.

A thread that holds a lock when another thread forks the process does not exist in the child,
so the child's copy of that lock stays taken for good and the first call there that needs it
hangs. The runtime is rebuilt in a child (:mod:`vedart.lifecycle`); the locks made here guard
what outlives a runtime (module state, and the state of decorated functions and kernels), and
a child gets each of them anew, unlocked. The state such a lock guarded is left as the fork
found it. vedart never forks while one of its own threads holds one of these locks.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType
from typing import Protocol


class _Lock(Protocol):
    """What a ``threading.Lock`` and a ``threading.RLock`` both offer."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


class ForkSafeLock:
    """A ``threading.Lock`` (``threading.RLock`` with ``reentrant=True``) that a forked child
    gets back unlocked; used as a lock is (``with``, ``acquire``, ``release``)."""

    __slots__ = ("__weakref__", "_lock", "_reentrant")

    def __init__(self, *, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock = self._new_lock()
        _LOCKS.add(self)

    def _new_lock(self) -> _Lock:
        return threading.RLock() if self._reentrant else threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._lock.release()

    def renew(self) -> None:
        """Replace the lock with a new, unlocked one (in a forked child, no other thread can
        hold it)."""
        self._lock = self._new_lock()


_LOCKS: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_LOCKS):
        lock.renew()


os.register_at_fork(after_in_child=_after_fork_in_child)
