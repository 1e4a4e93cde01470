from __future__ import annotations

import pytest
from fakes import GIB, FakeProbe

import vedart as veda
from vedart.gpu.devices import CudaProbe, reason_for_cuda_status
from vedart.gpu.nvml import parse_pci_bus_id


def test_available_context_reports_devices_and_memory_in_mib() -> None:
    probe = FakeProbe(count=2, free=30 * 2**20, total=100 * 2**20, utilization=40.0)
    gpu = veda.init(device_probe=probe).gpu
    assert gpu is not None and gpu and gpu.is_available() and gpu.unavailable_reason is None
    assert gpu.backend == "cupy" and gpu.device_count == 2
    assert [d.ordinal for d in gpu.devices] == [0, 1]
    stats = gpu.get_memory_stats()
    assert {k: stats[k] for k in ("used_mb", "free_mb", "total_mb")} == \
        {"used_mb": 70.0, "free_mb": 30.0, "total_mb": 100.0}
    assert set(stats) == {"used_mb", "free_mb", "total_mb", "pool_allocated_mb", "pool_cached_mb",
                          "peak_allocated_mb", "fragmentation", "pinned_used_mb",
                          "pinned_cached_mb"}
    assert all(isinstance(value, float) and value >= 0 for value in stats.values())
    assert gpu.get_utilization(1) == 40.0


def test_utilization_is_clamped_to_percent_range() -> None:
    gpu = veda.init(device_probe=FakeProbe(utilization=130.0)).gpu
    assert gpu is not None and gpu.get_utilization() == 100.0


def test_configured_devices_restrict_the_context() -> None:
    config = veda.Config.builder().devices([1]).build()
    gpu = veda.init(config, device_probe=FakeProbe(count=2)).gpu
    assert gpu is not None and [d.ordinal for d in gpu.devices] == [1]
    with pytest.raises(veda.DeviceError, match=r"device: got 0; allowed: .*\[1\]"):
        gpu.get_memory_stats(0)


def test_configured_device_that_is_absent_raises_config_error_and_releases_the_probe() -> None:
    probe = FakeProbe(count=1)
    with pytest.raises(veda.ConfigError, match=r"devices: got \[0, 3\].*not present: \[3\]"):
        veda.init(veda.Config.builder().devices([0, 3]).build(), device_probe=probe)
    assert probe.closed


def test_unavailable_context_is_falsy_and_queries_raise_with_the_reason() -> None:
    gpu = veda.init(device_probe=FakeProbe(reason="no CUDA devices")).gpu
    assert gpu is not None and not gpu and gpu.device_count == 0
    assert gpu.unavailable_reason == "no CUDA devices"
    with pytest.raises(veda.GPUUnavailableError, match="no GPU: no CUDA devices"):
        gpu.get_memory_stats()


def test_seed_monitoring_snippet_takes_the_no_gpu_branch_without_a_gpu() -> None:
    runtime = veda.init(device_probe=FakeProbe(reason="cupy is not installed"))
    branch = "stats" if runtime.gpu else "GPU not available"
    assert branch == "GPU not available"


def test_real_probe_without_a_driver_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI installs CuPy but has no NVIDIA driver: the real discovery path must say so."""
    pytest.importorskip("cupy")
    probe = CudaProbe()
    reason = probe.discover().unavailable_reason
    probe.close()
    if reason is None:
        pytest.skip("a CUDA GPU is present")
    assert reason == "CUDA driver not found"
    runtime = veda.init()
    assert runtime.gpu is not None and runtime.gpu.unavailable_reason == "CUDA driver not found"


@pytest.mark.parametrize(
    ("status", "environ", "driver", "reason"),
    [
        (35, {}, False, "CUDA driver not found"),
        (35, {}, True, "CUDA driver is too old for the installed CuPy (cudaErrorInsufficientDriver)"),
        (100, {}, True, "no CUDA devices"),
        (100, {"CUDA_VISIBLE_DEVICES": ""}, True, "disabled by CUDA_VISIBLE_DEVICES=''"),
        (100, {"CUDA_VISIBLE_DEVICES": "-1"}, True, "disabled by CUDA_VISIBLE_DEVICES='-1'"),
        (3, {}, True, "CUDA failed to initialise: boom"),
    ],
)
def test_reason_for_cuda_status(status: int, environ: dict[str, str], driver: bool,
                                reason: str) -> None:
    assert reason_for_cuda_status(status, "boom", environ, driver) == reason


_CUPYS_MESSAGE = """
================================================================
Failed to import CuPy.

On Linux, you may need to set LD_LIBRARY_PATH environment variable depending on how you installed CUDA/ROCm.

Original error:
  ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory
================================================================
"""


@pytest.mark.parametrize(("error", "reason"), [
    (ModuleNotFoundError("No module named 'cupy'", name="cupy"), "cupy is not installed"),
    (ImportError(_CUPYS_MESSAGE), "cupy failed to import: ImportError: libnvrtc.so.12: cannot "
                                  "open shared object file: No such file or directory"),
    (ModuleNotFoundError("No module named 'fastrlock'", name="fastrlock"),
     "cupy failed to import: ModuleNotFoundError: No module named 'fastrlock'"),
    (OSError("libcudart.so: bad ELF\nsecond line"), "cupy failed to import: OSError: libcudart.so: "
                                                    "bad ELF"),
])
def test_cupy_missing_or_broken_is_reported(monkeypatch: pytest.MonkeyPatch, error: Exception,
                                            reason: str) -> None:
    import builtins

    real_import = builtins.__import__

    def no_cupy(name: str, *args: object, **kwargs: object) -> object:
        if name == "cupy":
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    assert CudaProbe().discover().unavailable_reason == reason


@pytest.mark.parametrize(
    ("text", "address"),
    [("0000:3B:00.0", (0, 0x3B, 0, 0)), ("00000000:3b:00.0", (0, 0x3B, 0, 0)),
     (b"00000001:C1:1F.1", (1, 0xC1, 0x1F, 1))],
)
def test_pci_bus_ids_from_cuda_and_nvml_compare_equal(text: str | bytes,
                                                      address: tuple[int, ...]) -> None:
    assert parse_pci_bus_id(text) == address


def test_bad_pci_bus_id() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        parse_pci_bus_id("3B:00")


def test_free_memory_comes_from_the_probe() -> None:
    probe = FakeProbe(free=5 * GIB)
    gpu = veda.init(device_probe=probe).gpu
    assert gpu is not None and gpu.free_memory(0) == 5 * GIB and probe.memory_queries == 1


def test_free_memory_reuses_a_young_reading_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu import context

    probe = FakeProbe(count=2, free=5 * GIB)
    gpu = veda.init(device_probe=probe).gpu
    assert gpu is not None
    monkeypatch.setattr(context, "FREE_MEMORY_MAX_AGE_S", 3600.0)
    assert [gpu.free_memory(0), gpu.free_memory(0), gpu.free_memory(1)] == [5 * GIB] * 3
    assert probe.memory_queries == 2  # one per device
    probe.free[0] = 1 * GIB
    assert gpu.free_memory(0) == 5 * GIB  # still young
    monkeypatch.setattr(context, "FREE_MEMORY_MAX_AGE_S", 0.0)
    assert gpu.free_memory(0) == 1 * GIB and probe.memory_queries == 3
    assert gpu.get_memory_stats(0)["free_mb"] == 1 * GIB / 2**20  # statistics read afresh


def test_a_small_need_reuses_an_older_reading_a_large_one_reads_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu import context

    probe = FakeProbe(free=5 * GIB)
    gpu = veda.init(device_probe=probe).gpu
    assert gpu is not None and gpu.free_memory(0) == 5 * GIB
    monkeypatch.setattr(context, "FREE_MEMORY_MAX_AGE_S", 0.0)  # every reading is old
    probe.free[0] = 1 * GIB
    small = 5 * GIB // context.FREE_MEMORY_SLACK
    assert gpu.free_memory(0, small) == 5 * GIB and probe.memory_queries == 1
    assert gpu.free_memory(0, small + 1) == 1 * GIB and probe.memory_queries == 2
    assert gpu.free_memory(0) == 1 * GIB and probe.memory_queries == 3  # no need: afresh
    monkeypatch.setattr(context, "FREE_MEMORY_SLACK_AGE_S", 0.0)
    assert gpu.free_memory(0, 1) == 1 * GIB and probe.memory_queries == 4


class _Block:
    """What an allocator hands out, as far as peak tracking reads it."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id


class _CountingPool:
    def __init__(self) -> None:
        self.used = 0

    def used_bytes(self) -> int:
        return self.used


def test_peak_tracking_wraps_the_allocator_set_before_and_puts_it_back() -> None:
    import threading

    import cupy

    from vedart.gpu.memory import PeakTracker

    pool, sizes = _CountingPool(), []

    def users_allocator(size: int) -> _Block:
        sizes.append(size)
        pool.used += size
        return _Block(1)

    before = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(users_allocator)
    try:
        peak, lock = {0: 0, 1: 0}, threading.Lock()
        first = PeakTracker(pool, peak, lock)
        second = PeakTracker(pool, peak, lock)  # a runtime replacing another wraps the same
        assert first.allocate is users_allocator and second.allocate is users_allocator
        allocate = cupy.cuda.get_allocator()
        assert allocate(300).device_id == 1 and allocate(200).device_id == 1
        assert sizes == [300, 200] and peak == {0: 0, 1: 500}
        pool.used = 100  # blocks freed: the peak stays
        allocate(50)
        assert peak == {0: 0, 1: 500}
        assert not first.close()  # the newer tracker is installed: left alone
        assert second.close() and cupy.cuda.get_allocator() is users_allocator
        assert not second.close()
    finally:
        cupy.cuda.set_allocator(before)


def test_an_allocation_read_before_a_peak_reset_does_not_raise_the_new_peak() -> None:
    import threading

    import cupy

    from vedart.gpu.memory import PeakTracker

    read, resume = threading.Event(), threading.Event()

    class PausingPool(_CountingPool):
        def used_bytes(self) -> int:
            used = self.used
            if threading.current_thread().name == "allocating":
                read.set()  # the allocating thread is held here, after its first reading
                resume.wait()
            return used

    pool, peak, lock = PausingPool(), {1: 0}, threading.Lock()

    def users_allocator(size: int) -> _Block:
        pool.used += size
        return _Block(1)

    before = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(users_allocator)
    try:
        tracker = PeakTracker(pool, peak, lock)
        allocating = threading.Thread(target=cupy.cuda.get_allocator(), args=(500,),
                                      name="allocating")
        allocating.start()
        assert read.wait(10)
        pool.used = 100  # the 500 bytes freed, then the peak reset (as DeviceMemory does)
        with lock:
            peak[1] = pool.used
        resume.set()
        allocating.join()
        assert peak == {1: 100}
        assert tracker.close()
    finally:
        cupy.cuda.set_allocator(before)


def test_the_pool_read_is_the_users_own_when_its_malloc_is_the_allocator() -> None:
    import threading

    import cupy

    from vedart.gpu.memory import PeakTracker, pool_in_use

    default, own = object(), cupy.cuda.MemoryPool()
    before = cupy.cuda.get_allocator()
    try:
        assert pool_in_use(default) is cupy.get_default_memory_pool()  # CuPy's default
        cupy.cuda.set_allocator(len)  # an allocator of no pool
        assert pool_in_use(default) is default
        cupy.cuda.set_allocator(own.malloc)
        assert pool_in_use(default) is own
        tracker = PeakTracker(own, {}, threading.Lock())
        assert pool_in_use(default) is own  # seen through the tracker
        assert tracker.close() and cupy.cuda.get_allocator().__self__ is own
    finally:
        cupy.cuda.set_allocator(before)


def test_a_disabled_context_closes_without_raising_cudas_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lost CUDA context every CUDA call fails; closing must not raise then (it
    must still raise for a context that was not lost)."""
    class LostContext(RuntimeError):
        pass

    def failing_close() -> None:
        raise LostContext("cudaErrorIllegalAddress: an illegal memory access was encountered")

    gpu = veda.init(device_probe=FakeProbe()).gpu
    assert gpu is not None and gpu.transfers is not None
    monkeypatch.setattr(gpu.transfers, "close", failing_close)
    with pytest.raises(LostContext):
        gpu.close()
    assert gpu.disable("the CUDA context is lost") is True
    # The first cause stays named; the caller learns that it was not the first.
    assert gpu.disable("the same error, met by the next thread") is False
    assert not gpu.is_available() and gpu.unavailable_reason == "the CUDA context is lost"
    probe = gpu._probe
    gpu.close()
    assert probe.closed  # type: ignore[attr-defined]


def test_a_runtime_on_real_devices_prepares_staging_for_every_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls go to the device with the most free memory, so each device's first large copy
    needs its own bounce slots and ring; devices injected through a probe get none."""
    from vedart.gpu import context
    from vedart.gpu.transfer import TransferEngine

    prepared: list[int] = []
    monkeypatch.setattr(context, "CudaProbe", lambda: FakeProbe(3))
    monkeypatch.setattr(TransferEngine, "prepare", lambda self, device: prepared.append(device))
    veda.init(veda.Config.builder().devices([0, 2]).build())
    assert prepared == [0, 2]
    prepared.clear()
    veda.init(device_probe=FakeProbe(3))
    assert prepared == []
