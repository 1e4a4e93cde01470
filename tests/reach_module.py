"""Helpers a decorated function reaches, written as a user's module would be: functions that
make arrays, functions calling each other, a class whose methods make arrays."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

import reach_module as rm_alias  # the module itself, as user code imports its siblings
import reach_package
import vedart as veda

calls_made = 0
last_size = 0


def top(n: int) -> Any:
    return middle(n) + np.zeros(n)


def middle(n: int) -> Any:
    return bottom(n) + np.zeros(n)


def bottom(n: int) -> Any:
    return np.zeros(n) + 1.0


def counts_calls(n: int) -> Any:
    global calls_made
    calls_made += 1
    return np.zeros(n)


def calls_a_counter(n: int) -> Any:
    return counts_calls(n)


def fails_inside(n: int) -> Any:
    raise ArithmeticError(f"helper failed for {n}")


def calls_a_failing_helper(n: int) -> Any:
    return fails_inside(n) + np.zeros(n)


class Model:
    """Fits a constant offset: methods make arrays, as estimator classes do."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.offset: Any = None

    def fit(self, x: Any) -> Model:
        self.offset = np.zeros(x.shape[-1]) + self.scale * x.mean(axis=0)
        return self

    def fit_negated(self, x: Any) -> Model:
        self.offset = np.zeros(x.shape[-1]) - self.scale * x.mean(axis=0)
        return self

    @staticmethod
    def blank(n: int) -> Any:
        return np.zeros(n)

    @property
    def size(self) -> int:
        return int(np.zeros(1).size) * len(self.offset)


def fit_a_model(x: Any) -> Model:
    model = Model(2.0).fit(x)
    assert isinstance(model, Model)
    return model


def makes_functions(n: int) -> Any:
    """What a call can hand back that runs code later: a closure with a default, a recursive
    closure, a lambda, a reached helper, a reached class and a method of an object made in
    the call."""
    offset = np.zeros(n) + 1.0

    def shifted(x: Any, extra: Any = offset) -> Any:
        return x + offset + extra + np.zeros(n)

    def countdown(k: int) -> int:
        return 0 if k == 0 else countdown(k - 1) + 1

    return shifted, countdown, lambda: np.zeros(n), bottom, Model, Model(2.0).fit


def uses_class_helpers(n: int) -> Any:
    return Model.blank(n)


def scaled(x: Any, factor: float = 2.0) -> Any:
    return np.zeros(x.shape) + factor * x


def scaled_offset(x: Any) -> Any:
    return Model().fit(scaled(x)).offset


@veda.gpu
def decorated_bottom(n: int) -> Any:
    return bottom(n)


def calls_a_gpu_function(n: int) -> Any:
    return decorated_bottom(n) + bottom(n)


def bottom_twice(n: int) -> Any:
    return np.zeros(n) + np.zeros(n) + 1.0


def assigns_through_the_module(n: int) -> Any:
    rm_alias.last_size = n
    rm_alias.scratch = n
    del rm_alias.scratch
    return rm_alias.bottom(n)


def uses_a_module_attribute(n: int) -> Any:
    import reach_module as itself  # bound inside: not reached (the import is as written)

    return itself.bottom(n) + rm_alias.bottom(n)


def is_model(value: Any) -> bool:
    return isinstance(value, Model) and issubclass(type(value), Model)


class Registered:
    """Records its subclasses: subclassing it has effects, so it is not reached."""

    subclasses: list[type] = []

    def __init_subclass__(cls) -> None:
        Registered.subclasses.append(cls)

    def make(self, n: int) -> Any:
        return np.zeros(n)


def uses_registered(n: int) -> Any:
    return Registered().make(n)


class Slotted:
    """Holds its arrays in slots: its objects have no ``__dict__``."""

    __slots__ = ("values", "__private", "unset")

    def __init__(self, n: int) -> None:
        self.values = np.zeros(n)
        self.__private = np.zeros(n) + 1.0

    def private(self) -> Any:
        return self.__private


def make_slotted(n: int) -> Slotted:
    return Slotted(n)


class Layer:
    """A base class whose methods make arrays, reached from its subclass through super()."""

    def __init__(self, n: int) -> None:
        self.weights = np.zeros(n) + 1.0

    def forward(self, x: Any) -> Any:
        return np.zeros(len(x)) + x * self.weights

    @classmethod
    def sized(cls, n: int) -> Layer:
        return cls(n)


class Scaled(Layer):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.bias = np.zeros(n)

    def forward(self, x: Any) -> Any:
        return super(Scaled, self).forward(x) + self.bias

    @classmethod
    def sized(cls, n: int) -> Layer:
        return super().sized(n)


def uses_super(x: Any) -> Any:
    layer = Scaled.sized(len(x))
    return layer.forward(x), layer.weights


make = np.zeros  # a NumPy function bound to a module name, which tests rebind


def makes_through_a_module_name(n: int) -> Any:
    return make(n)


def calls_a_maker(n: int) -> Any:
    return makes_through_a_module_name(n)


@dataclasses.dataclass
class Settings:
    scale: float = 1.0

    def ramp(self, n: int) -> Any:
        return np.zeros(n) + self.scale


@dataclasses.dataclass(order=True, frozen=True)
class Ranked:
    rank: float = 1.0

    def ramp(self, n: int) -> Any:
        return np.zeros(n) + self.rank


FIRST = Ranked(1.0)


def compares_with_objects_made_outside(n: int) -> Any:
    made, other = Ranked(1.0), Ranked(2.0)  # objects of the device class
    answers = (made == FIRST, FIRST == made, made != FIRST, other > FIRST, FIRST < other,
               other == FIRST, FIRST <= made, made >= FIRST, {made: 1}.get(FIRST))
    return made.ramp(n), answers


class Version:
    """Ordered by ``__lt__`` alone, as ``sorted`` needs; hashed as ``object`` hashes."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __lt__(self, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.number < other.number

    def __eq__(self, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.number == other.number

    __hash__ = object.__hash__


class Handle:
    """Closed when freed."""

    def __init__(self) -> None:
        self.open = True

    def __eq__(self, other: Any) -> Any:
        return isinstance(other, Handle) and self.open == other.open

    __hash__ = None  # type: ignore[assignment]

    def __del__(self) -> None:
        self.open = False


class Stateless:
    __slots__ = ()

    def __eq__(self, other: Any) -> Any:
        return other.__class__ is self.__class__


LATEST, OUTSIDE_HANDLE, STATELESS = Version(3), Handle(), Stateless()


def compares_in_other_ways(n: int) -> Any:
    made = Version(2)
    answers = (made < LATEST, LATEST < made, sorted([LATEST, made])[0] is made,
               len({made, LATEST}), Handle() == OUTSIDE_HANDLE, OUTSIDE_HANDLE.open,
               type(Stateless() == STATELESS))
    return np.zeros(n) + made.number, answers


class Counted:
    made = 0

    def __init__(self) -> None:
        type(self).count()

    @classmethod
    def count(cls) -> None:
        cls.made += 1

    def zeros(self, n: int) -> Any:
        return np.zeros(n)


def makes_a_counted(n: int) -> Any:
    return Counted().zeros(n)


def through_a_package(n: int) -> Any:
    return reach_package.ramp(n)


class Cached:
    def __init__(self, n: int) -> None:
        self.n = n

    @functools.cached_property
    def zeros(self) -> Any:
        return np.zeros(self.n)


def reads_a_cached_property(n: int) -> Any:
    return Cached(n).zeros


def subclasses_in_the_call(n: int) -> Any:
    @dataclasses.dataclass
    class Tuned(Settings):  # a subclass of the device class, in a clone
        extra: float = 2.0

    made = Tuned()
    return made.ramp(n) * made.extra, repr(made), made.__class__ is Tuned, \
        isinstance(Settings(), Tuned), made


class Maker:
    def make(self, n: int) -> Any:
        return make(n)


def makes_through_a_method(n: int) -> Any:
    return Maker().make(n)
