"""What a @gpu call hands back from the device, on a CPU-only machine: device arrays are
FakeDeviceArray (host memory with CuPy's view and address behaviour)."""

from __future__ import annotations

import dataclasses
import types
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from fakes import FakeDeviceArray

import vedart as veda
from vedart.offload.arguments import HOST_CLASS, Memo, map_arrays
from vedart.offload.assigned import ArgumentState
from vedart.offload.results import (
    RESULT_DEPTH,
    made_recording,
    results_to_host,
    unconverted_paths,
)
from vedart.offload.substitute import ModuleMapper, device_clone

IDENTITY = ModuleMapper({"numpy": "numpy"})


def device(host: np.ndarray) -> FakeDeviceArray:
    return FakeDeviceArray.of(host)


def rng(seed: int = 1) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_results_to_host_types() -> None:
    Pair = namedtuple("Pair", "first second")
    value = {
        "scalar": device(np.array(2.5)),
        "array": device(np.arange(3)),
        "nested": [Pair(device(np.array(1, dtype=np.int32)), "text")],
        "plain": 7,
    }
    host, moved = results_to_host(value, FakeDeviceArray)
    assert moved == 8 + 3 * np.arange(3).itemsize + 4
    assert type(host["scalar"]) is np.float64 and host["scalar"] == 2.5
    assert type(host["array"]) is np.ndarray
    assert type(host["nested"][0]) is Pair and type(host["nested"][0].first) is np.int32
    assert host["nested"][0].second == "text" and host["plain"] == 7


def test_made_zero_d_arrays_stay_arrays_and_reductions_become_scalars() -> None:
    made_0d, summed, made_1d = device(np.array(2.5)), device(np.array(7.0)), device(np.ones(2))
    host, _ = results_to_host((made_0d, summed, made_1d), FakeDeviceArray,
                              made_arrays=[made_0d, made_1d])
    assert type(host[0]) is np.ndarray and host[0].shape == () and host[0] == 2.5
    assert type(host[1]) is np.float64 and host[1] == 7.0
    assert type(host[2]) is np.ndarray
    alone, moved = results_to_host(made_0d, FakeDeviceArray, made_arrays=[made_0d])
    assert type(alone) is np.ndarray and alone.shape == () and moved == 8
    assert type(results_to_host(summed, FakeDeviceArray)[0]) is np.float64


def test_array_makers_inside_the_function_are_recorded() -> None:
    def zero_d(x: np.ndarray) -> tuple[Any, ...]:
        return (np.array(x.sum()), np.zeros(()), np.asarray(x[0]), np.full((), 3.0),
                np.copy(x.max()), np.where(x[0] > 0.5, x[0], x[1]), np.reshape(x[:1], ()),
                np.reshape(x.sum(), ()), x.sum(), np.ones(3))

    x = rng().random(4)
    made: list[Any] = []
    token = made_recording.set(made)
    try:
        result = device_clone(zero_d, IDENTITY)(x)
    finally:
        made_recording.reset(token)
    assert [id(value) for value in made] == [id(value) for value in result[:7]]
    assert [type(value) for value in result] == [type(value) for value in zero_d(x)]


def test_integer_results_carry_numpys_own_scalar_type() -> None:
    index = device(np.array(3, dtype=np.longlong))  # what CuPy's argmax gives
    positions = device(np.arange(4, dtype=np.longlong))
    host, _ = results_to_host((index, positions), FakeDeviceArray)
    assert type(host[0]) is type(np.arange(4).argmax())
    assert host[1].dtype.char == np.arange(4).dtype.char


def test_every_host_copy_is_made_by_the_given_copy_function() -> None:
    """A GPU call passes its transfer engine's ``to_host``: one array, and each group of
    overlapping arrays, is one copy through it."""
    whole, other = device(rng().random(12)), device(rng(2).random(3))
    copied: list[tuple[int, ...]] = []

    def copy(array: Any) -> np.ndarray:
        copied.append(array.shape)
        return array.get()

    alone, _ = results_to_host(whole, FakeDeviceArray, copy=copy)
    host, moved = results_to_host((whole, whole[2:8:2], other), FakeDeviceArray, copy=copy)
    # The overlapping pair as one span of 96 bytes; spans go in address order, and where
    # ``other`` lies against ``whole`` is the allocator's choice.
    assert copied[0] == (12,) and sorted(copied[1:]) == [(3,), (96,)], copied
    np.testing.assert_array_equal(alone, whole.get())
    np.testing.assert_array_equal(host[1], whole.get()[2:8:2])
    assert moved == whole.nbytes + other.nbytes


def test_a_writes_argument_comes_back_as_the_callers_own_array() -> None:
    out = rng().random(12)
    device_out = device(out)
    device_out *= 2  # the function's in-place write on the device
    other = device(rng(2).random(3))
    host, moved = results_to_host((device_out, device_out[2:8:2], other), FakeDeviceArray,
                                  writes={id(device_out): (device_out, out)})
    assert host[0] is out
    assert np.shares_memory(host[1], out)
    assert moved == other.nbytes  # the caller's array gets its data from the copy-back
    np.copyto(out, device_out.get())  # the copy-back after the results
    np.testing.assert_array_equal(host[1], device_out.get()[2:8:2])
    np.testing.assert_array_equal(host[2], other.get())


def test_one_result_that_is_a_view_of_a_writes_argument_is_a_view_of_the_callers() -> None:
    out = rng().random(12)
    device_out = device(out)
    elsewhere = device(rng(3).random(4))  # a result outside every writes= argument
    writes = {id(device_out): (device_out, out)}
    host, moved = results_to_host(device_out[1:], FakeDeviceArray, writes=writes)
    assert np.shares_memory(host, out) and moved == 0
    alone, moved = results_to_host(elsewhere, FakeDeviceArray, writes=writes)
    np.testing.assert_array_equal(alone, elsewhere.get())
    assert moved == elsewhere.nbytes


def test_a_view_of_a_non_contiguous_writes_argument_is_a_copy() -> None:
    backing = rng().random(24)
    out = backing[::2]  # the device holds a contiguous copy: the layouts differ
    device_out = device(out)
    host, _ = results_to_host((device_out, device_out[1:]), FakeDeviceArray,
                              writes={id(device_out): (device_out, out)})
    assert host[0] is out
    assert not np.shares_memory(host[1], backing)
    np.testing.assert_array_equal(host[1], out[1:])


@pytest.mark.parametrize("views", [
    lambda x: (x, x[::2]),
    lambda x: (x, x),
    lambda x: (x[::-1], x[1:5], x[3]),
    lambda x: (x.reshape(4, 5), x.reshape(4, 5).T, x.reshape(4, 5)[1:, ::-2]),
    lambda x: {"whole": x, "tail": [x[10:]]},
])
def test_results_sharing_memory_share_it_on_the_host(views: Any) -> None:
    x = rng().random(20)
    expected = views(x)
    host, moved = results_to_host(views(device(x)), FakeDeviceArray)
    flat_expected = expected if isinstance(expected, tuple) else (expected["whole"],
                                                                  expected["tail"][0])
    flat_host = host if isinstance(host, tuple) else (host["whole"], host["tail"][0])
    for actual, wanted in zip(flat_host, flat_expected):
        assert type(actual) is type(wanted)
        np.testing.assert_array_equal(actual, wanted)
        if isinstance(wanted, np.ndarray):
            assert actual.strides == wanted.strides
    arrays = [value for value in flat_host if isinstance(value, np.ndarray)]
    for first in arrays:
        for second in arrays:
            assert np.shares_memory(first, second) == np.shares_memory(
                flat_expected[[id(v) for v in flat_host].index(id(first))],
                flat_expected[[id(v) for v in flat_host].index(id(second))])
    assert moved <= x.nbytes  # one transfer of the range they cover
    if len(flat_host) == 2 and flat_expected[0] is flat_expected[1]:
        assert flat_host[0] is flat_host[1]


def test_separate_arrays_do_not_share() -> None:
    a, b = device(rng().random(5)), device(rng(2).random(5))
    host, moved = results_to_host((a, b), FakeDeviceArray)
    assert not np.shares_memory(host[0], host[1]) and moved == a.nbytes + b.nbytes


@dataclasses.dataclass(frozen=True)
class Fit:
    weights: Any
    history: list[Any]
    name: str = "fit"
    steps: int = dataclasses.field(default=0, init=False)


def test_device_arrays_inside_dataclasses_and_namespaces_are_converted() -> None:
    weights, loss = rng().random(3), rng(2).random(4)
    result = (Fit(device(weights), [device(loss)]),
              types.SimpleNamespace(mean=device(np.array(1.5)), label="m"))
    host, _ = results_to_host(result, FakeDeviceArray)
    fit, namespace = host
    assert type(fit) is Fit and fit.name == "fit" and fit.steps == 0
    assert type(fit.weights) is np.ndarray and type(fit.history[0]) is np.ndarray
    np.testing.assert_array_equal(fit.weights, weights)
    np.testing.assert_array_equal(fit.history[0], loss)
    assert type(namespace.mean) is np.float64 and namespace.label == "m"
    assert unconverted_paths(host, FakeDeviceArray) == []


def test_device_arrays_left_inside_other_objects_are_named() -> None:
    class Model:
        def __init__(self, coef: Any) -> None:
            self.coef = coef

    deep: Any = device(np.ones(2))
    for _ in range(9):
        deep = [deep]
    host, _ = results_to_host({"model": Model(device(np.ones(2))), "deep": deep},
                              FakeDeviceArray)
    assert unconverted_paths(host, FakeDeviceArray) == [
        "result['model'].coef", "result['deep']" + "[0]" * 9]


def test_what_a_result_and_the_values_a_call_bound_share_comes_back_once() -> None:
    coef, weights = device(rng().random(4)), device(rng(2).random(6))
    history = [coef, Fit(weights, [coef])]
    memo = Memo()
    (bound, tail), moved = results_to_host((history, weights[2:]), FakeDeviceArray, memo=memo,
                                           depth=RESULT_DEPTH + 1)  # each as deep as a result
    assert bound[1].history[0] is bound[0] and moved == (4 + 6) * 8
    assert np.shares_memory(tail, bound[1].weights)  # as on the device
    result, moved = results_to_host({"h": history, "again": history, "coef": coef,
                                     "tail": weights[3:]}, FakeDeviceArray, memo=memo)
    assert result["h"] is bound and result["again"] is bound and result["coef"] is bound[0]
    assert np.shares_memory(result["tail"], bound[1].weights) and moved == 0
    np.testing.assert_array_equal(result["tail"], np.asarray(weights[3:]))
    alone, moved = results_to_host(coef, FakeDeviceArray, memo=memo)
    assert alone is bound[0] and moved == 0
    assert results_to_host(history, FakeDeviceArray, memo=memo)[0] is bound  # (not in a tuple)
    inner = [device(np.ones(2))]
    (again, outer), _ = results_to_host((inner, [inner]), FakeDeviceArray)
    assert outer[0] is again and type(again[0]) is np.ndarray
    (outer, again), _ = results_to_host(([inner], inner), FakeDeviceArray)  # deeper first:
    assert type(outer[0][0]) is np.ndarray and type(again[0]) is np.ndarray  # walked anew


@dataclasses.dataclass
class Fitted:
    coef_: Any = None
    predict_: Any = None
    again: Any = None

    def scale(self, y: Any) -> Any:
        return y * self.coef_


def fit_in_place(self: Fitted, x: Any) -> Any:
    self.coef_ = x * 2
    self.predict_ = lambda y: y * self.coef_
    self.again = self.scale
    model = types.SimpleNamespace(coef=x)
    model.predict = lambda y: y + model.coef
    model.scaled = lambda y, by=model: y * by.coef
    model.keyed = lambda y, *, by=model: y - by.coef
    return {"all": [self]}, self.coef_, model


def landed(func: Any, *args: Any) -> Any:
    """``func(*args)`` run as @gpu's GPU path runs it, on fake device arrays: the arguments'
    arrays copied to the device, the run watched, then what it bound converted and given to
    the caller's objects and containers, then its result converted, with one memo."""
    device_args = map_arrays(args, np.ndarray, device, 3)
    state = ArgumentState(device_args, FakeDeviceArray)
    result = device_clone(func, IDENTITY)(*device_args)
    state.launched()
    twins = state.twins(args, {}, device_args, {})
    held = state.held(twins)
    memo = state.stand_ins(twins, args)
    values, _ = results_to_host(tuple(value for _, _, value in held), FakeDeviceArray,
                                memo=memo, depth=RESULT_DEPTH + 1)
    state.bind(held, values, twins)
    state.as_bound(memo)
    converted = results_to_host(result, FakeDeviceArray, memo=memo)[0]
    memo.give_host_classes()
    return converted


def test_what_the_run_bound_and_returned_holds_the_callers_object_itself() -> None:
    fitted, x = Fitted(), rng().random(3)
    everything, coef, model = landed(fit_in_place, fitted, x)
    assert everything["all"][0] is fitted and coef is fitted.coef_
    assert fitted.predict_.__closure__[0].cell_contents is fitted
    assert fitted.again.__self__ is fitted
    fitted.coef_ = np.ones(3)
    np.testing.assert_array_equal(fitted.predict_(2.0), np.full(3, 2.0))
    assert model.predict.__closure__[0].cell_contents is model  # the record holding it
    assert model.scaled.__defaults__[0] is model and model.keyed.__kwdefaults__["by"] is model
    np.testing.assert_array_equal(model.predict(1.0), 1.0 + x)
    np.testing.assert_array_equal(model.scaled(2.0), 2.0 * x)


def steps_state(state: dict[str, Any], x: Any) -> Any:
    state["w"] = state["w"] * 2
    state["seen"] = x
    return (state, 1), [state]


def test_a_copied_dict_the_run_returns_anywhere_is_the_callers() -> None:
    x = rng().random(2)
    state = {"w": np.ones(2), "tmp": 1}
    (first, _), second = landed(steps_state, state, x)
    assert first is state and second[0] is state
    assert state["seen"] is x and type(state["w"]) is np.ndarray and state["w"][0] == 2.0


def closes_over(weights: Any) -> Any:
    def weighted(x: Any) -> Any:
        return x * weights

    return weights, weighted, lambda x, w=weights: x + w


@dataclasses.dataclass(eq=False)
class Node:
    parent: Any = None
    children: list[Any] = dataclasses.field(default_factory=list)

    def __copy__(self) -> Node:
        raise AssertionError("an unchanged record is not copied")


def test_cycles_and_records_without_device_arrays_come_back_as_themselves() -> None:
    root = Node()
    root.children.append(Node(root))
    itself: dict[str, Any] = {}
    itself["me"] = itself
    (tree, same, loss), _ = results_to_host((root, itself, device(np.ones(2))),
                                            FakeDeviceArray)
    assert tree is root and tree.children[0].parent is root and same is itself
    assert type(loss) is np.ndarray


@dataclasses.dataclass(eq=False)
class Callback:
    model: Any = None


@dataclasses.dataclass(eq=False)
class Trained:
    callbacks: list[Any]
    history: dict[str, Any]


class OnHost:
    pass


class OnDevice(OnHost):  # stands for a device class substitution makes of OnHost
    pass


setattr(OnDevice, HOST_CLASS, OnHost)


def test_arrays_below_a_cycle_are_converted_however_deep_it_is_met_first() -> None:
    callback = Callback()
    model = Trained([callback], {"loss": [device(np.ones(1))]})
    callback.model = model
    back, _ = results_to_host(model, FakeDeviceArray)
    assert type(back.history["loss"][0]) is np.ndarray
    made = OnDevice()
    loop: list[Any] = [None, made]
    loop[0] = loop
    made.loop = loop
    made.inner = types.SimpleNamespace(deeper=types.SimpleNamespace(w=device(np.ones(2))))
    (_, made_back, _), _ = results_to_host([0, made, device(np.ones(3))], FakeDeviceArray)
    assert type(made_back) is OnHost and type(made_back.inner.deeper.w) is np.ndarray
    shared = {"a": {"b": device(np.ones(2))}}
    nested: Any = shared
    for _ in range(7):
        nested = [nested]
    (_, again), _ = results_to_host((nested, shared), FakeDeviceArray)  # deep, then shallow
    assert type(again["a"]["b"]) is np.ndarray


def keeps_a_node_it_made(owner: Any, x: Any) -> Any:
    node = OnDevice()  # as an object of a reached class made in the call is
    node.me = node
    node.stats = {"w": x * 2}
    owner.runs_ = [node]
    return node


def fills_the_callers_deeply(config: Any, x: Any) -> Any:
    config.a.b.c.d.w = x * 2  # beyond what is watched of the caller's object
    return config


def fills_a_copied_dict_deeply(state: dict[str, Any], x: Any) -> Any:
    state["cfg"]["inner"]["deep"]["v"] = x * 2  # the caller's dicts, below what is watched
    return state


def reaches_the_callers_list_twice(owner: Any, log: list[Any], x: Any) -> Any:
    log.append(x * 2)  # through the copy the run was given
    owner.last_ = [owner.a.b.c.d]  # the caller's list itself, below what is watched
    return [log]


def test_a_copy_returned_stands_for_the_callers_list_as_the_run_left_it() -> None:
    log = [np.zeros(2), device(np.full(2, 5.0))]  # a CuPy array from before the call
    owner = types.SimpleNamespace(a=types.SimpleNamespace(b=types.SimpleNamespace(
        c=types.SimpleNamespace(d=log))))
    x = rng().random(2)
    (back,) = landed(reaches_the_callers_list_twice, owner, log, x)
    assert len(log) == 3 and len(back) == 3  # the item the run appended, as on the CPU
    np.testing.assert_array_equal(back[2], x * 2)
    assert unconverted_paths(back, FakeDeviceArray) == []


def test_what_the_run_bound_and_returned_comes_back_converted_to_the_top() -> None:
    owner, x = types.SimpleNamespace(), rng().random(2)
    node = landed(keeps_a_node_it_made, owner, x)
    assert type(node) is OnHost and type(node.stats["w"]) is np.ndarray
    assert type(owner.runs_[0].stats["w"]) is np.ndarray
    config = types.SimpleNamespace(a=types.SimpleNamespace(b=types.SimpleNamespace(
        c=types.SimpleNamespace(d=types.SimpleNamespace(w=None)))))
    back = landed(fills_the_callers_deeply, config, x)
    assert unconverted_paths(back, FakeDeviceArray) == [] and type(back.a.b.c.d.w) is np.ndarray
    state = {"w": np.ones(2), "cfg": {"inner": {"deep": {}}}}  # "w": uploaded as a copy
    back = landed(fills_a_copied_dict_deeply, state, x)
    assert unconverted_paths(back, FakeDeviceArray) == []


def grows_the_callers(holder: Any, outer: list[Any]) -> Any:
    holder.outer.append(0)  # the caller's list: its copy is no longer paired with it
    return outer[0]


def test_a_copy_not_paired_with_the_callers_list_comes_back_converted() -> None:
    holder, inner = types.SimpleNamespace(), [rng().random(2)]
    holder.outer = outer = [inner]
    returned = landed(grows_the_callers, holder, outer)
    assert type(returned) is list and type(returned[0]) is np.ndarray
    np.testing.assert_array_equal(returned[0], inner[0])


def calls_each_other(weights: Any) -> Any:
    def even(n: int) -> Any:
        return weights if n == 0 else odd(n - 1)

    def odd(n: int) -> Any:
        return -weights if n == 0 else even(n - 1)

    return even


def test_functions_calling_each_other_come_back_calling_each_other() -> None:
    weights = rng().random(2)
    device_even = device_clone(calls_each_other, IDENTITY)(device(weights))
    even, _ = results_to_host(device_even, FakeDeviceArray)
    odd = next(cell.cell_contents for cell in even.__closure__
               if callable(cell.cell_contents))
    assert odd.__globals__ is globals() and even.__globals__ is globals()
    assert any(cell.cell_contents is even for cell in odd.__closure__)
    assert type(even(3)) is np.ndarray and np.array_equal(even(3), -weights)
    # The device function keeps its own cells: it still computes with device arrays.
    assert type(device_even(2)) is FakeDeviceArray


def test_device_arrays_held_by_functions_the_call_made_are_the_results_host_arrays() -> None:
    weights = rng().random(3)
    result = device_clone(closes_over, IDENTITY)(device(weights))
    (host, weighted, added), moved = results_to_host(result, FakeDeviceArray)
    assert type(host) is np.ndarray and moved == weights.nbytes  # one copy, shared
    assert weighted.__closure__[0].cell_contents is host and added.__defaults__ == (host,)
    assert weighted.__globals__ is globals() and added.__globals__ is globals()
    np.testing.assert_array_equal(weighted(2.0), 2.0 * weights)
    np.testing.assert_array_equal(added(1.0), 1.0 + weights)
    held = original = [device(np.ones(2))]  # the decorated function's caller's: left alone

    def reads_the_callers(scale: Any) -> Any:
        return lambda: (held, scale)

    got_held, got_scale = results_to_host(device_clone(reads_the_callers, IDENTITY)(
        device(weights)), FakeDeviceArray)[0]()
    assert got_held is original and held is original and type(got_scale) is np.ndarray


def test_to_host_is_public() -> None:
    value = (np.ones(2), 3)
    assert veda.to_host(value) is value


def test_an_array_another_thread_adds_while_results_are_converted_is_converted_too() -> None:
    # A container the result shares with other code (a module's list a returned closure
    # refers to) may gain a device array between the walk that finds the arrays and the one
    # that converts them: that array is copied then, not a KeyError that sends the call to
    # the CPU.
    first, added = rng(11).random(3), rng(12).random(4)
    shared = [device(first)]

    def copy_while_another_thread_appends(array: Any) -> np.ndarray:
        if len(shared) == 1:
            shared.append(device(added))
        return array.get()

    host, moved = results_to_host({"log": shared, "n": 2}, FakeDeviceArray,
                                  copy=copy_while_another_thread_appends)
    assert [type(item) for item in host["log"]] == [np.ndarray, np.ndarray]
    np.testing.assert_array_equal(host["log"][0], first)
    np.testing.assert_array_equal(host["log"][1], added)
    assert moved == first.nbytes + added.nbytes and host["n"] == 2
