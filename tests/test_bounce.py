"""The bounce copy's slot discipline, with host memory standing in for the device."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from vedart.gpu.bounce import BounceBuffers, _SwitchInterval, pinned_slots


class HostSide:
    """Copies at once into host memory and logs every call, to check the order of slots."""

    def __init__(self, fail_at_send: int | None = None) -> None:
        self.log: list[tuple[str, int]] = []
        self.fail_at_send = fail_at_send
        self.sends = 0
        self.entered = threading.Event()
        self.hold: threading.Event | None = None

    def begin(self) -> None:
        self.log.append(("begin", -1))

    def end(self) -> None:
        self.log.append(("end", -1))

    def wait_slot(self, slot: int) -> None:
        self.log.append(("wait", slot))

    def send(self, target: int, source: int, nbytes: int, slot: int) -> None:
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(10)
        if self.sends == self.fail_at_send:
            raise RuntimeError("copy failed")
        self.sends += 1
        ctypes.memmove(target, source, nbytes)
        self.log.append(("send", slot))

    def settle(self) -> None:
        self.log.append(("settle", -1))


def slots(count: int = 3, nbytes: int = 1000) -> list[np.ndarray]:
    return [np.empty(nbytes, np.uint8) for _ in range(count)]


@pytest.mark.parametrize("order", ["C", "F"])
def test_every_byte_arrives_and_no_slot_is_refilled_before_its_copy_is_waited_for(
        order: str) -> None:
    side = HostSide()
    buffers = BounceBuffers(slots(), side)
    source = np.asarray(np.random.default_rng(3).random((37, 29)), order=order)  # 8,584 bytes
    target = np.zeros(source.nbytes, np.uint8)
    assert buffers.try_copy(target.ctypes.data, source)
    assert target.tobytes() == source.tobytes(order="A")
    sends = [slot for kind, slot in side.log if kind == "send"]
    assert sends == [index % 3 for index in range(9)]  # ceil(8584 / 1000) pieces
    for position, (kind, slot) in enumerate(side.log):
        if kind == "send":  # the last call about this slot before sending out of it: a wait
            assert [k for k, s in side.log[:position] if s == slot][-1] == "wait"
    assert side.log[0] == ("begin", -1) and side.log[-1] == ("end", -1)


def test_a_second_copy_while_one_runs_is_refused_at_once() -> None:
    side = HostSide()
    side.hold = threading.Event()
    buffers = BounceBuffers(slots(), side)
    source = np.arange(500, dtype=np.float64)
    first_target = np.zeros(source.nbytes, np.uint8)
    first = threading.Thread(target=buffers.try_copy, args=(first_target.ctypes.data, source))
    first.start()
    assert side.entered.wait(10)
    other_target = np.zeros(source.nbytes, np.uint8)
    assert not buffers.try_copy(other_target.ctypes.data, source)
    assert not other_target.any()
    side.hold.set()
    first.join(10)
    assert first_target.tobytes() == source.tobytes()


def test_a_failed_copy_waits_for_what_it_queued_and_the_buffers_stay_usable() -> None:
    side = HostSide(fail_at_send=2)
    buffers = BounceBuffers(slots(), side)
    source = np.arange(1000, dtype=np.float64)
    target = np.zeros(source.nbytes, np.uint8)
    with pytest.raises(RuntimeError, match="copy failed"):
        buffers.try_copy(target.ctypes.data, source)
    assert side.log[-1] == ("settle", -1)
    side.fail_at_send = None
    assert buffers.try_copy(target.ctypes.data, source)
    assert target.tobytes() == source.tobytes()


def test_retired_buffers_take_no_more_copies() -> None:
    side = HostSide()
    buffers = BounceBuffers(slots(), side)
    buffers.retire()
    assert side.log == [("settle", -1)]
    target = np.zeros(8, np.uint8)
    assert not buffers.try_copy(target.ctypes.data, np.ones(1))
    assert not target.any()


def test_slots_come_all_or_none() -> None:
    given: list[tuple[tuple[int, ...], np.dtype]] = []

    def take(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        given.append((shape, dtype))
        return None if len(given) == 3 else np.empty(shape, dtype)

    assert pinned_slots(take, slots=4, slot_bytes=64) is None
    arrays = pinned_slots(lambda shape, dtype: np.empty(shape, dtype), slots=4, slot_bytes=64)
    assert arrays is not None and [a.shape for a in arrays] == [(64,)] * 4
    assert all(a.dtype == np.uint8 for a in arrays)


def test_the_switch_interval_is_the_least_asked_for_until_the_last_holder_leaves() -> None:
    interval, before = _SwitchInterval(), sys.getswitchinterval()
    assert before > 1e-3  # the interpreter's default, 5 ms
    with interval.lowered(1e-3):
        assert sys.getswitchinterval() == pytest.approx(1e-3)
        with interval.lowered(1e-4):  # a bounce copy while the loop loads
            assert sys.getswitchinterval() == pytest.approx(1e-4)
        with interval.lowered(5e-4):  # never raised while held
            assert sys.getswitchinterval() == pytest.approx(1e-4)
    assert sys.getswitchinterval() == before


def test_restoring_the_switch_interval_loses_nothing_to_rounding() -> None:
    interval, before = _SwitchInterval(), sys.getswitchinterval()
    try:
        sys.setswitchinterval(200e-6)  # kept as 199 us; read back and set again, 198 us
        own = sys.getswitchinterval()
        for _ in range(100):
            with interval.lowered(5e-5):
                pass
        assert sys.getswitchinterval() == own
    finally:
        sys.setswitchinterval(before)


def _in_child(check: Callable[[], bool]) -> int:
    """In a child forked now: exit 0 if ``check()``, else 1; in this process: the child's exit
    code. (os.fork directly: the child goes on from where this thread is.)"""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 1)
        finally:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_fork_waits_for_a_change_of_the_switch_interval_under_way() -> None:
    interval, before = _SwitchInterval(), sys.getswitchinterval()
    released: list[float] = []
    interval._lock.acquire()  # a thread between lowering the interval and counting itself

    def finish() -> None:
        time.sleep(0.2)
        released.append(time.monotonic())
        interval._lock.release()

    threading.Thread(target=finish).start()
    assert _in_child(lambda: sys.getswitchinterval() == before) == 0
    forked = time.monotonic()
    assert released and forked >= released[0]


def test_a_holder_that_forked_leaves_the_interval_to_the_childs_own_holders() -> None:
    interval, before = _SwitchInterval(), sys.getswitchinterval()
    entered, release = threading.Event(), threading.Event()
    child = -1
    with interval.lowered(1e-3):
        child = os.fork()
        if child == 0:  # this thread, in the child, still inside lowered(); none holds it here
            given_back = sys.getswitchinterval() == before

            def hold() -> None:
                with interval.lowered(5e-5):
                    entered.set()
                    release.wait(10)

            holder = threading.Thread(target=hold)
            holder.start()
            entered.wait(10)
    if child == 0:
        try:
            held = sys.getswitchinterval() == pytest.approx(5e-5)  # still the holder's
            release.set()
            holder.join(10)
            os._exit(0 if given_back and held and sys.getswitchinterval() == before else 1)
        finally:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert sys.getswitchinterval() == before
