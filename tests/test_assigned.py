"""Attributes a GPU run assigns to the objects among a call's arguments: converted after a
success, put back after a failure (``vedart.offload.assigned``). A stand-in array type plays
the device's; the GPU tests run the same through ``@veda.gpu``."""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from vedart.offload.assigned import ArgumentObjects, bound_arguments


class Device:
    """A stand-in for a device array: converted to ``host`` (its bytes: 8)."""

    def __init__(self, host: Any) -> None:
        self.host = host


def converted(value: Any) -> tuple[Any, int]:
    if isinstance(value, Device):
        return value.host, 8
    if isinstance(value, list):
        return [item.host if isinstance(item, Device) else item for item in value], 8
    return value, 0


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
    assert objects.to_host(converted) == 16
    assert type(model.coef) is np.ndarray and model.history == ["first", 1.5]
    assert model.steps == 1
    # held before the call: the caller's own value, whatever its type
    assert isinstance(model.kept_on_device, Device)
    assert model.coef is not coef_before


def test_a_failed_attempt_puts_every_attribute_back() -> None:
    model = Model()
    before = dict(vars(model))
    objects = ArgumentObjects((), {"model": model})
    model.coef = Device(np.zeros(3))
    model.steps += 1
    model.scratch = Device(1)
    del model.kept_on_device
    objects.restore()
    assert vars(model) == before
    assert all(vars(model)[name] is value for name, value in before.items())


def test_only_objects_among_the_arguments_are_watched() -> None:
    def plain(x: Any) -> Any:
        return x

    plain.attribute = 1
    namespace = types.SimpleNamespace(a=1)
    values: tuple[Any, ...] = (np.ones(2), np.float64(1.0), 3, "text", [Model()], {"m": Model()},
                               (Model(),), Model, np, plain, None)
    assert not ArgumentObjects(values, {})
    model = Model()
    objects = ArgumentObjects((model, namespace, model), {"again": model})
    assert objects
    model.added = Device(2)
    namespace.a = Device(3)
    assert objects.to_host(converted) == 16  # the model counted once
    assert model.added == 2 and namespace.a == 3


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
    assert objects.to_host(converted) == 8 and holder.coef == 5
