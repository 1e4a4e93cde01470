"""Attributes a GPU run assigns to the objects among a call's arguments: converted after a
success, put back after a failure (``vedart.offload.assigned``). A stand-in array type plays
the device's; the GPU tests run the same through ``@veda.gpu``."""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np
import pytest

from vedart.offload.assigned import ArgumentObjects, bound_arguments


class Device:
    """A stand-in for a device array: converted to ``host`` (its bytes: 8)."""

    def __init__(self, host: Any) -> None:
        self.host = host


def converted(values: tuple[Any, ...]) -> list[Any]:
    """What the GPU path's conversion does to the values the run left, for the stand-in."""
    return [value.host if isinstance(value, Device) else
            [item.host if isinstance(item, Device) else item for item in value]
            if isinstance(value, list) else value for value in values]


def after_success(objects: ArgumentObjects) -> None:
    held = objects.held()
    objects.bind(held, converted(tuple(value for _, _, value in held)))


def test_a_failure_after_the_conversion_puts_the_attributes_back() -> None:
    model = Model()
    coef = model.coef
    objects = ArgumentObjects((model,), {})
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
    objects = ArgumentObjects((model, np.ones(2)), {})
    model.coef = Device(np.zeros(3))  # assigned on the device
    model.history = [Device("first"), 1.5]  # added
    model.steps = 1  # assigned, nothing to convert
    objects.launched()
    assert {name for _, name, _ in objects.held()} == {"coef", "history", "steps"}
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
    objects = ArgumentObjects((), {"model": model})
    model.coef = Device(np.zeros(3))
    model.steps += 1
    model.scratch = Device(1)
    del model.kept_on_device
    history.append(Device(2))  # what an attribute holds is not undone
    if launched:
        objects.launched()
    objects.restore()
    assert vars(model).keys() == {*before, "history"}
    assert all(vars(model)[name] is value for name, value in before.items())
    assert model.history is history and len(history) == 1


def test_runs_in_flight_together_each_bind_their_own_values() -> None:
    model = Model()
    first = ArgumentObjects((model,), {})
    model.coef = first_coef = Device(np.zeros(3))
    first.launched()
    second = ArgumentObjects((model,), {})  # a lane's next item, launched before the first lands
    model.coef = Device(np.ones(3))
    model.steps = 2
    second.launched()
    assert first.held() == []  # the second run's values: the first leaves them alone
    after_success(first)
    assert isinstance(model.coef, Device)
    second.restore()  # the second failed: its bindings go, the first's come back
    assert model.coef is first_coef and model.steps == 0


def test_only_objects_among_the_arguments_are_watched() -> None:
    def plain(x: Any) -> Any:
        return x

    plain.attribute = 1
    namespace = types.SimpleNamespace(a=1)
    values: tuple[Any, ...] = (np.ones(2), np.float64(1.0), 3, "text", [Model()], {"m": Model()},
                               (Model(),), Model, np, plain, None, Slotted())
    assert not ArgumentObjects(values, {})
    model = Model()
    objects = ArgumentObjects((model, namespace, model), {"again": model})
    assert objects
    model.added = Device(2)
    namespace.a = Device(3)
    objects.launched()
    assert len(objects.held()) == 2  # the model counted once
    after_success(objects)
    assert model.added == 2 and namespace.a == 3


class Slotted:
    __slots__ = ("coef",)


class Refusing:
    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError("a proxy that answers nothing")


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
    objects = ArgumentObjects((), {}, bound_arguments(holder.fit))
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
    assert not ArgumentObjects((Refusing(),), {})  # not watched; no error
