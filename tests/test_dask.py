"""par_iter on Dask distributed, on a real LocalCluster of two worker processes (started once
for the module): the same results, order, errors and terminals as the thread scheduler;
functions and items that cannot be pickled; a worker killed mid-run; starting, connecting and
shutting down."""

from __future__ import annotations

import itertools
import operator
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import pytest
from dask_functions import (
    DoesNotLoad,
    big_endian_arrays,
    exits_on_three,
    fails_on_one_zero,
    fails_on_seven,
    fails_on_three_with_an_error_that_does_not_load,
    half_second_identity,
    held_total,
    interrupts_on_three,
    is_even,
    overwrite_late_unless_first,
    pair_up,
    repeat_twice,
    same_array,
    same_unless_none,
    scaled_column_sums,
    short_identity,
    slow_identity,
    slow_total,
    square,
    with_pid,
    worker_gpu_decision,
    worker_threshold,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vedart as veda
from vedart.cli import collect_info, format_info
from vedart.parallel.dask_scheduler import DASK_WINDOW_PER_THREAD, DaskCluster
from vedart.parallel.dask_shared import SHARED_MIN_BYTES, SHM_DIRECTORY, SharedRing

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as local:
        yield local


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    with distributed.Client(cluster, set_as_default=False) as connected:
        yield connected


def on_dask(client: Any, **options: Any) -> veda.Runtime:
    builder = veda.Config.builder().scheduler("dask").dask_client(client)
    for name, value in options.items():
        getattr(builder, name)(value)
    return veda.init(builder.build())


def outcome(run: Callable[[], Any]) -> tuple[Any, ...]:
    """("ok", value) or ("error", type, index, stage, message) of ``run()``."""
    try:
        return ("ok", run())
    except veda.ParIterError as error:
        return ("error", type(error.__cause__).__name__, error.index, error.stage, str(error))
    except Exception as error:
        return ("error", type(error).__name__, str(error))


STAGES = st.sampled_from([("map", square), ("filter", is_even), ("flat_map", repeat_twice),
                          ("gpu_map", square), ("map", fails_on_seven)]) | \
    st.tuples(st.sampled_from(["take", "skip"]), st.integers(0, 30))

TERMINALS: dict[str, Callable[[veda.ParIter[Any]], Any]] = {
    "collect": lambda p: p.collect(),
    "collect_skip": lambda p: p.collect(errors="skip"),
    "collect_return": lambda p: [repr(v) for v in p.collect(errors="return")],
    "collect_progress": lambda p: p.collect(errors="skip", progress=True),
    "sum": lambda p: p.sum(),
    "count": lambda p: p.count(),
    "min": lambda p: p.min(default=None),
    "max": lambda p: p.max(key=square, default=None),
    "any": lambda p: p.any(is_even),
    "all": lambda p: p.all(),
    "fold": lambda p: p.fold(0, operator.add),
    "reduce": lambda p: p.reduce(operator.add),
    "to_dict": lambda p: p.to_dict(is_even),
    "for_each": lambda p: p.for_each(square),
    "enumerate_chunk": lambda p: p.enumerate(1).chunk(3).collect(),
}


def results(source: list[int], stages: list[tuple[str, Any]]) -> dict[str, tuple[Any, ...]]:
    def pipeline() -> veda.ParIter[Any]:
        described = veda.par_iter(source)
        for kind, argument in stages:
            described = getattr(described, kind)(argument)
        return described

    return {name: outcome(lambda: terminal(pipeline())) for name, terminal in TERMINALS.items()}


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=st.lists(st.integers(0, 40), max_size=60), stages=st.lists(STAGES, max_size=4))
def test_every_terminal_equals_the_thread_scheduler(client: Any, source: list[int],
                                                    stages: list[tuple[str, Any]]) -> None:
    veda.init(veda.Config.builder().scheduler("threads").build())
    expected = results(source, stages)
    on_dask(client)
    assert results(source, stages) == expected


def test_results_in_input_order_each_once_from_both_workers(client: Any) -> None:
    on_dask(client)
    pairs = veda.par_iter(range(400), chunk_size=7).map(with_pid).collect()
    assert [value for value, _ in pairs] == list(range(400))
    worker_pids = set(client.run(os.getpid).values())
    assert {pid for _, pid in pairs} == worker_pids and os.getpid() not in worker_pids


def test_an_endless_source_is_read_only_as_far_as_the_window(client: Any) -> None:
    on_dask(client)
    read: list[int] = []

    def endless() -> Iterator[int]:
        for value in itertools.count():
            read.append(value)
            yield value

    assert veda.par_iter(endless(), chunk_size=3).map(square).take(5).collect() == \
        [0, 1, 4, 9, 16]
    # chunk x (the window of tasks in flight on two single-threaded workers, refilled once)
    assert len(read) <= 3 * (DASK_WINDOW_PER_THREAD * 2 + 1)


def test_until_a_task_has_measured_the_items_one_single_item_task_per_worker_runs(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    on_dask(client)
    submitted: list[list[int]] = []  # items per batch, per submission
    real_map = client.map

    def recording_map(function: Any, steps: Any, batches: list[Any], *rest: Any,
                      **options: Any) -> Any:
        submitted.append([len(batch) for batch in batches])
        return real_map(function, steps, batches, *rest, **options)

    monkeypatch.setattr(client, "map", recording_map)
    assert veda.par_iter(range(60)).map(slow_identity).collect() == list(range(60))
    assert submitted[0] == [1, 1]  # two single-threaded workers
    # 10 ms items: about 0.1 s of work per task once measured
    assert max(submitted[1]) >= 5


def test_an_item_that_raises_names_its_index_and_stage(client: Any) -> None:
    on_dask(client)
    with pytest.raises(veda.ParIterError, match=r"item 7 failed in stage #2 map\(fails_on") \
            as raised:
        veda.par_iter(range(20)).flat_map(repeat_twice).map(fails_on_seven).collect()
    assert raised.value.index == 7 and raised.value.stage == "#2 map(fails_on_seven)"
    assert isinstance(raised.value.__cause__, ArithmeticError)
    returned = veda.par_iter(range(10)).map(fails_on_seven).collect(errors="return")
    assert isinstance(returned[7], ArithmeticError) and returned[:7] == list(range(7))
    assert veda.par_iter(range(10)).map(fails_on_seven).collect(errors="skip") == \
        [0, 1, 2, 3, 4, 5, 6, 8, 9]


def test_an_unpicklable_function_fails_before_any_item_is_read(client: Any) -> None:
    on_dask(client)
    lock = threading.Lock()
    read: list[int] = []

    def source() -> Iterator[int]:
        for value in range(5):
            read.append(value)
            yield value

    with pytest.raises(veda.ParIterError, match=r"stage #2 map\(holds_a_lock\) cannot run on "
                                                r"Dask workers.*cannot be pickled.*lock") as raised:
        veda.par_iter(source()).map(square).map(_holding(lock)).collect()
    assert raised.value.stage == "#2 map(holds_a_lock)"
    assert read == []


def _holding(lock: Any) -> Callable[[int], int]:
    def holds_a_lock(x: int) -> int:
        with lock:
            return x

    return holds_a_lock


def test_an_unpicklable_item_fails_naming_its_index(client: Any) -> None:
    on_dask(client)
    items: list[Any] = [1, 2, threading.Lock(), 4]
    with pytest.raises(veda.ParIterError, match=r"item 2 cannot be sent to a Dask worker for "
                                                r"stage #1 map\(square\).*lock") as raised:
        veda.par_iter(items, chunk_size=4).map(square).collect()
    assert raised.value.index == 2


def test_an_item_that_pickles_but_does_not_load_fails_naming_its_index(client: Any) -> None:
    on_dask(client)
    items: list[Any] = [1, 2, DoesNotLoad(), 4, 5, 6]
    with pytest.raises(veda.ParIterError, match=r"item 2 cannot be sent to a Dask worker for "
                                                r"stage #1 map\(square\): it cannot be pickled "
                                                r"and loaded back \(ValueError") as raised:
        veda.par_iter(items, chunk_size=2).map(square).collect(errors="skip")
    assert raised.value.index == 2


def test_an_exception_that_does_not_load_fails_its_item_alone(client: Any) -> None:
    on_dask(client)
    got = veda.par_iter(range(10), chunk_size=5).map(
        fails_on_three_with_an_error_that_does_not_load).collect(errors="return")
    assert [value for value in got if not isinstance(value, Exception)] == \
        [0, 1, 2, 4, 5, 6, 7, 8, 9]
    failure = got[3]
    assert isinstance(failure, RuntimeError)
    assert "cannot be sent back from its Dask worker" in str(failure)


def test_gpu_map_runs_the_gpu_machinery_in_the_workers_and_reports_them(client: Any) -> None:
    on_dask(client, gpu=False)  # the workers' @gpu calls then run on the CPU on any host
    rng = np.random.default_rng(5)
    matrices = [rng.random((30, 20)) for _ in range(12)]
    got = veda.par_iter(matrices).gpu_map(scaled_column_sums).collect()
    for result, matrix in zip(got, matrices):
        assert type(result) is np.ndarray and result.dtype == np.float64
        np.testing.assert_allclose(result, (matrix * 2.0).sum(axis=0))
    snapshot = veda.get_runtime().telemetry.snapshot()
    rows = {row["function"]: row for row in snapshot["functions"]}
    assert rows["dask_functions.scaled_column_sums"]["calls"] == 12
    workers = [row for row in snapshot["workers"]
               if row["function"] == "dask_functions.scaled_column_sums"]
    assert sum(row["calls"] for row in workers) == 12
    assert all(row["worker"].startswith("tcp://") and "(CPU)" in row["worker"]
               for row in workers)
    with pytest.raises(veda.ConfigError, match=r"gpu_map\(device\): got 0 under "
                                               r"scheduler='dask'"):
        veda.par_iter(matrices).gpu_map(scaled_column_sums, device=0).collect()


def test_workers_run_gpu_functions_with_the_clients_config(client: Any) -> None:
    on_dask(client, offload_threshold="123KB")
    assert set(client.run(worker_threshold).values()) == {123_000}
    matrix = np.random.default_rng(2).random((8, 4))
    np.testing.assert_allclose(client.submit(scaled_column_sums, matrix).result(),
                               (matrix * 2.0).sum(axis=0))


def test_the_workers_of_a_cpu_cluster_of_this_host_use_no_gpu_and_others_may(
        cluster: Any, client: Any) -> None:
    from vedart.parallel.dask_worker import CPU_CLUSTER_REASON

    no_gpu = (True, f"no GPU: {CPU_CLUSTER_REASON}")  # not "GPU disabled by config": it is not
    on_dask(client)  # the caller's client of a LocalCluster
    assert set(client.run(worker_gpu_decision).values()) == {no_gpu}
    by_address = veda.init(veda.Config.builder().scheduler("dask")
                           .dask_address(cluster.scheduler_address).build())
    assert by_address.dask is not None  # workers that may be on other hosts: the GPUs they see
    by_address_decisions = by_address.dask.client.run(worker_gpu_decision).values()
    assert all(gpu and reason != no_gpu[1] for gpu, reason in by_address_decisions)
    runtime = veda.init(veda.Config.builder().scheduler("dask").dask_cluster("cpu")
                        .dask_workers(1).build())
    assert runtime.dask is not None and runtime.config.gpu
    assert set(runtime.dask.client.run(worker_gpu_decision).values()) == {no_gpu}
    runtime = veda.init(veda.Config.builder().scheduler("dask").dask_cluster("cpu")
                        .dask_workers(1).gpu(False).build())
    assert runtime.dask is not None
    assert set(runtime.dask.client.run(worker_gpu_decision).values()) == \
        {(False, "GPU disabled by config")}
    veda.shutdown()


def counting_shipments(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Array bytes of each batch the Dask scheduler sends through shared memory from now on."""
    shipped: list[int] = []
    real_ship = SharedRing.ship

    def ship(ring: SharedRing, batch: Any) -> Any:
        result = real_ship(ring, batch)
        if result is not None:
            shipped.append(sum(size for _, size in result[0].spans))
        return result

    monkeypatch.setattr(SharedRing, "ship", ship)
    return shipped


class MainScriptHolder:
    """Stands in for a class of the caller's script: pickled by name it cannot be found."""

    def __init__(self, matrix: np.ndarray) -> None:
        self.matrix = matrix


MainScriptHolder.__module__ = "__main__"


def shared_segments() -> set[str]:
    """Names of the SharedMemory segments that exist now (Python names them psm_...)."""
    return {name for name in os.listdir(SHM_DIRECTORY) if name.startswith("psm_")}


@pytest.mark.skipif(not os.path.isdir(SHM_DIRECTORY), reason="no /dev/shm")
def test_an_embedded_clusters_large_batches_travel_through_shared_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["__main__"], "MainScriptHolder", MainScriptHolder,
                        raising=False)  # as a class of the caller's script is found there
    shipped = counting_shipments(monkeypatch)
    segments_before = shared_segments()
    rng = np.random.default_rng(5)
    matrices = [rng.random((512, 512)) for _ in range(12)]  # 2 MB each
    veda.init(veda.Config.builder().scheduler("dask").dask_cluster("cpu").dask_workers(2)
              .build())
    sums = veda.par_iter(matrices).gpu_map(scaled_column_sums).collect()
    for got, matrix in zip(sums, matrices):
        np.testing.assert_allclose(got, (matrix * 2.0).sum(axis=0))
    same = veda.par_iter(matrices).map(same_array).collect()  # views of the segment there
    for got, matrix in zip(same, matrices):
        np.testing.assert_array_equal(got, matrix)
        assert got.flags.writeable and got.dtype == matrix.dtype
    assert shipped and min(shipped) >= SHARED_MIN_BYTES, shipped
    shipments = len(shipped)
    held = [MainScriptHolder(matrix) for matrix in matrices]  # by value, as cloudpickle sends
    np.testing.assert_allclose(veda.par_iter(held).map(held_total).collect(),
                               [m.sum() for m in matrices])
    assert len(shipped) == shipments  # the worker could not resolve __main__.MainScriptHolder
    assert len(shared_segments() - segments_before) == 1  # the runtime's one ring
    veda.shutdown()
    assert shared_segments() <= segments_before  # unlinked at shutdown


@pytest.mark.skipif(not os.path.isdir(SHM_DIRECTORY), reason="no /dev/shm")
def test_a_cancelled_task_still_running_cannot_write_into_the_next_pipelines_items() -> None:
    veda.init(veda.Config.builder().scheduler("dask").dask_cluster("cpu").dask_workers(2)
              .build())
    first = [np.zeros(1_000_000), np.ones(1_000_000)]  # 8 MB each: through the ring
    with pytest.raises(veda.ParIterError, match="the first item fails at once"):
        veda.par_iter(first).map(overwrite_late_unless_first).collect()
    second = [np.ones(1_000_000) for _ in range(2)]  # the same spans, while item 1 runs on
    assert veda.par_iter(second).map(slow_total).collect() == [1e6, 1e6]
    veda.shutdown()


@pytest.mark.skipif(not os.path.isdir(SHM_DIRECTORY), reason="no /dev/shm")
def test_a_span_is_reused_only_once_it_and_every_older_one_are_released(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.parallel import dask_shared
    from vedart.parallel.batch import Batch

    monkeypatch.setattr(dask_shared, "RING_BYTES", 8 * SHARED_MIN_BYTES)
    ring = SharedRing.create()
    assert ring is not None
    rng = np.random.default_rng(8)
    size = 8 * SHARED_MIN_BYTES // 3 - 4096  # three batches fill the ring
    batches = [Batch([rng.random(size // 8)], [index]) for index in range(4)]
    try:
        shipped = [ring.ship(batch) for batch in batches[:3]]
        assert all(result is not None for result in shipped)
        assert ring.ship(batches[3]) is None  # full: that batch goes as a task argument
        first, second = shipped[0], shipped[1]
        assert first is not None and second is not None
        ring.release(second[1])  # a pipeline that finished first: its span stays held...
        assert ring.ship(batches[3]) is None
        np.testing.assert_array_equal(first[0].load().items[0], batches[0].items[0])
        ring.release(first[1])  # ...until every older span is released
        fourth = ring.ship(batches[3])
        assert fourth is not None
        np.testing.assert_array_equal(fourth[0].load().items[0], batches[3].items[0])
    finally:
        ring.close()


@pytest.mark.parametrize("by_address", [False, True])
def test_a_callers_local_cluster_shares_memory_one_by_address_does_not(
        cluster: Any, monkeypatch: pytest.MonkeyPatch, by_address: bool) -> None:
    shipped = counting_shipments(monkeypatch)
    with distributed.Client(cluster.scheduler_address if by_address else cluster,
                            set_as_default=False) as client:
        on_dask(client)
        matrices = [np.random.default_rng(6).random((512, 512)) for _ in range(4)]
        sums = veda.par_iter(matrices).gpu_map(scaled_column_sums).collect()
        np.testing.assert_allclose(sums[3], (matrices[3] * 2.0).sum(axis=0))
        veda.shutdown()
    # By address, the workers may be on other hosts.
    assert (shipped == []) is by_address, shipped


def test_a_chain_holding_much_data_goes_to_the_cluster_once(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    on_dask(client)
    sent: list[list[Any]] = []
    real_map = type(client).map

    def spying_map(self: Any, function: Any, steps: list[Any], *rest: Any, **kwargs: Any) -> Any:
        sent.append(steps)
        return real_map(self, function, steps, *rest, **kwargs)

    monkeypatch.setattr(type(client), "map", spying_map)
    table = np.random.default_rng(4).random(300_000)  # 2.4 MB in the closure
    doubled = veda.par_iter(range(12), chunk_size=1).map(lambda i: float(table[i] * 2)).collect()
    assert doubled == [float(value * 2) for value in table[:12]]
    chains = [chain for steps in sent for chain in steps]
    assert chains and all(isinstance(chain, distributed.Future) for chain in chains)
    assert len({chain.key for chain in chains}) == 1  # one copy for every task
    small = veda.par_iter(range(4), chunk_size=1).map(lambda i: i * 2).collect()
    assert small == [0, 2, 4, 6] and all(isinstance(chain, bytes) for chain in sent[-1])


def test_info_shows_the_scheduler_and_its_workers(client: Any) -> None:
    on_dask(client, gpu=False)
    info = collect_info(veda.get_runtime())
    dask = info["scheduler"]
    assert dask["address"] == client.scheduler.address and len(dask["workers"]) == 2
    assert all(worker["threads"] == 1 and worker["gpus"] == [] for worker in dask["workers"])
    assert f"Dask scheduler {client.scheduler.address}" in format_info(info)


def test_connecting_by_address_leaves_the_cluster_running(cluster: Any) -> None:
    runtime = veda.init(veda.Config.builder().scheduler("dask")
                        .dask_address(cluster.scheduler_address).build())
    assert runtime.dask is not None and runtime.dask.address == cluster.scheduler_address
    pairs = veda.par_iter(range(30)).map(with_pid).collect()
    assert [value for value, _ in pairs] == list(range(30))
    assert os.getpid() not in {pid for _, pid in pairs}
    veda.shutdown()
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as still:
        assert len(still.nthreads()) == 2


def test_a_callers_client_is_never_closed(client: Any) -> None:
    config = on_dask(client).config
    assert pickle.loads(pickle.dumps(config)).dask_client is None  # it stays in this process
    assert config.as_dict()["dask_client"] == repr(client)
    assert veda.par_iter([3]).map(square).collect() == [9]
    veda.shutdown()
    assert client.status == "running" and client.submit(square, 4).result() == 16


def test_a_chain_holding_much_data_outlives_its_only_worker_and_waits_for_workers() -> None:
    # One worker, killed mid-run: Dask runs the task holding the chain again on the worker
    # the nanny starts. And before it starts, the pipeline waits, as its tasks do.
    with distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as lone, \
            distributed.Client(lone, set_as_default=False) as own:
        on_dask(own)
        table = np.random.default_rng(5).random(300_000)  # 2.4 MB in the closure
        threading.Timer(1.0, lone.scale, (1,)).start()
        victims: list[int] = []

        def source() -> Iterator[int]:
            for value in range(30):
                if value == 10:
                    victims.extend(own.run(os.getpid).values())
                    os.kill(victims[0], signal.SIGKILL)
                yield value

        doubled = veda.par_iter(source(), chunk_size=1).map(
            lambda i: float(table[i] * 2)).collect()
        assert doubled == [float(value * 2) for value in table[:30]] and len(victims) == 1


class _RacingFuture:
    """A task's future whose first timed wait hits distributed's sync() race: it raises
    UnboundLocalError (dask/distributed#8514), and then gives its result."""

    def __init__(self, status: str) -> None:
        self.status, self.waits = status, 0

    def result(self, timeout: float | None = None) -> str:
        self.waits += 1
        if self.waits == 1:
            raise UnboundLocalError("cannot access local variable 'result'")
        return "the batch"


def test_a_result_wait_that_loses_distributeds_timeout_race_waits_again(client: Any) -> None:
    cluster = DaskCluster(client, None, False, timeout=5.0)
    for status in ("pending", "finished"):
        future = _RacingFuture(status)
        assert cluster.result(future) == "the batch" and future.waits == 2
    with pytest.raises(UnboundLocalError):  # a task that failed so: its own error
        cluster.result(_RacingFuture("error"))


def test_a_worker_killed_mid_run_still_gives_each_item_once(client: Any) -> None:
    on_dask(client)
    victim = min(client.run(os.getpid).values())

    def source() -> Iterator[int]:
        for value in range(150):
            if value == 40:
                os.kill(victim, signal.SIGKILL)
            yield value

    assert veda.par_iter(source(), chunk_size=2).map(slow_identity).collect() == \
        list(range(150))
    assert not psutil.pid_exists(victim) or \
        psutil.Process(victim).status() == psutil.STATUS_ZOMBIE


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_address_that_does_not_answer_raises_within_the_timeout() -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    config = veda.Config.builder().scheduler("dask").dask_address(address).dask_timeout(0.5)
    with pytest.raises(veda.SchedulerUnavailableError,
                       match=rf"the Dask scheduler at '{address}' did not answer within "
                             r"dask_timeout=0.5 s"):
        veda.init(config.build())


@pytest.mark.parametrize("first", ["array", "failure", "dict"])
def test_arrays_come_back_from_the_workers_with_their_dtype_and_layout(client: Any,
                                                                       first: str) -> None:
    rng = np.random.default_rng()
    arrays = [rng.random(50).astype(">f4"), np.asfortranarray(rng.random((4, 3))),
              rng.integers(-9, 9, 20).astype(">i8"), rng.random(300_000).astype(">f8")]
    leading = {"array": arrays[0], "failure": None, "dict": {"key": 1}}[first]
    items = [leading, *arrays[1:], types.SimpleNamespace(inside=arrays[0])]
    on_dask(client)
    got = veda.par_iter(items, chunk_size=len(items)).map(same_unless_none).collect(
        errors="return")
    if first == "array":
        assert got[0].dtype.str == ">f4"
        np.testing.assert_array_equal(got[0], arrays[0])
    else:
        assert isinstance(got[0], ValueError) if first == "failure" else got[0] == {"key": 1}
    for result, array in zip([*got[1:4], got[4].inside], [*arrays[1:], arrays[0]]):
        assert result.dtype.str == array.dtype.str
        np.testing.assert_array_equal(result, array)
    assert got[1].flags.f_contiguous


@pytest.mark.parametrize("function, interrupt", [(interrupts_on_three, KeyboardInterrupt),
                                                 (exits_on_three, SystemExit)])
def test_an_interrupt_raised_in_a_worker_reaches_the_caller_and_the_workers_live_on(
        client: Any, function: Callable[[int], int], interrupt: type[BaseException]) -> None:
    on_dask(client)
    before = sorted(client.run(os.getpid).values())
    with pytest.raises(interrupt, match="stop at 3"):
        veda.par_iter(range(6), chunk_size=1).map(function).collect()
    assert sorted(client.run(os.getpid).values()) == before  # none was killed and restarted
    assert veda.par_iter(range(6)).map(square).collect() == [x * x for x in range(6)]


def test_arrays_numpy_pickles_in_band_come_back_with_their_byte_order(client: Any) -> None:
    on_dask(client)
    for n, (strided, timedeltas, fortran) in zip([3, 5], veda.par_iter([3, 5]).map(
            big_endian_arrays).collect()):
        assert (strided.dtype.str, timedeltas.dtype.str, fortran.dtype.str) == \
            (">i4", ">m8[s]", ">m8[s]")
        np.testing.assert_array_equal(strided, np.arange(0, 2 * n, 2))
        np.testing.assert_array_equal(timedeltas, np.arange(n).astype("m8[s]"))
        assert fortran.flags.f_contiguous and not fortran.flags.c_contiguous
        np.testing.assert_array_equal(fortran, np.arange(2 * n).reshape(2, n).astype("m8[s]").T)


@pytest.mark.parametrize(("address", "problem"), [
    ("not an address", "missing port number in address 'not an address'"),
    ("localhost", "missing port number in address 'localhost'"),
    ("foo://bar", "unknown address scheme 'foo'")])
def test_a_malformed_address_is_named_before_a_client_is_made(
        monkeypatch: pytest.MonkeyPatch, address: str, problem: str) -> None:
    made = []
    monkeypatch.setattr(distributed, "Client", lambda *args, **kwargs: made.append(args))
    config = veda.Config.builder().scheduler("dask").dask_address(address).build()
    with pytest.raises(veda.ConfigError) as error:
        veda.init(config)
    assert str(error.value).startswith(
        f"dask_address: got {address!r}; allowed: a Dask scheduler address such as "
        f"'tcp://host:8786' ({problem}")
    assert made == []  # a half-made Client waits out its timeouts when the process exits


def test_a_closed_client_is_refused_at_init_and_fails_a_later_pipeline(cluster: Any) -> None:
    with distributed.Client(cluster, set_as_default=False) as own:
        on_dask(own)
    assert own.status == "closed"
    with pytest.raises(veda.ParIterError, match=r"^par_iter cancelled: the Dask scheduler at "
                                                r"tcp://\S+ went away: the client was closed"):
        veda.par_iter(range(4)).map(abs).collect()
    with pytest.raises(veda.ConfigError, match=r"^dask_client: got a distributed.Client whose "
                                               r"status is 'closed'; allowed: a running Client$"):
        on_dask(own)


@pytest.mark.parametrize("module, extra", [("distributed", "dask"), ("dask_cuda", "dask-cuda")])
def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, module: str,
                                  extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # the import fails as when not installed
    config = veda.Config.builder().scheduler("dask").dask_cluster("cuda").build()
    with pytest.raises(veda.ConfigError, match=rf"needs the '{module}' package.*"
                                               rf"pip install 'vedart\[{extra}\]'"):
        veda.init(config)


def test_the_embedded_cluster_leaves_no_process_behind() -> None:
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    runtime = veda.init(veda.Config.builder().scheduler("dask").dask_workers(1).gpu(False)
                        .build())  # "auto" without a GPU: a LocalCluster on any host
    assert runtime.dask is not None and type(runtime.dask.cluster).__name__ == "LocalCluster"
    assert veda.par_iter(range(5)).map(square).collect() == [0, 1, 4, 9, 16]
    # multiprocessing's resource tracker serves this process until it exits, by design.
    started = [child for child in psutil.Process().children(recursive=True)
               if child.pid not in before and "resource_tracker" not in " ".join(child.cmdline())]
    assert started
    veda.shutdown()
    assert [child.pid for child in started
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE] == []


def test_a_scheduler_that_goes_away_fails_the_pipeline_without_hanging() -> None:
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as doomed:
        veda.init(veda.Config.builder().scheduler("dask").dask_address(doomed.scheduler_address)
                  .dask_timeout(2).build())

        def source() -> Iterator[int]:
            for value in range(100):
                if value == 10:
                    doomed.close()  # the scheduler and its worker go away mid-run
                yield value

        with pytest.raises(veda.ParIterError, match=r"the Dask scheduler at tcp://\S+ went "
                                                    r"away"):
            veda.par_iter(source(), chunk_size=1).map(slow_identity).collect()
        veda.shutdown()


def test_the_bench_checks_results_and_skips_the_gpu_row_with_its_reason() -> None:
    from vedart.bench import dask as bench

    result = bench.run(quick=True, items=20, workers=1, matrices=4)
    python = result["python_map"]
    assert python["items"] == 20 and python["workers"] == 1 and python["speedup"] > 0
    if result["gpu_map"] is not None:  # a host with a GPU and dask-cuda
        assert result["gpu_map"]["matrices"] == 4 and result["gpu_map"]["ratio"] > 0
        assert (result["gpu_map"]["cost_model"], result["static_gpu_map"]["cost_model"]) == \
            ("default", "static")
        return
    assert result["gpu_note"].startswith(("no GPU", "dask-cuda not installed"))
    assert f"gpu_map on a LocalCUDACluster: skipped: {result['gpu_note']}" in \
        bench.format_table(result)


def test_the_bench_table_holds_the_default_row_against_the_target_and_the_static_row() -> None:
    from vedart.bench import dask as bench

    def gpu_row(cost_model: str, ratio: float) -> dict[str, Any]:
        return {"matrices": 64, "shape": [1000, 1000], "cost_model": cost_model, "gpus": 1,
                "threads_s": 0.1, "dask_s": 0.1 * ratio, "ratio": ratio}

    result = {"python_map": {"items": 2000, "item_ms": 2.0, "threads": 16, "workers": 8,
                             "threads_s": 4.0, "dask_s": 0.8, "speedup": 5.0},
              "gpu_map": gpu_row("default", 1.6), "static_gpu_map": gpu_row("static", 1.1)}
    lines = bench.format_table(result).splitlines()
    assert lines[1].startswith("default config, gpu_map over 64") and \
        lines[1].endswith("ratio 1.60x (target <= 1.5) MISSED")
    assert lines[2].startswith("static config, gpu_map over 64") and \
        lines[2].endswith("ratio 1.10x")


def test_a_workers_config_keeps_the_clients_settings_and_drops_what_is_the_clients() -> None:
    from vedart.parallel.dask_worker import worker_config

    client_side = veda.Config.builder().scheduler("dask").dask_address("tcp://h:1") \
        .offload_threshold("5MB").devices([1, 2]).progress(True).build()
    on_cpu = worker_config(client_side, 3, own_gpu=False)
    assert (on_cpu.scheduler, on_cpu.dask_address, on_cpu.threads, on_cpu.devices,
            on_cpu.progress, on_cpu.device_processes) == ("threads", None, 3, None, False, False)
    assert on_cpu.offload_threshold == 5_000_000
    assert worker_config(client_side, 1, own_gpu=True).devices == (0,)  # dask-cuda: its own


@pytest.mark.parametrize(("stop", "task", "items"), [
    ("shutdown", half_second_identity, 8), ("close the client", half_second_identity, 8),
    ("shutdown", short_identity, 400)])  # tasks quicker than a result wait's poll
@pytest.mark.parametrize("errors", ["skip", "raise"])
def test_a_pipeline_on_a_callers_client_stopped_midway_raises_and_loses_nothing_silently(
        cluster: Any, stop: str, task: Callable[[int], int], items: int, errors: str) -> None:
    with distributed.Client(cluster, set_as_default=False) as own:
        on_dask(own)
        stopper = threading.Timer(0.3, veda.shutdown if stop == "shutdown" else own.close)
        stopper.start()
        try:
            with pytest.raises(veda.ParIterError, match="par_iter cancelled: the "
                               + ("runtime's scheduler was shut down" if stop == "shutdown"
                                  else "Dask scheduler at tcp://.* went away")):
                veda.par_iter(range(items), chunk_size=1).map(task).collect(errors=errors)
        finally:
            stopper.join()


class HoldsALock(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


async def fetch_failing_three_to_six(x: int) -> int:
    if 3 <= x <= 6:
        raise HoldsALock("connection reset")
    return x


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_items_that_failed_upstream_stay_in_the_client_in_their_places(
        client: Any, chunk_size: int | None) -> None:
    def run(errors: str) -> Any:
        return outcome(lambda: [repr(value) for value in veda.par_iter(
            range(10), chunk_size=chunk_size).async_map(fetch_failing_three_to_six).map(
            square).collect(errors=errors)])

    on_threads = {}
    veda.init(veda.Config.builder().threads(2).build())
    for errors in ("skip", "return", "raise"):
        on_threads[errors] = run(errors)
    on_dask(client)
    for errors in ("skip", "return", "raise"):
        assert run(errors) == on_threads[errors], errors
    assert on_threads["skip"] == ("ok", ["0", "1", "4", "49", "64", "81"])


@pytest.mark.parametrize("positional", ["enumerate", "chunk"])
def test_failures_of_one_dask_stage_keep_their_places_through_the_next(
        client: Any, positional: str) -> None:
    def run(errors: str) -> Any:  # (1, 0) fails, (1, 1) of the same source index does not
        pipeline = veda.par_iter(range(4)).flat_map(pair_up).map(fails_on_one_zero)
        pipeline = pipeline.enumerate() if positional == "enumerate" else pipeline.chunk(3)
        return outcome(lambda: [repr(value) for value in pipeline.map(same_array).collect(
            errors=errors)] + [repr(value) for value in pipeline.map(same_array).take(
            1).collect(errors=errors)])

    veda.init(veda.Config.builder().threads(2).build())
    on_threads = {errors: run(errors) for errors in ("skip", "return", "raise")}
    on_dask(client)
    for errors in ("skip", "return", "raise"):
        assert run(errors) == on_threads[errors], errors


MAIN_SCRIPT_CALLING_A_GPU_FUNCTION = """
import numpy as np
import vedart as veda

@veda.gpu
def doubled(values):
    return values * 2

def doubled_plus_one(values):
    return doubled(values) + 1

if __name__ == "__main__":
    veda.init(veda.Config.builder().scheduler("dask").dask_cluster("cpu").dask_workers(1)
              .build())
    items = [np.full(4, float(number)) for number in range(3)]
    print([float(got[0]) for got in veda.par_iter(items).map(doubled_plus_one).collect()])
    print([float(got[0]) for got in veda.par_iter(items).map(lambda v: doubled(v)).collect()])
    veda.shutdown()
"""


def test_a_main_script_function_calling_its_gpu_function_runs_on_dask(tmp_path: Any) -> None:
    script = tmp_path / "main_script.py"
    script.write_text(MAIN_SCRIPT_CALLING_A_GPU_FUNCTION)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["[1.0, 3.0, 5.0]", "[0.0, 2.0, 4.0]"]
