"""NumPy expressions a user writes, drawn by hypothesis over dtypes, shapes and layouts, and a
comparison that says whether two runs gave the same answer (the parity suite's parts: the GPU
half compares ``@veda.gpu`` under ``veda.force("gpu")`` with plain NumPy; the CPU half runs the
same cases NumPy against NumPy).

Every expression is a module-level function or lambda whose NumPy calls go through the module
name ``np``, so ``@veda.gpu`` substitutes them as it does in user code.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

DTYPES: tuple[np.dtype[Any], ...] = tuple(np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))
LAYOUTS = ("C", "F", "strided", "big-endian")
# Relative tolerance by dtype character: float16, float32/complex64, float64/complex128. GPU
# reductions and linear algebra add in another order than NumPy's.
_RTOL = {"e": 1e-2, "f": 1e-4, "F": 1e-4, "d": 1e-9, "D": 1e-9}


# --- inputs -----------------------------------------------------------------------------------

def fill(rng: np.random.Generator, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Fresh random values of ``dtype``: never zero for integers (no division by zero), small
    enough that sums and products of a few stay representable in float16 (an array for shape
    ``()`` too, not a scalar)."""
    if dtype.kind == "b":
        values = rng.random(shape) < 0.5
    elif dtype.kind == "u":
        values = rng.integers(1, 100, shape)
    elif dtype.kind == "i":
        values = rng.integers(1, 50, shape) * rng.choice([-1, 1], shape)
    elif dtype.kind == "f":
        values = rng.uniform(-10, 10, shape)
    else:
        values = rng.uniform(-10, 10, shape) + 1j * rng.uniform(-10, 10, shape)
    return np.asarray(values, dtype=dtype)


def laid_out(array: np.ndarray, layout: str, rng: np.random.Generator) -> np.ndarray:
    """``array``'s values in ``layout``: C order, Fortran order, a strided view (every second
    element of a larger array along each axis), or big-endian bytes."""
    if layout == "F":
        return np.asfortranarray(array)
    if layout == "big-endian":
        return array.astype(array.dtype.newbyteorder(">"))
    if layout == "strided" and array.ndim:
        backing = fill(rng, array.dtype, tuple(2 * side + 1 for side in array.shape))
        view = backing[tuple(slice(1, None, 2) for _ in array.shape)]
        view[...] = array
        return view
    return array.copy()


@st.composite
def arrays(draw: st.DrawFn, dtype: np.dtype[Any] | None = None,
           shape: tuple[int, ...] | None = None, min_dims: int = 0, max_dims: int = 4,
           min_side: int = 0, max_side: int = 5) -> np.ndarray:
    """An array of a drawn (or given) dtype, shape and layout with fresh random values."""
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    if shape is None:
        ndim = draw(st.integers(min_dims, max_dims))
        shape = tuple(draw(st.integers(min_side, max_side)) for _ in range(ndim))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return laid_out(fill(rng, dtype, shape), draw(st.sampled_from(LAYOUTS)), rng)


def _axis(ndim: int) -> st.SearchStrategy[int | None]:
    """None, a valid axis, or now and then one out of range (NumPy's AxisError)."""
    return st.one_of(st.none(), st.integers(-ndim - 1, ndim)) if ndim else \
        st.sampled_from([None, 0])


# --- expressions ----------------------------------------------------------------------------

UNARY: dict[str, Callable[..., Any]] = {
    "negative": lambda x: -x,
    "absolute": lambda x: np.abs(x),
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "exp": lambda x: np.exp(x / 10),
    "log1p": lambda x: np.log1p(np.abs(x)),
    "sin": lambda x: np.sin(x),
    "tanh": lambda x: np.tanh(x),
    "floor": lambda x: np.floor(x),
    "round": lambda x: np.round(x),
    "round_1": lambda x: np.round(x, 1),
    "square": lambda x: np.square(x),
    "power_2": lambda x: x ** 2,
    "sign": lambda x: np.sign(x),
    "isfinite": lambda x: np.isfinite(x),
    "conj": lambda x: np.conj(x),
    "invert": lambda x: ~x,
    "astype_f4": lambda x: x.astype(np.float32),
    "clip": lambda x: np.clip(x, -5, 5),
    "copy": lambda x: x.copy(),
    "self": lambda x: x,
    "transpose": lambda x: x.T,
    "reversed": lambda x: x[..., ::-1],
    "every_second": lambda x: x[::2],
    "ellipsis": lambda x: x[...],
    "ravel": lambda x: np.ravel(x),
    "reshape_flat": lambda x: x.reshape(-1),
    "new_axis": lambda x: x[None],
    "first": lambda x: x[0],
    "item_0d": lambda x: x[()],
    "masked": lambda x: x[np.abs(x) > 2],
    "with_view": lambda x: (x, x[::2]),
    "twice": lambda x: (x, x),
    "array_of_sum": lambda x: np.array(x.sum()),
    "float_of_sum": lambda x: float(x.sum()),
    "int_of_size": lambda x: int(np.size(x)),
    "sort": lambda x: np.sort(x),
    "argsort": lambda x: np.argsort(x, kind="stable"),
    "unique": lambda x: np.unique(x),
    "median": lambda x: np.median(x),
    "percentile_30": lambda x: np.percentile(x, 30),
    "histogram_8": lambda x: np.histogram(x, bins=8),
    "nonzero": lambda x: np.nonzero(x),
    "concatenate": lambda x: np.concatenate([x, x]),
    "stack": lambda x: np.stack([x, x]),
    "fft": lambda x: np.fft.fft(x),
    "ifft": lambda x: np.fft.ifft(x),
    "rfft": lambda x: np.fft.rfft(x),
    "irfft": lambda x: np.fft.irfft(x),
    "fft2": lambda x: np.fft.fft2(x),
    "rfft2": lambda x: np.fft.rfft2(x),
}

REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": lambda x, axis, keepdims: x.sum(axis=axis, keepdims=keepdims),
    "sum_f8": lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims,
                                               dtype=np.float64),
    "prod": lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims),
    "mean": lambda x, axis, keepdims: x.mean(axis=axis, keepdims=keepdims),
    "std": lambda x, axis, keepdims: np.std(x, axis=axis, keepdims=keepdims),
    "var": lambda x, axis, keepdims: np.var(x, axis=axis, keepdims=keepdims),
    "min": lambda x, axis, keepdims: x.min(axis=axis, keepdims=keepdims),
    "max": lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims),
    "argmax": lambda x, axis, keepdims: x.argmax(axis=axis, keepdims=keepdims),
    "argmin": lambda x, axis, keepdims: np.argmin(x, axis=axis, keepdims=keepdims),
    "any": lambda x, axis, keepdims: np.any(x, axis=axis, keepdims=keepdims),
    "all": lambda x, axis, keepdims: x.all(axis=axis, keepdims=keepdims),
    "cumsum": lambda x, axis, keepdims: np.cumsum(x, axis=axis),
}

BINARY: dict[str, Callable[..., Any]] = {
    "add": lambda x, y: x + y,
    "subtract": lambda x, y: x - y,
    "multiply": lambda x, y: x * y,
    "true_divide": lambda x, y: x / y,
    "floor_divide": lambda x, y: x // y,
    "maximum": lambda x, y: np.maximum(x, y),
    "greater": lambda x, y: x > y,
    "equal": lambda x, y: x == y,
    "where": lambda x, y: np.where(np.abs(x) > 2, x, y),
    "matmul": lambda x, y: x @ y,
    "dot": lambda x, y: np.dot(x, y),
    "einsum_ij_jk": lambda x, y: np.einsum("ij,jk->ik", x, y),
    "einsum_i_i": lambda x, y: np.einsum("i,i", x, y),
}

INDEXING: dict[str, Callable[..., Any]] = {
    "take": lambda x, index: x[index],
    "take_axis": lambda x, index: np.take(x, index, axis=-1),
}

LINALG: dict[str, Callable[..., Any]] = {
    "solve": lambda m, b: np.linalg.solve(m, b),
    "inv": lambda m, b: np.linalg.inv(m),
    "eigh": lambda m, b: np.linalg.eigh(m @ np.swapaxes(m, -1, -2).conj()).eigenvalues,
    "eigh_type": lambda m, b: type(np.linalg.eigh(m)).__name__,
    "svd": lambda m, b: np.linalg.svd(m).S,
    "det": lambda m, b: np.linalg.det(m),
    "norm": lambda m, b: np.linalg.norm(m),
}

RANDOM: dict[str, Callable[..., Any]] = {
    "random": lambda seed, shape: np.random.default_rng(seed).random(shape),
    "integers": lambda seed, shape: np.random.default_rng(seed).integers(0, 10, size=shape),
    "standard_normal_f4": lambda seed, shape: np.random.default_rng(seed).standard_normal(
        shape, dtype=np.float32),
}


@dataclass
class Case:
    """One drawn expression with its inputs: ``func(*args, **kwargs)``. ``values``: whether
    values are compared (random draws differ between NumPy and CuPy: shape, dtype and type
    are). ``scale``: a magnitude the result's rounding is relative to besides its own: a sum's
    rounding grows with its terms, not with the sum (fifteen float16 terms of up to 9.98,
    85.1 in magnitude, summing to 0.9412: NumPy read 0.9414 and CuPy 0.961, H100)."""

    name: str
    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    values: bool = True
    scale: float = 0.0

    def __repr__(self) -> str:
        described = ", ".join(
            f"array(shape={a.shape}, dtype={a.dtype.str}, strides={a.strides})"
            if isinstance(a, np.ndarray) else repr(a) for a in self.args)
        return f"Case({self.name}({described}, **{self.kwargs}))"

    def fresh_args(self) -> tuple[Any, ...]:
        """The arguments again, as copies laid out the same way (each run gets its own)."""
        return tuple(_same_layout_copy(a) if isinstance(a, np.ndarray) else a for a in self.args)


def _same_layout_copy(array: np.ndarray) -> np.ndarray:
    if array.flags.c_contiguous or array.flags.f_contiguous or array.ndim == 0:
        return array.copy(order="K")
    backing = np.empty(tuple(2 * side + 1 for side in array.shape), array.dtype)
    view = backing[tuple(slice(1, None, 2) for _ in array.shape)]
    view[...] = array
    return view


@st.composite
def unary_cases(draw: st.DrawFn, name: str) -> Case:
    x = draw(arrays())
    return Case(name, UNARY[name], (x,), scale=_sum_scale(x) if name in _WHOLE_SUMS else 0.0)


_WHOLE_SUMS = frozenset({"array_of_sum", "float_of_sum"})


def _sum_scale(x: np.ndarray) -> float:
    """A sum's ``Case.scale``: the magnitude of its terms (floats only)."""
    return float(np.abs(x.astype(np.complex128)).sum()) if x.dtype.kind in "fc" else 0.0


@st.composite
def reduction_cases(draw: st.DrawFn, name: str) -> Case:
    x = draw(arrays())
    return Case(name, REDUCTIONS[name], (x,),
                {"axis": draw(_axis(x.ndim)), "keepdims": draw(st.booleans())},
                scale=_sum_scale(x) if name in ("sum", "cumsum") else 0.0)


@st.composite
def binary_cases(draw: st.DrawFn, name: str) -> Case:
    if name in ("matmul", "einsum_ij_jk"):
        n, k, m = (draw(st.integers(0, 5)) for _ in range(3))
        shapes = [(n, k), (k + draw(st.sampled_from([0, 0, 0, 1])), m)]  # now and then a misfit
    elif name in ("dot", "einsum_i_i"):
        n = draw(st.integers(0, 6))
        shapes = [(n,), (n,)]
    else:  # broadcasting: y's shape is a suffix of x's, with some sides set to 1
        x_shape = draw(st.lists(st.integers(0, 4), max_size=4).map(tuple))
        suffix = x_shape[len(x_shape) - draw(st.integers(0, len(x_shape))):]
        shapes = [x_shape, tuple(draw(st.sampled_from([side, 1])) for side in suffix)]
    x = draw(arrays(shape=shapes[0]))
    y = draw(arrays(dtype=draw(st.sampled_from([x.dtype, *DTYPES])).newbyteorder("="),
                    shape=shapes[1]))
    return Case(name, BINARY[name], (x, y))


@st.composite
def indexing_cases(draw: st.DrawFn, name: str) -> Case:
    x = draw(arrays(min_dims=1, min_side=1))
    side = x.shape[-1] if name == "take_axis" else x.shape[0]
    index = draw(st.lists(st.integers(-side, side - 1), max_size=6))
    return Case(name, INDEXING[name], (x, np.array(index, dtype=np.intp)))


@st.composite
def linalg_cases(draw: st.DrawFn, name: str) -> Case:
    n = draw(st.integers(1, 4))
    batch = draw(st.sampled_from([(), (), (2,)]))
    dtype = draw(st.sampled_from(DTYPES))
    m = draw(arrays(dtype=dtype, shape=(*batch, n, n)))
    if dtype.kind in "fc":  # well conditioned: solve and inv compare within tolerance
        m = m + np.asarray(20 * np.eye(n), dtype=m.dtype)
    b = draw(arrays(dtype=dtype, shape=(*batch, n)))
    return Case(name, LINALG[name], (m, b))


@st.composite
def random_cases(draw: st.DrawFn, name: str) -> Case:
    # size=(): NumPy's generators return a 0-d array, the GPU path a scalar (docs/offload.md)
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    return Case(name, RANDOM[name], (draw(st.integers(0, 2**31)), shape), values=False)


_KINDS: dict[str, Callable[[str], st.SearchStrategy[Case]]] = {
    **dict.fromkeys(UNARY, unary_cases), **dict.fromkeys(REDUCTIONS, reduction_cases),
    **dict.fromkeys(BINARY, binary_cases), **dict.fromkeys(INDEXING, indexing_cases),
    **dict.fromkeys(LINALG, linalg_cases), **dict.fromkeys(RANDOM, random_cases)}


def cases() -> st.SearchStrategy[Case]:
    """Every expression, about evenly, with its inputs."""
    return st.sampled_from(sorted(_KINDS)).flatmap(lambda name: _KINDS[name](name))


# --- known differences ------------------------------------------------------------------------

# Methods that return a 0-d array for a 0-d array in NumPy: the GPU path gives a scalar.
_ZERO_D_METHODS = frozenset({"copy", "astype_f4", "ellipsis", "transpose"})


# Reductions without identity that the suite calls as array methods (``x.min(axis=0)``).
_NO_IDENTITY_METHODS = frozenset({"min", "argmax"})


def known_difference(case: Case) -> str | None:
    """Why the GPU path cannot give NumPy's answer for ``case`` (docs/offload.md, "Parity"), or
    None when it must."""
    first = case.args[0] if case.args else None
    if not isinstance(first, np.ndarray):
        return None
    if case.name == "power_2" and first.dtype.kind == "b":
        return "bool ** 2 is int64 on the GPU (NumPy: int8)"
    if case.name in _ZERO_D_METHODS and first.ndim == 0:
        return "a method's 0-d array result comes back as a scalar"
    if case.name == "true_divide" and any(map(np.iscomplexobj, case.args)) and \
            not np.all(np.asarray(case.args[1])):
        return "a complex division by zero is nan+nanj on the GPU (NumPy: inf or nan by parts)"
    if case.name in _NO_IDENTITY_METHODS and first.size == 0:
        return "a CuPy method reducing an empty axis gives an empty array (NumPy: ValueError)"
    if case.name == "prod" and first.dtype.kind == "c" and _may_overflow(first):
        return "an overflowing complex product has nan parts on the GPU (NumPy: finite ones)"
    return None


def _may_overflow(array: np.ndarray) -> bool:
    """Whether a product of some of ``array``'s complex values may leave its dtype's range:
    the product of their magnitudes, those under 1 taken as 1, bounds every such product."""
    bound = np.prod(np.maximum(np.abs(array.astype(np.complex128)), 1.0))
    return bool(bound > np.finfo(array.real.dtype).max / 4)  # a part's products add two terms


# --- running and comparing --------------------------------------------------------------------

@dataclass(frozen=True)
class Raised:
    """What a run that raised leaves to compare: the exception's type."""

    kind: type[BaseException]


def outcome(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)``, or :class:`Raised` with the exception's type (warnings, such
    as NumPy's for a division by zero, are ignored: the parity compared is of answers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return func(*args, **kwargs)
        except Exception as error:
            return Raised(type(error))


def _tolerance(dtype: np.dtype[Any]) -> float:
    return _RTOL.get(dtype.char, 0.0)


def assert_same(actual: Any, expected: Any, *, values: bool = True, byte_order: bool = True,
                where: str = "result", scale: float = 0.0) -> None:
    """Raise AssertionError (naming ``where`` inside the result) unless ``actual`` is what
    ``expected`` is: the same exception type, the same Python type, and for arrays and NumPy
    scalars the same dtype (byte order included unless ``byte_order`` is False) and shape, with
    values equal (integers, booleans) or within the dtype's tolerance (``_RTOL``, relative to
    the largest magnitude in ``expected``, or ``scale`` where larger: see ``Case.scale``);
    containers compared item by item."""
    if isinstance(expected, Raised) or isinstance(actual, Raised):
        assert type(actual) is Raised and type(expected) is Raised and \
            actual.kind is expected.kind, f"{where}: {actual!r} where NumPy gave {expected!r}"
        return
    assert type(actual) is type(expected), \
        f"{where}: type {type(actual).__name__} where NumPy gave {type(expected).__name__}"
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, not {len(expected)}"
        for index, (inner_actual, inner_expected) in enumerate(zip(actual, expected)):
            assert_same(inner_actual, inner_expected, values=values, byte_order=byte_order,
                        where=f"{where}[{index}]", scale=scale)
        if isinstance(expected, tuple) and len(expected) == 2 and expected[0] is expected[1]:
            assert actual[0] is actual[1], f"{where}: the same array twice came back as two"
        return
    if isinstance(expected, (np.ndarray, np.generic)):
        expected_dtype = expected.dtype if byte_order else expected.dtype.newbyteorder("=")
        actual_dtype = actual.dtype if byte_order else actual.dtype.newbyteorder("=")
        assert actual_dtype == expected_dtype, \
            f"{where}: dtype {actual.dtype.str} where NumPy gave {expected.dtype.str}"
        assert actual.shape == expected.shape, \
            f"{where}: shape {actual.shape} where NumPy gave {expected.shape}"
        if values:
            _assert_values(np.asarray(actual), np.asarray(expected), where, scale)
        return
    if values and isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), f"{where}: {actual!r} where NumPy gave nan"
    elif values and isinstance(expected, (float, complex)):  # the dtype is gone: float16's
        assert actual == expected or \
            abs(actual - expected) <= 1e-2 * max(1.0, abs(expected), scale), \
            f"{where}: {actual!r} where NumPy gave {expected!r}"
    elif values:
        assert actual == expected, f"{where}: {actual!r} where NumPy gave {expected!r}"


def _assert_values(actual: np.ndarray, expected: np.ndarray, where: str, scale: float) -> None:
    rtol = _tolerance(expected.dtype)
    if rtol == 0.0 or expected.size == 0:
        np.testing.assert_array_equal(actual, expected, err_msg=where)
        return
    finite = np.abs(expected[np.isfinite(expected)]).astype(np.float64)
    largest = float(finite.max()) if finite.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=rtol,
                               atol=rtol * max(largest, scale, 1.0), equal_nan=True,
                               err_msg=where)
