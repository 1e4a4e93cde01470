"""Locks that a forked child gets back unlocked.

A thread that holds a lock when another thread forks the process does not exist in the child,
so the child's copy of that lock stays taken for good and the first call there that needs it
hangs. The runtime is rebuilt in a child (:mod:`vedart.lifecycle`); the locks registered here
guard what outlives a runtime (module state, and the state of decorated functions and kernels),
and in a child each is replaced by a new lock of its kind, unlocked, except a reentrant lock
the forking thread itself holds, which that thread goes on to release. The state such a lock
guarded is left as the fork found it. The locks stay plain ``threading`` locks: taking one
costs what it did, and is as safe against an interrupt.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

_RLOCK_TYPE = type(threading.RLock())
# (id of the owner, attribute) -> a weak reference to the owner, dropped with the owner.
_REGISTERED: dict[tuple[int, str], weakref.ref[Any]] = {}


def renew_in_child(owner: object, *names: str) -> None:
    """After a fork, the child replaces the lock ``getattr(owner, name)`` of each of ``names``
    with a new, unlocked lock of the same kind (``threading.Lock`` or ``threading.RLock``).
    ``owner`` is an object (``self``) or a module (``sys.modules[__name__]``); it is referred to
    weakly."""
    for name in names:
        key = (id(owner), name)
        _REGISTERED[key] = weakref.ref(owner, _forget(key))


def _forget(key: tuple[int, str]) -> Callable[[weakref.ref[Any]], None]:
    def forget(_: weakref.ref[Any]) -> None:
        _REGISTERED.pop(key, None)

    return forget


def _after_fork_in_child() -> None:
    for (_, name), reference in list(_REGISTERED.items()):
        owner = reference()
        if owner is None:
            continue
        lock = getattr(owner, name)
        if isinstance(lock, _RLOCK_TYPE):
            if not lock._is_owned():  # held by a thread the child does not have, or free
                setattr(owner, name, threading.RLock())
        else:
            setattr(owner, name, threading.Lock())


os.register_at_fork(after_in_child=_after_fork_in_child)
