"""gpu_map over several devices, one worker process per device, without a GPU: the parent's
devices are faked (FakeProbe) and the workers, finding no GPU, run their gpu_map on the CPU;
everything between them (the ring, the protocol, order, errors, shutdown) is what runs on a
multi-GPU machine. Also the ring allocator and the item encoding on their own."""

from __future__ import annotations

import os
import pickle
import sys
import time
import types
from typing import Any

import numpy as np
import pytest
import worker_functions as wf
from fakes import FakeProbe

import vedart as veda
from vedart.parallel import device_workers
from vedart.parallel.byte_ring import ALIGN, ByteRing, aligned
from vedart.parallel.device_workers import (
    PlacementFeed,
    decode,
    encode,
    function_payload,
    write_buffers,
)
from vedart.parallel.gpu_map import offloaded
from vedart.parallel.par_iter import par_iter
from vedart.parallel import gpu_map


def two_fake_gpus(**options: Any) -> veda.Runtime:
    builder = veda.Config.builder().cost_model("static").threads(2)
    for name, value in options.items():
        builder = getattr(builder, name)(value)
    return veda.init(builder.build(), device_probe=FakeProbe(count=2))


def worker_pids(runtime: veda.Runtime) -> list[int]:
    workers = runtime.scheduler.lanes("processes", lambda: None)
    return [worker._process.pid for worker in workers.workers]


# --- the ring ------------------------------------------------------------------------------

def test_ring_spans_are_aligned_allocated_in_order_and_released_oldest_first() -> None:
    ring = ByteRing(10 * ALIGN)
    assert [ring.allocate(n) for n in (1, ALIGN + 1, 3 * ALIGN)] == [0, ALIGN, 3 * ALIGN]
    assert ring.allocate(5 * ALIGN) is None  # 4 free at the end, none before the oldest
    ring.release()  # frees [0, ALIGN)
    assert ring.allocate(4 * ALIGN) == 6 * ALIGN
    assert ring.allocate(ALIGN) == 0  # wrapped into the released span
    assert ring.allocate(ALIGN) is None and ring.in_use == 4
    assert aligned(0) == ALIGN and aligned(ALIGN + 1) == 2 * ALIGN


def test_ring_wraps_to_the_start_and_never_overlaps_a_span_in_use() -> None:
    ring = ByteRing(8 * ALIGN)
    first, second = ring.allocate(4 * ALIGN), ring.allocate(3 * ALIGN)
    assert (first, second) == (0, 4 * ALIGN)
    assert ring.allocate(2 * ALIGN) is None  # 1 free at the end, 0 before the oldest
    ring.release()
    assert ring.allocate(2 * ALIGN) == 0  # wrapped: before the oldest span
    assert ring.allocate(2 * ALIGN) == 2 * ALIGN
    assert ring.allocate(ALIGN) is None  # up to the oldest, which starts at 4 * ALIGN
    with pytest.raises(ValueError, match="at most 512"):
        ring.allocate(9 * ALIGN)
    assert not ring.fits(9 * ALIGN) and ring.fits(8 * ALIGN)


# --- items and functions ---------------------------------------------------------------------

def test_items_round_trip_through_the_ring_with_their_arrays_out_of_band() -> None:
    rng = np.random.default_rng(0)
    item = {"c": rng.random((3, 4)), "f": np.asfortranarray(rng.random((5, 2)).astype(np.float32)),
            "big_endian": np.arange(6, dtype=">i4"), "strided": np.arange(20)[::3],
            "other": ("text", 7)}
    meta, buffers = encode(item)
    assert len(buffers) == 3  # the strided view is copied in-band, the rest are not
    ring = np.zeros(4096, np.uint8)
    spans = write_buffers(ring, 128, buffers)
    assert all(start % ALIGN == 0 for start, _ in spans)
    back = decode(meta, memoryview(ring), spans)
    for key in ("c", "f", "big_endian", "strided"):
        assert back[key].dtype == item[key].dtype and np.array_equal(back[key], item[key])
    assert back["f"].flags.f_contiguous and back["other"] == ("text", 7)
    assert np.shares_memory(back["c"], ring)  # a view of the ring, not a copy


def test_only_functions_a_worker_can_import_travel() -> None:
    payload = function_payload(offloaded(wf.fails_on_seven, None))
    function, options = pickle.loads(payload)  # the plain function, by reference
    assert function is wf.fails_on_seven and options.force is None
    assert pickle.loads(function_payload(wf.forced_cpu_pid)) is wf.forced_cpu_pid
    assert function_payload(offloaded(lambda x: x, None)) is None

    def main_script_function(x: Any) -> Any:
        return x

    main_script_function.__module__ = "__main__"
    assert function_payload(offloaded(main_script_function, None)) is None
    for options in ({"writes": ("x",)}, {"returns": "device"}, {"device": 0}):
        assert function_payload(veda.gpu(**options)(wf.fails_on_seven)) is None
    # Its code writes into its argument, which must be this process's array.
    assert function_payload(veda.gpu(wf.clips_in_place)) is None


def test_a_worker_is_given_its_device_as_this_process_sees_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a job scheduler's share of a node
    assert [device_workers.visible_device(n) for n in (0, 1)] == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_workers.visible_device(1) == "1"


# --- pipelines over worker processes -------------------------------------------------------

def test_items_run_in_one_worker_process_per_device_in_input_order() -> None:
    runtime = two_fake_gpus()
    rng = np.random.default_rng(1)
    items = [{"x": rng.random((50, 8)), "scale": i, "label": f"item {i}"} for i in range(40)]
    results = par_iter(items).gpu_map(wf.scaled_sum).collect()
    for result, item in zip(results, items):
        np.testing.assert_allclose(result[0], item["x"].sum(axis=0) * item["scale"])
        assert result[1] == item["label"]
    pids = worker_pids(runtime)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    ran_in = set(par_iter([np.ones(4)] * 20).gpu_map(wf.forced_cpu_pid).collect())
    assert ran_in <= set(pids) and len(ran_in) == 2  # both workers took items


def test_the_workers_calls_count_in_this_process_telemetry() -> None:
    runtime = two_fake_gpus()
    for count in (10, 6):
        par_iter([np.ones(2)] * count).gpu_map(wf.pid_of_item).collect()
    stats = runtime.telemetry.function("worker_functions.pid_of_item").as_dict()
    assert stats["calls"] == stats["cpu_calls"] == 16  # both pipelines, both workers, once
    assert stats["last_path"] == "cpu" and stats["last_reason"].startswith("no GPU")


def test_an_early_close_cancels_the_items_the_workers_have_not_started() -> None:
    runtime = two_fake_gpus()
    arrays = [np.full(2, i) for i in range(100)]
    assert [a[0] for a in par_iter(arrays).gpu_map(wf.sleeps).take(2).collect()] == [0, 1]
    ran = runtime.telemetry.function("worker_functions.sleeps").as_dict()["calls"]
    assert 2 <= ran <= 16  # not the ~100 the workers had been sent
    with pytest.raises(veda.ParIterError) as caught:  # a failure cancels the rest too
        par_iter(arrays).gpu_map(wf.fails_on_seven).collect()
    assert caught.value.index == 7
    assert [a[0] for a in par_iter(arrays).gpu_map(wf.sleeps).collect()] == list(range(100))


def test_a_failed_item_names_its_index_and_the_workers_stay_usable() -> None:
    two_fake_gpus()
    arrays = [np.full(3, i, dtype=np.int64) for i in range(12)]
    pipeline = par_iter(arrays).gpu_map(wf.fails_on_seven)
    with pytest.raises(veda.ParIterError) as caught:
        pipeline.collect()
    assert caught.value.index == 7 and isinstance(caught.value.__cause__, ArithmeticError)
    assert "item seven" in str(caught.value.__cause__)
    returned = pipeline.collect(errors="return")
    assert isinstance(returned[7], ArithmeticError)
    assert [r.tolist() for i, r in enumerate(returned) if i != 7] == \
        [(a * 2).tolist() for i, a in enumerate(arrays) if i != 7]
    assert len(pipeline.collect(errors="skip")) == 11


def test_a_small_ring_makes_the_parent_wait_and_large_items_run_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_workers, "RING_BYTES", 64 * 1024)
    full = []
    allocate = device_workers.ByteRing.allocate

    def noting_full_rings(ring: ByteRing, nbytes: int) -> int | None:
        offset = allocate(ring, nbytes)
        full.append(offset is None)
        return offset

    monkeypatch.setattr(device_workers.ByteRing, "allocate", noting_full_rings)
    two_fake_gpus()
    rng = np.random.default_rng(2)
    arrays = [rng.random(1000) for _ in range(200)]  # 8 KB each: 8 fit a ring at a time
    arrays[5] = rng.random(20_000)  # 160 KB: larger than a ring, runs in this process
    pids = par_iter(arrays).gpu_map(wf.pid_of_item).collect()
    assert pids[5] == os.getpid() and os.getpid() not in pids[:5] + pids[6:]
    assert any(full)  # the parent waited for ring space
    assert [r.tolist() for r in par_iter(arrays).gpu_map(wf.fails_on_seven).collect()] == \
        [(a * 2).tolist() for a in arrays]


def test_results_and_exceptions_that_cannot_travel_fail_their_item_only() -> None:
    two_fake_gpus()
    arrays = [np.full(2, i) for i in range(4)]
    outcomes = par_iter(arrays).gpu_map(wf.raises_unloadable).collect(errors="return")
    assert all(isinstance(o, RuntimeError) and "could not be loaded here" in str(o)
               for o in outcomes)
    outcomes = par_iter(arrays).gpu_map(wf.returns_a_lock).collect(errors="return")
    assert all("cannot be sent back from its worker process" in str(o) for o in outcomes)
    assert par_iter(arrays).gpu_map(wf.fails_on_seven).collect()[3].tolist() == [6, 6]


def test_a_pipeline_closed_early_leaves_the_workers_to_the_next() -> None:
    two_fake_gpus()
    arrays = [np.full(2, 100 + i) for i in range(300)]  # none is 7
    assert [a.tolist() for a in par_iter(arrays).gpu_map(wf.fails_on_seven).take(3)
            .collect()] == [[200, 200], [202, 202], [204, 204]]
    doubled = par_iter(arrays).gpu_map(wf.fails_on_seven).map(lambda a: int(a[0])).collect()
    assert doubled == [2 * (100 + i) for i in range(300)]


@pytest.fixture
def fake_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process lanes on fake streams (no CUDA here)."""
    from test_gpu_map import FakeBinding

    monkeypatch.setattr(gpu_map, "CudaBinding", FakeBinding)


def test_a_worker_that_dies_fails_its_items_and_later_pipelines_stay_in_process(
        fake_lanes: None) -> None:
    runtime = two_fake_gpus()
    arrays = [np.full(2, i) for i in range(8)]
    with pytest.raises(veda.ParIterError) as caught:
        par_iter(arrays).gpu_map(wf.exits_the_worker).collect()
    assert "exited (exit code 3)" in str(caught.value.__cause__)
    workers = runtime.scheduler.lanes("processes", lambda: None)
    assert not workers.acquire()  # broken: the next gpu_map runs its lanes in-process
    assert par_iter(arrays).gpu_map(wf.forced_cpu_pid).collect() == [os.getpid()] * 8


def test_items_after_a_worker_died_go_to_the_live_one() -> None:
    two_fake_gpus()
    arrays = [np.full(2, i) for i in range(8)]

    def paused() -> Any:  # items after the pause are dispatched once a worker has died
        yield from arrays
        time.sleep(1.0)
        yield from (np.full(2, 10 + i) for i in range(10))

    outcomes = par_iter(paused()).gpu_map(wf.exits_the_worker).collect(errors="return")
    failed = [o for o in outcomes[:8] if not isinstance(o, np.ndarray)]
    assert failed and all(isinstance(o, veda.OffloadError) for o in failed)
    assert [o.tolist() for o in outcomes[8:]] == [[10 + i] * 2 for i in range(10)]


def test_shutdown_stops_the_workers_and_frees_their_rings() -> None:
    runtime = two_fake_gpus()
    assert len(par_iter([np.ones(3)] * 4).gpu_map(wf.forced_cpu_pid).collect()) == 4
    workers = runtime.scheduler.lanes("processes", lambda: None).workers
    veda.shutdown()
    assert all(worker._process.poll() is not None for worker in workers)
    with pytest.raises(FileNotFoundError):
        device_workers.SharedMemory(name=workers[0]._memory.name)


def test_a_worker_reports_where_each_item_ran_though_lanes_place_items_ahead(
        fake_lanes: None) -> None:
    # What a worker does per delivered batch, on fake lanes in this process.
    from test_gpu_map import MB, FakeOffload, first_times_ten
    from test_gpu_map import items as lane_items

    runtime = veda.init(veda.Config.builder().threads(2).device_processes(False).build(),
                        device_probe=FakeProbe(1))
    for _ in range(2):  # the feed starts from the placements made before it
        placed = PlacementFeed(runtime.telemetry)
        pipeline = par_iter(iter(lane_items(48, 2 * MB))).gpu_map(
            FakeOffload(first_times_ten, gpu_seconds=0.001))
        with pipeline._batches() as batches:
            where = [placed.take(origin) for batch in batches for origin in batch.origins]
        assert all(w is not None and w[0] == "gpu" and w[2] <= w[3] for w in where)
        assert len(where) == 48


def test_a_function_the_workers_cannot_import_runs_here(fake_lanes: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("made_in_this_process")
    exec("import os\ndef pid(x):\n    return os.getpid()\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    two_fake_gpus()
    with pytest.warns(veda.OffloadWarning, match=r"cannot load #1 gpu_map\(pid\)'s function"):
        pids = par_iter([np.ones(2)] * 4).gpu_map(module.pid, force="cpu").collect()
    assert pids == [os.getpid()] * 4
    assert par_iter([np.ones(2)] * 4).gpu_map(wf.pid_of_item).collect()[0] != os.getpid()


def test_a_script_that_never_shuts_down_leaves_no_rings_behind(tmp_path: Any) -> None:
    import subprocess

    script = tmp_path / "script.py"
    script.write_text(
        "import numpy as np\nfrom fakes import FakeProbe\nimport vedart as veda\n"
        "import worker_functions as wf\n"
        "veda.init(veda.Config.builder().cost_model('static').build(),"
        " device_probe=FakeProbe(count=2))\n"
        "print(len(veda.par_iter([np.ones(3)] * 6).gpu_map(wf.pid_of_item).collect()))\n")
    tests = os.path.dirname(os.path.abspath(__file__))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([tests] + sys.path)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "6", done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_device_processes_off_keeps_every_lane_in_this_process(fake_lanes: None) -> None:
    runtime = two_fake_gpus(device_processes=False)
    assert par_iter([np.ones(2)] * 3).gpu_map(wf.forced_cpu_pid).collect() == [os.getpid()] * 3
    assert "processes" not in runtime.scheduler._lanes


def test_a_force_block_keeps_the_items_in_this_process(fake_lanes: None) -> None:
    runtime = two_fake_gpus()
    with veda.force("cpu"):  # the block's forcing could not reach a worker
        assert par_iter([np.ones(2)] * 3).gpu_map(wf.forced_cpu_pid).collect() == \
            [os.getpid()] * 3
    assert "processes" not in runtime.scheduler._lanes


class ItemOfTheScript:
    """Stands for a class defined in the user's script (moved into ``__main__`` by the test)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


def test_items_a_worker_could_not_load_run_here_and_the_others_in_the_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    monkeypatch.setattr(ItemOfTheScript, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "ItemOfTheScript", ItemOfTheScript,
                        raising=False)
    two_fake_gpus()
    items: list[Any] = [np.ones(2) for _ in range(6)]
    items[1] = threading.Lock()  # does not pickle
    items[4] = ItemOfTheScript(np.ones(3))  # pickles here; a worker cannot load it
    pids = par_iter(items).gpu_map(wf.pid_of_item).collect()
    assert pids[1] == pids[4] == os.getpid()
    assert os.getpid() not in pids[:1] + pids[2:4] + pids[5:]
    assert device_workers.encode_for_worker(items[0]) is not None


@pytest.mark.timeout(60)  # a stalled worker queue hangs the second pipeline
def test_an_interrupt_between_reserving_an_item_and_sending_it_stalls_no_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    two_fake_gpus()
    arrays = [np.full(2, 100 + i) for i in range(20)]  # none is 7
    assert len(par_iter(arrays).gpu_map(wf.pid_of_item).collect()) == 20  # workers started
    reserve = device_workers.DeviceWorker.reserve
    reserved = []

    def interrupted_after_the_fifth(worker: Any, *args: Any) -> tuple[int, int]:
        reservation = reserve(worker, *args)
        reserved.append(reservation)
        if len(reserved) == 5:
            raise KeyboardInterrupt  # arrives after the reservation, before it is sent
        return reservation

    monkeypatch.setattr(device_workers.DeviceWorker, "reserve", interrupted_after_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        par_iter(arrays).gpu_map(wf.fails_on_seven).collect()
    monkeypatch.undo()
    assert [r.tolist() for r in par_iter(arrays).gpu_map(wf.fails_on_seven).collect()] == \
        [(a * 2).tolist() for a in arrays]
