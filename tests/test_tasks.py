"""Task and TaskThreads: run-once, cancellation, waiting with and without a timeout, helping,
FIFO order, idle counts, and closing with or without the queued tasks."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import CancelledError

import pytest

from vedart.tasks import Task, TaskThreads, drain


def test_a_task_runs_once_and_every_waiter_sees_its_value() -> None:
    runs: list[int] = []
    started = threading.Event()
    release = threading.Event()

    def work() -> int:
        runs.append(1)
        started.set()
        release.wait()
        return 42

    task: Task[int] = Task(work)
    assert task.claim() and not task.claim()
    runner = threading.Thread(target=task.run)
    runner.start()
    started.wait()
    seen: list[int] = []
    waiters = [threading.Thread(target=lambda: seen.append(task.result())) for _ in range(4)]
    for waiter in waiters:
        waiter.start()
    assert not task.wait(timeout=0.02)  # still running
    release.set()
    for thread in [runner, *waiters]:
        thread.join()
    assert seen == [42] * 4 and runs == [1]
    assert task.wait(timeout=0) and task.wait()


def test_a_helpable_task_runs_in_the_waiting_thread_and_keeps_its_exception() -> None:
    ran_on: list[str] = []

    def work() -> None:
        ran_on.append(threading.current_thread().name)
        raise ValueError("bad item")

    task: Task[None] = Task(work)
    with pytest.raises(ValueError, match="bad item"):
        task.result()
    with pytest.raises(ValueError, match="bad item"):  # kept, not run again
        task.result()
    assert ran_on == [threading.current_thread().name]


def test_a_cancelled_task_never_runs_and_releases_its_waiters() -> None:
    task: Task[int] = Task(lambda: 1, helpable=False)
    waiter_result: list[BaseException] = []

    def wait() -> None:
        try:
            task.result()
        except CancelledError as error:
            waiter_result.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.01)
    assert task.cancel() and task.cancel()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and len(waiter_result) == 1
    assert not task.claim()
    running: Task[int] = Task(lambda: 1)
    assert running.claim() and not running.cancel()  # started: cannot be cancelled


def test_task_threads_run_in_fifo_order_and_count_idle_threads() -> None:
    threads = TaskThreads(1, "test-fifo")
    try:
        order: list[int] = []
        tasks = [threads.submit(Task(lambda n=n: order.append(n), helpable=False))
                 for n in range(20)]
        for task in tasks:
            task.wait()
        assert order == list(range(20))
        deadline = time.monotonic() + 5
        while threads.idle() != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert threads.idle() == 1
        assert {thread.name for thread in threading.enumerate()} >= {"test-fifo-0"}
    finally:
        threads.close(cancel_queued=True)
        threads.join()


@pytest.mark.parametrize("cancel_queued", [True, False])
def test_closing_cancels_or_drains_the_queue_and_refuses_new_tasks(cancel_queued: bool) -> None:
    threads = TaskThreads(1, "test-close")
    started, release = threading.Event(), threading.Event()

    def block() -> bool:
        started.set()
        return release.wait()

    blocker = threads.submit(Task(block, helpable=False))
    started.wait()
    queued = [threads.submit(Task(lambda n=n: n, helpable=False)) for n in range(3)]
    threads.close(cancel_queued=cancel_queued)
    release.set()
    threads.join()
    assert blocker.result() is True
    if cancel_queued:
        for task in queued:
            with pytest.raises(CancelledError):
                task.result()
    else:
        assert [task.result() for task in queued] == [0, 1, 2]
    late = threads.submit(Task(lambda: 1, helpable=False))
    with pytest.raises(CancelledError):
        late.result()
    assert not any(thread.name.startswith("test-close") for thread in threading.enumerate())


class Payload:
    """A value whose lifetime a test follows."""


@pytest.mark.parametrize("fails", [False, True])
def test_a_worker_thread_keeps_nothing_of_its_last_task(fails: bool) -> None:
    pool = TaskThreads(1, "test-keep")
    payloads: list[weakref.ref[Payload]] = []

    def work() -> Payload:
        payload = Payload()
        payloads.append(weakref.ref(payload))
        if fails:  # the traceback holds the frame, and with it the payload
            raise ValueError("item failed")
        return payload

    task = pool.submit(Task(work))
    if fails:
        with pytest.raises(ValueError):
            task.result()
    else:
        task.result()
    del task
    for _ in range(200):  # until the thread is back waiting for a next task, which never comes
        gc.collect()  # the failure's traceback and its frames hold one another
        if payloads[0]() is None:
            break
        time.sleep(0.01)
    assert payloads[0]() is None  # what the waiter dropped is gone
    pool.close(cancel_queued=False)
    pool.join()


def test_waiting_without_time_only_looks() -> None:
    task: Task[int] = Task(lambda: 1)
    assert not task.wait(timeout=0) and not task.wait(timeout=-1)
    assert task.result() == 1
    assert task.wait(timeout=0) and task.wait(timeout=-1)


EXIT_SCRIPT = """
import atexit, sys, time
from vedart.tasks import Task, TaskThreads, drain
done = []
atexit.register(lambda: print("atexit sees the task done:", bool(done), flush=True))
threads = TaskThreads(1, "exit-test", finish_at_exit=sys.argv[1] == "finish")
threads.submit(Task(lambda: (time.sleep(0.3), done.append(1)), helpable=False))
"""


@pytest.mark.parametrize(("mode", "done"), [("finish", True), ("leave", False)])
def test_finish_at_exit_runs_queued_tasks_before_atexit_handlers(mode: str, done: bool) -> None:
    result = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, mode], capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.strip() == f"atexit sees the task done: {done}"


def test_drain_takes_what_a_queue_holds_without_waiting() -> None:
    import queue

    source: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    for value in (1, None, 3):
        source.put(value)
    assert drain(source) == [1, None, 3]
    assert drain(source) == [] and source.empty()
