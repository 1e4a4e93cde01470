"""Which parameters a function's own code writes into in place (``vedart.offload.inplace``):
the GPU path copies those arguments back, as the CPU path leaves them written."""

from __future__ import annotations

import functools
import inspect
import tokenize
import types
from typing import Any

import numpy as np
import pytest

import vedart as veda

from vedart.offload.inplace import found_writes


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


def reshaped_by_function(x: np.ndarray) -> None:
    y = np.reshape(x, (-1,))
    y[:3] = 0


def transposed_by_function(x: np.ndarray) -> None:
    np.transpose(x)[0] = 1


def enumerated_rows(x: np.ndarray) -> None:
    for _, row in enumerate(x):
        row /= row.sum()


def zipped_rows(x: np.ndarray, w: np.ndarray) -> None:
    for row, weight in zip(x, w):
        row *= weight


def rows_in_a_comprehension(x: np.ndarray) -> list[None]:
    return [row.sort() for row in x]


def split_halves(x: np.ndarray) -> None:
    first, _ = np.split(x, 2)
    first *= 2


def nan_to_num_in_place(x: np.ndarray, y: np.ndarray) -> None:
    np.nan_to_num(x, copy=False)
    np.nan_to_num(y)


def filtered_into(x: np.ndarray, filters: Any) -> None:
    filters.gaussian_filter(x, 2.0, output=x)


def outputs_by_position(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
    np.clip(x, 0.0, 1.0, x)
    np.dot(y, y, z)


def copy_by_keyword(x: np.ndarray, v: np.ndarray) -> None:
    np.copyto(dst=x, src=v)


def walrus(x: np.ndarray) -> None:
    if (first := x[0]) is not None:
        first[:] = 0


def in_a_dict(x: np.ndarray) -> None:
    held = {"x": x}
    held["x"][:] = 0


def local_helper(x: np.ndarray, y: np.ndarray) -> None:
    def clear(r: np.ndarray) -> None:
        r[:] = 0

    clear(x)
    clear(y.copy())


def else_after_a_break(x: np.ndarray, steps: int) -> None:
    for _ in range(steps):
        break
    else:
        x = x.copy()
    x += 1  # the caller's x when the loop broke


def masked_copies(x: np.ndarray) -> float:
    valid = x[~np.isnan(x)]
    valid -= valid.mean()
    positive = x[x > 0]
    positive *= 2
    picked = x[[0, 2]]
    picked += 1
    return float(valid.sum())


def puts(x: np.ndarray, index: np.ndarray, values: np.ndarray, queue: Any) -> None:
    x.put(index, values)
    queue.put(values)


def a_method_named_like_a_ufunc(x: np.ndarray, counter: Any) -> None:
    counter.add(x, 1, x)


def test_lambdas_methods_and_what_has_no_source() -> None:
    assert found_writes(lambda x, y: x.fill(y)) == ("x",)

    class Model:
        def normalise(self, x: np.ndarray) -> None:
            x /= np.linalg.norm(x)

    assert found_writes(Model.normalise) == ("x",)
    assert found_writes(Model().normalise) == ("x",)  # the function the method runs
    assert found_writes(functools.partial(centre, y=None)) == ("x",)

    def logged(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)
        return wrapper

    assert found_writes(logged(centre)) == ()  # a wrapper may change what it passes on
    assert found_writes(veda.gpu(centre)) == ("x",)  # vedart's passes it on
    namespace: dict[str, Any] = {}
    exec("def made(x):\n    x += 1\n", namespace)  # no source to read
    assert found_writes(namespace["made"]) == ()
    assert found_writes(np.add) == ()


def layout_step(x: np.ndarray) -> None:
    flat = x.reshape(-1)
    flat -= flat.mean()


def contiguous_first(x: np.ndarray) -> None:
    x = np.ascontiguousarray(x)
    x[x < 0] = 0


def swapped_buffers(u: np.ndarray, u_new: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        u_new[1:-1] = u[1:-1] + 0.1 * (u[:-2] - 2 * u[1:-1] + u[2:])
        u, u_new = u_new, u
    return u


def interior(u: np.ndarray) -> np.ndarray:
    return u[1:-1, 1:-1]


def through_a_returned_view(u: np.ndarray, v: np.ndarray) -> None:
    interior(u)[...] = 0
    inner = interior(v.copy())
    inner += 1


def imports_inside(x: np.ndarray) -> None:
    import numpy as numpy_inside

    numpy_inside.fill_diagonal(x, 0)


def collected(x: np.ndarray, y: np.ndarray) -> None:
    bufs = []
    bufs.append(x)
    bufs[0][:] = 0
    held = {"y": y}
    for value in held.values():
        value += 1


def lambda_bound_to_a_name(x: np.ndarray) -> None:
    clear = lambda a: a.fill(0)  # noqa: E731
    clear(x)


def integer_inverted(x: np.ndarray, k: int) -> None:
    row = x[~k]
    row[:] = 0


def not_in_place_byteswap(x: np.ndarray, y: np.ndarray) -> None:
    x.byteswap()
    y.byteswap(inplace=True)


@veda.gpu
def decorated_helper(a: np.ndarray) -> None:
    a /= a.sum()


def calls_a_decorated_helper(x: np.ndarray) -> float:
    decorated_helper(x)
    return float(x.max())


def w4(a: np.ndarray) -> None:
    a -= 1.0


def w3(a: np.ndarray) -> None:
    w4(a)


def w2(a: np.ndarray) -> None:
    w3(a)


def w1(a: np.ndarray) -> None:
    w2(a)


def met_deeper_first(x: np.ndarray, y: np.ndarray) -> None:
    w1(y)  # w3 is met three calls down, where its call of w4 (a fourth) is not read
    w3(x)  # and again two calls from w4: read then, and x is written


def chosen_in_a_branch(x: np.ndarray, in_place: bool) -> Any:
    if in_place:
        op = lambda a: a.sort()  # noqa: E731
    else:
        op = lambda a: np.sort(a)  # noqa: E731
    return op(x)


def nested_swap(x: np.ndarray, y: np.ndarray) -> None:
    a, b = y, x
    b, (a, _) = a, (b, a)
    a[:] = 0  # x


def added_to_a_list(x: np.ndarray) -> None:
    bufs: list[np.ndarray] = []
    bufs += [x]
    bufs[0][:] = 0


def bound_in_a_comprehension(x: np.ndarray) -> None:
    rows = [(r := row) for row in x]
    r[:] = 0
    del rows


def closed_over_after_the_def(x: np.ndarray) -> None:
    def clear() -> None:
        view[:] = 0

    view = x[1:]
    clear()


def the_row_with_the_largest_sum(x: np.ndarray) -> None:
    best = max((row for row in x), key=lambda row: row.sum())
    best[:] = 0


def lists_grown_with_plus(x: np.ndarray) -> list[np.ndarray]:
    rows: list[np.ndarray] = []
    rows += [x[0]]
    rows += [x[1]]
    shape: tuple[int, ...] = ()
    shape += (len(x),)
    return rows


def binds_dict_items(state: dict[str, Any], cfg: dict[str, Any], x: np.ndarray) -> None:
    state["w"] = state["w"] - x  # a new array bound: no array written
    cfg["calls"] = cfg.get("calls", 0) + 1


def largest_of_a_row(x: np.ndarray) -> None:
    largest = max(x[0])
    largest += 1
    np.zeros(3).byteswap(True)


def positional_inplace(x: np.ndarray) -> None:
    x.byteswap(True)


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
    (reshaped_by_function, ("x",)),
    (transposed_by_function, ("x",)),
    (enumerated_rows, ("x",)),
    (zipped_rows, ("x",)),
    (rows_in_a_comprehension, ("x",)),
    (split_halves, ("x",)),
    (nan_to_num_in_place, ("x",)),
    (filtered_into, ("x",)),
    (outputs_by_position, ("x", "z")),
    (copy_by_keyword, ("x",)),
    (walrus, ("x",)),
    (in_a_dict, ("x",)),
    (local_helper, ("x",)),
    (else_after_a_break, ("x",)),
    (masked_copies, ()),
    (puts, ("x", "queue")),  # (only arrays are copied back: the queue is not one)
    (a_method_named_like_a_ufunc, ()),
    (layout_step, ("x",)),
    (contiguous_first, ("x",)),
    (swapped_buffers, ("u", "u_new")),
    (through_a_returned_view, ("u",)),
    (imports_inside, ("x",)),
    (collected, ("x", "y")),
    (lambda_bound_to_a_name, ("x",)),
    (integer_inverted, ("x",)),
    (not_in_place_byteswap, ("y",)),
    (calls_a_decorated_helper, ("x",)),
    (met_deeper_first, ("x",)),
    (chosen_in_a_branch, ("x",)),
    (nested_swap, ("x",)),
    (added_to_a_list, ("x",)),
    (bound_in_a_comprehension, ("x",)),
    (closed_over_after_the_def, ("x",)),
    (largest_of_a_row, ()),
    (the_row_with_the_largest_sum, ("x",)),
    (lists_grown_with_plus, ()),
    (binds_dict_items, ()),
    (positional_inplace, ("x",)),
])
def test_the_parameters_a_function_writes_into(func: Any, written: tuple[str, ...]) -> None:
    assert found_writes(func) == written


def edited_since_import(a: np.ndarray) -> None:
    a[0] = 1


def writes_and_calls(x: np.ndarray, y: np.ndarray) -> None:
    x -= 1
    edited_since_import(y)


def test_a_helper_that_cannot_be_read_leaves_the_functions_own_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper whose file was edited since import: reading it raises (a TokenError)."""
    read = inspect.getsource

    def getsource(func: Any) -> str:
        if func is edited_since_import:
            raise tokenize.TokenError("EOF in multi-line string", (1, 0))
        return read(func)

    monkeypatch.setattr(inspect, "getsource", getsource)
    assert found_writes(writes_and_calls) == ("x",)


def prepares(x: np.ndarray) -> float:
    prep(x)  # noqa: F821  # (bound in the globals each test gives the code)
    return float(x.sum())


def test_one_code_with_other_globals_is_read_with_its_own() -> None:
    """Functions made from one code object over other globals (identical modules, a
    factory) call other helpers: each is read with its own."""

    def centring(a: np.ndarray) -> None:
        a -= a.mean()

    def pure(a: np.ndarray) -> np.ndarray:
        return a - a.mean()

    writing = types.FunctionType(prepares.__code__, {**globals(), "prep": centring})
    reading = types.FunctionType(prepares.__code__, {**globals(), "prep": pure})
    assert found_writes(writing) == ("x",)
    assert found_writes(reading) == ()
    assert found_writes(writing) == ("x",)
