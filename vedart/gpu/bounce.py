"""Host -> device copies through a few pinned slots on the calling thread, in plain Python: how
large arrays go to the device while the compiled staging loop (:mod:`vedart.gpu.staging_loop`)
is still loading, or where it cannot be loaded.

The first large ``cupy.asarray`` of a process is slow whoever makes it: 1.2-2.3 GB/s for 64 MB
and 1.3-2.6 GB/s for 256 MB against 3.8-7.9 GB/s for a second 64 MB one, while the same copies
through four 4 MiB pinned slots, refilled by ``np.copyto`` as the copies out of them complete,
ran at 6.4-8.3 and 7.7-9.4 GB/s (H100 80GB HBM3, 2026-11-25, fresh processes). Loading the loop
takes about a second after ``init``; the slots take 8-21 ms to pin, so the runtime pins them
first (:meth:`vedart.gpu.transfer.TransferEngine.prepare`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np

from vedart.locks import renew_in_child

MIB = 2**20
SLOTS = 4
SLOT_BYTES = 4 * MIB
# The interpreter's switch interval during a bounce copy. Each piece hands the interpreter lock
# over several times (NumPy's copy and CuPy's calls release it), and taking it back from a
# thread running Python (the loop's loader, at start-up) waits up to the interval: 5 ms by
# default, which cut a 256 MB copy to 0.8-2.0 GB/s (H100 80GB HBM3, 2026-11-25).
BOUNCE_SWITCH_S = 50e-6


class _SwitchInterval:
    """Lowers ``sys.setswitchinterval`` while anything holds it lowered (bounce copies, to
    several devices at once, and the staging loop's loading): to the least interval asked for
    since nothing held it, restoring the interval found then after the last holder leaves. A
    forked child gets that interval back at once: the threads holding it lowered are not there,
    and a holder that forked leaves it without effect there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._saved = 0.0
        self._generation = 0  # one more in each forked child
        # A fork waits for a change under way, so that the child finds the count and the
        # interval agreeing. Looked up at each fork: a child has a new lock (renew_in_child).
        renew_in_child(self, "_lock")
        os.register_at_fork(before=lambda: self._lock.acquire(),
                            after_in_parent=lambda: self._lock.release(),
                            after_in_child=self._after_fork_in_child)

    @contextmanager
    def lowered(self, seconds: float) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self._saved = sys.getswitchinterval()
            if seconds < sys.getswitchinterval():  # never raised while held
                sys.setswitchinterval(seconds)
            self._active += 1
            generation = self._generation
        try:
            yield
        finally:
            with self._lock:
                if generation == self._generation:  # else entered before a fork, here undone
                    self._active -= 1
                    if self._active == 0:
                        _restore(self._saved)

    def _after_fork_in_child(self) -> None:
        if self._active:
            _restore(self._saved)
        self._active = 0
        self._generation += 1


def _restore(seconds: float) -> None:
    """Set the switch interval to ``seconds`` read from ``sys.getswitchinterval``: the
    interpreter keeps whole microseconds, truncating, so the value read back is set with half
    a microsecond added, or each restore would lose one."""
    sys.setswitchinterval(seconds + 0.5e-6)


SWITCH_INTERVAL = _SwitchInterval()


class DeviceSide(Protocol):
    """The device calls of one bounce copy, ordered on one stream (``CupySide`` on a GPU)."""

    def begin(self) -> None:
        """Order the copies after the work queued so far on the caller's current stream (the
        target may reuse memory that work still reads)."""

    def end(self) -> None:
        """Order later work on the caller's current stream after the copies."""

    def wait_slot(self, slot: int) -> None:
        """Block until the copy last queued out of ``slot`` has completed."""

    def send(self, target: int, source: int, nbytes: int, slot: int) -> None:
        """Queue a copy of ``nbytes`` from host address ``source`` (in ``slot``) to device
        address ``target``, then mark ``slot`` busy until it completes."""

    def settle(self) -> None:
        """Block until every queued copy has completed."""


class CupySide:
    """:class:`DeviceSide` on the current CuPy device: one stream, one event per slot."""

    def __init__(self, slots: int) -> None:
        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.events = [cupy.cuda.Event(disable_timing=True) for _ in range(slots)]
        self._memcpy = cupy.cuda.runtime.memcpyAsync
        self._host_to_device = cupy.cuda.runtime.memcpyHostToDevice
        self._current_stream = cupy.cuda.get_current_stream

    def begin(self) -> None:
        self.stream.wait_event(self._current_stream().record())

    def end(self) -> None:
        self._current_stream().wait_event(self.stream.record())

    def wait_slot(self, slot: int) -> None:
        self.events[slot].synchronize()

    def send(self, target: int, source: int, nbytes: int, slot: int) -> None:
        self._memcpy(target, source, nbytes, self._host_to_device, self.stream.ptr)
        self.events[slot].record(self.stream)

    def settle(self) -> None:
        self.stream.synchronize()


class BounceBuffers:
    """Pinned host arrays of equal size (``slots``) and the device side they are sent through;
    one copy at a time (:meth:`try_copy` answers False while another runs)."""

    def __init__(self, slots: list[np.ndarray], side: DeviceSide) -> None:
        self.slots = slots
        self.side = side
        self._addresses = [slot.ctypes.data for slot in slots]
        self._lock = threading.Lock()
        self._retired = False

    def try_copy(self, target: int, source: np.ndarray) -> bool:
        """Copy the bytes of ``source`` (C- or Fortran-contiguous) to device address
        ``target``, ordered after the work queued on the caller's current stream and before
        the work queued there later, and return True; False at once, copying nothing, while
        another copy holds the buffers or after :meth:`retire`. Interrupted or failed, it
        waits for what it queued, so no slot is refilled under a copy still reading it."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._retired:
                return False
            with SWITCH_INTERVAL.lowered(BOUNCE_SWITCH_S):
                self.side.begin()
                self._copy(target, source.reshape(-1, order="A").view(np.uint8))
                self.side.end()
            return True
        finally:
            self._lock.release()

    def _copy(self, target: int, flat: np.ndarray) -> None:
        slot_bytes, count = self.slots[0].nbytes, len(self.slots)
        try:
            for index, offset in enumerate(range(0, flat.nbytes, slot_bytes)):
                slot = index % count
                nbytes = min(slot_bytes, flat.nbytes - offset)
                self.side.wait_slot(slot)
                np.copyto(self.slots[slot][:nbytes], flat[offset:offset + nbytes])
                self.side.send(target + offset, self._addresses[slot], nbytes, slot)
        except BaseException:
            self.side.settle()
            raise

    def retire(self) -> None:
        """Take no more copies, and wait until none out of the slots is under way: the slots
        may then go back to the pinned pool."""
        with self._lock:
            self._retired = True
            self.side.settle()


def pinned_slots(take: Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray | None],
                 slots: int = SLOTS, slot_bytes: int = SLOT_BYTES) -> list[np.ndarray] | None:
    """``slots`` pinned uint8 arrays of ``slot_bytes`` from ``take(shape, dtype)`` (the pinned
    pool's ``array``), or None when it cannot give them all."""
    arrays = []
    for _ in range(slots):
        array = take((slot_bytes,), np.dtype(np.uint8))
        if array is None:
            return None
        arrays.append(array)
    return arrays
