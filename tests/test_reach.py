"""Substitution that reaches helpers (``@veda.gpu(reach=...)``), on a NumPy-only machine: a
recording stand-in is the device package, so the test sees which code ran with the device
namespace. Nothing shared may change: the helpers' module, its functions and classes, and what
other threads see."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import numpy as np
import pytest
import reach_module as rm
import recording_numpy

import vedart as veda
from vedart.offload import substitute
from vedart.offload.arguments import map_arrays
from vedart.offload.results import results_to_host
from vedart.offload.substitute import (
    ModuleMapper,
    Reach,
    clone_is_current,
    device_clone,
    helper_of,
)
from vedart.telemetry import CallRecord, Telemetry

RECORDING = ModuleMapper({"numpy": "recording_numpy"})


@pytest.fixture(autouse=True)
def _clear_recording() -> None:
    recording_numpy.calls.clear()


def reaching(func: Any) -> tuple[Any, Reach]:
    reach = Reach.of(func, RECORDING)
    return device_clone(func, RECORDING, reach), reach


def routed() -> int:
    return len(recording_numpy.calls)


def test_helpers_and_their_helpers_run_with_the_device_namespace() -> None:
    clone, reach = reaching(rm.top)
    np.testing.assert_array_equal(clone(3), rm.top(3))
    assert routed() == 3  # top, middle and bottom each made their zeros on the "device"
    assert reach.names == ("reach_module.bottom", "reach_module.middle")
    recording_numpy.calls.clear()
    device_clone(rm.top, RECORDING)(3)  # without reach: the function's own code only
    assert routed() == 1


def test_functions_read_through_a_module_name_are_reached() -> None:
    clone, reach = reaching(rm.uses_a_module_attribute)
    np.testing.assert_array_equal(clone(2), rm.uses_a_module_attribute(2))
    assert routed() == 1  # rm_alias.bottom ran as a clone; the inside import's did not
    assert reach.names == ("reach_module.bottom",)


def test_assignments_through_a_reached_module_reach_the_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rm, "last_size", 0)
    clone, reach = reaching(rm.assigns_through_the_module)
    clone(5)
    assert rm.last_size == 5 and not hasattr(rm, "scratch")
    assert routed() == 1 and reach.names == ("reach_module.bottom",)  # the module was reached
    clone(6)
    assert rm.last_size == 6


def test_objects_made_in_the_call_run_device_methods_and_come_back_as_their_class() -> None:
    clone, reach = reaching(rm.fit_a_model)
    x = np.random.default_rng(1).random((4, 3))
    model = clone(x)
    assert routed() == 1 and "reach_module.Model" in reach.names
    assert isinstance(model, rm.Model) and type(model) is not rm.Model  # a device class
    np.testing.assert_allclose(model.offset, 2.0 * x.mean(axis=0))
    back = map_arrays(model, np.ndarray, lambda array: array * 1, 8, records=True)
    assert type(back) is rm.Model  # as results leave a call
    np.testing.assert_allclose(back.offset, 2.0 * x.mean(axis=0))
    assert clone(x).size == 3 and routed() == 3  # a property's getter is cloned too
    assert reaching(rm.uses_class_helpers)[0](2).shape == (2,) and routed() == 4  # static
    assert reaching(rm.is_model)[0](rm.Model())  # made outside the call: a Model all the same


def test_functions_and_classes_the_call_returns_compute_with_numpy_after_it() -> None:
    made = reaching(rm.makes_functions)[0](3)
    assert routed() == 1
    x = np.random.default_rng().random(3)
    assert made[0](x).shape == (3,) and routed() == 2  # in the call's namespace: the "device"
    back, _ = results_to_host(made, NoDeviceArray)
    shifted, countdown, make, helper, model_class, fit = back
    recording_numpy.calls.clear()
    np.testing.assert_array_equal(shifted(x), x + 2.0)
    assert shifted.__globals__ is vars(rm) and shifted.__qualname__.endswith("<locals>.shifted")
    assert countdown(4) == 4 and make().shape == (3,)
    assert helper is rm.bottom and model_class is rm.Model  # what the module binds
    assert fit.__func__ is rm.Model.fit and type(fit.__self__) is rm.Model
    assert type(fit(x[None, :])) is rm.Model and fit.__self__.offset.shape == (3,)
    assert routed() == 0  # nothing ran with the device namespace after the call
    shifted = reaching(rm.makes_functions)[0](3)[0]
    doubled = map_arrays(shifted, np.ndarray, lambda array: array * 2, 8, records=True)
    np.testing.assert_array_equal(doubled(np.zeros(3)), np.full(3, 4.0))  # closure, default


def test_objects_of_a_class_with_slots_come_back_as_their_class() -> None:
    made = reaching(rm.make_slotted)[0](3)
    assert type(made) is not rm.Slotted and routed() == 2
    back, _ = results_to_host([made], NoDeviceArray)
    assert type(back[0]) is rm.Slotted
    np.testing.assert_array_equal(back[0].values, np.zeros(3))
    np.testing.assert_array_equal(back[0].private(), np.ones(3))
    assert not hasattr(back[0], "unset")
    converted = map_arrays(reaching(rm.make_slotted)[0](2), np.ndarray, lambda a: a + 1, 8,
                           records=True)  # as results convert device arrays: a copy
    assert type(converted) is rm.Slotted
    np.testing.assert_array_equal(converted.values, np.ones(2))
    np.testing.assert_array_equal(converted.private(), np.full(2, 2.0))


def test_methods_reached_through_super_run_as_clones() -> None:
    x = np.random.default_rng().random(4)
    clone, reach = reaching(rm.uses_super)
    for got, want in zip(clone(x), rm.uses_super(x)):
        np.testing.assert_array_equal(got, want)
    # Layer.__init__ (through super() in Scaled.__init__, reached from Scaled.sized through
    # super() in a classmethod), Scaled.__init__'s own, Layer.forward (through super(Scaled,
    # self)): all three on the device
    assert routed() == 3
    assert reach.names == ("reach_module.Layer", "reach_module.Scaled")


def test_a_class_whose_subclassing_has_effects_is_not_reached() -> None:
    clone, reach = reaching(rm.uses_registered)
    assert clone(2).shape == (2,)
    assert rm.Registered.subclasses == [] and routed() == 0 and reach.names == ()


def test_nothing_shared_changes_and_other_threads_see_plain_numpy() -> None:
    module_before = dict(vars(rm))
    methods_before = dict(vars(rm.Model))
    clone, _ = reaching(rm.top)
    other_thread: list[Any] = []
    started, finish = threading.Event(), threading.Event()

    def plain() -> None:
        started.set()
        finish.wait(5)
        other_thread.append(rm.middle(2))

    thread = threading.Thread(target=plain)
    thread.start()
    started.wait(5)
    clone(2)
    finish.set()
    thread.join(5)
    assert {ident for _, ident in recording_numpy.calls} == {threading.get_ident()}
    np.testing.assert_array_equal(other_thread[0], rm.middle(2))
    assert dict(vars(rm)) == module_before and dict(vars(rm.Model)) == methods_before
    assert sys.modules["numpy"] is np and rm.np is np


def test_clones_are_bounded_in_depth_and_count_and_remade_when_code_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(substitute, "REACH_DEPTH", 1)
    reaching(rm.top)[0](2)
    assert routed() == 2  # top and middle; bottom is two calls deep
    monkeypatch.setattr(substitute, "REACH_DEPTH", 8)
    monkeypatch.setattr(substitute, "REACH_FUNCTIONS", 1)
    recording_numpy.calls.clear()
    clone, reach = reaching(rm.top)
    clone(2)
    assert routed() == 2 and reach.names == ("reach_module.middle",)
    monkeypatch.setattr(substitute, "REACH_FUNCTIONS", 128)
    recording_numpy.calls.clear()
    clone, reach = reaching(rm.top)
    clone(2)
    assert routed() == 3
    monkeypatch.setattr(rm.bottom, "__code__", rm.bottom_twice.__code__)  # redefined in place
    clone(2)
    assert routed() == 7  # the new code ran as a clone: two zeros on the "device"


def test_a_helper_defined_again_is_not_counted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module reloaded, or a notebook cell run again, binds a new function object of the
    same name: the bound counts helpers by name, so editing helpers does not exhaust it."""
    monkeypatch.setattr(substitute, "REACH_FUNCTIONS", 2)
    clone, reach = reaching(rm.top)
    for _ in range(3):
        monkeypatch.setattr(rm, "bottom", types.FunctionType(
            rm.bottom.__code__, rm.bottom.__globals__, rm.bottom.__name__))
        recording_numpy.calls.clear()
        np.testing.assert_array_equal(clone(2), rm.top(2))
        assert routed() == 3  # bottom, made anew, still ran as a clone
    assert reach.names == ("reach_module.bottom", "reach_module.middle")


def test_clones_are_remade_when_defaults_or_a_class_method_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng().random((3, 2))
    clone, _ = reaching(rm.scaled_offset)
    np.testing.assert_array_equal(clone(x), rm.scaled_offset(x))
    monkeypatch.setattr(rm.scaled, "__defaults__", (7.0,))
    np.testing.assert_array_equal(clone(x), rm.scaled_offset(x))
    monkeypatch.setattr(rm.Model, "fit", rm.Model.fit_negated)  # as mock.patch.object does
    np.testing.assert_array_equal(clone(x), rm.scaled_offset(x))
    assert routed() == 3 * 2  # every run's scaled and fit ran as clones
    clone, _ = reaching(rm.fit_a_model)
    made = type(clone(x))
    monkeypatch.setattr(rm.Model, "fits", 1, raising=False)  # not a method: no new class
    assert type(clone(x)) is made


def test_clones_are_remade_when_their_module_rebinds_a_name_they_substitute(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``make = np.zeros`` rebound (as ``mock.patch`` does) after a clone was made: the clone
    ran the device twin of the old value, a silently different answer."""
    clone, reach = reaching(rm.calls_a_maker)
    own = device_clone(rm.makes_through_a_module_name, RECORDING)
    np.testing.assert_array_equal(clone(2), np.zeros(2))
    assert clone_is_current(own) and routed() == 1
    monkeypatch.setattr(rm, "make", np.ones)
    reach.drop_stale()  # as the decorated function's next GPU run does first
    np.testing.assert_array_equal(clone(2), np.ones(2))  # the helper was made again
    assert not clone_is_current(own)
    assert clone_is_current(device_clone(rm.makes_through_a_module_name, RECORDING))
    monkeypatch.setattr(rm, "make", lambda n: np.full(n, 3.0))
    reach.drop_stale()
    np.testing.assert_array_equal(clone(2), np.full(2, 3.0))
    monkeypatch.setattr(rm, "make", np.zeros)
    through_a_class, reach = reaching(rm.makes_through_a_method)
    np.testing.assert_array_equal(through_a_class(2), np.zeros(2))
    monkeypatch.setattr(rm, "make", np.ones)
    reach.drop_stale()
    np.testing.assert_array_equal(through_a_class(2), np.ones(2))  # the class made again
    monkeypatch.setattr(substitute, "REACH_FUNCTIONS", 1)  # made again, not counted again
    clone, reach = reaching(rm.calls_a_maker)
    for maker in (np.zeros, np.ones, np.zeros, np.ones):
        monkeypatch.setattr(rm, "make", maker)
        reach.drop_stale()
        np.testing.assert_array_equal(clone(2), maker(2))
    assert reach.names == ("reach_module.makes_through_a_module_name",)


def test_a_subclass_defined_in_the_call_answers_its_own_class() -> None:
    clone, _ = reaching(rm.subclasses_in_the_call)
    values, text, own, base_is_sub, made = clone(2)
    expected_values, *expected, _ = rm.subclasses_in_the_call(2)
    np.testing.assert_array_equal(values, expected_values)
    assert [text, own, base_is_sub] == expected == [
        "subclasses_in_the_call.<locals>.Tuned(scale=1.0, extra=2.0)", True, False]
    assert routed() == 1  # ramp, inherited from the device class, ran as a clone
    made_class = type(made)
    back, _ = results_to_host([made], NoDeviceArray)
    assert type(back[0]) is made_class  # its own class, not its base's
    assert isinstance(back[0], rm.Settings) and back[0].extra == 2.0


def test_objects_made_in_the_call_compare_with_objects_made_outside_as_on_the_cpu() -> None:
    # A dataclass's generated __eq__ and ordering compare the objects' __class__.
    clone, _ = reaching(rm.compares_with_objects_made_outside)
    values, answers = clone(2)
    expected_values, expected_answers = rm.compares_with_objects_made_outside(2)
    np.testing.assert_array_equal(values, expected_values)
    assert answers == expected_answers == (True, True, False, True, True, False, True, True, 1)
    assert routed() == 1  # made on the device all the same


def test_other_comparisons_with_objects_made_outside_answer_as_on_the_cpu() -> None:
    # __lt__ alone (the reflection tried first is added), a hash kept beside a cloned __eq__,
    # a class whose __del__ would run on shared attributes, and one without a __dict__.
    clone, _ = reaching(rm.compares_in_other_ways)
    values, answers = clone(2)
    expected_values, expected_answers = rm.compares_in_other_ways(2)
    np.testing.assert_array_equal(values, expected_values)
    assert answers == expected_answers == (True, False, True, 2, True, True, bool)
    assert routed() == 1


def test_class_state_written_in_the_call_goes_to_the_class(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rm.Counted, "made", 0)
    clone, _ = reaching(rm.makes_a_counted)
    clone(2), clone(2)
    rm.makes_a_counted(2)
    assert rm.Counted.made == 3 and routed() == 2
    device_class = type(clone.__globals__["Counted"]())  # read as the clone reads it
    assert device_class is not rm.Counted and "made" not in vars(device_class)


@pytest.mark.parametrize("function", [
    rm.through_a_package,  # a package re-exporting a helper of a submodule that binds NumPy
    rm.reads_a_cached_property,  # a functools.cached_property
])
def test_helpers_reached_through_packages_and_cached_properties(function: Any) -> None:
    clone, _ = reaching(function)
    np.testing.assert_array_equal(clone(3), function(3))
    assert routed() == 1  # the helper made its zeros on the "device"


def test_another_gpu_function_is_called_through_its_wrapper_not_cloned() -> None:
    clone, reach = reaching(rm.calls_a_gpu_function)
    np.testing.assert_array_equal(clone(3), rm.calls_a_gpu_function(3))
    assert reach.names == ("reach_module.bottom",)


def test_a_helper_that_assigns_module_globals_runs_as_written() -> None:
    before = rm.calls_made
    clone, reach = reaching(rm.calls_a_counter)
    clone(2)
    assert rm.calls_made == before + 1  # the assignment reached the real module
    assert routed() == 0  # not cloned: its np.zeros is NumPy's


def test_a_failure_in_a_helper_is_named() -> None:
    clone, _ = reaching(rm.calls_a_failing_helper)
    with pytest.raises(ArithmeticError) as caught:
        clone(2)
    assert helper_of(caught.value) == "reach_module.fails_inside"
    with pytest.raises(ArithmeticError) as caught:
        device_clone(rm.calls_a_failing_helper, RECORDING)(2)
    assert helper_of(caught.value) is None


def test_reach_is_an_option_checked_at_decoration() -> None:
    assert rm.top.__module__ == "reach_module"
    assert veda.gpu(rm.top).gpu_options.reach is True  # type: ignore[attr-defined]
    assert veda.gpu(reach=False)(rm.top).gpu_options.reach is False  # type: ignore[attr-defined]
    with pytest.raises(veda.ConfigError, match=r"reach: got 'yes'; allowed: True"):
        veda.gpu(reach="yes")  # type: ignore[arg-type]


class NoDeviceArray:
    """No value is one: results_to_host then only walks the result."""


def test_results_without_device_arrays_still_leave_as_their_class() -> None:
    clone, _ = reaching(rm.fit_a_model)
    model = clone(np.ones((2, 2)))
    model.offset = [1.0, 2.0]  # no arrays left in it
    back, moved = results_to_host([model], NoDeviceArray)
    assert type(back[0]) is rm.Model and moved == 0


def test_the_report_lists_the_helpers_a_function_ran_as_clones() -> None:
    telemetry = Telemetry()
    telemetry.record(CallRecord("user.solve", "gpu", "forced"))
    telemetry.function("user.solve").helpers = ("user.build_matrix", "user.Model")
    assert telemetry.snapshot()["functions"][0]["helpers"] == ["user.build_matrix",
                                                                "user.Model"]
    assert "helpers run as device clones:\n  user.solve: user.build_matrix, user.Model" in \
        telemetry.report()
