"""The transfer engine and memory management on the real GPU (``pytest -m gpu``)."""

from __future__ import annotations

import copy
import ctypes
import gc
import itertools
import threading
from typing import Any

import numpy as np
import pytest

import vedart as veda
from vedart.gpu.staging_loop import COPY_TO_DEVICE
from vedart.gpu.transfer import STAGING_LOOP, LoopLoader, TransferEngine, Tuning

pytestmark = pytest.mark.gpu

MB = 2**20
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


@pytest.fixture()
def engine() -> Any:
    # Small pieces and a low cutoff so modest arrays go through the staging ring (from 1 MiB)
    # over several turns of each worker's slots, and smaller ones direct.
    engine = TransferEngine(2 * 2**30, Tuning(piece_bytes=256 * 1024, min_piece_bytes=64 * 1024,
                                              pool_from=MB, slots=3, threads=4))
    assert engine.loop.wait() is not None  # so large arrays take the ring, not the direct copy
    yield engine
    engine.close()


@pytest.fixture()
def staging_engine() -> Any:
    # Stages ahead every array from 64 KiB up to 64 MiB (what par_iter's lanes use).
    engine = TransferEngine(2 * 2**30, Tuning(stage_from=64 * 1024, pool_from=64 * MB))
    yield engine
    engine.close()


def moved(engine: TransferEngine, staging_engine: TransferEngine, how: str,
          host: np.ndarray) -> Any:
    """``host`` on the device by ``to_device``, staged ahead then uploaded, or uploaded
    through a pinned copy the caller keeps (what a @gpu call does with its small inputs)."""
    if how == "to_device":
        return engine.to_device(host)
    import cupy

    if how == "upload+keep":
        keep: list[Any] = []
        device = staging_engine.upload(host, keep)
        assert len(keep) == (host.nbytes > 0)  # every array here is below its pool_from
        cupy.cuda.get_current_stream().synchronize()
        return device
    staged = staging_engine.stage(host)
    assert staging_engine.stages(host) == (staged is not host)
    device = staging_engine.upload(staged)
    cupy.cuda.get_current_stream().synchronize()
    return device


HOW = ["to_device", "stage+upload", "upload+keep"]


def random_array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    array = raw.view(dtype).reshape(shape)
    if np.dtype(dtype).kind in "fc":  # keep NaN payloads out: compare bytes, not values
        array = rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        array = raw.astype(bool).reshape(shape)
    return array


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (), (7,), (1000, 333), (3, 200_001)])
def test_round_trip_is_byte_exact(engine: TransferEngine, staging_engine: TransferEngine,
                                  how: str, dtype: str, shape: tuple[int, ...]) -> None:
    host = random_array(dtype, shape, seed=len(shape) * 31 + np.dtype(dtype).num)
    device = moved(engine, staging_engine, how, host)
    assert device.shape == host.shape and device.dtype == host.dtype
    back = engine.to_host(device)
    assert type(back) is np.ndarray and back.dtype == host.dtype and back.shape == host.shape
    assert back.tobytes() == host.tobytes()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("layout", ["fortran", "strided", "readonly", "bigendian", "broadcast",
                                    "odd_offset"])
def test_layouts_round_trip(engine: TransferEngine, staging_engine: TransferEngine, how: str,
                            layout: str) -> None:
    base = np.random.default_rng(5).standard_normal((700, 900))
    host = {
        "fortran": np.asfortranarray(base),
        "strided": base[:, ::3],
        "readonly": base.copy(),
        "bigendian": base.astype(">f8"),
        "broadcast": np.broadcast_to(base[0], (700, 900)),
        # contiguous, but its pieces start 3 bytes past any alignment
        "odd_offset": base.view(np.uint8).ravel()[3:3 + 5_000_001],
    }[layout]
    if layout == "readonly":
        host.flags.writeable = False
    before = host.copy()
    back = engine.to_host(moved(engine, staging_engine, how, host))
    np.testing.assert_array_equal(back, host)
    np.testing.assert_array_equal(host, before)  # the caller's array is only read
    if layout == "fortran":
        assert back.flags.f_contiguous


@pytest.mark.parametrize("nontemporal_below", [0, 2**40])
def test_both_ways_of_filling_the_slots_deliver_the_same_bytes(nontemporal_below: int) -> None:
    """Slots are filled with memcpy from Tuning.nontemporal_below, with non-temporal stores
    below it; either way every byte arrives, from a source at any alignment."""
    import cupy

    engine = TransferEngine(2**30, Tuning(piece_bytes=256 * 1024, min_piece_bytes=64 * 1024,
                                          pool_from=MB, threads=4,
                                          nontemporal_below=nontemporal_below))
    assert engine.loop.wait() is not None
    try:
        raw = np.random.default_rng(12).integers(0, 256, 3 * MB + 200, dtype=np.uint8)
        for offset in (0, 1, 37):
            host = raw[offset:offset + 3 * MB + 101]
            assert cupy.asnumpy(engine.to_device(host)).tobytes() == host.tobytes()
    finally:
        engine.close()


def test_concurrent_transfers_from_8_threads(engine: TransferEngine) -> None:
    errors: list[str] = []

    def worker(seed: int) -> None:
        import cupy

        rng = np.random.default_rng(seed)
        with cupy.cuda.Stream(non_blocking=True):
            for round_ in range(50):
                host = rng.standard_normal(int(rng.integers(1, 400_000)))
                if not np.array_equal(engine.to_host(engine.to_device(host)), host):
                    errors.append(f"thread {seed} round {round_}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_failure_mid_transfer_leaves_the_array_untouched_and_the_ring_usable(
        engine: TransferEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine.loop.wait()
    assert real is not None
    Copy = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_int64] * 4)
    forward = Copy(int(real.addresses[COPY_TO_DEVICE]))
    copies = itertools.count(1)

    def third_copy_fails(target: int, slot: int, size: int, stream: int) -> int:
        if next(copies) == 3:
            return 700  # CUDA_ERROR_ILLEGAL_ADDRESS
        return int(forward(target, slot, size, stream))

    failing_copy = Copy(third_copy_fails)
    failing = copy.copy(real)
    failing.addresses = real.addresses.copy()
    failing.addresses[COPY_TO_DEVICE] = ctypes.cast(failing_copy, ctypes.c_void_p).value
    host = np.random.default_rng(11).standard_normal(3 * MB // 8)  # some 16 pieces, 3 slots each
    before = host.copy()
    failing_loop = LoopLoader(lambda: failing)
    assert failing_loop.wait() is failing
    monkeypatch.setattr(engine, "loop", failing_loop)
    with pytest.raises(RuntimeError, match="CUDA driver status 700 \\(CUDA_ERROR_ILLEGAL_ADDRESS"):
        engine.to_device(host)
    monkeypatch.undo()
    np.testing.assert_array_equal(host, before)
    for seed in range(3):  # the same ring, reused
        again = np.random.default_rng(seed).standard_normal(3 * MB // 8)
        assert engine.to_host(engine.to_device(again)).tobytes() == again.tobytes()


def test_a_failed_allocation_while_the_crew_copies_sends_nothing_and_keeps_the_ring(
        engine: TransferEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The crew starts copying before the target exists; when allocating it fails, the error
    reaches the caller (the @gpu fallback handles out-of-memory) and the ring stays usable."""
    import cupy

    real_empty = cupy.empty

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise cupy.cuda.memory.OutOfMemoryError(3 * MB, 0)

    host = np.random.default_rng(13).standard_normal(3 * MB // 8)
    before = host.copy()
    others = set(threading.enumerate())  # the runtime's ring, made ahead at init, among them
    monkeypatch.setattr(cupy, "empty", no_memory)
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        engine.to_device(host)
    monkeypatch.setattr(cupy, "empty", real_empty)
    np.testing.assert_array_equal(host, before)
    crew = {thread for thread in set(threading.enumerate()) - others
            if thread.name.startswith("vedart-staging-crew")}
    assert len(crew) == engine.tuning.threads - 1
    for seed in range(3):  # the same ring, reused
        again = np.random.default_rng(seed).standard_normal(3 * MB // 8)
        assert engine.to_host(engine.to_device(again)).tobytes() == again.tobytes()
    assert {thread for thread in set(threading.enumerate()) - others
            if thread.name.startswith("vedart-staging-crew")} == crew  # the same ring


def test_empty_cache_stops_idle_rings_crews_and_later_copies_start_new_ones(
        engine: TransferEngine) -> None:
    before = set(threading.enumerate())
    host = np.random.default_rng(12).standard_normal(3 * MB // 8)
    assert engine.to_host(engine.to_device(host)).tobytes() == host.tobytes()
    crew = [thread for thread in set(threading.enumerate()) - before
            if thread.name.startswith("vedart-staging-crew")]
    assert len(crew) == engine.tuning.threads - 1 and all(thread.is_alive() for thread in crew)
    engine.empty_cache()
    assert not any(thread.is_alive() for thread in crew)
    assert engine.stats()["pinned_used_mb"] == 0.0
    again = np.random.default_rng(14).standard_normal(3 * MB // 8)
    assert engine.to_host(engine.to_device(again)).tobytes() == again.tobytes()
    new_crew = [thread for thread in set(threading.enumerate()) - before
                if thread.name.startswith("vedart-staging-crew") and thread.is_alive()]
    assert len(new_crew) == engine.tuning.threads - 1  # the copy took a new ring, not cupy
    assert engine.stats()["pinned_used_mb"] > 0
    engine.close()
    assert not any(thread.is_alive() for thread in new_crew)
    with pytest.raises(RuntimeError, match="transfer engine is closed"):
        engine.to_device(again)


def test_until_the_staging_loop_is_loaded_large_arrays_go_direct() -> None:
    import cupy

    release = threading.Event()

    def slow_load() -> Any:
        release.wait(30)
        return STAGING_LOOP.wait()

    engine = TransferEngine(2**30, Tuning(pool_from=MB, threads=4), LoopLoader(slow_load))
    try:
        host = np.random.default_rng(13).standard_normal(3 * MB // 8)
        assert np.array_equal(cupy.asnumpy(engine.to_device(host)), host)
        assert engine.stats()["pinned_used_mb"] == 0  # direct: no staging ring was taken
        release.set()
        assert engine.loop.wait(30) is not None
        assert np.array_equal(cupy.asnumpy(engine.to_device(host)), host)
        assert engine.stats()["pinned_used_mb"] > 0  # the ring (kept for the next transfer)
    finally:
        release.set()
        engine.close()


def test_while_the_staging_loop_loads_prepared_bounce_slots_carry_large_arrays(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    release = threading.Event()

    def slow_load() -> Any:
        release.wait(30)
        return STAGING_LOOP.wait()

    engine = TransferEngine(2**30, Tuning(pool_from=MB, threads=4), LoopLoader(slow_load))
    real_asarray = cupy.asarray
    try:
        engine.prepare(0)
        for _ in range(1000):  # the slots are pinned first, before the loop is waited for
            if engine._bounce:
                break
            threading.Event().wait(0.01)
        assert list(engine._bounce) == [0]

        def no_direct_copy(value: Any, *args: Any, **kwargs: Any) -> Any:
            assert not isinstance(value, np.ndarray) or value.nbytes < MB, "went direct"
            return real_asarray(value, *args, **kwargs)

        monkeypatch.setattr(cupy, "asarray", no_direct_copy)
        rng = np.random.default_rng(29)
        for host in (rng.standard_normal((1500, 1001)),  # 12 MB: three turns of 4 slots
                     np.asfortranarray(rng.random((700, 900), dtype=np.float32)),
                     rng.integers(0, 255, 5 * MB + 3, dtype=np.uint8)):
            device = engine.to_device(host)
            assert (device.flags.c_contiguous, device.flags.f_contiguous) == (
                host.flags.c_contiguous, host.flags.f_contiguous)
            assert np.array_equal(device.get(), host)
        release.set()
        engine.wait_prepared(60)
        assert engine.has_idle_ring(0) and not engine._bounce  # given back once the ring is made
    finally:
        release.set()
        engine.close()


def test_pinned_results_stay_under_the_limit_and_fall_back_to_pageable() -> None:
    import cupy

    engine = TransferEngine(8 * MB, Tuning(piece_bytes=MB, slots=1, threads=2))
    device = cupy.asarray(np.arange(3 * MB // 8, dtype=np.float64))
    held = [engine.to_host(device) for _ in range(5)]  # 3 MiB each: only one fits beside the ring
    assert all(np.array_equal(h, held[0]) for h in held)
    assert engine.pinned.used_bytes <= 8 * MB
    engine.close()


def test_small_uploads_past_the_pinned_limit_go_direct() -> None:
    import cupy

    engine = TransferEngine(MB, Tuning())  # one 1 MiB block
    arrays = [np.random.default_rng(seed).random(100_000) for seed in range(3)]  # 800 KB each
    keep: list[Any] = []
    devices = [engine.upload(array, keep) for array in arrays]
    cupy.cuda.get_current_stream().synchronize()
    assert len(keep) == 1 and engine.pinned.used_bytes <= MB
    assert all(np.array_equal(device.get(), array) for device, array in zip(devices, arrays))
    engine.close()


def test_a_thread_whose_first_cuda_call_is_a_large_copy_gets_it_through_an_idle_ring(
        engine: TransferEngine) -> None:
    """A ring made on one thread serves later transfers on any thread, in the CUDA context its
    events and stream belong to, whatever the calling thread has (or has not yet) made
    current."""
    import cupy

    host = np.random.default_rng(13).standard_normal(3 * MB // 8)  # staged (from 1 MiB here)
    assert cupy.asnumpy(engine.to_device(host)).tobytes() == host.tobytes()
    assert sum(len(idle) for idle in engine._idle_rings.values()) == 1  # left for the next
    outcome: list[Any] = []

    def first_cuda_call() -> None:
        try:
            outcome.append(cupy.asnumpy(engine.to_device(host)))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=first_cuda_call)
    thread.start()
    thread.join()
    assert isinstance(outcome[0], np.ndarray), outcome[0]
    assert outcome[0].tobytes() == host.tobytes()


@pytest.mark.parametrize("pinned_limit", [2**30, MB])
def test_fortran_ordered_results_stay_fortran_ordered_however_they_come_back(
        pinned_limit: int) -> None:
    """Pinned from 64 KiB within the limit; below it, or past the limit, through ``.get``."""
    import cupy

    engine = TransferEngine(pinned_limit)
    try:
        for shape in ((30, 40), (400, 500)):  # 9.6 KB: below the cutoff; 1.6 MB: pinned or not
            host = np.asfortranarray(np.random.default_rng(14).standard_normal(shape))
            back = engine.to_host(cupy.asarray(host, order="F"))
            assert back.flags.f_contiguous and not back.flags.c_contiguous
            np.testing.assert_array_equal(back, host)
    finally:
        engine.close()


def test_an_interrupted_copy_to_the_host_lands_before_its_pinned_block_can_be_reused(
        engine: TransferEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt right after the copy is queued drops the result; its block goes back to
    the pool, where the next result or staged input may take it, so the copy into it must have
    finished by then."""
    import cupy

    device = cupy.random.standard_normal(256 * MB // 8)  # about 5 ms to copy
    used_before = engine.pinned.used_bytes
    queue_copy = cupy.cuda.runtime.memcpyAsync

    def interrupted_after_queueing(*args: Any) -> None:
        queue_copy(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", interrupted_after_queueing)
    with pytest.raises(KeyboardInterrupt):
        engine.to_host(device)
    assert cupy.cuda.get_current_stream().done  # the copy had landed when the error came out
    gc.collect()
    assert engine.pinned.used_bytes == used_before


def test_no_leak_after_1000_offloaded_calls() -> None:
    import cupy

    runtime = veda.init(veda.Config.builder().pinned_memory_limit("1GB").cost_model("static").build())
    assert runtime.gpu and runtime.gpu.transfers is not None
    runtime.gpu.transfers.loop.wait()  # so every call takes the staging ring
    device = runtime.gpu.devices[0].ordinal  # the device whose statistics are read below
    f = veda.gpu(device=device)(lambda x: x * 2 + 1)
    x = np.random.default_rng().random(2_500_000)  # 20 MB: through the staging ring, pinned out
    np.testing.assert_allclose(f(x), x * 2 + 1)
    gc.collect()
    pool = cupy.get_default_memory_pool()
    baseline_used = pool.used_bytes()
    baseline_pinned = runtime.gpu.get_memory_stats(device)["pinned_used_mb"]
    assert baseline_pinned > 0  # the ring, kept for the next call
    for _ in range(1000):
        f(x)
    gc.collect()
    assert pool.used_bytes() == baseline_used
    stats = runtime.gpu.get_memory_stats(device)
    assert stats["pinned_used_mb"] == baseline_pinned  # every result's block went back
    assert stats["peak_allocated_mb"] >= 20_000_000 / MB
    assert 0.0 <= stats["fragmentation"] <= 1.0
    veda.empty_cache()
    assert runtime.gpu.get_memory_stats()["pool_cached_mb"] == 0.0


def test_gpu_memory_fraction_out_of_memory_falls_back_to_cpu() -> None:
    runtime = veda.init(veda.Config.builder().gpu_memory_fraction(0.01).cost_model("static")
                       .build())
    assert runtime.gpu
    limit_bytes = 0.01 * runtime.gpu.devices[0].total_memory
    x = np.random.default_rng().random(int(limit_bytes * 0.4) // 8)  # fits; x*x*x temps do not
    f = veda.gpu(lambda a: a * a * a + a * a)
    with pytest.warns(veda.OffloadWarning, match="OutOfMemoryError"):
        np.testing.assert_allclose(f(x), x * x * x + x * x)
    last = runtime.telemetry.recent()[-1]
    assert last.path == "fallback" and "OutOfMemoryError" in last.reason
    veda.shutdown()  # lifts the pool limit for the tests that follow


def test_registered_host_memory_goes_straight_to_the_device(
        engine: TransferEngine, staging_engine: TransferEngine) -> None:
    import cupy

    host = np.zeros(48 * MB, np.uint8)  # a worker's input ring, in miniature
    small = np.ndarray((1000, 1000), np.float32, buffer=host, offset=0)
    large = np.ndarray((20 * MB // 8,), np.float64, buffer=host, offset=8 * MB)
    rng = np.random.default_rng(5)
    small[...] = rng.random(small.shape, dtype=np.float32)
    large[...] = rng.random(large.shape)
    outside = rng.random(300_000)
    staging_engine.register_host(host.ctypes.data, host.nbytes)
    assert not staging_engine.stages(small) and staging_engine.stages(outside)
    staging_engine.close()  # unregisters, so another engine may register the same memory
    engine.register_host(host.ctypes.data, host.nbytes)  # its ring takes arrays from 1 MiB
    for array in (small, large, np.asfortranarray(small[:10]), outside):
        device = engine.to_device(array)
        cupy.cuda.get_current_stream().synchronize()
        assert device.dtype == array.dtype and np.array_equal(device.get(), array)
    keep: list[Any] = []
    below_pool = small[:100]  # 400 KB, in the registered memory: below the engine's pool_from
    device = engine.upload(below_pool, keep)  # one copy from where it is, no pinned copy
    cupy.cuda.get_current_stream().synchronize()
    assert keep == [] and np.array_equal(device.get(), below_pool)
    device = engine.upload(below_pool.copy(), keep)  # the same bytes outside it: a pinned copy
    cupy.cuda.get_current_stream().synchronize()
    assert len(keep) == 1 and np.array_equal(device.get(), below_pool)


def test_peak_tracking_wraps_the_allocator_the_user_set_and_puts_it_back() -> None:
    import cupy

    veda.shutdown()  # the fixture's runtime puts CuPy's default allocator back
    default = cupy.cuda.get_allocator()
    own_pool, sizes = cupy.cuda.MemoryPool(), []

    def counting(size: int) -> Any:
        sizes.append(size)
        return own_pool.malloc(size)

    x = np.random.default_rng().random(1_000_000)  # 8 MB
    f = veda.gpu(force="gpu")(lambda a: a * 2 + 1)
    try:
        for allocator in (counting, own_pool.malloc):
            cupy.cuda.set_allocator(allocator)
            runtime = veda.init(veda.Config.builder().cost_model("static").build())
            assert runtime.gpu
            runtime.gpu.reset_peak_memory()
            np.testing.assert_allclose(f(x), x * 2 + 1)
            call = runtime.telemetry.recent()[-1]
            assert call.path == "gpu"
            if allocator is counting:
                assert sum(sizes) >= x.nbytes  # the user's allocator served the call
            else:  # the user's pool is the one whose figures are read, on the call's device
                peak = runtime.gpu.get_memory_stats(call.device)["peak_allocated_mb"]
                assert peak >= x.nbytes / MB
            veda.shutdown()
            assert cupy.cuda.get_allocator() == allocator
    finally:
        cupy.cuda.set_allocator(default)
