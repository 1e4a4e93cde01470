"""par_iter without a GPU: adapters and terminals against Python builtins, order, exactly-once,
laziness, bounded read-ahead, errors, cancellation, nested pipelines, shutdown and re-init,
progress display."""

from __future__ import annotations

import functools
import gc
import io
import itertools
import sys
import threading
import time
import tracemalloc
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vedart as veda
from vedart.errors import ConfigError, ParIterError
from vedart.parallel.par_iter import ParIter, par_iter
from vedart.parallel.progress import PlainProgress
from vedart.parallel.scheduler import MAX_CHUNK, WINDOW_PER_THREAD, Scheduler
from vedart.tasks import Task

THREADS = 4
examples = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
int_lists = st.lists(st.integers(-1000, 1000), max_size=60)
chunk_sizes = st.none() | st.integers(1, 7)


@pytest.fixture(autouse=True)
def runtime() -> veda.Runtime:
    return veda.init(veda.Config.builder().gpu(False).threads(THREADS).build())


def naturals() -> Iterator[int]:
    yield from itertools.count()


class CountingSource:
    """An endless source that counts the items it has yielded."""

    def __init__(self) -> None:
        self.produced = 0

    def __iter__(self) -> Iterator[int]:
        while True:
            self.produced += 1
            yield self.produced - 1


# --- adapters and terminals against builtins ----------------------------------------------

def triple_plus_one(x: int) -> int:
    return 3 * x + 1


def is_even(x: int) -> bool:
    return x % 2 == 0


def repeat_by_mod3(x: int) -> list[int]:
    return [x] * (x % 3)


def chunked(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


Adapter = Callable[[ParIter[Any]], ParIter[Any]]
ADAPTERS: list[tuple[str, Adapter, Callable[[list[Any]], list[Any]]]] = [
    ("map", lambda p: p.map(triple_plus_one), lambda xs: list(map(triple_plus_one, xs))),
    ("filter", lambda p: p.filter(is_even), lambda xs: list(filter(is_even, xs))),
    ("flat_map", lambda p: p.flat_map(repeat_by_mod3),
     lambda xs: list(itertools.chain.from_iterable(map(repeat_by_mod3, xs)))),
    ("enumerate", lambda p: p.enumerate(5), lambda xs: list(enumerate(xs, 5))),
    ("zip", lambda p: p.zip(range(40), "abcdefghijklmnopqrstuvwxyz"),
     lambda xs: list(zip(xs, range(40), "abcdefghijklmnopqrstuvwxyz"))),
    ("take", lambda p: p.take(7), lambda xs: list(itertools.islice(xs, 7))),
    ("skip", lambda p: p.skip(7), lambda xs: list(itertools.islice(xs, 7, None))),
    ("chunk", lambda p: p.chunk(4), lambda xs: chunked(xs, 4)),
]


@pytest.mark.parametrize(("name", "adapter", "builtin"), ADAPTERS, ids=[a[0] for a in ADAPTERS])
@examples
@given(items=int_lists, chunk_size=chunk_sizes)
def test_adapter_equals_builtin(name: str, adapter: Adapter,
                                builtin: Callable[[list[Any]], list[Any]], items: list[int],
                                chunk_size: int | None) -> None:
    assert adapter(par_iter(items, chunk_size)).collect() == builtin(items)


@examples
@given(items=int_lists, chunk_size=chunk_sizes, skip=st.integers(0, 10), take=st.integers(0, 50),
       size=st.integers(1, 5))
def test_composed_pipeline_equals_builtins(items: list[int], chunk_size: int | None, skip: int,
                                           take: int, size: int) -> None:
    pipeline = (par_iter(items, chunk_size).map(triple_plus_one).filter(is_even)
                .flat_map(repeat_by_mod3).skip(skip).enumerate().map(lambda pair: pair[0] * pair[1])
                .take(take).chunk(size).map(sum))
    expected = itertools.islice(itertools.chain.from_iterable(
        map(repeat_by_mod3, filter(is_even, map(triple_plus_one, items)))), skip, None)
    expected_values = [i * v for i, v in enumerate(expected)][:take]
    assert pipeline.collect() == [sum(c) for c in chunked(expected_values, size)]


@examples
@given(items=int_lists, chunk_size=chunk_sizes)
def test_terminals_equal_builtins(items: list[int], chunk_size: int | None) -> None:
    pipeline = par_iter(items, chunk_size)

    def sub(accumulated: int, x: int) -> int:  # neither associative nor commutative
        return accumulated * 2 - x

    assert pipeline.fold(7, sub) == functools.reduce(sub, items, 7)
    assert pipeline.sum() == sum(items) and pipeline.sum(10) == sum(items, 10)
    assert pipeline.count() == len(items)
    assert pipeline.min(default=None) == min(items, default=None)
    assert pipeline.max(key=abs, default="none") == max(items, key=abs, default="none")
    assert pipeline.min(key=lambda x: x % 7, default=0) == min(items, key=lambda x: x % 7,
                                                               default=0)
    assert pipeline.any(is_even) == any(map(is_even, items))
    assert pipeline.all(is_even) == all(map(is_even, items))
    assert pipeline.any() == any(items) and pipeline.all() == all(items)
    assert pipeline.to_dict(lambda x: x % 5) == {x % 5: x for x in items}
    seen: list[int] = []
    lock = threading.Lock()

    def record(x: int) -> None:
        with lock:
            seen.append(x)

    assert pipeline.for_each(record) is None
    assert sorted(seen) == sorted(items)
    if items:
        assert pipeline.reduce(sub) == functools.reduce(sub, items)


class Item:
    """An item whose lifetime a test follows."""

    def __init__(self, index: int) -> None:
        self.index = index


def _fails_at_ten(item: Item) -> int:
    if item.index == 10:
        raise ValueError("item 10")
    return item.index


@pytest.mark.parametrize("fails", [False, True])
def test_a_finished_pipeline_keeps_none_of_its_items(fails: bool) -> None:
    items = [Item(i) for i in range(30)]
    alive = [weakref.ref(item) for item in items]
    stage = _fails_at_ten if fails else (lambda item: item)
    try:
        veda.par_iter(items).map(stage).collect()
    except ParIterError:
        pass
    del items
    for _ in range(200):  # until the worker threads are back waiting for work
        gc.collect()
        if not any(ref() is not None for ref in alive):
            break
        time.sleep(0.01)
    assert [ref() for ref in alive if ref() is not None] == []


def test_empty_pipeline_terminals_raise_like_builtins() -> None:
    with pytest.raises(ValueError, match="empty"):
        par_iter([]).min()
    with pytest.raises(ValueError, match="empty"):
        par_iter([]).max(key=abs)
    with pytest.raises(TypeError, match="reduce\\(\\) of an empty pipeline"):
        par_iter([]).reduce(lambda a, b: a + b)


def test_float_sum_matches_builtin_exactly() -> None:
    values = [0.1 * i for i in range(20_000)]
    assert par_iter(values).map(lambda x: x * 1.5).sum() == sum(x * 1.5 for x in values)


# --- order, exactly once, laziness, bounded read-ahead ----------------------------------

def test_results_come_in_input_order_when_items_finish_out_of_order() -> None:
    def slow_for_small(x: int) -> int:
        time.sleep(0.002 * (x % 5 == 0))
        return x

    assert par_iter(range(300), chunk_size=1).map(slow_for_small).collect() == list(range(300))


def test_every_item_is_processed_exactly_once() -> None:
    counts: Counter[int] = Counter()
    lock = threading.Lock()

    def count(x: int) -> int:
        with lock:
            counts[x] += 1
        return x

    assert par_iter(range(20_000)).map(count).filter(lambda x: True).sum() == sum(range(20_000))
    assert counts == Counter(range(20_000))


def test_adapters_are_lazy() -> None:
    source = CountingSource()
    pipeline = par_iter(source).map(triple_plus_one).filter(is_even).take(3)
    assert source.produced == 0
    assert pipeline.collect() == [4, 10, 16]
    assert 0 < source.produced <= WINDOW_PER_THREAD * THREADS * MAX_CHUNK


def test_take_before_map_reads_exactly_n_items() -> None:
    source = CountingSource()
    assert par_iter(source).take(5).map(triple_plus_one).collect() == [1, 4, 7, 10, 13]
    assert source.produced == 5


def test_take_on_an_endless_generator_returns() -> None:
    assert par_iter(naturals()).map(lambda x: x * x).take(1000).sum() == sum(
        x * x for x in range(1000))
    assert par_iter(naturals()).any(lambda x: x > 50_000) is True


def test_ten_million_items_are_consumed_with_bounded_read_ahead() -> None:
    processed = itertools.count()
    most_ahead = 0

    def source() -> Iterator[int]:
        nonlocal most_ahead
        for produced in range(10_000_000):
            if produced % 4096 == 0:
                most_ahead = max(most_ahead, produced - _count_value(processed))
            yield produced

    def touch(x: int) -> int:
        next(processed)
        return x

    assert par_iter(source()).map(touch).count() == 10_000_000
    assert most_ahead <= (WINDOW_PER_THREAD * THREADS + 1) * MAX_CHUNK


def _count_value(counter: itertools.count) -> int:  # type: ignore[type-arg]
    return int(repr(counter)[len("count("):-1])


# --- errors and cancellation ----------------------------------------------------------------

def parse(text: str) -> int:
    return int(text)


def test_item_error_names_index_and_stage_and_chains() -> None:
    items = ["1", "2", "x", "4"]
    with pytest.raises(ParIterError) as caught:
        par_iter(items).map(str.strip).map(parse).collect()
    error = caught.value
    assert (error.index, error.stage) == (2, "#2 map(parse)")
    assert isinstance(error.__cause__, ValueError)
    assert str(error) == ("par_iter item 2 failed in stage #2 map(parse): ValueError: "
                          "invalid literal for int() with base 10: 'x'")


def test_index_is_the_source_index_after_filter_and_flat_map() -> None:
    def fail_on_13(x: int) -> int:
        if x == 13:
            raise KeyError(x)
        return x

    with pytest.raises(ParIterError) as caught:
        par_iter(range(20)).filter(lambda x: x % 2).flat_map(lambda x: [x, x]).map(
            fail_on_13).sum()
    assert (caught.value.index, caught.value.stage) == (13, "#3 map(fail_on_13)")


@pytest.mark.parametrize("later", ["map", "filter"])
def test_a_later_stage_failing_on_one_value_of_a_flat_map_fails_that_value_alone(
        later: str) -> None:
    def reciprocal(x: int) -> float:
        return 1 / x

    def stages(pipeline: Any) -> Any:
        return pipeline.map(reciprocal) if later == "map" else pipeline.filter(reciprocal)

    lists = [[1, 0, 2], [4]]
    fused = stages(par_iter(lists).flat_map(lambda values: values))
    unfused = stages(par_iter(lists).flat_map(lambda values: values).take(99))
    kept = [1.0, 0.5, 0.25] if later == "map" else [1, 2, 4]
    assert fused.collect(errors="skip") == unfused.collect(errors="skip") == kept
    returned = fused.collect(errors="return")
    assert [value for value in returned if not isinstance(value, Exception)] == kept
    assert [type(value) for value in returned].index(ZeroDivisionError) == 1


def _triple_unless_3_mod_7(x: int) -> int:
    if x % 7 == 3:
        raise ValueError(f"map of {x}")
    if x % 9 == 4:  # what next() on an exhausted iterator raises: a failure like any other
        raise StopIteration(f"map of {x}")
    return x * 3 + 1


def _even_unless_5_mod_11(x: int) -> bool:
    if x % 11 == 5:
        raise KeyError(f"filter of {x}")
    return x % 2 == 0


def _some_neighbours_unless_6_mod_13(x: int) -> list[int]:
    if x % 13 == 6:
        raise ZeroDivisionError(f"flat_map of {x}")
    return [x, x + 1][:x % 3]


ELEMENTWISE = {"map": _triple_unless_3_mod_7, "filter": _even_unless_5_mod_11,
               "flat_map": _some_neighbours_unless_6_mod_13}


def _shown(values: list[Any]) -> list[Any]:
    return [(type(value).__name__, str(value)) if isinstance(value, Exception) else value
            for value in values]


def _item_by_item(items: list[int], kinds: list[str]) -> list[Any]:
    """What the stages make of each item in turn, an exception in the place of each value a
    stage failed on (the values a flat_map made are items of their own)."""
    made: list[Any] = []
    for item in items:
        values: list[Any] = [item]
        for kind in kinds:
            function, after = ELEMENTWISE[kind], []
            for value in values:
                try:
                    if isinstance(value, Exception):
                        after.append(value)
                    elif kind == "map":
                        after.append(function(value))
                    elif kind == "filter":
                        after += [value] if function(value) else []
                    else:
                        after += function(value)
                except Exception as error:  # noqa: BLE001  # kept in its place
                    after.append(error)
            values = after
        made += values
    return made


@settings(max_examples=150, deadline=None)
@given(items=st.lists(st.integers(0, 300), max_size=80),
       kinds=st.lists(st.sampled_from(sorted(ELEMENTWISE)), min_size=1, max_size=4),
       split=st.integers(0, 4), chunk_size=chunk_sizes)
def test_fused_element_wise_stages_answer_as_each_item_in_turn(
        items: list[int], kinds: list[str], split: int, chunk_size: int | None) -> None:
    pipeline = par_iter(items, chunk_size=chunk_size)
    for position, kind in enumerate(kinds):
        if position == split:  # a take stops fusion: the stages after it get failed items
            pipeline = pipeline.take(10**6)
        pipeline = getattr(pipeline, kind)(ELEMENTWISE[kind])
    expected = _item_by_item(items, kinds)
    assert _shown(pipeline.collect(errors="return")) == _shown(expected)
    assert pipeline.collect(errors="skip") == [value for value in expected
                                               if not isinstance(value, Exception)]


def test_a_chain_of_many_flat_maps_runs_with_its_failures_in_place() -> None:
    pipeline = par_iter(range(4), chunk_size=4)
    for _ in range(40):  # more than one generated loop can nest
        pipeline = pipeline.flat_map(lambda x: [x])
    got = pipeline.map(_triple_unless_3_mod_7).collect(errors="return")
    assert got[:3] == [1, 4, 7] and isinstance(got[3], ValueError)


class Counted:
    """Counts the instances alive."""

    alive = 0

    def __init__(self) -> None:
        Counted.alive += 1

    def __del__(self) -> None:
        Counted.alive -= 1


@pytest.mark.parametrize("middle", ["map", "flat_map"])
def test_fused_stages_hold_one_items_values_at_a_time(middle: str) -> None:
    seen: list[int] = []

    def alive_here(counted: Counted) -> Counted:
        seen.append(Counted.alive)  # this item's value, and none of the item's before
        return counted

    pipeline = par_iter(range(20), chunk_size=20).map(lambda x: Counted())
    pipeline = pipeline.map(alive_here) if middle == "map" else \
        pipeline.flat_map(lambda counted: [alive_here(counted)])
    assert len(pipeline.map(lambda counted: 0).collect()) == 20
    assert set(seen) == {1}


def test_a_source_longer_than_len_can_tell_runs_as_any_other() -> None:
    assert par_iter(range(2**63)).any()
    assert par_iter(range(2**63)).async_map(str).any()
    assert par_iter(range(2**63)).map(str).take(3).collect(progress=True) == ["0", "1", "2"]
    assert not [thread.name for thread in threading.enumerate()
                if thread.name.startswith("vedart-async-map")]


@pytest.mark.parametrize("progress", ["no", 0, 2, "True"])
def test_collect_progress_must_be_none_or_a_bool(progress: Any) -> None:
    with pytest.raises(ConfigError, match=r"collect\(progress\): got .*; allowed: None "
                       r"\(the runtime's Config.progress\), True or False"):
        par_iter([1, 2]).collect(progress=progress)
    assert par_iter([1, 2]).collect(progress=np.False_) == [1, 2]  # a flag from an array


class OldStyleSequence:
    """Iterable through ``__getitem__`` alone, as ``iter`` accepts."""

    def __getitem__(self, index: int) -> int:
        if index >= 3:
            raise IndexError(index)
        return index * 10


def test_a_sequence_with_getitem_alone_is_iterable_as_for_the_builtins() -> None:
    assert par_iter(OldStyleSequence()).map(lambda x: x + 1).collect() == [1, 11, 21]
    assert par_iter("ab").zip(OldStyleSequence()).collect() == [("a", 0), ("b", 10)]
    with pytest.raises(TypeError, match=r"par_iter: got 5 of type int; allowed: an iterable"):
        par_iter(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"par_iter: got .*1.0.* of type float64; allowed: an "
                       r"iterable"):
        par_iter(np.float64(1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"par_iter: got array\(3\.\) of type ndarray; "
                       r"allowed: an iterable"):
        par_iter(np.array(3.0))
    with pytest.raises(TypeError, match=r"zip\(\*others\): argument 1 is .*3.* of type int64"):
        par_iter([1]).zip(np.int64(3))  # type: ignore[arg-type]


def test_zip_reads_its_iterables_row_by_row_as_the_builtin_does() -> None:
    def raising_at(count: int) -> Iterator[int]:
        yield from range(count)
        raise LookupError("read too far")

    assert par_iter(range(10)).zip(raising_at(5), [1, 2, 3]).collect() == \
        list(zip(range(10), raising_at(5), [1, 2, 3]))
    assert par_iter(range(10)).zip(raising_at(5), "ab").count() == 2
    shared = iter(range(100))
    assert par_iter(range(10)).zip(shared, [1, 2]).collect() == [(0, 0, 1), (1, 1, 2)]
    assert next(shared) == 3  # as after zip(range(10), shared, [1, 2])
    with pytest.raises(ParIterError, match="item 2 failed in stage #1 zip: LookupError"):
        par_iter(range(10)).zip(raising_at(2), [1, 2, 3]).collect()
    assert par_iter(range(3)).zip().collect() == list(zip(range(3)))  # 1-tuples


@pytest.mark.parametrize("pipeline", [
    lambda: par_iter(itertools.count()).skip(2_000_000).take(1).collect(),
    lambda: par_iter(itertools.count()).take(2_000_000).count(),
])
def test_take_and_skip_of_millions_hold_a_read_at_a_time(pipeline: Callable[[], Any]) -> None:
    tracemalloc.start()
    try:
        pipeline()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak  # two million ints at once take some 70 MB


def test_first_failure_in_input_order_is_raised() -> None:
    def fail_late_slowly(x: int) -> int:
        if x == 3:
            time.sleep(0.05)
            raise ValueError("first")
        if x == 40:
            raise ValueError("second, but finished first")
        return x

    with pytest.raises(ParIterError, match="first") as caught:
        par_iter(range(100), chunk_size=1).map(fail_late_slowly).collect()
    assert caught.value.index == 3


def test_failure_cancels_remaining_work_and_the_pool_stays_usable() -> None:
    started = itertools.count()

    def fail_early(x: int) -> int:
        next(started)
        time.sleep(0.001)
        if x == 5:
            raise RuntimeError("boom")
        return x

    with pytest.raises(ParIterError):
        par_iter(range(10_000), chunk_size=1).map(fail_early).collect()
    time.sleep(0.05)  # let tasks that were already running finish
    assert _count_value(started) < 5 + 4 * WINDOW_PER_THREAD * THREADS
    assert par_iter(range(100)).map(triple_plus_one).sum() == sum(map(triple_plus_one, range(100)))


def test_errors_skip_and_return() -> None:
    items = ["1", "x", "3", "y"]
    assert par_iter(items).map(parse).collect(errors="skip") == [1, 3]
    returned = par_iter(items).map(parse).collect(errors="return")
    assert returned[0::2] == [1, 3]
    assert [type(value) for value in returned[1::2]] == [ValueError, ValueError]
    assert "'y'" in str(returned[3])


def test_failed_items_keep_their_place_through_positional_stages() -> None:
    pipeline = par_iter(["1", "x", "3", "4", "5"]).map(parse)
    assert pipeline.enumerate().map(lambda pair: pair[0]).collect(errors="skip") == [0, 2, 3, 4]
    assert pipeline.skip(2).collect() == [3, 4, 5]
    assert pipeline.take(1).collect() == [1]
    chunks = pipeline.chunk(2).collect(errors="return")
    assert isinstance(chunks[0], ValueError) and chunks[1:] == [[3, 4], [5]]


def test_terminal_functions_report_their_stage() -> None:
    with pytest.raises(ParIterError) as caught:
        par_iter([1, 2, 0]).map(abs).for_each(lambda x: 1 / x)
    assert (caught.value.index, caught.value.stage) == (2, "#2 for_each(<lambda>)")
    with pytest.raises(ParIterError) as caught:
        par_iter([1, 2, 0, 4]).fold(0, lambda total, x: total + 1 // x)
    assert (caught.value.index, caught.value.stage) == (2, "#1 fold(<lambda>)")
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_source_error_is_raised_after_the_items_before_it() -> None:
    def broken() -> Iterator[int]:
        yield from range(7)
        raise OSError("disk gone")

    seen: list[int] = []
    with pytest.raises(ParIterError) as caught:
        par_iter(broken()).map(triple_plus_one).for_each(seen.append)
    assert (caught.value.index, caught.value.stage) == (7, "source")
    assert isinstance(caught.value.__cause__, OSError)
    assert sorted(seen) == [triple_plus_one(x) for x in range(7)]


def test_zip_error_names_the_stage() -> None:
    def short() -> Iterator[str]:
        yield "a"
        raise LookupError("gone")

    with pytest.raises(ParIterError) as caught:
        par_iter(range(5)).zip(short()).collect()
    assert (caught.value.index, caught.value.stage) == (1, "#1 zip")


def test_zip_reads_no_iterable_past_the_end_of_an_earlier_one() -> None:
    """As the builtin zip: an iterable that would raise only past the shortest one's end is
    never read that far."""
    def raising_at(position: int) -> Iterator[int]:
        yield from range(position)
        raise LookupError("read too far")

    for make in (lambda: raising_at(5), lambda: raising_at(3)):
        expected = list(zip(range(10), [1, 2, 3], make()))
        assert par_iter(range(10)).zip([1, 2, 3], make()).collect() == expected
    with pytest.raises(ParIterError) as caught:  # raising before the shortest ends does raise
        par_iter(range(10)).zip([1, 2, 3, 4], raising_at(2)).collect()
    assert caught.value.index == 2


def test_numpy_integers_count_as_ints() -> None:
    items = list(range(10))
    pipeline = par_iter(items, chunk_size=np.int64(3))
    assert pipeline.skip(np.int64(2)).take(np.uint8(5)).collect() == items[2:7]
    assert pipeline.chunk(np.int32(4)).collect() == [items[:4], items[4:8], items[8:]]
    assert pipeline.enumerate(np.int64(1)).collect() == list(enumerate(items, 1))
    with pytest.raises(ConfigError, match=r"take\(n\): got np.True_; allowed: an int >= 0"):
        pipeline.take(np.True_)


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda: par_iter([1], chunk_size=0), ConfigError,
     "chunk_size: got 0; allowed: None (automatic) or an int >= 1"),
    (lambda: par_iter(5), TypeError, "par_iter: got 5 of type int; allowed: an iterable"),
    (lambda: par_iter([1]).take(-1), ConfigError, "take(n): got -1; allowed: an int >= 0"),
    (lambda: par_iter([1]).skip(1.5), ConfigError, "skip(n): got 1.5; allowed: an int >= 0"),
    (lambda: par_iter([1]).chunk(0), ConfigError, "chunk(size): got 0; allowed: an int >= 1"),
    (lambda: par_iter([1]).map(3), TypeError, "map(f): got 3 of type int; allowed: a callable"),
    (lambda: par_iter([1]).zip([1], 2), TypeError, "zip(*others): argument 2 is 2 of type int"),
    (lambda: par_iter([1]).collect(errors="maybe"), ConfigError,
     "collect(errors): got 'maybe'; allowed: 'raise', 'skip', 'return'"),
    (lambda: par_iter([1]).gpu_map(abs, device=-1), ConfigError,
     "gpu_map(device): got -1; allowed: None or a CUDA ordinal >= 0"),
    (lambda: par_iter([1]).gpu_map(veda.gpu(abs), force="gpu"), ConfigError,
     "force: got 'gpu' for abs, which is already @veda.gpu"),
])
def test_bad_arguments_name_argument_value_and_allowed(build: Callable[[], Any],
                                                       error: type[Exception],
                                                       message: str) -> None:
    with pytest.raises(error) as caught:
        build()
    assert message in str(caught.value)


# --- scheduler: nesting, shutdown, re-init ------------------------------------------------

def run_with_deadline(work: Callable[[], Any], seconds: float = 60.0) -> Any:
    """``work()`` on a thread; fails the test instead of hanging when it deadlocks."""
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(value=work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "pipeline did not finish: deadlock"
    return outcome["value"]


def test_nested_pipelines_do_not_deadlock() -> None:
    veda.init(veda.Config.builder().gpu(False).threads(2).build())

    def inner_sum(n: int) -> int:
        return par_iter(range(n), chunk_size=1).map(lambda x: par_iter([x, x]).sum()).sum()

    result = run_with_deadline(lambda: par_iter(range(30), chunk_size=1).map(inner_sum).collect())
    assert result == [n * (n - 1) for n in range(30)]


def test_scheduler_is_shared_and_sized_by_config(runtime: veda.Runtime) -> None:
    par_iter(range(10)).map(abs).collect()
    scheduler = runtime.scheduler
    par_iter(range(10)).filter(is_even).collect()
    assert runtime.scheduler is scheduler and scheduler.threads == THREADS


def test_reinit_between_pipelines_replaces_and_joins_the_pool(runtime: veda.Runtime) -> None:
    assert par_iter(range(100)).map(triple_plus_one).sum() == 14950
    old = runtime.scheduler
    old_workers = [t for t in threading.enumerate() if t.name.startswith("vedart-worker")]
    new_runtime = veda.init(veda.Config.builder().gpu(False).threads(3).build())
    assert old.closed and not any(t.is_alive() for t in old_workers)
    assert par_iter(range(100)).map(triple_plus_one).sum() == 14950
    assert new_runtime.scheduler.threads == 3 and new_runtime.scheduler is not old


def test_shutdown_cancels_queued_tasks_and_joins_workers() -> None:
    scheduler = Scheduler(1)
    started, release = threading.Event(), threading.Event()

    def block() -> bool:
        started.set()
        return release.wait()

    running = scheduler.submit(Task(block))
    ran: list[int] = []
    queued = [scheduler.submit(Task(functools.partial(ran.append, n))) for n in range(5)]
    started.wait(10)
    stopper = threading.Thread(target=scheduler.shutdown)
    stopper.start()
    stopper.join(0.05)
    assert stopper.is_alive(), "shutdown waits for the running task"
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and scheduler.closed
    assert running.result() is True and ran == []
    assert all(task.cancel() for task in queued)
    assert scheduler.submit(Task(lambda: 1)).cancel()


def test_shutdown_during_a_pipeline_raises_par_iter_error() -> None:
    started = threading.Event()

    def slow(x: int) -> int:
        started.set()
        time.sleep(0.01)
        return x

    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            par_iter(range(10_000), chunk_size=1).map(slow).collect()
        except ParIterError as error:
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(10)
    veda.shutdown()
    thread.join(30)
    assert "scheduler was shut down" in str(outcome["error"])
    assert outcome["error"].index is None


# --- progress -------------------------------------------------------------------------------

def test_plain_progress_counts_items_on_stderr(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # "not installed"
    assert par_iter(range(50)).map(abs).collect(progress=True) == list(range(50))
    assert capsys.readouterr().err.endswith("\rpar_iter: 50/50 items\n")


def test_progress_counts_the_items_that_reached_the_terminal(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # "not installed"
    pipeline = par_iter(range(3000)).map(lambda x: 1 / (x - 2000))
    with pytest.raises(ParIterError, match="item 2000 failed"):
        pipeline.collect(progress=True)
    assert capsys.readouterr().err.endswith("\rpar_iter: 2000/3000 items\n")
    assert len(pipeline.collect(errors="skip", progress=True)) == 2999
    assert capsys.readouterr().err.endswith("\rpar_iter: 3000/3000 items\n")


def test_plain_progress_without_known_total() -> None:
    stream = io.StringIO()
    display = PlainProgress(None, stream)
    display.update(3)
    display.update(4)
    display.close()
    assert stream.getvalue().endswith("\rpar_iter: 7 items\n")


def test_tqdm_bar_when_installed_and_config_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    bars: list[Any] = []

    class FakeTqdm:
        def __init__(self, total: int | None, unit: str, desc: str) -> None:
            self.total, self.count, self.closed = total, 0, False
            bars.append(self)

        def update(self, n: int) -> None:
            self.count += n

        def close(self) -> None:
            self.closed = True

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeTqdm))
    veda.init(veda.Config.builder().gpu(False).progress(True).build())
    assert par_iter(range(1000)).map(abs).sum() == sum(range(1000))
    assert par_iter(range(1000)).filter(is_even).collect(progress=False) == list(range(0, 1000, 2))
    assert [(bar.total, bar.count, bar.closed) for bar in bars] == [(1000, 1000, True)]
    par_iter(range(10)).filter(is_even).count()
    assert (bars[-1].total, bars[-1].count) == (None, 5)


# --- the benchmark on a CPU-only machine ----------------------------------------------------

def test_benchmark_runs_without_a_gpu_and_marks_gpu_columns_na() -> None:
    from vedart.bench import par_iter as bench

    result = bench.run(quick=True, matrices=3, size=64, map_sum_items=20_000)
    assert result["note"] == "no GPU: GPU columns n/a" and "cupy_loop_s" not in result
    assert result["map_sum_ratio"] == result["par_iter_map_sum_s"] / result["builtin_map_sum_s"]
    text = bench.format_table(result)
    assert "over 20,000 ints" in text and "(target <= 3.0)" in text
    assert text.endswith("no GPU: GPU columns n/a")
