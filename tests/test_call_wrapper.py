"""The @gpu wrapper compiled with the function's own parameters (vedart.offload.call_wrapper)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.units import format_bytes

rng = np.random.default_rng()


def last_decision(wrapped: Any) -> tuple[str, str]:
    name = f"{wrapped.__module__}.{wrapped.__qualname__}"
    decision = veda.get_runtime().telemetry.function(name).last_decision()
    assert decision is not None
    return decision


def static_runtime(**probe_options: Any) -> veda.Runtime:
    """A runtime with the static rule on faked devices: what reaches the decision shows in its
    reasons."""
    return veda.init(veda.Config.builder().cost_model("static").build(),
                     device_probe=FakeProbe(**probe_options))


def every_kind(a, /, b, *rest, c, d=None, **extra):  # type: ignore[no-untyped-def]
    return a, b, rest, c, d, extra


def test_fast_path_counts_arrays_in_every_kind_of_parameter() -> None:
    static_runtime()
    wrapped = veda.gpu(every_kind)
    arrays = [rng.random(n) for n in (3, 5, 7, 11, 13, 17, 19)]
    args = (arrays[0], arrays[1], arrays[2], [arrays[3]])
    kwargs = {"c": arrays[4], "d": {"k": (arrays[5],)}, "e": arrays[6], "f": 2.5}
    result = wrapped(*args, **kwargs)
    expected = every_kind(*args, **kwargs)
    assert len(result) == len(expected)
    for got, want in zip(result, expected):
        assert got is want or got == want
    total = sum(array.nbytes for array in arrays)
    assert last_decision(wrapped) == ("cpu", f"below threshold: {format_bytes(total)} < 1.0 MB")


def test_an_array_past_the_cutoff_in_any_parameter_reaches_the_decision() -> None:
    static_runtime(free=0)
    wrapped = veda.gpu(threshold=1000)(every_kind)
    small, large = rng.random(2), rng.random(200)
    for args, kwargs in [((large, small), {"c": small}),
                         ((small, small, large), {"c": small}),
                         ((small, small), {"c": large}),
                         ((small, small), {"c": small, "d": [large]}),
                         ((small, small), {"c": small, "e": {"k": large}})]:
        wrapped(*args, **kwargs)
        path, reason = last_decision(wrapped)
        assert (path, reason.split(" free")[0]) == ("cpu", "device 0 has 0 B"), (args, kwargs)


def test_defaults_are_the_functions_own_objects() -> None:
    veda.init(veda.Config.builder().gpu(False).build())

    def remember(x, seen=[], *, log={}):  # noqa: B006 - the shared defaults are the point
        seen.append(x)
        log[x] = len(seen)
        return seen, log

    wrapped = veda.gpu(remember)
    seen, log = wrapped(1)
    assert seen is remember.__defaults__[0] and log is remember.__kwdefaults__["log"]
    assert wrapped(2) == ([1, 2], {1: 1, 2: 2})


@pytest.mark.parametrize("call", [
    lambda f: f(),
    lambda f: f(1, 2, 3, 4),
    lambda f: f(1, c=2),
    lambda f: f(1, 2, b=3),
    lambda f: f(a=1, b=2),
])
def test_a_bad_call_raises_what_the_function_raises(call: Any) -> None:
    veda.init(device_probe=FakeProbe())

    def three(a, /, b, c=None):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(TypeError) as direct:
        call(three)
    with pytest.raises(TypeError) as wrapped:
        call(veda.gpu(three))
    assert str(wrapped.value) == str(direct.value)


def test_parameters_named_like_builtins_or_the_template_own_names() -> None:
    static_runtime()

    def builtins_named(type, next, len=3):  # type: ignore[no-untyped-def]
        return type + next + len

    def template_named(_vd_plan, _vd_func=1):  # type: ignore[no-untyped-def]
        return _vd_plan + _vd_func

    x = rng.random(4)
    for function, kwargs in [(builtins_named, {"next": x}), (template_named, {"_vd_func": x})]:
        wrapped = veda.gpu(function)
        np.testing.assert_array_equal(wrapped(x, **kwargs), function(x, **kwargs))
        assert last_decision(wrapped) == ("cpu", "below threshold: 64 B < 1.0 MB")


def test_a_function_of_thousands_of_parameters_is_wrapped() -> None:
    static_runtime()
    names = [f"p{index}" for index in range(5000)]
    namespace: dict[str, Any] = {}
    exec(f"def many({', '.join(names)}):\n    return p0 + p4999", namespace)  # noqa: S102
    wrapped = veda.gpu(namespace["many"])
    assert wrapped(*range(5000)) == 4999


def test_other_callables_take_the_variadic_wrapper_with_the_same_rules() -> None:
    class Scale:
        def __call__(self, x: np.ndarray, factor: float = 2.0) -> np.ndarray:
            return x * factor

    def signed(x: np.ndarray) -> np.ndarray:
        return -x

    signed.__signature__ = inspect.Signature()  # type: ignore[attr-defined]  # a lying one
    x = rng.random(6)
    for callable_, expected in [(Scale(), x * 3.0),
                                (functools.partial(np.multiply, 3.0), x * 3.0),
                                (signed, -x)]:
        runtime = static_runtime()
        wrapped = veda.gpu(callable_)
        args = (x, 3.0) if isinstance(callable_, Scale) else (x,)
        np.testing.assert_array_equal(wrapped(*args), expected)
        [row] = runtime.telemetry.snapshot()["functions"]
        assert row["last_reason"] == "below threshold: 48 B < 1.0 MB"
        named = {Scale: "Scale", functools.partial: "multiply"}.get(type(callable_), "signed")
        assert wrapped.__name__ == named  # what it runs, not the wrapper's own name
    assert veda.gpu(functools.partial(signed)).__doc__ == signed.__doc__


def test_wrappers_sharing_one_compiled_template_keep_their_own_functions_and_defaults() -> None:
    def scaled(x, factor=2.0):  # type: ignore[no-untyped-def]
        return x * factor

    def shifted(x, factor=-5.0):  # type: ignore[no-untyped-def]
        return x + factor

    shifted.__qualname__ = scaled.__qualname__  # the same source and name: compiled once
    static_runtime()
    first, second, again = veda.gpu(scaled), veda.gpu(shifted), veda.gpu(scaled)
    assert len({id(first.__code__), id(second.__code__), id(again.__code__)}) == 3  # copies
    assert (first(3.0), second(3.0), again(3.0), second(3.0, 1.0)) == (6.0, -2.0, 6.0, 4.0)
    assert (first.__defaults__, second.__defaults__) == ((2.0,), (-5.0,))
