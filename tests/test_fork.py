"""A process forked after vedart started (multiprocessing's fork start method): the child gets
a fresh runtime from the parent's configuration, runs @gpu calls on the CPU with the reason,
runs pipelines on threads of its own, and leaves the parent's device worker processes alone.
Each child has a time limit, so a hang fails the test instead of stalling CI."""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import worker_functions as wf
from fakes import FakeProbe
from numba import cuda

import vedart as veda
from vedart.errors import GPUUnavailableError
from vedart.kernels.registry import gpu_kernel
from vedart.lifecycle import FORKED_CHILD_REASON
from vedart.locks import renew_in_child

CHILD_LIMIT_S = 60.0
# Python 3.12+ warns at every fork of a process with threads; forking one is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks")


@veda.gpu
def scaled(x: np.ndarray) -> np.ndarray:
    return np.sqrt(x) * 3.0 + 1.0


kernel_started = threading.Event()
kernel_may_finish = threading.Event()


@gpu_kernel(threads_per_block=8)
@cuda.jit
def add_one_once_let(a):  # type: ignore[no-untyped-def]
    """Adds 1 to every element; its thread 0 first waits for ``kernel_may_finish``."""
    i = cuda.grid(1)
    if i == 0:
        kernel_started.set()
        kernel_may_finish.wait(CHILD_LIMIT_S)
    if i < a.size:
        a[i] += 1


def thread_name(item: int) -> str:
    time.sleep(0.002)  # long enough for the pool's workers to take items
    return threading.current_thread().name


def in_forked_child(work: Callable[[], Any]) -> Any:
    """``work()``'s value, computed in a child forked now; its exception's text, raised here,
    when it failed; AssertionError when the child did not answer within CHILD_LIMIT_S."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def run() -> None:
        try:
            answers.put(("ok", work()))
        except BaseException as error:  # noqa: BLE001  # reported to the parent
            answers.put(("failed", f"{type(error).__name__}: {error}"))

    child = context.Process(target=run, daemon=True)
    child.start()
    try:
        try:
            status, value = answers.get(timeout=CHILD_LIMIT_S)
        except queue.Empty:
            raise AssertionError(f"the forked child hung or died (exit code {child.exitcode}) "
                                 f"without answering within {CHILD_LIMIT_S:.0f} s") from None
        assert status == "ok", value
        child.join(CHILD_LIMIT_S)
        assert child.exitcode == 0, f"the forked child ended with exit code {child.exitcode}"
        return value
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def child_gpu_call_and_pipelines() -> dict[str, Any]:
    x = np.random.default_rng().random(5000)
    return {
        "x": x, "value": scaled(x),
        "reason": scaled.explain(x).reason,
        "threads": veda.par_iter(range(200)).map(thread_name).collect(),
        "gpu_map": veda.par_iter([x, x * 2]).gpu_map(scaled).collect(),
        "config_threads": veda.get_runtime().config.threads,
    }


def test_a_forked_child_runs_gpu_calls_on_the_cpu_with_the_reason_and_pipelines_on_threads(
        ) -> None:
    veda.init(veda.Config.builder().cost_model("static").threads(3).build(),
              device_probe=FakeProbe(count=1))
    x = np.random.default_rng().random(100)
    np.testing.assert_allclose(scaled(x), np.sqrt(x) * 3.0 + 1.0)  # the plan of this runtime
    assert veda.par_iter(range(20)).map(thread_name).count() == 20  # its workers started
    got = in_forked_child(child_gpu_call_and_pipelines)
    x_child = got["x"]
    np.testing.assert_allclose(got["value"], np.sqrt(x_child) * 3.0 + 1.0)
    assert got["value"].dtype == np.float64
    assert got["reason"] == f"no GPU: {FORKED_CHILD_REASON}"
    assert any(name.startswith("vedart-worker") for name in got["threads"]), got["threads"]
    assert got["config_threads"] == 3  # the parent's configuration
    for result, item in zip(got["gpu_map"], (x_child, x_child * 2), strict=True):
        np.testing.assert_allclose(result, np.sqrt(item) * 3.0 + 1.0)
    # The parent's runtime is untouched.
    assert veda.get_runtime().gpu and scaled.explain(x).reason != f"no GPU: {FORKED_CHILD_REASON}"
    assert veda.par_iter(range(20)).map(thread_name).count() == 20


def test_a_child_forked_before_any_gpu_keeps_its_gpu_probe() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    assert in_forked_child(lambda: scaled.explain(np.ones(3)).reason) == \
        "GPU disabled by config"


def test_a_forked_child_leaves_the_parents_device_worker_processes_alone() -> None:
    runtime = veda.init(veda.Config.builder().cost_model("static").threads(2).build(),
                        device_probe=FakeProbe(count=2))
    arrays = [np.full(2, i) for i in range(10)]
    pids = veda.par_iter(arrays).gpu_map(wf.pid_of_item).collect()
    assert os.getpid() not in pids
    workers = runtime.scheduler.lanes("processes", lambda: None)

    def shut_down_and_exit() -> int:
        veda.shutdown()
        workers.shutdown()  # what the child's atexit runs when it exits normally
        return os.getpid()

    assert in_forked_child(shut_down_and_exit) != os.getpid()
    assert all(worker.broken is None for worker in workers.workers)
    again = veda.par_iter(arrays).gpu_map(wf.pid_of_item).collect()
    assert set(again) <= set(pids) and os.getpid() not in again


def test_a_staging_loop_loading_at_the_fork_loads_afresh_in_the_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu.transfer import STAGING_LOOP

    for name in ("_load", "_lock", "_loaded", "_thread", "_calls"):  # restored at the end
        monkeypatch.setattr(STAGING_LOOP, name, getattr(STAGING_LOOP, name))
    release = threading.Event()

    def slow_load() -> Any:
        release.wait()
        return "loaded"

    STAGING_LOOP.forget()
    STAGING_LOOP._load = slow_load
    assert STAGING_LOOP.calls() is None  # loading, on a thread the child will not have

    def child() -> Any:
        release.set()
        return STAGING_LOOP.wait(10)

    try:
        assert in_forked_child(child) == "loaded"
    finally:
        release.set()
        assert STAGING_LOOP.wait(10) == "loaded"


def test_a_child_forked_while_the_loop_loads_gets_the_switch_interval_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu.transfer import STAGING_LOOP

    for name in ("_load", "_lock", "_loaded", "_thread", "_calls"):  # restored at the end
        monkeypatch.setattr(STAGING_LOOP, name, getattr(STAGING_LOOP, name))
    before, release = sys.getswitchinterval(), threading.Event()
    STAGING_LOOP.forget()
    STAGING_LOOP._load = lambda: release.wait(10) and "loaded"
    assert STAGING_LOOP.calls() is None  # loading, with the interval lowered meanwhile
    try:
        assert sys.getswitchinterval() < before
        assert in_forked_child(sys.getswitchinterval) == before  # no loader thread there
    finally:
        release.set()
        assert STAGING_LOOP.wait(10) == "loaded"
    assert sys.getswitchinterval() == before


class Guarded:
    """An object whose lock a forked child gets back unlocked."""

    def __init__(self, reentrant: bool) -> None:
        self.lock = threading.RLock() if reentrant else threading.Lock()
        renew_in_child(self, "lock")


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child(
        reentrant: bool) -> None:
    guarded = Guarded(reentrant)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with guarded.lock:
            held.set()
            release.wait(CHILD_LIMIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(CHILD_LIMIT_S)

        def child() -> list[bool]:
            taken = [guarded.lock.acquire(timeout=5)]
            guarded.lock.release()
            return taken + [guarded.lock.acquire(blocking=False)]

        assert in_forked_child(child) == [True, True]
        assert not guarded.lock.acquire(blocking=False)  # the parent's holder still has it
    finally:
        release.set()
        holder.join()
    assert guarded.lock.acquire(timeout=5)
    guarded.lock.release()


def test_a_reentrant_lock_the_forking_thread_holds_stays_its_own_in_the_child() -> None:
    guarded = Guarded(reentrant=True)

    def child() -> list[bool]:
        guarded.lock.release()  # the with block below, in the child: it must not raise
        return [guarded.lock.acquire(blocking=False)]

    with guarded.lock:
        assert in_forked_child(child) == [True]


def test_a_child_forked_while_a_simulated_kernel_runs_says_it_cannot_simulate_kernels(
        ) -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    kernel_started.clear()
    kernel_may_finish.clear()
    parents = np.random.default_rng().random(16).astype(np.float32)
    expected = parents + 1
    running = threading.Thread(target=add_one_once_let, args=(parents,))
    running.start()
    try:
        assert kernel_started.wait(CHILD_LIMIT_S)

        def child() -> tuple[str, bool]:
            kernel_may_finish.set()  # the child's own copy
            values = np.random.default_rng().random(16).astype(np.float32)
            before = values.copy()
            try:
                add_one_once_let(values)
            except GPUUnavailableError as error:
                return str(error), bool((values == before).all())
            return "no error", False

        message, untouched = in_forked_child(child)
        assert message.startswith("cannot simulate add_one_once_let: this process was forked "
                                  "while another thread simulated a kernel"), message
        assert "'spawn'" in message
        assert untouched
    finally:
        kernel_may_finish.set()
        running.join(CHILD_LIMIT_S)
    np.testing.assert_allclose(parents, expected)
    again = np.random.default_rng().random(16).astype(np.float32)
    before = again.copy()
    kernel_may_finish.set()
    add_one_once_let(again)  # the parent simulates as before
    np.testing.assert_allclose(again, before + 1)
