"""Which parameters a function's own code writes into in place (``vedart.offload.inplace``):
the GPU path copies those arguments back, as the CPU path leaves them written."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vedart.offload.inplace import written_parameters


def centre(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x -= x.mean()
    return x @ y


def centre_a_copy(x: np.ndarray) -> np.ndarray:
    x = x - x.mean()
    x /= x.std()
    return x


def zero_the_negatives(x: np.ndarray, limit: float) -> None:
    x[x < limit] = 0


def clip_into(x: np.ndarray, low: float) -> None:
    np.clip(x, low, 1.0, out=x)


def clip_into_a_tuple(x: np.ndarray) -> None:
    np.clip(x, 0.0, 1.0, out=(x,))


def sort_it(x: np.ndarray) -> np.ndarray:
    x.sort()
    return x


def through_a_view(x: np.ndarray) -> None:
    tail = x[1:]
    tail += 1


def through_a_transpose(x: np.ndarray) -> None:
    t = x.T
    t[0] += 1


def through_reshape(x: np.ndarray) -> None:
    flat = x.reshape(-1)
    flat[:3] = 0


def copy_into(x: np.ndarray, y: np.ndarray) -> None:
    np.copyto(x, y)


def ufunc_output_by_position(x: np.ndarray, y: np.ndarray) -> None:
    np.multiply(y, 2.0, x)


def ufunc_at(x: np.ndarray, index: np.ndarray) -> None:
    np.add.at(x, index, 1.0)


def shuffle(x: np.ndarray, rng: np.random.Generator) -> None:
    rng.shuffle(x)


def maybe_copied(x: np.ndarray, copy: bool) -> None:
    if copy:
        x = x.copy()
    x += 1  # the caller's x when copy is False


def as_array_first(x: Any) -> None:
    x = np.asarray(x)
    x *= 2


def astype_copies(x: np.ndarray) -> None:
    x = x.astype(np.float64)
    x += 1


def astype_without_a_copy(x: np.ndarray) -> None:
    x = x.astype(np.float64, copy=False)
    x += 1


def row_by_row(x: np.ndarray) -> None:
    for row in x:
        row[:] = row / row.sum()


def in_a_loop(x: np.ndarray, steps: int) -> None:
    for _ in range(steps):
        x *= 0.5


def rebound_in_a_loop(x: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        x = x * 0.5
        x += 1
    return x


def rebound_then_written_in_a_while(x: np.ndarray) -> None:
    while x.sum() > 1:
        x -= 1  # the caller's x on the first pass
        x = x / 2


def by_an_inner_function(x: np.ndarray) -> None:
    def fill() -> None:
        x[0] = 1

    fill()


def by_an_inner_lambda(x: np.ndarray) -> None:
    (lambda: x.fill(0))()


def inner_parameter_shadows(x: np.ndarray) -> None:
    def fill(x: np.ndarray) -> None:
        x[0] = 1

    fill(np.zeros(3))


def in_a_handler(x: np.ndarray) -> None:
    try:
        x = x / x.sum()
    except ZeroDivisionError:
        pass
    x[0] = 0  # the caller's x if the division raised


def unpacked(x: np.ndarray, y: np.ndarray) -> None:
    _, b = y, x
    b[0] = 0


def reads_only(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    z = x @ y
    z += 1
    return np.sort(z)


def sets_attributes(self: Any, x: np.ndarray) -> None:
    self.coef = x
    self.steps += 1
    self.history[0] = x


def sets_an_array_attribute(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
    x.real = 0
    y.imag += 1
    z.shape = (-1,)  # not copied back: the device copy's shape would not fit the caller's


def keyword_only(*, out: np.ndarray) -> None:
    out[...] = 1


def normalise_rows(m: np.ndarray, by: float = 1.0) -> None:
    m /= m.sum(axis=1, keepdims=True) * by


def through_a_helper(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    normalise_rows(x)
    return y


def through_a_helper_by_keyword(x: np.ndarray, y: np.ndarray) -> None:
    normalise_rows(by=2.0, m=x[1:])
    normalise_rows(y.copy())


def through_two_helpers(x: np.ndarray) -> None:
    through_a_helper(x, x)


def shadowed_helper(x: np.ndarray) -> None:
    normalise_rows = print  # a local name: not the module's helper
    normalise_rows(x)


def calls_itself(x: np.ndarray, n: int) -> None:
    if n:
        calls_itself(x, n - 1)


def one_of_two(x: np.ndarray, y: np.ndarray) -> None:
    two_of_two(y, x)


def two_of_two(x: np.ndarray, y: np.ndarray) -> None:
    one_of_two(y, x)
    x += 1


@pytest.mark.parametrize(("func", "written"), [
    (centre, ("x",)),
    (centre_a_copy, ()),
    (zero_the_negatives, ("x",)),
    (clip_into, ("x",)),
    (clip_into_a_tuple, ("x",)),
    (sort_it, ("x",)),
    (through_a_view, ("x",)),
    (through_a_transpose, ("x",)),
    (through_reshape, ("x",)),
    (copy_into, ("x",)),
    (ufunc_output_by_position, ("x",)),
    (ufunc_at, ("x",)),
    (shuffle, ("x",)),
    (maybe_copied, ("x",)),
    (as_array_first, ("x",)),
    (astype_copies, ()),
    (astype_without_a_copy, ("x",)),
    (row_by_row, ("x",)),
    (in_a_loop, ("x",)),
    (rebound_in_a_loop, ()),
    (rebound_then_written_in_a_while, ("x",)),
    (by_an_inner_function, ("x",)),
    (by_an_inner_lambda, ("x",)),
    (inner_parameter_shadows, ()),
    (in_a_handler, ("x",)),
    (unpacked, ("x",)),
    (reads_only, ()),
    (sets_attributes, ()),
    (sets_an_array_attribute, ("x", "y")),
    (keyword_only, ("out",)),
    (through_a_helper, ("x",)),
    (through_a_helper_by_keyword, ("x",)),
    (through_two_helpers, ("x",)),
    (shadowed_helper, ()),
    (calls_itself, ()),
    (one_of_two, ("y",)),
    (two_of_two, ("x",)),
])
def test_the_parameters_a_function_writes_into(func: Any, written: tuple[str, ...]) -> None:
    assert written_parameters(func) == written


def test_lambdas_methods_and_what_has_no_source() -> None:
    assert written_parameters(lambda x, y: x.fill(y)) == ("x",)

    class Model:
        def normalise(self, x: np.ndarray) -> None:
            x /= np.linalg.norm(x)

    assert written_parameters(Model.normalise) == ("x",)
    assert written_parameters(Model().normalise) == ()  # a bound method: not a plain function
    namespace: dict[str, Any] = {}
    exec("def made(x):\n    x += 1\n", namespace)  # no source to read
    assert written_parameters(namespace["made"]) == ()
    assert written_parameters(np.add) == ()
