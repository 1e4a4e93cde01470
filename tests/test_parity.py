"""The parity suite: NumPy expressions a user writes (tests/parity_cases.py) give the same
answer through @veda.gpu on the GPU path as in plain NumPy: the same values within the dtype's
tolerance, dtype, shape, Python type, and exception type where NumPy raises.

CPU half (CI): the cases, run through the NumPy-to-device substitution with NumPy itself as the
device package, against plain NumPy; and the comparison catches what it must.
GPU half (``pytest -m gpu``): ``settings`` profile ``parity-gpu``, at least 2,000 examples,
each case under ``veda.force("gpu")`` against plain NumPy. Differences that remain by design
are listed in docs/offload.md ("Parity") and relaxed here only as listed there.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import parity_cases as pc
import pytest
from hypothesis import HealthCheck, assume, given, settings

import vedart as veda
from vedart.offload.substitute import ModuleMapper, device_clone

_SLOW_DRAWS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("parity-cpu", max_examples=60, deadline=None,
                          suppress_health_check=_SLOW_DRAWS)
settings.register_profile("parity-gpu", max_examples=2000, deadline=None,
                          suppress_health_check=_SLOW_DRAWS)
IDENTITY = ModuleMapper({"numpy": "numpy"})


@settings(settings.get_profile("parity-cpu"))
@given(pc.cases())
def test_cases_through_the_substitution_agree_with_numpy(case: pc.Case) -> None:
    expected = pc.outcome(case.func, case.fresh_args(), case.kwargs)
    actual = pc.outcome(device_clone(case.func, IDENTITY), case.fresh_args(), case.kwargs)
    pc.assert_same(actual, expected, values=case.values)


@settings(settings.get_profile("parity-cpu"))
@given(pc.arrays())
def test_each_run_gets_a_copy_laid_out_as_the_drawn_array(array: np.ndarray) -> None:
    copy = pc.Case("self", pc.UNARY["self"], (array,)).fresh_args()[0]
    assert copy is not array and not np.shares_memory(copy, array)
    assert copy.dtype == array.dtype
    assert (copy.flags.c_contiguous, copy.flags.f_contiguous) == \
        (array.flags.c_contiguous, array.flags.f_contiguous)
    np.testing.assert_array_equal(copy, array)
    if array.dtype.kind in "iu" and array.size:
        assert (array != 0).all()


def test_known_differences_are_the_documented_ones() -> None:
    flags = np.array([True, False])
    assert pc.known_difference(pc.Case("power_2", pc.UNARY["power_2"], (flags,))) == \
        "bool ** 2 is int64 on the GPU (NumPy: int8)"
    assert pc.known_difference(pc.Case("power_2", pc.UNARY["power_2"], (np.ones(2),))) is None
    zero_d = np.asarray(1.5)
    assert pc.known_difference(pc.Case("copy", pc.UNARY["copy"], (zero_d,))) is not None
    assert pc.known_difference(pc.Case("copy", pc.UNARY["copy"], (np.ones(2),))) is None


@pytest.mark.parametrize(("actual", "expected", "message"), [
    (np.ones(3, np.float32), np.ones(3, np.float64), "dtype <f4 where NumPy gave <f8"),
    (np.ones(3, ">f4"), np.ones(3, "<f4"), "dtype >f4 where NumPy gave <f4"),
    (np.float64(1.0), np.array(1.0), "type float64 where NumPy gave ndarray"),
    (np.int64(3), 3, "type int64 where NumPy gave int"),
    (np.ones((3, 1)), np.ones(3), r"shape \(3, 1\) where NumPy gave \(3,\)"),
    (np.array([1, 2]), np.array([1, 3]), "Arrays are not equal"),
    (np.array([1.0, 2.0]), np.array([1.0, 2.001]), "Not equal to tolerance"),
    (np.float32(1.01), np.float32(1.0), "Not equal to tolerance"),
    ((np.ones(2), 1.5), (np.ones(2), 2.5), r"result\[1\]: 1.5 where NumPy gave 2.5"),
    (pc.Raised(TypeError), pc.Raised(ValueError), "where NumPy gave Raised"),
    (np.ones(2), pc.Raised(TypeError), "where NumPy gave Raised"),
])
def test_the_comparison_catches_a_mismatch(actual: Any, expected: Any, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        pc.assert_same(actual, expected)


def test_the_comparison_accepts_the_same_answer() -> None:
    x = np.random.default_rng(4).random(5).astype(np.float32)
    pc.assert_same((x, x[::2], np.float32(x.sum())),
                   (x.copy(), x[::2].copy(), np.float32(x.sum() * (1 + 1e-6))))
    pc.assert_same(np.ones(2, ">f8"), np.ones(2, "<f8"), byte_order=False)
    pc.assert_same(pc.Raised(TypeError), pc.Raised(TypeError))
    twice = np.ones(2)
    with pytest.raises(AssertionError, match="the same array twice came back as two"):
        pc.assert_same((twice, twice.copy()), (twice, twice))


def _big_endian(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.byteorder == ">"


@pytest.mark.gpu
@settings(settings.get_profile("parity-gpu"))
@given(pc.cases())
def test_gpu_path_gives_what_numpy_gives(case: pc.Case) -> None:
    assume(pc.known_difference(case) is None)
    expected = pc.outcome(case.func, case.fresh_args(), case.kwargs)
    args = case.fresh_args()
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    with veda.force("gpu"):
        actual = pc.outcome(veda.gpu(case.func), args, case.kwargs)
    # Big-endian inputs: GPU results come back in native byte order (docs/offload.md).
    pc.assert_same(actual, expected, values=case.values,
                   byte_order=not any(map(_big_endian, args)), scale=case.scale)
    for argument, original in zip(args, before):
        if isinstance(original, np.ndarray):
            assert argument.dtype == original.dtype
            np.testing.assert_array_equal(argument, original)
