"""par_iter's async_map: coroutines awaited concurrently on one event loop per pipeline run,
bounded, in input order, with errors reported as the other stages report them."""

from __future__ import annotations

import asyncio
import random
import threading
from contextvars import ContextVar
from typing import Any

import pytest

import vedart as veda
from vedart.errors import ConfigError, ParIterError
from vedart.offload.force import forced_path
from vedart.parallel.async_map import DEFAULT_CONCURRENCY
from vedart.parallel.par_iter import par_iter


def test_calls_overlap_up_to_the_concurrency_and_no_further() -> None:
    concurrency, count = 4, 12
    started, active, peak = [0], [0], [0]

    async def gated(x: int) -> int:
        started[0] += 1
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        wave_end = min(concurrency * (x // concurrency + 1), count)
        for _ in range(5000):  # a wave passes once all its calls are under way together
            if started[0] >= wave_end:
                break
            await asyncio.sleep(0.001)
        else:
            raise TimeoutError(f"item {x}: only {started[0]} calls started")
        active[0] -= 1
        return x * 10

    assert par_iter(range(count)).async_map(gated, concurrency=concurrency).collect() == \
        [x * 10 for x in range(count)]
    assert peak[0] == concurrency


def test_results_come_in_input_order_whatever_order_the_calls_finish_in() -> None:
    rng = random.Random(5)
    delays = [rng.random() * 0.02 for _ in range(100)]

    async def late(x: int) -> str:
        await asyncio.sleep(delays[x])
        return f"item {x}"

    assert par_iter(range(100)).async_map(late).map(str.upper).collect() == \
        [f"ITEM {x}" for x in range(100)]
    assert par_iter(range(100)).map(lambda x: x % 7).async_map(late).count() == 100


def test_plain_functions_and_functions_returning_awaitables_are_accepted() -> None:
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    def returns_coroutine(x: int) -> Any:
        return double(x)

    assert par_iter(range(6)).async_map(lambda x: x + 1).collect() == [1, 2, 3, 4, 5, 6]
    assert par_iter(range(6)).async_map(returns_coroutine).collect() == [0, 2, 4, 6, 8, 10]
    pending = par_iter([[1, 2], [3]]).async_map(len)
    assert pending.sum() == 3 and repr(pending).endswith("#1 async_map(len))")


def test_one_event_loop_per_pipeline_run_off_the_calling_thread() -> None:
    async def where(_: int) -> tuple[asyncio.AbstractEventLoop, int]:
        return asyncio.get_running_loop(), threading.get_ident()

    pipeline = par_iter(range(30)).async_map(where)
    first, second = pipeline.collect(), pipeline.collect()  # holding the loops: ids stay apart
    for run in (first, second):
        assert len({id(loop) for loop, _ in run}) == 1
    assert first[0][0] is not second[0][0]  # a loop of its own for each run
    assert first[0][0].is_closed() and second[0][0].is_closed()
    assert first[0][1] != threading.get_ident()


def test_a_failed_call_names_its_index_and_stage_and_errors_options_apply() -> None:
    async def fails_on_three(x: int) -> int:
        await asyncio.sleep(0.001 * (5 - x % 5))
        if x == 3:
            raise ValueError("three")
        return x

    pipeline = par_iter(range(10)).map(lambda x: x).async_map(fails_on_three)
    with pytest.raises(ParIterError) as caught:
        pipeline.collect()
    assert caught.value.index == 3 and caught.value.stage == "#2 async_map(fails_on_three)"
    assert isinstance(caught.value.__cause__, ValueError)
    returned = pipeline.collect(errors="return")
    assert isinstance(returned[3], ValueError)
    assert [r for i, r in enumerate(returned) if i != 3] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert pipeline.collect(errors="skip") == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    # An item that failed upstream is passed on, not called.
    upstream = par_iter([1, 0, 2]).map(lambda x: 1 // x).async_map(fails_on_three)
    assert upstream.collect(errors="skip") == [1, 0]


@pytest.mark.timeout(30)  # the other items' tasks must not be left waiting
def test_a_system_exit_in_a_call_reaches_the_caller_as_it_is() -> None:
    async def exits_on_two(x: int) -> int:
        await asyncio.sleep(0.001)
        if x == 2:
            raise SystemExit(3)
        return x

    with pytest.raises(SystemExit) as caught:
        par_iter(range(10)).async_map(exits_on_two, concurrency=4).collect()
    assert caught.value.code == 3
    assert par_iter(range(2)).async_map(exits_on_two).collect() == [0, 1]


def test_an_early_end_cancels_the_calls_under_way() -> None:
    waiting: list[int] = []
    cleaned: list[int] = []

    async def endless_wait(x: int) -> int:
        if x < 2:
            while not waiting:  # the first two end once a call that never ends is under way
                await asyncio.sleep(0.001)
            return x
        waiting.append(x)
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(x)
        return x

    assert par_iter(iter(int, 1)).enumerate().map(lambda pair: pair[0]) \
        .async_map(endless_wait, concurrency=5).take(2).collect() == [0, 1]
    assert waiting and sorted(cleaned) == sorted(waiting)  # every call under way was cancelled
    assert max(waiting) <= 6  # no more than 5 were in flight


REQUEST_ID: ContextVar[str] = ContextVar("REQUEST_ID", default="none")


def test_the_context_around_the_pipeline_applies_to_its_calls() -> None:
    async def seen(_: int) -> tuple[str, str | None]:
        return REQUEST_ID.get(), forced_path.get()

    token = REQUEST_ID.set("request 7")
    try:
        with veda.force("cpu"):
            assert par_iter(range(3)).async_map(seen).collect() == [("request 7", "cpu")] * 3
    finally:
        REQUEST_ID.reset(token)


@pytest.mark.parametrize("concurrency", [0, -1, 2.5, True, "8", None])
def test_a_bad_concurrency_is_refused_before_anything_runs(concurrency: Any) -> None:
    with pytest.raises(ConfigError, match=rf"async_map\(concurrency\): got {concurrency!r}; "
                                          r"allowed: an int >= 1"):
        par_iter([1]).async_map(lambda x: x, concurrency=concurrency)
    with pytest.raises(TypeError, match=r"async_map\(f\): got 3 of type int; allowed: a callable"):
        par_iter([1]).async_map(3)  # type: ignore[arg-type]
    assert DEFAULT_CONCURRENCY >= 1


def test_shutdown_during_an_async_map_pipeline_raises_par_iter_error() -> None:
    started = threading.Event()
    cancelled: list[int] = []

    async def slow(x: int) -> int:
        started.set()
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cancelled.append(x)
            raise
        return x

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = par_iter(range(2_000)).async_map(slow, concurrency=2).collect()
        except ParIterError as error:
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    veda.shutdown()
    thread.join(30)
    assert not thread.is_alive()
    assert "scheduler was shut down" in str(outcome.get("error")), outcome.keys()
    assert not [each.name for each in threading.enumerate()
                if each.name.startswith("vedart-async-map")]
    assert par_iter(range(3)).async_map(slow).collect() == [0, 1, 2]  # a new runtime


def test_an_async_map_pipeline_starts_no_worker_pool() -> None:
    veda.init(veda.Config.builder().threads(3).build())

    async def twice(x: int) -> int:
        return 2 * x

    assert par_iter(range(5)).async_map(twice).collect() == [0, 2, 4, 6, 8]
    assert not [each.name for each in threading.enumerate()
                if each.name.startswith("vedart-worker")]
