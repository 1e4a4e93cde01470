"""The compiled staging loop (vedart.gpu.staging_loop) with stand-ins for the CUDA driver: host
memory plays the device, and every call is logged."""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numba
import numpy as np
import pytest

from vedart.errors import CUDADriverError
from vedart.gpu import staging_loop
from vedart.gpu.staging_loop import Crew, DriverCalls, copy_and_send, open_driver_calls
from vedart.offload.failures import depends_on_the_moment, is_gpu_failure, loses_context

KIB = 1024
I64 = ctypes.c_int64
Call1 = ctypes.CFUNCTYPE(ctypes.c_int, I64)
Call2 = ctypes.CFUNCTYPE(ctypes.c_int, I64, I64)
Call4 = ctypes.CFUNCTYPE(ctypes.c_int, I64, I64, I64, I64)


class FakeDriver:
    """Stand-ins for the four driver calls; ``copy_to_device`` copies host to host and fails
    with ``fail_status`` on call number ``fail_at`` (1-based) when set, and on any target
    below 1 MiB (no host address: what a loop that took a sentinel of the target cell for a
    target would send to)."""

    def __init__(self, fail_at: int | None = None, fail_status: int = 700) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.copies = 0
        self.fail_at, self.fail_status = fail_at, fail_status

        def set_context(context: int) -> int:
            self._record("context", threading.get_ident(), context)
            return 0

        def synchronize(event: int) -> int:
            self._record("sync", event)
            return 0

        def copy_to_device(target: int, slot: int, size: int, stream: int) -> int:
            with self.lock:
                self.copies += 1
                if self.copies == self.fail_at:
                    return self.fail_status
            if target < 2**20:
                self._record("copy to no address", target)
                return self.fail_status
            ctypes.memmove(target, slot, size)
            self._record("copy", target, slot, size, stream)
            return 0

        def record(event: int, stream: int) -> int:
            self._record("record", event, stream)
            return 0

        # Kept as attributes: the callbacks must outlive every call through their addresses.
        self.callbacks = (Call1(set_context), Call1(synchronize), Call4(copy_to_device),
                          Call2(record))
        libc = ctypes.CDLL(None)
        self.calls = np.array([staging_loop._address(libc.memcpy)]
                              + [staging_loop._address(callback) for callback in self.callbacks]
                              + [staging_loop._address(libc.sem_wait),
                                 staging_loop._address(libc.sem_post)], dtype=np.int64)

    def _record(self, *entry: Any) -> None:
        with self.lock:
            self.log.append(entry)


class Slots:
    """``workers`` x ``count`` host buffers of ``size`` bytes standing in for pinned slots,
    with made-up event handles."""

    def __init__(self, workers: int, count: int, size: int) -> None:
        self.buffers = [np.empty(size, np.uint8) for _ in range(workers * count)]
        self.addresses = np.array([b.ctypes.data for b in self.buffers], np.int64)
        self.events = np.arange(1000, 1000 + workers * count, dtype=np.int64)
        self.count = count

    def of(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
        start = worker * self.count
        return self.addresses[start:start + self.count], self.events[start:start + self.count]


def run_workers(driver: FakeDriver, source: np.ndarray, target: np.ndarray, workers: int,
                slots: Slots, piece: int, min_piece: int, counter: np.ndarray,
                nontemporal: bool = True) -> list[int]:
    statuses = [0] * workers

    target_cell = np.array([target.ctypes.data], np.int64)

    def work(worker: int) -> None:
        addresses, events = slots.of(worker)
        statuses[worker] = copy_and_send(counter, source.nbytes, piece, min_piece, nontemporal,
                                         source.ctypes.data, target_cell, addresses,
                                         events, 77, 55, driver.calls)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


@pytest.mark.parametrize("nontemporal", [True, False])
@pytest.mark.parametrize(("nbytes", "workers"), [(1, 1), (300 * KIB + 7, 3), (2_000_003, 4),
                                                 (5 * 2**20, 8)])
def test_every_byte_arrives_once_from_several_workers(nbytes: int, workers: int,
                                                      nontemporal: bool) -> None:
    source = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    target = np.zeros_like(source)
    driver = FakeDriver()
    counter = np.zeros(1, np.int64)
    piece, min_piece = 256 * KIB, 16 * KIB
    statuses = run_workers(driver, source, target, workers, Slots(workers, 2, piece), piece,
                           min_piece, counter, nontemporal)
    assert statuses == [0] * workers
    np.testing.assert_array_equal(target, source)
    spans = sorted((entry[1] - target.ctypes.data, entry[3])
                   for entry in driver.log if entry[0] == "copy")
    assert spans[0][0] == 0 and sum(size for _, size in spans) == nbytes
    assert all(start + size == following for (start, size), (following, _)
               in itertools.pairwise(spans))  # disjoint and gap-free
    assert all(entry[4] == 77 for entry in driver.log if entry[0] == "copy")  # the given stream
    contexts = [entry for entry in driver.log if entry[0] == "context"]
    assert len(contexts) == workers and {entry[2] for entry in contexts} == {55}


def test_pieces_grow_from_the_minimum_to_the_largest_and_stay_there() -> None:
    source = np.random.default_rng(1).integers(0, 256, 10 * 2**20 + 5, dtype=np.uint8)
    target = np.zeros_like(source)
    driver = FakeDriver()
    piece, min_piece = 2**20, 64 * KIB
    assert run_workers(driver, source, target, 1, Slots(1, 3, piece), piece, min_piece,
                       np.zeros(1, np.int64)) == [0]
    sizes = [entry[3] for entry in driver.log if entry[0] == "copy"]
    largest = sizes.index(piece)
    assert sizes[0] == min_piece  # the first copy to the device starts early ...
    assert sizes[:largest] == sorted(sizes[:largest])  # ... then pieces grow to the largest
    assert all(size <= claimed // 2 or size == min_piece  # (at most half of what came before)
               for size, claimed in zip(sizes[1:largest], itertools.accumulate(sizes)))
    # and stay there (no small copies at the end, each with its own fixed cost) but the last
    assert sizes[largest:-1] == [piece] * (len(sizes) - largest - 1)
    assert 0 < sizes[-1] <= piece
    np.testing.assert_array_equal(target, source)


class LoggingMemcpy:
    """A ``memcpy`` stand-in that copies and logs each call's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

        def memcpy(target: int, source: int, size: int) -> int:
            ctypes.memmove(target, source, size)
            self.sizes.append(size)
            return target

        self.callback = ctypes.CFUNCTYPE(I64, I64, I64, I64)(memcpy)
        self.address = staging_loop._address(self.callback)


@pytest.mark.parametrize("nontemporal", [True, False])
@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 200, 4096 + 17, 2**20 + 3])
@pytest.mark.parametrize("target_offset", [0, 1, 33, 63])
@pytest.mark.parametrize("source_offset", [0, 5])
def test_copy_piece_copies_exactly_the_bytes_at_any_alignment(
        size: int, target_offset: int, source_offset: int, nontemporal: bool) -> None:
    """Non-temporal: the middle goes through 64-byte blocks, which need an aligned target, and
    only the unaligned ends through memcpy; otherwise memcpy copies it all. Nothing outside
    the target range is written."""
    source = np.random.default_rng(size).integers(0, 256, size + 64, dtype=np.uint8)
    buffer = np.full(size + 256, 0xAB, dtype=np.uint8)
    start = -buffer.ctypes.data % 64 + target_offset
    before = buffer.copy()
    memcpy = LoggingMemcpy()
    staging_loop.copy_piece(memcpy.address, buffer.ctypes.data + start,
                            source.ctypes.data + source_offset, size, nontemporal)
    np.testing.assert_array_equal(buffer[start:start + size],
                                  source[source_offset:source_offset + size])
    np.testing.assert_array_equal(buffer[:start], before[:start])
    np.testing.assert_array_equal(buffer[start + size:], before[start + size:])
    if not nontemporal:
        assert memcpy.sizes == [size]
    else:
        head = min(size, -target_offset % 64)
        middle = (size - head) // 64 * 64
        assert sum(memcpy.sizes) == size - middle and all(part < 64 for part in memcpy.sizes)


def test_a_slot_is_refilled_only_after_waiting_for_the_copy_out_of_it() -> None:
    source = np.random.default_rng(2).integers(0, 256, 9 * 64 * KIB, dtype=np.uint8)
    target = np.zeros_like(source)
    driver = FakeDriver()
    slots = Slots(1, 2, 64 * KIB)
    run_workers(driver, source, target, 1, slots, 64 * KIB, 64 * KIB, np.zeros(1, np.int64))
    steps = [entry for entry in driver.log if entry[0] != "context"]
    assert len(steps) == 3 * 9
    for turn in range(9):  # per piece: wait on the slot's event, copy out of it, record it
        sync, copy, record = steps[3 * turn:3 * turn + 3]
        slot = turn % 2
        assert sync == ("sync", slots.events[slot])
        assert copy[0] == "copy" and copy[2] == slots.addresses[slot]
        assert record == ("record", slots.events[slot], 77)


def test_a_failed_copy_stops_every_worker_and_returns_its_status() -> None:
    source = np.random.default_rng(3).integers(0, 256, 4 * 2**20, dtype=np.uint8)
    before = source.copy()
    target = np.zeros_like(source)
    driver = FakeDriver(fail_at=3, fail_status=700)
    counter = np.zeros(1, np.int64)
    slots = Slots(2, 2, 256 * KIB)
    statuses = run_workers(driver, source, target, 2, slots, 256 * KIB, 256 * KIB, counter)
    assert 700 in statuses and set(statuses) <= {0, 700}
    assert counter[0] >= source.nbytes  # nothing left to claim
    copied = sum(entry[3] for entry in driver.log if entry[0] == "copy")
    assert copied < source.nbytes  # stopped early, not after every piece
    np.testing.assert_array_equal(source, before)  # the source is only read
    # A later worker of the same transfer finds nothing to do.
    late = FakeDriver()
    addresses, events = slots.of(0)
    assert copy_and_send(counter, source.nbytes, 256 * KIB, 256 * KIB, True, source.ctypes.data,
                         np.array([target.ctypes.data], np.int64), addresses, events, 77, 55,
                         late.calls) == 0
    assert [entry[0] for entry in late.log] == ["context"]


class FakeErrorDriver:
    """A driver library stand-in for DriverCalls: its functions and error naming."""

    def __init__(self) -> None:
        self.name, self.text = ctypes.c_char_p(b"CUDA_ERROR_ILLEGAL_ADDRESS"), ctypes.c_char_p(
            b"an illegal memory access was encountered")
        Naming = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))

        def name(status: int, out: Any) -> int:
            out[0] = self.name
            return 0

        def text(status: int, out: Any) -> int:
            out[0] = self.text
            return 0

        noop = Call1(lambda value: 0)
        self.cuCtxSetCurrent = self.cuEventSynchronize = self.cuMemcpyHtoDAsync_v2 = noop
        self.cuEventRecord = self.cuCtxGetCurrent = noop
        self.cuGetErrorName, self.cuGetErrorString = Naming(name), Naming(text)


def test_driver_errors_name_the_status() -> None:
    calls = DriverCalls(ctypes.CDLL(None), FakeErrorDriver())  # type: ignore[arg-type]
    assert calls.addresses.shape == (7,) and (calls.addresses != 0).all()
    error = calls.error(700)
    assert "CUDA driver status 700" in str(error)
    assert "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered" in str(error)
    # Told apart as CuPy's and Numba's errors are: the GPU's fault, and the context is lost.
    assert isinstance(error, CUDADriverError) and isinstance(error, RuntimeError)
    assert is_gpu_failure(error) and depends_on_the_moment(error) and loses_context(error)


def test_a_failed_context_query_raises_the_driver_error() -> None:
    driver = FakeErrorDriver()
    driver.cuCtxGetCurrent = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))(
        lambda handle: 201)
    calls = DriverCalls(ctypes.CDLL(None), driver)  # type: ignore[arg-type]
    with pytest.raises(CUDADriverError,
                       match=r"^cuCtxGetCurrent failed: CUDA driver status 201 \(CUDA_ERROR_"):
        calls.current_context()


def test_no_driver_calls_without_the_driver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ctypes.CDLL

    def without_cuda(name: str | None, *args: Any, **kwargs: Any) -> Any:
        if name == "libcuda.so.1":
            raise OSError("libcuda.so.1: cannot open shared object file")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", without_cuda)
    assert open_driver_calls() is None


def test_load_sends_and_cancels_a_transfer_that_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver()
    calls = SimpleNamespace(addresses=driver.calls)
    monkeypatch.setattr(staging_loop, "open_driver_calls", lambda: calls)
    assert staging_loop.load() is calls
    # Both workers of its two-worker crew ran the sent transfer, its thread the cancelled one,
    # and they did nothing else: no wait, copy or record.
    assert [entry[0] for entry in driver.log] == ["context", "context", "context"]
    assert len({entry[1] for entry in driver.log}) == 2
    assert not any(thread.name.startswith("vedart-staging-crew") for thread in threading.enumerate())


def crew_of(driver: FakeDriver, workers: int, slots: Slots) -> Crew:
    return Crew([slots.of(worker) for worker in range(workers)], driver.calls)


@pytest.mark.parametrize(("nbytes", "used"), [(1, 1), (300 * KIB + 7, 3), (5 * 2**20 + 3, 4)])
def test_a_crew_sends_every_byte_once_with_the_workers_asked_for(nbytes: int, used: int) -> None:
    driver = FakeDriver()
    slots = Slots(4, 2, 256 * KIB)  # kept: the crew holds only their addresses
    crew = crew_of(driver, 4, slots)
    try:
        for seed in range(3):  # the same crew, transfer after transfer
            driver.log.clear()
            source = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
            target = np.zeros_like(source)
            assert crew.send(nbytes, 256 * KIB, 16 * KIB, seed != 1, source.ctypes.data,
                             target.ctypes.data, 77, 55, driver.calls, used) == 0
            np.testing.assert_array_equal(target, source)
            contexts = [entry for entry in driver.log if entry[0] == "context"]
            # One worker per thread: the caller and used - 1 crew threads, all in context 55.
            assert len(contexts) == used == len({entry[1] for entry in contexts})
            assert {entry[2] for entry in contexts} == {55}
            assert sum(entry[3] for entry in driver.log if entry[0] == "copy") == nbytes
    finally:
        crew.close()


def test_a_failed_copy_in_a_crew_returns_its_status_and_leaves_the_crew_usable() -> None:
    failing = FakeDriver(fail_at=3, fail_status=700)
    slots = Slots(3, 2, 256 * KIB)
    crew = crew_of(failing, 3, slots)
    source = np.random.default_rng(5).integers(0, 256, 4 * 2**20, dtype=np.uint8)
    before = source.copy()
    target = np.zeros_like(source)
    try:
        assert crew.send(source.nbytes, 256 * KIB, 256 * KIB, True, source.ctypes.data,
                         target.ctypes.data, 77, 55, failing.calls, 3) == 700
        assert sum(entry[3] for entry in failing.log if entry[0] == "copy") < source.nbytes
        np.testing.assert_array_equal(source, before)  # the source is only read
        working = FakeDriver()  # each send brings its driver calls
        assert crew.send(source.nbytes, 256 * KIB, 256 * KIB, True, source.ctypes.data,
                         target.ctypes.data, 77, 55, working.calls, 3) == 0
        np.testing.assert_array_equal(target, source)
    finally:
        crew.close()


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_a_started_crew_fills_its_slots_but_sends_only_once_it_has_the_target() -> None:
    driver = FakeDriver()
    slots = Slots(3, 2, 256 * KIB)
    for buffer in slots.buffers:
        buffer[:] = 0
    crew = crew_of(driver, 3, slots)
    source = np.random.default_rng(6).integers(1, 256, 4 * 2**20, dtype=np.uint8)  # no zeros
    target = np.zeros_like(source)
    helper_slots = slots.buffers[slots.count:]  # workers 1 and 2: the crew's threads
    try:
        crew.start(source.nbytes, 256 * KIB, 64 * KIB, True, source.ctypes.data, 77, 55,
                   driver.calls, 3)
        # Both threads fill both slots of theirs (pieces of at least 64 KiB), then wait for
        # the target.
        assert wait_until(lambda: all(buffer[:64 * KIB].all() for buffer in helper_slots))
        cpu_before = time.process_time()
        time.sleep(0.2)
        assert time.process_time() - cpu_before < 0.1  # they sleep, not spin, while they wait
        assert not any(entry[0] == "copy" for entry in driver.log)  # nothing sent yet
        assert not target.any()
        with pytest.raises(RuntimeError, match="already running a transfer"):
            crew.start(source.nbytes, 256 * KIB, 64 * KIB, True, source.ctypes.data, 77, 55,
                       driver.calls, 3)
        assert crew.finish(target.ctypes.data) == 0
        np.testing.assert_array_equal(target, source)
        assert sum(entry[3] for entry in driver.log if entry[0] == "copy") == source.nbytes
    finally:
        crew.close()


def test_a_cancelled_transfer_sends_nothing_and_leaves_the_crew_usable() -> None:
    driver = FakeDriver()
    slots = Slots(4, 2, 256 * KIB)
    threads_before = crew_threads()
    crew = crew_of(driver, 4, slots)
    source = np.random.default_rng(7).integers(0, 256, 3 * 2**20 + 5, dtype=np.uint8)
    before = source.copy()
    try:
        crew.start(source.nbytes, 256 * KIB, 16 * KIB, True, source.ctypes.data, 77, 55,
                   driver.calls, 4)
        crew.cancel()  # returns once every woken thread has stopped
        assert [entry for entry in driver.log if entry[0] in ("copy", "record")] == []
        assert len([entry for entry in driver.log if entry[0] == "context"]) == 3  # no caller
        np.testing.assert_array_equal(source, before)
        assert not crew.under_way
        crew.cancel()  # nothing under way: nothing to do
        with pytest.raises(RuntimeError, match="no transfer under way"):
            crew.finish(source.ctypes.data)
        target = np.zeros_like(source)
        assert crew.send(source.nbytes, 256 * KIB, 16 * KIB, True, source.ctypes.data,
                         target.ctypes.data, 77, 55, driver.calls, 4) == 0
        np.testing.assert_array_equal(target, source)
        # Closing a crew left with a started transfer stops its threads all the same.
        crew.start(source.nbytes, 256 * KIB, 16 * KIB, True, source.ctypes.data, 77, 55,
                   driver.calls, 4)
    finally:
        crew.close()
    assert crew_threads() == threads_before


def test_a_transfer_cancelled_once_every_piece_is_claimed_sends_nothing() -> None:
    """Three pieces for two crew threads of two slots each: one thread holds two pieces and
    waits with full slots, the other holds one and finds nothing left to claim; both must
    stop without sending when the transfer is cancelled."""
    driver = FakeDriver()
    slots = Slots(3, 2, 64 * KIB)
    crew = crew_of(driver, 3, slots)
    source = np.random.default_rng(8).integers(0, 256, 3 * 64 * KIB, dtype=np.uint8)
    try:
        crew.start(source.nbytes, 64 * KIB, 64 * KIB, True, source.ctypes.data, 77, 55,
                   driver.calls, 3)
        # Three claims of pieces and one past the end: every piece is held.
        assert wait_until(lambda: crew._counter[0] >= 4 * 64 * KIB)
        time.sleep(0.05)
        crew.cancel()
        assert [entry for entry in driver.log if entry[0] not in ("context", "sync")] == []
        assert len([entry for entry in driver.log if entry[0] == "sync"]) == 3  # three pieces
        target = np.zeros_like(source)  # and the crew still sends the next transfer
        assert crew.send(source.nbytes, 64 * KIB, 64 * KIB, True, source.ctypes.data,
                         target.ctypes.data, 77, 55, driver.calls, 3) == 0
        np.testing.assert_array_equal(target, source)
    finally:
        crew.close()


@pytest.mark.parametrize("target", [0, -1])
def test_finish_refuses_a_target_the_loop_would_take_for_not_yet_or_cancelled(
        target: int) -> None:
    driver = FakeDriver()
    slots = Slots(2, 2, 64 * KIB)
    crew = crew_of(driver, 2, slots)
    source = np.random.default_rng(9).integers(0, 256, 256 * KIB, dtype=np.uint8)
    try:
        crew.start(source.nbytes, 64 * KIB, 64 * KIB, True, source.ctypes.data, 77, 55,
                   driver.calls, 2)
        with pytest.raises(ValueError, match=rf"target: got {target}; allowed: a device "
                                             r"address \(> 0\)"):
            crew.finish(target)
        assert crew.under_way  # left for the caller to cancel
        crew.cancel()
        assert not any(entry[0] in ("copy", "record") for entry in driver.log)
    finally:
        crew.close()


def crew_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate()
            if thread.name.startswith("vedart-staging-crew")}


def test_a_crew_refuses_more_workers_than_it_has_and_closes_its_threads() -> None:
    driver = FakeDriver()
    slots = Slots(3, 1, 64 * KIB)
    before = crew_threads()
    crew = crew_of(driver, 3, slots)
    own = crew_threads() - before
    assert {thread.name for thread in own} == {"vedart-staging-crew-1", "vedart-staging-crew-2"}
    for workers in (0, 4):
        with pytest.raises(ValueError, match=f"workers: got {workers}; allowed: 1 to 3"):
            crew.send(1, 64 * KIB, 64 * KIB, True, 0, 0, 77, 55, driver.calls, workers)
    crew.close()
    crew.close()  # idempotent
    assert not any(thread.is_alive() for thread in own)
    assert driver.log == []  # refused before any work: no worker ever ran
    with pytest.raises(RuntimeError, match="the staging crew is closed"):
        crew.send(1, 64 * KIB, 64 * KIB, True, 0, 0, 77, 55, driver.calls, 1)


def test_a_crew_whose_thread_ends_before_parking_is_unavailable_and_leaves_none_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the parking handshake a send would wait for that thread for ever."""
    def fails_to_start(*args: Any) -> None:
        raise MemoryError("no memory for the first call")

    driver = FakeDriver()
    slots = Slots(3, 1, 64 * KIB)
    before = crew_threads()
    monkeypatch.setattr(staging_loop, "crew_member", fails_to_start)
    monkeypatch.setattr(threading, "excepthook", lambda hook_args: None)  # expected
    with pytest.raises(staging_loop.CrewUnavailable, match="ended before it parked"):
        crew_of(driver, 3, slots)
    assert crew_threads() - before == set()


def test_a_crew_send_compiles_nothing_new_whatever_number_types_it_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every send reaches the compiled functions with the types load() compiled them for."""
    driver = FakeDriver()
    monkeypatch.setattr(staging_loop, "open_driver_calls",
                        lambda: SimpleNamespace(addresses=driver.calls))
    staging_loop.load()
    functions = (staging_loop.crew_wake, staging_loop.crew_finish, staging_loop.crew_cancel,
                 staging_loop.crew_member)
    compiled = [len(function.signatures) for function in functions]
    assert all(compiled)  # load() ran each of them
    source = np.random.default_rng(4).integers(0, 256, 300 * KIB + 3, dtype=np.uint8)
    target = np.zeros_like(source)
    slots = Slots(2, 2, 64 * KIB)
    crew = crew_of(driver, 2, slots)
    try:
        assert crew.send(np.int64(source.nbytes), np.int32(64 * KIB), 16 * KIB, np.bool_(True),
                         source.ctypes.data, np.uint64(target.ctypes.data), np.uint64(77), 55,
                         driver.calls.astype(np.uint64), np.int16(2)) == 0
        crew.start(np.int32(source.nbytes), 64 * KIB, np.int64(16 * KIB), False,
                   np.int64(source.ctypes.data), 77, np.uint64(55), driver.calls, np.uint8(2))
        crew.cancel()
    finally:
        crew.close()
    np.testing.assert_array_equal(target, source)
    assert [len(function.signatures) for function in functions] == compiled


def test_load_gives_none_without_the_driver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging_loop, "open_driver_calls", lambda: None)
    assert staging_loop.load() is None


@pytest.mark.skipif(not staging_loop._X86, reason="checks x86 instructions")
def test_the_non_temporal_copy_compiles_to_streaming_stores_and_a_fence() -> None:
    """If the compiler dropped the non-temporal hint, every other test would still pass."""
    uncached = numba.njit(nogil=True)(staging_loop.copy_piece.py_func)
    signature = (numba.int64, numba.int64, numba.int64, numba.int64, numba.boolean)
    uncached.compile(signature)
    assembly = uncached.inspect_asm(signature)
    assert "movnt" in assembly and "sfence" in assembly
    assert assembly.index("movnt") < assembly.rindex("sfence")
