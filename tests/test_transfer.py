"""Transfer-engine logic that needs no GPU: size classes, pinned-limit accounting and block
reuse, layout decisions, loading the staging loop (its pieces and slots:
test_staging_loop.py)."""

from __future__ import annotations

import copy
import ctypes
import gc
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeProbe, gpu_unavailable_reason

import vedart as veda
from vedart.gpu.pinned import PinnedPool, size_class
from vedart.offload.adaptive import Calibration
from vedart.gpu import transfer
from vedart.gpu.transfer import (LoopLoader, TransferEngine, Tuning, contiguous_layout,
                                 native_byte_order)


class HostBlock:
    """Ordinary (pageable) memory standing in for a pinned block."""

    def __init__(self, size: int) -> None:
        self.buffer = ctypes.create_string_buffer(size)
        self.ptr = ctypes.addressof(self.buffer)
        self.size = size


def make_pool(limit: int) -> tuple[PinnedPool, list[int]]:
    allocations: list[int] = []

    def allocate(size: int) -> HostBlock:
        allocations.append(size)
        return HostBlock(size)

    return PinnedPool(limit, allocate), allocations


@pytest.mark.parametrize(("nbytes", "size"), [(1, 65536), (65537, 131072), (2**21, 2**21),
                                              (2**21 + 1, 2**22), (100 * 2**20 + 5, 102 * 2**20)])
def test_size_class(nbytes: int, size: int) -> None:
    assert size_class(nbytes) == size


def test_pinned_arrays_return_their_block_when_the_last_view_dies() -> None:
    pool, allocations = make_pool(limit=8 * 2**20)
    array = pool.array((1000, 3), np.dtype(np.float64))
    assert array is not None and array.shape == (1000, 3) and array.flags.c_contiguous
    array[...] = 1.5
    view = array[10:20]
    assert pool.used_bytes == size_class(24_000) and pool.cached_bytes == 0
    del array
    gc.collect()
    assert pool.used_bytes == size_class(24_000)  # the view still holds the block
    assert float(view.sum()) == 1.5 * 30
    del view
    gc.collect()
    assert pool.used_bytes == 0 and pool.cached_bytes == size_class(24_000)
    again = pool.array((10,), np.dtype(np.int64))  # same size class: reused, not allocated
    assert again is not None and allocations == [size_class(24_000)]


def test_a_pinned_array_freed_while_its_pool_is_locked_gives_its_block_back() -> None:
    # A collection may run inside take(), the pool locked, and free a pinned array there.
    pool, _ = make_pool(limit=8 * 2**20)
    array: np.ndarray | None = pool.array((10,), np.dtype(np.uint8))
    freed = threading.Event()

    def free_under_the_lock() -> None:
        nonlocal array
        with pool._lock:
            array = None
        freed.set()

    threading.Thread(target=free_under_the_lock, daemon=True).start()
    assert freed.wait(5), "giving the block back deadlocked on the pool's own lock"
    assert pool.used_bytes == 0 and pool.cached_bytes == size_class(10)


def test_pinned_limit_is_never_exceeded_and_cached_blocks_are_dropped_first() -> None:
    pool, allocations = make_pool(limit=4 * 2**20)
    first = pool.array((2**20,), np.dtype(np.uint8))           # 1 MiB class
    second = pool.array((3 * 2**20,), np.dtype(np.uint8))      # 4 MiB class: over the limit
    assert first is not None and second is None
    del first
    gc.collect()
    assert pool.cached_bytes == 2**20
    third = pool.array((3 * 2**20,), np.dtype(np.uint8))  # fits once the cache is dropped
    assert third is not None and pool.cached_bytes == 0 and pool.used_bytes == 4 * 2**20
    assert allocations == [2**20, 4 * 2**20]


def test_fortran_order_pinned_array() -> None:
    pool, _ = make_pool(limit=2**24)
    array = pool.array((30, 40), np.dtype(np.float32), order="F")
    assert array is not None and array.flags.f_contiguous and array.shape == (30, 40)


def test_empty_cache_drops_cached_blocks() -> None:
    pool, _ = make_pool(limit=2**24)
    block = pool.take(100)
    assert block is not None
    pool.give_back(block)
    pool.empty_cache()
    assert pool.cached_bytes == 0 and pool.used_bytes == 0


class FailingAllocator:
    """Host blocks, except that the calls numbered in ``failures`` (1-based) raise theirs."""

    def __init__(self, failures: dict[int, BaseException]) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self, size: int) -> HostBlock:
        self.calls += 1
        if self.calls in self.failures:
            raise self.failures[self.calls]
        return HostBlock(size)


def test_a_pool_short_of_system_pinned_memory_frees_its_cache_retries_then_gives_none() -> None:
    allocate = FailingAllocator({2: MemoryError("no pinned memory"),
                                 4: MemoryError("no pinned memory"),
                                 5: MemoryError("no pinned memory")})
    pool = PinnedPool(2**30, allocate)
    cached = pool.take(2**20)
    pool.give_back(cached)
    # The first try fails, the cache goes back to the system, and the second try succeeds.
    block = pool.take(4 * 2**20)
    assert block is not None and allocate.calls == 3
    assert pool.used_bytes == 4 * 2**20 and pool.cached_bytes == 0
    # Both tries fail: no block (callers then use pageable memory), and nothing counted.
    assert pool.take(8 * 2**20) is None and allocate.calls == 5
    assert pool.used_bytes == 4 * 2**20 and pool.cached_bytes == 0
    assert pool.array((3,), np.dtype(np.float64)) is not None  # and the pool still serves


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), RuntimeError("driver error")])
def test_a_failed_or_interrupted_allocation_is_not_counted_and_propagates(
        failure: BaseException) -> None:
    pool = PinnedPool(4 * 2**20, FailingAllocator({1: failure}))
    with pytest.raises(type(failure)):
        pool.take(4 * 2**20)
    assert pool.used_bytes == 0  # else the limit would refuse the next take for good
    assert pool.take(4 * 2**20) is not None


def test_a_closed_pool_gives_no_block_and_frees_the_blocks_given_back_to_it() -> None:
    pool, allocations = make_pool(limit=2**24)
    result = pool.array((1000,), np.dtype(np.float64))  # outlives its pool's engine
    cached = pool.take(100)
    pool.give_back(cached)
    pool.close()
    assert pool.cached_bytes == 0 and pool.take(100) is None
    assert pool.array((10,), np.dtype(np.uint8)) is None
    del result
    gc.collect()
    assert pool.used_bytes == 0 and pool.cached_bytes == 0 and not pool._free
    assert allocations == [size_class(8000), size_class(100)]


def test_layout_and_byte_order_decisions() -> None:
    c = np.zeros((3, 4))
    assert contiguous_layout(c) == "C" and contiguous_layout(np.asfortranarray(c)) == "F"
    assert contiguous_layout(c[:, ::2]) is None
    big_endian = np.arange(4, dtype=">i4")
    native = native_byte_order(big_endian)
    assert native.dtype.isnative and native.tolist() == [0, 1, 2, 3]
    assert native_byte_order(c) is c


@pytest.mark.skipif(gpu_unavailable_reason() is None,
                    reason="a real device is behind the probe: its pool holds what earlier "
                           "tests left there")
def test_memory_stats_and_empty_cache_without_a_device_behind_the_probe() -> None:
    runtime = veda.init(device_probe=FakeProbe())
    assert runtime.gpu is not None
    stats = runtime.gpu.get_memory_stats()
    assert stats["pinned_used_mb"] == 0.0 and stats["pool_allocated_mb"] == 0.0
    veda.empty_cache()  # nothing cached: must not raise


def test_a_closed_engine_refuses_staging_work_instead_of_restarting_threads() -> None:
    engine = TransferEngine(2**20)
    assert engine.submit_staging(lambda: 42).result() == 42
    engine.close()
    with pytest.raises(RuntimeError, match="transfer engine is closed"):
        engine.submit_staging(lambda: 42)


class FakeRing:
    """A staging ring's outside: its device, events to wait for, its crew and its release."""

    def __init__(self, under_way: bool = False) -> None:
        self.device, self.released_to = 0, None
        self.events = [FakeEvent(), FakeEvent()]
        self.crew = FakeCrew(under_way)

    def release_to(self, pinned: PinnedPool) -> None:
        assert all(event.synchronized for event in self.events)  # its copies are done first
        self.released_to = pinned


class FakeCrew:
    """A crew's transfer state: one under way until cancelled."""

    def __init__(self, under_way: bool) -> None:
        self.under_way = under_way

    def cancel(self) -> None:
        self.under_way = False


class FakeEvent:
    def __init__(self) -> None:
        self.synchronized = False

    def synchronize(self) -> None:
        self.synchronized = True


def test_a_closed_engine_refuses_rings_and_releases_the_ring_of_a_transfer_still_running(
        ) -> None:
    engine = TransferEngine(2**20)
    idle, running = FakeRing(), FakeRing()
    engine._return_ring(idle)  # type: ignore[arg-type]
    engine.close()
    assert idle.released_to is engine.pinned  # idle rings go at close
    with pytest.raises(RuntimeError, match="transfer engine is closed"):
        engine._take_ring(0, None)  # type: ignore[arg-type]  # refused before it is used
    engine._return_ring(running)  # type: ignore[arg-type]  # its transfer ended after close
    assert running.released_to is engine.pinned and not engine._idle_rings[0]


def test_a_ring_left_with_a_transfer_under_way_is_stopped_before_it_is_kept() -> None:
    """A failure between a crew's start and finish (allocating the target) returns the ring
    with its crew woken; the next transfer must find it idle."""
    engine = TransferEngine(2**20)
    ring = FakeRing(under_way=True)
    engine._return_ring(ring)  # type: ignore[arg-type]
    assert not ring.crew.under_way and engine._idle_rings[0] == [ring]
    engine._idle_rings.clear()
    engine.close()


def test_staging_threads_closed_under_a_caller_refuse_its_work_with_the_engine_error() -> None:
    engine = TransferEngine(2**20)
    engine._fill_pool().close(cancel_queued=True)  # as a close racing a submit would leave it
    with pytest.raises(RuntimeError, match="transfer engine is closed"):
        engine.submit_staging(lambda: 42)
    engine.close()


def test_a_copy_of_a_pinned_arrays_memory_holder_does_not_give_the_block_back_again() -> None:
    pool, _ = make_pool(limit=8 * 2**20)
    array = pool.array((10,), np.dtype(np.uint8))
    assert array is not None
    holder = array.base
    while not isinstance(holder, ctypes.Array):
        holder = holder.base
    duplicate = copy.copy(holder)  # owns a copy of the bytes, and the holder's attributes
    del duplicate
    gc.collect()
    assert pool.used_bytes == size_class(10) and pool.cached_bytes == 0
    del array, holder
    gc.collect()
    assert pool.used_bytes == 0 and pool.cached_bytes == size_class(10)


class BlockingLoad:
    """A staging-loop load that waits until released, counting the loads started."""

    def __init__(self, result: object = None, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.started = 0
        self.result, self.error = result, error

    def __call__(self) -> object:
        self.started += 1
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        return self.result


def test_the_staging_loop_loads_in_the_background_once_and_no_caller_waits() -> None:
    calls = object()
    load = BlockingLoad(result=calls)
    loader = LoopLoader(load)  # type: ignore[arg-type]
    answers: list[object] = []
    callers = [threading.Thread(target=lambda: answers.append(loader.calls()))
               for _ in range(8)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(5)
    assert answers == [None] * 8  # while it loads, nobody waits: large arrays go direct
    assert loader.wait(timeout=0.05) is None  # still loading
    load.release.set()
    assert loader.wait(timeout=5) is calls
    assert loader.calls() is calls
    assert load.started == 1


@pytest.mark.parametrize("fails", [False, True])
def test_the_switch_interval_is_lowered_while_the_loop_loads_and_restored_after(
        fails: bool) -> None:
    before, seen = sys.getswitchinterval(), []

    def load() -> object:
        seen.append(sys.getswitchinterval())
        if fails:
            raise OSError("cannot compile")
        return "calls"

    loader = LoopLoader(load)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert loader.wait(timeout=5) == (None if fails else "calls")
    assert seen == [pytest.approx(transfer.LOADING_SWITCH_S)] and before > seen[0]
    assert sys.getswitchinterval() == before


def test_a_staging_loop_that_cannot_load_warns_once_and_leaves_copies_direct() -> None:
    load = BlockingLoad(error=OSError("cannot compile"))
    load.release.set()
    loader = LoopLoader(load)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert loader.wait(timeout=5) is None
        assert loader.calls() is None and loader.wait(timeout=5) is None
    assert [str(w.message) for w in caught] == [
        "vedart: the compiled staging loop could not be loaded (OSError('cannot compile')); "
        "large host-to-device copies use cupy.asarray"]
    assert load.started == 1


def test_a_loader_thread_that_cannot_start_leaves_copies_direct_and_nobody_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    load = BlockingLoad()
    loader = LoopLoader(load)  # type: ignore[arg-type]
    with pytest.warns(RuntimeWarning, match="can't start new thread"):
        assert loader.calls() is None  # the copy goes direct instead of raising
    assert loader.wait() is None  # returns at once: nothing is loading
    assert load.started == 0


def test_a_loader_says_whether_it_is_loading_or_was_within_a_span() -> None:
    load = BlockingLoad(result=object())
    loader = LoopLoader(load)  # type: ignore[arg-type]
    assert not loader.loading_within(3600.0)  # not begun: nothing was sent direct for it
    loader.start()
    loader.start()  # once begun, begun
    assert loader.loading_within() and loader.loading_within(3600.0)
    load.release.set()
    assert loader.wait(timeout=5) is not None and load.started == 1
    assert not loader.loading_within()
    assert loader.loading_within(3600.0)  # a time measured over the last hour overlaps it


def test_gpu_times_measured_while_the_staging_loop_loads_are_not_learned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = veda.Config.builder().cost_model("adaptive").profile_path(
        str(tmp_path / "p.json")).build()
    runtime = veda.init(config, device_probe=FakeProbe())
    assert runtime.gpu and runtime.gpu.transfers is not None and runtime.cost_model is not None
    load = BlockingLoad()
    runtime.gpu.transfers.loop = LoopLoader(load)  # type: ignore[arg-type]
    runtime.gpu.transfers.loop.start()  # loading until released
    # No GPU launch and upload time to beat: a sum of 8 MB from the CPU's cache can take less
    # than the default calibration's, and the GPU would then never be tried.
    runtime.cost_model.calibration = Calibration(gpu_launch_s=1e-9, h2d_bytes_per_s=1e15)
    learned: dict[int, list[str]] = {}  # host bytes -> paths learned
    real_observe = runtime.cost_model.observe
    monkeypatch.setattr(runtime.cost_model, "observe", lambda key, signature, nbytes, path, seconds:
                        learned.setdefault(nbytes, []).append(path)
                        or real_observe(key, signature, nbytes, path, seconds))

    @veda.gpu
    def total(x: np.ndarray) -> float:
        return float(x.sum())

    rng = np.random.default_rng(5)
    staged = rng.random(runtime.gpu.transfers.tuning.pool_from // 8 + 1)  # through the loop
    direct = rng.random(10**6)  # 8 MB: cupy.asarray whether or not the loop is loaded
    try:
        with pytest.warns(veda.OffloadWarning):  # gpu tries fail for real here (no driver)
            for x in (staged, direct):
                for _ in range(6):
                    assert total(x) == pytest.approx(float(np.sum(x)))
    finally:
        load.release.set()
    tries = runtime.telemetry.function(f"{__name__}.{total.__qualname__}").as_dict()
    # The GPU was tried and timed for both sizes (the first try is warm-up), but only the
    # arrays that never use the loop had their GPU times learned.
    assert tries["fallback_calls"] >= 4
    assert set(learned[staged.nbytes]) == {"cpu"} and "gpu" in learned[direct.nbytes]


class HeldRing:
    """A staging ring stand-in that is being made until ``release`` is set."""

    def __init__(self, made: list[HeldRing], release: threading.Event, device: int) -> None:
        self.device, self.events, self.released = device, [], False
        self.crew = self  # its crew: nothing under way to cancel
        made.append(self)
        assert release.wait(10)

    def cancel(self) -> None:
        pass

    def release_to(self, pinned: PinnedPool) -> None:
        self.released = True


@pytest.mark.parametrize("close_first", [False, True])
def test_a_copy_takes_the_ring_made_ahead_and_a_closed_engine_releases_it(
        monkeypatch: pytest.MonkeyPatch, close_first: bool) -> None:
    made: list[HeldRing] = []
    release = threading.Event()
    monkeypatch.setattr(transfer, "StagingRing", lambda pinned, device, tuning, driver:
                        HeldRing(made, release, device))
    driver = object()
    engine = TransferEngine(2**30, loop=LoopLoader(lambda: driver))  # type: ignore[arg-type]
    engine.prepare(3)
    engine.prepare(3)  # one ring per device is made ahead
    if close_first:
        engine.close()
        release.set()
        engine.wait_prepared(timeout=10)
        assert len(made) <= 1 and all(ring.released for ring in made)
        return
    taken: list[object] = []
    copy = threading.Thread(
        target=lambda: taken.append(engine._take_ring(3, driver)))  # type: ignore[arg-type]
    copy.start()  # it waits for the ring being made
    release.set()
    copy.join(10)
    assert len(made) == 1 and taken == made and not made[0].released
    engine.wait_prepared(timeout=10)
    assert not engine._idle_rings[3]  # taken, not kept idle beside a second one


def test_a_ring_that_cannot_be_made_ahead_warns_and_leaves_it_to_the_first_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot(*args: object) -> None:
        raise OSError("no pinned memory")

    monkeypatch.setattr(transfer, "StagingRing", cannot)
    engine = TransferEngine(2**30, loop=LoopLoader(object))  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.prepare(0)
        engine.wait_prepared(timeout=10)
    assert [str(w.message) for w in caught] == [
        "vedart: no staging ring made ahead (OSError('no pinned memory')); the first large "
        "host-to-device copy makes one"]
    with pytest.raises(OSError, match="no pinned memory"):  # the copy tries again itself
        engine._take_ring(0, object())  # type: ignore[arg-type]
    engine.close()


def test_without_numba_the_staging_loop_is_simply_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu import staging_loop  # imported before: the harder case

    monkeypatch.setattr(staging_loop, "load", lambda: "loaded")  # what a bypassed import gives
    monkeypatch.setitem(sys.modules, "vedart.gpu.staging_loop", None)  # import fails
    assert transfer._load_staging_loop() is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"threads": 0}, "Tuning.threads: got 0; allowed: >= 1"),
    ({"piece_bytes": 0, "min_piece_bytes": 0}, "Tuning.piece_bytes: got 0; allowed: >= 1"),
    ({"piece_bytes": 2**20, "min_piece_bytes": 2**21},
     r"Tuning.min_piece_bytes: got 2097152; allowed: at most piece_bytes \(1048576\)"),
])
def test_tuning_refuses_values_the_staging_loop_cannot_work_with(fields: dict[str, int],
                                                                message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Tuning(**fields)


@pytest.mark.parametrize(("cpus", "workers"), [({0}, 1), ({0, 1, 2}, 3), (set(range(64)), 12)])
def test_transfers_use_twelve_workers_or_as_many_as_there_are_cpus(
        monkeypatch: pytest.MonkeyPatch, cpus: set[int], workers: int) -> None:
    monkeypatch.setattr(transfer.os, "sched_getaffinity", lambda pid: cpus, raising=False)
    assert Tuning().threads == workers
    assert Tuning(threads=20).threads == 20  # what is asked for is kept
