"""What a GPU run changes in the objects and containers among a call's arguments: converted
or given to the caller's containers after a success, put back after a failure
(``vedart.offload.assigned``). A stand-in array type plays the device's; the GPU tests run the
same through ``@veda.gpu``."""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np
import pytest

from vedart.offload.assigned import ArgumentState, bound_arguments


class Device:
    """A stand-in for a device array: converted to ``host`` (its bytes: 8)."""

    def __init__(self, host: Any) -> None:
        self.host = host


def converted(values: tuple[Any, ...]) -> list[Any]:
    """What the GPU path's conversion does to the values the run left, for the stand-in."""
    return [value.host if isinstance(value, Device) else
            [item.host if isinstance(item, Device) else item for item in value]
            if isinstance(value, list) else value for value in values]


def after_success(state: ArgumentState, twins: dict[int, Any] | None = None) -> None:
    twins = twins or {}
    held = state.held(twins)
    state.bind(held, converted(tuple(value for _, _, value in held)), twins)


def watching(*values: Any) -> ArgumentState:
    return ArgumentState(values, Device)


def test_a_failure_after_the_conversion_puts_the_attributes_back() -> None:
    model = Model()
    coef = model.coef
    objects = watching(model)
    model.coef = Device(np.zeros(3))
    objects.launched()
    after_success(objects)
    assert type(model.coef) is np.ndarray and model.coef is not coef
    objects.restore()  # something failed after the conversion (a writes= copy-back, say)
    assert model.coef is coef


class Model:
    def __init__(self) -> None:
        self.coef: Any = np.ones(3)
        self.kept_on_device = Device("the caller's own")
        self.steps = 0


def test_assigned_attributes_are_converted_and_others_left_alone() -> None:
    model = Model()
    coef_before = model.coef
    objects = watching(model, np.ones(2))
    model.coef = Device(np.zeros(3))  # assigned on the device
    model.history = [Device("first"), 1.5]  # added
    model.steps = 1  # assigned, nothing to convert
    objects.launched()
    assert {name for _, name, _ in objects.held({})} == {"coef", "history", "steps"}
    after_success(objects)
    assert type(model.coef) is np.ndarray and model.history == ["first", 1.5]
    assert model.steps == 1
    # held before the call: the caller's own value, whatever its type
    assert isinstance(model.kept_on_device, Device)
    assert model.coef is not coef_before


@pytest.mark.parametrize("launched", [True, False])
def test_a_failed_attempt_puts_every_attribute_it_bound_back(launched: bool) -> None:
    model = Model()
    before = dict(vars(model))
    history = model.history = []
    log: list[Any] = []
    objects = watching(model, log)
    model.coef = Device(np.zeros(3))
    model.steps += 1
    model.scratch = Device(1)
    del model.kept_on_device
    model.coef_holder = holder = [Device(3)]  # a list the run made: gone with its attribute
    holder.append(4)
    log.append(Device(5))  # a list the call was given: put back
    history.append(2)  # an item of a list the object holds: not put back (its internals)
    if launched:
        objects.launched()
    objects.restore()
    assert vars(model).keys() == {*before, "history"}
    assert all(vars(model)[name] is value for name, value in before.items())
    assert model.history is history and history == [2] and log == []


def test_objects_in_argument_containers_are_put_back_and_those_objects_hold_are_not() -> None:
    in_list, held = Model(), Model()
    in_list.child = held
    state = watching([in_list], {"m": (Model(),)})
    in_list.steps += 1  # given (in a list argument): put back
    held.steps += 1  # held by its attribute: another thread's, maybe; left
    held.coef = Device(3)
    state.restore()
    assert in_list.steps == 0 and held.steps == 1 and isinstance(held.coef, Device)


def test_runs_in_flight_together_each_bind_their_own_values() -> None:
    model = Model()
    first = watching(model)
    model.coef = first_coef = Device(np.zeros(3))
    first.launched()
    second = watching(model)  # a lane's next item, launched before the first lands
    model.coef = Device(np.ones(3))
    model.steps = 2
    second.launched()
    assert first.held({}) == []  # the second run's values: the first leaves them alone
    after_success(first)
    assert isinstance(model.coef, Device)
    second.restore()  # the second failed: its bindings go, the first's come back
    assert model.coef is first_coef and model.steps == 0


def test_objects_lists_and_dicts_are_watched_through_containers_and_attributes() -> None:
    def plain(x: Any) -> Any:
        return x

    plain.attribute = 1
    values: tuple[Any, ...] = (np.ones(2), np.float64(1.0), 3, "text", Model, np, plain, None,
                               {1, 2}, frozenset({3}), Device(1), (1, "a"))
    assert not watching(*values)
    model, inner, namespace = Model(), Model(), types.SimpleNamespace(a=1)
    model.child = types.SimpleNamespace(coef=None)
    model.layers = [inner]
    in_tuple = types.SimpleNamespace(coef=None)
    model.buffers = ([], in_tuple)
    log: list[Any] = []
    state = watching(model, {"name": namespace}, (log,), model)
    model.added = Device(2)  # the object counted once
    model.child.coef = Device(3)  # an object it holds
    inner.coef = Device(4)  # an object in a list it holds
    namespace.a = Device(5)  # an object in a dict argument
    log.append(Device(6))  # a list in a tuple argument
    model.buffers[0].append(Device(7))  # a list in a tuple it holds
    in_tuple.coef = Device(8)  # an object in a tuple it holds
    state.launched()
    assert len(state.held({})) == 7
    after_success(state)
    assert (model.added, model.child.coef, inner.coef, namespace.a, log) == (2, 3, 4, 5, [6])
    assert model.buffers == ([7], in_tuple) and in_tuple.coef == 8
    assert model.layers[0] is inner and type(model.coef) is np.ndarray


def test_a_copied_container_gives_the_callers_container_the_runs_changes() -> None:
    weights, other, kept = np.ones(3), np.zeros(2), object()
    state_dict = {"w": weights, "tmp": 1, "other": other, "kept": kept}
    arrays = [weights]
    args: tuple[Any, ...] = (state_dict, arrays)
    # What the launch makes of them: copies holding device copies.
    device_dict = {"w": Device(weights), "tmp": 1, "other": Device(other), "kept": kept}
    device_list = [Device(weights)]
    device_args: tuple[Any, ...] = (device_dict, device_list)
    state = watching(*device_args)
    device_dict["w"] = Device(weights * 2)  # the run: state["w"] = state["w"] * 2
    del device_dict["tmp"]
    device_dict["alias"] = device_dict["other"]  # the caller's array, as on the CPU
    device_list.append(Device(np.full(2, 5.0)))
    state.launched()
    twins = state.twins(args, {}, device_args, {})
    after_success(state, twins)
    assert list(state_dict) == ["w", "other", "kept", "alias"]
    np.testing.assert_array_equal(state_dict["w"], weights * 2)
    assert state_dict["alias"] is other and state_dict["other"] is other
    assert state_dict["kept"] is kept and arrays[0] is weights
    np.testing.assert_array_equal(arrays[1], np.full(2, 5.0))
    state.restore()  # something failed after the conversion: the caller's are as before
    assert state_dict == {"w": weights, "tmp": 1, "other": other, "kept": kept}
    assert arrays == [weights]


def test_a_failed_run_drops_the_copies_changes_and_puts_the_callers_containers_back() -> None:
    settings, log, weights = {"n": 1}, [1.0], np.ones(2)
    state_dict = {"w": weights}
    device_dict = {"w": Device(weights)}
    state = watching(settings, log, device_dict)
    settings["n"] = 2
    settings["added"] = Device(1)
    log.append(Device(2))
    device_dict["w"] = Device(weights + 1)
    state.restore()
    assert settings == {"n": 1} and log == [1.0] and state_dict["w"] is weights


def test_a_device_copy_of_the_callers_array_stands_for_the_callers_own() -> None:
    x, model = np.arange(3.0), Model()
    device_x = Device(x)
    state = watching(model, device_x)
    model.x_ = device_x  # self.x_ = x
    state.launched()
    twins = state.twins((model, x), {}, (model, device_x), {})
    assert state.held(twins) == []  # nothing to convert: the caller's x is the value
    after_success(state, twins)
    assert model.x_ is x


def test_the_walk_looks_at_a_bounded_number_of_values_nearest_first() -> None:
    model = Model()
    big = list(range(100_000))
    state = watching(big, model)
    model.coef = Device(1)  # the model, an argument, is watched before the list's items
    big.append(2)
    state.launched()
    after_success(state)
    assert model.coef == 1 and len(big) == 100_001
    deep = Model()
    deep.child = types.SimpleNamespace(child=types.SimpleNamespace(
        child=types.SimpleNamespace(child=types.SimpleNamespace(coef=None))))
    state = watching(deep)
    deep.child.child.child.child.coef = Device(2)  # four levels below: beyond STATE_DEPTH
    state.launched()
    assert state.held({}) == []


class Slotted:
    __slots__ = ("coef", "__private", "steps")

    def __init__(self) -> None:
        object.__setattr__(self, "steps", 0)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("frozen")  # as attrs' frozen classes: vedart writes past it


def test_objects_with_slots_are_watched_as_objects_with_a_dict_are() -> None:
    slotted = Slotted()
    state = watching(slotted, slotted)
    object.__setattr__(slotted, "coef", Device(np.zeros(2)))  # what the run assigned
    object.__setattr__(slotted, "_Slotted__private", Device(1))
    state.launched()
    assert len(state.held({})) == 2  # the object watched once
    after_success(state)
    assert type(slotted.coef) is np.ndarray and slotted._Slotted__private == 1
    failed = watching(slotted)
    object.__setattr__(slotted, "steps", 1)
    object.__delattr__(slotted, "coef")
    failed.restore()
    assert slotted.steps == 0 and type(slotted.coef) is np.ndarray


class Refusing:
    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError("a proxy that answers nothing")


def run_on_copies(*host_args: Any) -> tuple[ArgumentState, tuple[Any, ...]]:
    """A state over copies of ``host_args`` as the upload makes them (dicts and lists
    holding arrays copied, arrays as stand-ins)."""
    def copied(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return Device(value)
        if isinstance(value, dict) and any(isinstance(v, np.ndarray) for v in value.values()):
            return {key: copied(item) for key, item in value.items()}
        if isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):
            return [copied(item) for item in value]
        return value
    device_args = tuple(copied(value) for value in host_args)
    return watching(*device_args), device_args


def landed(state: ArgumentState, host_args: tuple[Any, ...],
           device_args: tuple[Any, ...]) -> None:
    after_success(state, state.twins(host_args, {}, device_args, {}))


def test_numbers_never_stand_for_the_callers_values() -> None:
    caller = {"w": np.ones(2), "n": 0}
    state, (copy,) = run_on_copies(caller)
    copy["n"] += 1
    copy["errors"] = 0  # the same int object as the copy's "n" held at the start
    state.launched()
    caller["n"] = 1  # an earlier item of a lane landed meanwhile
    landed(state, (caller,), (copy,))
    assert caller["errors"] == 0 and caller["n"] == 1


def test_copies_are_watched_whatever_the_other_arguments_hold() -> None:
    params = {"layer": {"w": np.ones(2)}, **{f"b{i}": np.ones(1) for i in range(300)}}
    losses = [0.5] * 255
    state, (device_losses, copy) = run_on_copies(losses, params)
    copy["layer"]["w"] = Device(np.zeros(2))
    copy["b7"] = Device(np.zeros(1))
    state.launched()
    landed(state, (losses, params), (device_losses, copy))
    np.testing.assert_array_equal(params["layer"]["w"], np.zeros(2))
    np.testing.assert_array_equal(params["b7"], np.zeros(1))


def test_copies_of_one_container_each_give_their_own_changes() -> None:
    shared, arrays = {"w": np.ones(2), "n": 0}, [np.ones(2)]
    first, (first_dict, first_list) = run_on_copies(shared, arrays)  # two lane items, or
    second, (second_dict, second_list) = run_on_copies(shared, arrays)  # f(d, d)
    first_dict["a"] = Device(1)
    first_list.append(Device(2))
    first.launched()
    second_dict["b"] = Device(3)
    second_dict["n"] += 1
    second_list.append(Device(4))
    second.launched()
    landed(first, (shared, arrays), (first_dict, first_list))
    landed(second, (shared, arrays), (second_dict, second_list))
    assert (shared["a"], shared["b"], shared["n"]) == (1, 3, 1)
    assert arrays[1:] == [2, 4] and type(arrays[0]) is np.ndarray


def test_a_list_two_runs_in_flight_change_ends_with_host_values() -> None:
    model = Model()
    model.window = [1.0, 2.0]
    first = watching(model)
    model.window.append(Device(3.0))  # a lane's items: window.append(...); window.pop(0)
    model.window.pop(0)
    first.launched()
    second = watching(model)
    model.window.append(Device(4.0))
    model.window.pop(0)
    second.launched()
    after_success(first)
    after_success(second)
    assert model.window == [3.0, 4.0]


def test_the_callers_objects_and_lists_bound_elsewhere_keep_their_identity() -> None:
    parent, child, log = Model(), Model(), []
    state = watching(parent, child, log)
    child.coef = Device(np.zeros(2))
    log.append(Device(1))
    parent.child, parent.log = child, log
    state.launched()
    after_success(state)
    assert parent.child is child and parent.log is log
    assert type(child.coef) is np.ndarray and log == [1]


def test_odd_containers_are_read_without_their_own_methods() -> None:
    class Odd(dict):  # type: ignore[type-arg]
        def copy(self) -> Any:
            return 5

    odd = Odd(a=1)
    state = watching(odd)
    odd["b"] = Device(2)
    state.launched()
    after_success(state)
    assert odd == {"a": 1, "b": 2}


def test_objects_a_bound_method_or_partial_holds_are_arguments_too() -> None:
    first, second, third = Model(), Model(), Model()

    def fit(model: Model, other: Model, *, last: Model) -> None:
        pass

    class Holder:
        def fit(self, x: Any) -> None:
            pass

    holder = Holder()
    assert bound_arguments(fit) == ()
    assert bound_arguments(holder.fit) == (holder,)
    nested = functools.partial(functools.partial(fit, first, last=third), second)
    assert bound_arguments(nested) == (first, second, third)
    objects = watching(*bound_arguments(holder.fit))
    holder.coef = Device(5)
    objects.launched()
    after_success(objects)
    assert holder.coef == 5

    class Callable:
        def __call__(self, x: Any) -> None:
            pass

    callable_object = Callable()
    assert bound_arguments(callable_object) == (callable_object,)
    assert bound_arguments(Callable) == bound_arguments(len) == ()
    assert not watching(Refusing())  # not watched; no error


def test_array_twins_pair_the_callers_arrays_with_their_copies_as_the_run_began() -> None:
    """What the GPU path copies back into the arrays of a list, dict or tuple argument the
    function writes into (``for p in params: p -= step``), whatever the run did to the
    copies' items afterwards."""
    rng = np.random.default_rng(22)
    w, b, m = rng.random(3), rng.random(2), rng.random(4)
    params, state = [w, (b, 7)], {"m": m, "steps": 1}
    copies = [Device(w), (Device(b), 7)]
    state_copy = {"m": Device(m), "steps": 1}
    watched = watching(copies, state_copy)
    device_w, device_b, device_m = copies[0], copies[1][0], state_copy["m"]
    copies.reverse()  # the run rebinds and adds items: the pairs are those it began with
    copies.append(Device(rng.random(1)))
    state_copy["m"] = Device(rng.random(4))
    watched.launched()
    pairs = watched.array_twins(params, copies)
    assert [(id(host), id(copy)) for host, copy in pairs] == [
        (id(w), id(device_w)), (id(b), id(device_b))]
    assert [(id(host), id(copy)) for host, copy in watched.array_twins(state, state_copy)] == [
        (id(m), id(device_m))]
    assert watched.array_twins([w], [w]) == []  # the caller's own list: no copy
