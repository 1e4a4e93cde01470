"""NumPy-to-device substitution for one function, without touching any shared module.

``__array_function__`` / ``__array_ufunc__`` dispatch already sends ``np.mean(x)`` to CuPy when
``x`` is a CuPy array. What does not dispatch -- ``np.zeros(n)``, ``np.random.random(n)``,
``np.asarray(x)``, ``import numpy as np`` or ``from scipy.ndimage import convolve`` inside the
function -- is handled by running a *clone* of the function whose globals map every name bound
to a NumPy or SciPy module (or to a function of one) to its device twin, whose other globals are
looked up live in the real module, and whose ``__import__`` hands out device twins for NumPy and
SciPy imports. ``sys.modules``, ``builtins`` and the numpy module are never modified, so other
threads running NumPy code are unaffected.

Rules a user can rely on:
- The decorated function's own code (and functions and lambdas defined inside it) sees the
  substituted names. With a :class:`Reach` (``@veda.gpu(reach=True)``, the default) so do the
  helpers it reaches: a global name, or an attribute of a module bound to a global name, that
  is a plain Python function or class from the decorated function's own package (its module's
  top-level package; ``__main__`` for a script) or from a module that binds NumPy or SciPy
  names (a function judged by the module whose globals its code reads, so a wrapper made
  elsewhere, as ``@veda.gpu``'s, is not). A reached function runs as a clone made on first use
  (again when its code or defaults change); a reached class is seen as a device class, a
  subclass whose methods, static and class methods and properties (its own and its reached
  bases', also when found through ``super()``) are clones, whose ``isinstance`` answers as the
  class's does, and whose objects get the class back when they are returned
  (``type(model) is Model``). Reaching goes ``REACH_DEPTH`` calls deep and stops after
  ``REACH_FUNCTIONS`` functions (by qualified name); it never reaches vedart, CuPy, Numba or
  Dask code, exception and enum classes, classes of other metaclasses than ``type`` and
  ``abc.ABCMeta``, or classes whose subclassing runs code (``__init_subclass__``). Everything
  else, and everything without a Reach, runs on CuPy arrays through dispatch alone. Objects
  made by a reached class and kept somewhere other than the result or an attribute of an
  argument object (a global list) stay objects of the device class.
- A name whose device twin lacks an attribute falls back to the NumPy attribute (then dispatch,
  or a GPU failure that re-runs the call on the CPU).
- A function that assigns or deletes module globals (``global x; x = ...``) is not cloned; it
  runs with dispatch only, so its assignments reach the real module.
- Some device functions are adjusted to answer as NumPy's do (:func:`_as_numpy_does`): named
  tuples from ``numpy.linalg``, CuPy's linear algebra raising what cuSOLVER reports (a singular
  matrix), 0-d arrays from array makers, NumPy's own exception where CuPy accepts a dtype NumPy
  rejects, ``np.histogram`` of integers counted as NumPy counts them, ``np.percentile`` and
  its kin and the FFTs of an empty array, and the FFTs of a float16 array, answered by NumPy
  on the host, NumPy's ``IndexError`` for a 2-D FFT of fewer than two dimensions.
"""

from __future__ import annotations

import abc
import builtins
import dis
import enum
import functools
import importlib
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy

from vedart.locks import renew_in_child
from vedart.offload import linalg_status
from vedart.offload.arguments import HOST_CLASS, DeviceGlobals
from vedart.offload.results import (
    ARRAY_KEEPERS,
    ARRAY_MAKERS,
    is_array_to_numpy,
    note_made_array,
)

# Host package -> the package that holds its device twins (``scipy.ndimage`` -> ``cupyx.scipy.ndimage``).
DEVICE_PACKAGES: dict[str, str] = {"numpy": "cupy", "scipy": "cupyx.scipy"}
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
REACH_DEPTH = 8        # calls below the decorated function whose helpers still run as clones
REACH_FUNCTIONS = 128  # helper functions one decorated function's clone may reach in all
# Packages whose functions are never cloned: device twins come from the mapper, and the rest
# is machinery that must run as written.
_NEVER_REACHED = frozenset({"builtins", "cupy", "cupyx", "vedart", "numba", "dask",
                            "distributed"})
# vedart's modules of user code (the demo, bench workloads), which are reached as any user's.
_USER_CODE_IN_VEDART = frozenset({"vedart.demo", "vedart.bench.workloads"})
_PLAIN_METACLASSES = (type, abc.ABCMeta)
# Class attributes a device class holds clones of (see :meth:`Reach._clone_attribute`).
_METHOD_TYPES = (types.FunctionType, staticmethod, classmethod, property,
                 functools.cached_property)
# What a name may be bound to for a clone to see it otherwise: a function, a class, a module.
_REACHABLE = (types.FunctionType, type, types.ModuleType)
# Class attributes a device class never copies from its host's classes.
_CLASS_MACHINERY = frozenset({"__dict__", "__weakref__", "__slots__", "__module__",
                              "__qualname__", "__doc__", HOST_CLASS})


class ModuleMapper:
    """Finds the device twin of a host module by name; ``device_packages`` maps host root
    packages to device packages (``{"numpy": "cupy"}``). Twins are imported on first use."""

    def __init__(self, device_packages: Mapping[str, str]) -> None:
        self._device_packages = dict(device_packages)
        self._twins: dict[str, DeviceNamespace | None] = {}
        self.device_roots = frozenset(device_packages) | frozenset(
            package.partition(".")[0] for package in device_packages.values())

    def twin(self, host: types.ModuleType) -> DeviceNamespace | None:
        """The namespace to use for ``host`` inside a clone, or None if it has no device twin."""
        name = host.__name__
        if name not in self._twins:
            device_module = self._import_device(name)
            self._twins[name] = None if device_module is None else \
                DeviceNamespace(host, device_module, self)
        return self._twins[name]

    def _import_device(self, host_name: str) -> types.ModuleType | None:
        root, _, rest = host_name.partition(".")
        device_root = self._device_packages.get(root)
        if device_root is None:
            return None
        try:
            return importlib.import_module(f"{device_root}.{rest}" if rest else device_root)
        except ImportError:
            return None

    def twin_of_value(self, value: Any) -> Any:
        """The device twin of a module, or of a public function of a NumPy/SciPy module
        (``from numpy import zeros``); ``value`` itself when there is none."""
        if isinstance(value, types.ModuleType):
            return self.twin(value) or value
        module_name = getattr(value, "__module__", None)
        name = getattr(value, "__name__", None)
        if not isinstance(module_name, str) or not isinstance(name, str):
            return value
        if module_name.partition(".")[0] not in self._device_packages:
            return value
        public = ".".join(part for part in module_name.split(".") if not part.startswith("_"))
        try:
            host_module = importlib.import_module(public)
        except ImportError:
            return value
        twin = self.twin(host_module)
        if twin is None or getattr(host_module, name, None) is not value:
            return value
        return getattr(twin, name)

    def import_hook(self, real_import: Callable[..., Any]) -> Callable[..., Any]:
        """An ``__import__`` that imports for real and returns device twins for mapped packages."""

        def device_import(name: str, globals: Any = None, locals: Any = None,
                          fromlist: Any = (), level: int = 0) -> Any:
            module = real_import(name, globals, locals, fromlist, level)
            if level != 0 or name.partition(".")[0] not in self._device_packages:
                return module
            return self.twin(module) or module

        return device_import


class DeviceNamespace:
    """A host module seen through its device twin: attributes come from the device module
    when it has them, else from the host module; submodules are namespaces too."""

    def __init__(self, host: types.ModuleType, device: types.ModuleType,
                 mapper: ModuleMapper) -> None:
        self.__host = host
        self.__device = device
        self.__mapper = mapper
        self.__name__ = host.__name__

    def __getattr__(self, name: str) -> Any:
        host_value = getattr(self.__host, name, _MISSING)
        if isinstance(host_value, types.ModuleType):
            value: Any = self.__mapper.twin(host_value) or host_value
        else:
            value = getattr(self.__device, name, _MISSING)
            if value is _MISSING:
                if host_value is _MISSING:
                    raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
                value = host_value
            else:
                value = _as_numpy_does(value, host_value, self.__name__, name,
                                       self.__device.__name__)
        setattr(self, name, value)  # cache: the next lookup is a plain attribute read
        return value

    def __repr__(self) -> str:
        return f"<{self.__name__} on device ({self.__device.__name__})>"


_MISSING = object()
_STALE = (_MISSING,)  # Reach._known: made from what no value is made from (made again)

# Functions NumPy refuses for some dtypes of their first argument (by dtype.char) where CuPy's
# compute something: for those dtypes NumPy's function is called first on a small
# stand-in (two elements along each axis), so the call raises NumPy's own exception before
# any device work.
_NUMPY_REJECTS: dict[str, dict[str, str]] = {
    "numpy": {"round": "?", "around": "?", "percentile": "?", "quantile": "?",
              "nanpercentile": "?", "nanquantile": "?", "sign": "?"},
    "numpy.linalg": dict.fromkeys(("cholesky", "det", "eig", "eigh", "eigvals", "eigvalsh", "inv",
                                   "lstsq", "pinv", "qr", "slogdet", "solve", "svd",
                                   "tensorinv", "tensorsolve"), "e"),
    "numpy.fft": dict.fromkeys(("rfft", "rfft2", "rfftn", "ihfft"), "FDG"),
}


# Reductions without an identity: NumPy raises ValueError for a zero-size reduction where
# CuPy returns an empty array (``np.max`` of a (0, 0, 2) array along axis 0, H100,
# 2026-11-24); for an empty argument NumPy's function runs first on an empty stand-in.
_NO_IDENTITY: dict[str, frozenset[str]] = {"numpy": frozenset({
    "max", "min", "amax", "amin", "argmax", "argmin", "ptp", "nanmax", "nanmin", "nanargmax",
    "nanargmin"})}

# Functions whose default axes need at least this many dimensions: for an input with fewer,
# NumPy raises IndexError where CuPy's 2-D FFTs transform it (parity run, H100, 2026-11-24);
# for such an input NumPy's function runs first on a stand-in, as for ``_NUMPY_REJECTS``
# (with ``axes`` that fit, it passes and the device function runs).
_FEWEST_DIMENSIONS: dict[str, dict[str, int]] = {
    "numpy.fft": dict.fromkeys(("fft2", "ifft2", "rfft2", "irfft2"), 2)}

# numpy.fft's transforms.
_FFT_TRANSFORMS = frozenset({"fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2",
                             "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"})

# Functions that, for an empty argument, CuPy runs into an illegal memory access
# (``np.percentile`` of a (3, 0, 5, 4) array, H100, 2026-11-25; the CUDA context is then
# unusable) or answers where NumPy raises (``np.fft.irfft`` of a (0, 1) array: an empty array,
# where NumPy finds no data points; H200, 2026-11-25): with an empty first argument NumPy's
# function answers on the host (no data to copy).
_HOST_WHEN_EMPTY: dict[str, frozenset[str]] = {
    "numpy": frozenset({"percentile", "quantile", "nanpercentile", "nanquantile"}),
    "numpy.fft": _FFT_TRANSFORMS}

# numpy.fft transforms of a float16 input: NumPy scales by a factor rounded to float16 and gives
# irfft and hfft float16 results, where CuPy computes in float32 throughout (``np.fft.ifft`` of
# three float16 values: 0.70885 against 0.70903; ``irfft``: float16 against float32; H100,
# 2026-11-25). NumPy answers them on the host.
_HOST_FOR_FLOAT16: dict[str, frozenset[str]] = {"numpy.fft": _FFT_TRANSFORMS}

# numpy.fft transforms to a real output of 2 * (m - 1) points along their axis of length m by
# default: for m = 1, NumPy raises ValueError (no data points) where cuFFT fails with its own
# error, which re-ran the call on the CPU with a warning (H100, 2026-11-25). NumPy answers
# such a call on the host, which raises its ValueError.
_HOST_WITHOUT_POINTS: dict[str, frozenset[str]] = {"numpy.fft": frozenset({"irfft", "hfft"})}


def _as_numpy_does(device_function: Any, host_function: Any, host_module: str,
                   name: str, device_module: str) -> Any:
    """``device_function`` (the device twin of ``host_module.name``, from ``device_module``),
    adjusted where CuPy's answer would differ from NumPy's; other attributes, classes among
    them (``np.linalg.LinAlgError`` stays an exception a function can catch), pass through."""
    if not callable(device_function) or isinstance(device_function, type):
        return device_function
    if host_module == "numpy" and name in ARRAY_MAKERS:
        @functools.wraps(device_function)
        def making(*args: Any, **kwargs: Any) -> Any:
            return note_made_array(device_function(*args, **kwargs))

        return making
    if host_module == "numpy" and name in ARRAY_KEEPERS:
        @functools.wraps(device_function)
        def keeping(*args: Any, **kwargs: Any) -> Any:
            result = device_function(*args, **kwargs)
            return note_made_array(result) if args and is_array_to_numpy(args[0]) else result

        return keeping
    if host_module == "numpy" and name == "histogram":
        @functools.wraps(device_function)
        def histogram(a: Any, *args: Any, **kwargs: Any) -> Any:
            # CuPy's counts of integer samples differed from NumPy's (8 bins over int8 data,
            # H100); NumPy compares samples with the float64 edges as float64, and so does this.
            if getattr(getattr(a, "dtype", None), "kind", None) in ("b", "i", "u"):
                a = a.astype("float64")
            return device_function(a, *args, **kwargs)

        return histogram
    adjusted = _with_numpys_result_type(device_function, host_module, name)
    if device_module == "cupy.linalg":
        adjusted = _raising_linalg_errors(adjusted, name)
    if name in _HOST_WHEN_EMPTY.get(host_module, ()) and callable(host_function):
        adjusted = _on_host_when(adjusted, host_function, device_module, _is_empty)
    if name in _HOST_FOR_FLOAT16.get(host_module, ()) and callable(host_function):
        adjusted = _on_host_when(adjusted, host_function, device_module, _is_float16)
    if name in _HOST_WITHOUT_POINTS.get(host_module, ()) and callable(host_function):
        adjusted = _on_host_when(adjusted, host_function, device_module, _no_output_points)
    rejected = _NUMPY_REJECTS.get(host_module, {}).get(name)
    empty_checked = name in _NO_IDENTITY.get(host_module, ())
    fewest = _FEWEST_DIMENSIONS.get(host_module, {}).get(name, 0)
    if (rejected is None and not empty_checked and not fewest) or not callable(host_function):
        return adjusted
    rejected = rejected or ""

    @functools.wraps(device_function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if args and (getattr(getattr(args[0], "dtype", None), "char", None) in rejected
                     or (empty_checked and getattr(args[0], "size", None) == 0)
                     or getattr(args[0], "ndim", fewest) < fewest):
            host_function(*map(_stand_in, args),
                          **{key: _stand_in(value) for key, value in kwargs.items()})
        return adjusted(*args, **kwargs)

    return checked


def _is_empty(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return getattr(args[0], "size", None) == 0


def _is_float16(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return getattr(args[0], "dtype", None) == numpy.float16


def _no_output_points(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``irfft(a, n=None, axis=-1, ...)`` (or ``hfft``) would make 2 * (1 - 1) points:
    no ``n``, and ``a``'s axis of length 1."""
    n = kwargs.get("n", args[1] if len(args) > 1 else None)
    axis = kwargs.get("axis", args[2] if len(args) > 2 else -1)
    shape = getattr(args[0], "shape", None)
    if n is not None or not isinstance(shape, tuple) or \
            not isinstance(axis, (int, numpy.integer)) or \
            not -len(shape) <= axis < len(shape):
        return False
    return shape[axis] == 1


def _on_host_when(device_function: Any, host_function: Any, device_module: str,
                  when: Callable[[tuple[Any, ...], dict[str, Any]], bool]) -> Any:
    """``device_function``, except that where ``when(args, kwargs)`` holds (and no ``out=``
    is given) ``host_function`` runs on host copies of the arguments: NumPy's exception, or
    NumPy's result (an array of it on the device)."""
    @functools.wraps(device_function)
    def host_when(*args: Any, **kwargs: Any) -> Any:
        if not args or "out" in kwargs or not when(args, kwargs):
            return device_function(*args, **kwargs)
        result = host_function(*map(_on_host, args),
                               **{key: _on_host(value) for key, value in kwargs.items()})
        if isinstance(result, numpy.ndarray):
            # The package's own ``asarray`` (``cupy``, for a function of ``cupy.fft``).
            return importlib.import_module(device_module.partition(".")[0]).asarray(result)
        return result

    return host_when


def _on_host(value: Any) -> Any:
    """``value`` copied to a NumPy array when it is a device array, else ``value``."""
    if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
        return value.get()
    return value


# cupy.linalg functions that never read a cuSOLVER or cuBLAS status (CuPy 14.2), and
# ``norm``'s orders that are not computed through an SVD: they run outside CuPy's error state,
# whose entering and leaving took 24 Python calls and some 8 us, a ninth of a step of power
# iteration on a 96x96 matrix (``np.linalg.norm`` in the loop, H100, 2026-11-25).
_STATUS_FREE_LINALG = frozenset({"cross", "det", "matmul", "matrix_transpose", "slogdet"})
_CHECKED_ONCE = {"solve": linalg_status.solve, "inv": linalg_status.inv}


def _raising_linalg_errors(device_function: Any, name: str) -> Any:
    """``device_function`` (``cupy.linalg.<name>``) run with CuPy told to raise what cuSOLVER
    and cuBLAS report (a singular matrix to ``inv`` or ``solve``, a matrix ``cholesky`` cannot
    factor, an SVD that does not converge), as NumPy raises ``LinAlgError``; by default CuPy
    returns what the routine left (each check waits for the device). Functions that read no
    status, and ``norm`` of the default and Frobenius orders, run as they are; ``solve`` and
    ``inv`` of one matrix read one status (:mod:`vedart.offload.linalg_status`)."""
    import cupyx

    if name in _STATUS_FREE_LINALG:
        return device_function

    @functools.wraps(device_function)
    def raising(*args: Any, **kwargs: Any) -> Any:
        if linalg_status.raises_here():  # a GPU call's own thread: entering errstate took 3-8 us
            return device_function(*args, **kwargs)
        with cupyx.errstate(linalg="raise"):  # a thread the function started itself
            return device_function(*args, **kwargs)

    if name in _CHECKED_ONCE:
        checked = _CHECKED_ONCE[name]

        @functools.wraps(device_function)
        def checked_once(*args: Any, **kwargs: Any) -> Any:
            return checked(raising, *args, **kwargs)

        return checked_once
    if name != "norm":
        return raising

    @functools.wraps(device_function)
    def norm(x: Any, ord: Any = None, *args: Any, **kwargs: Any) -> Any:
        if ord is None or (isinstance(ord, str) and ord == "fro"):
            return device_function(x, ord, *args, **kwargs)
        return raising(x, ord, *args, **kwargs)

    return norm


def _stand_in(value: Any) -> Any:
    """A small host array of ``value``'s dtype and rank (two elements along each axis, none
    along an empty one: NumPy checks an empty input's size first), for an array; else
    ``value``."""
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if isinstance(dtype, numpy.dtype) and isinstance(shape, tuple):
        return numpy.zeros(tuple(2 if length else 0 for length in shape), dtype)
    return value

# numpy.linalg functions that return a named tuple where CuPy's return a plain one, and the
# named tuple's type (NumPy 2 defines them in numpy.linalg._linalg).
_LINALG_RESULT_TYPES = {"eig": "EigResult", "eigh": "EighResult", "qr": "QRResult",
                        "slogdet": "SlogdetResult", "svd": "SVDResult"}


def _with_numpys_result_type(device_function: Any, host_module: str, name: str) -> Any:
    """``device_function``, made to return its plain tuples as the named tuple NumPy's function
    of that name returns (``eigh(m).eigenvalues`` and the result's type then match the CPU
    path); other results (``svd(m, compute_uv=False)``) pass through."""
    type_name = _LINALG_RESULT_TYPES.get(name) if host_module == "numpy.linalg" else None
    if type_name is None:
        return device_function
    try:
        result_type = getattr(importlib.import_module("numpy.linalg._linalg"), type_name)
    except (ImportError, AttributeError):  # a NumPy that names no result types
        return device_function

    @functools.wraps(device_function)
    def named(*args: Any, **kwargs: Any) -> Any:
        result = device_function(*args, **kwargs)
        if type(result) is tuple and len(result) == len(result_type._fields):
            return result_type(*result)
        return result

    return named


class _CloneGlobals(DeviceGlobals):
    """Clone globals: substituted names are stored; every other name is read live from the
    function's real module globals (CPython consults ``__missing__`` for non-exact dicts),
    through ``reach`` (a helper function or class it reaches is a device clone) when given.
    ``origin``: the function cloned. ``depth``: how many calls below the decorated function
    the clone runs (0: itself). ``sources``: (name, the module's value it was substituted
    for), which :meth:`current` checks are still the module's."""

    def __init__(self, substituted: dict[str, Any], origin: types.FunctionType,
                 reach: Reach | None, depth: int, sources: tuple[tuple[str, Any], ...]) -> None:
        super().__init__(substituted)
        self.host_globals = origin.__globals__
        self.origin = origin
        self.reach = reach
        self.depth = depth
        self._sources = sources

    @property
    def substitutes(self) -> bool:
        """Whether the clone substituted any module name (else it never goes stale)."""
        return bool(self._sources)

    def current(self) -> bool:
        """Whether every substituted name is still bound in the module to what it was
        substituted for (``mod.maker = my_ones`` or ``mock.patch("mod.np", ...)`` since makes
        the clone stale: it would run the device twin of the old value)."""
        module_globals = self.host_globals
        for name, value in self._sources:
            if module_globals.get(name, _MISSING) is not value:
                return False
        return True

    def __missing__(self, name: str) -> Any:
        value = self.host_globals.get(name, _MISSING)
        if value is _MISSING:
            # What CPython reads after a KeyError, without raising one: a loop step calling
            # two builtins took 0.65 us in a clone against 0.87 us with the KeyError (and
            # 0.09 us in the function itself; AMD EPYC, 2 cores, 2026-11-25).
            return self["__builtins__"][name]
        if self.reach is None or not isinstance(value, _REACHABLE):
            return value
        return self.reach.device_value(value, self.depth + 1)


_READY = "__vedart_device_class_ready__"  # set on a device class once it is made


class _DeviceClass(type):
    """The metaclass of device classes: instances and subclasses of the host class count as
    theirs, so ``isinstance(model, Model)`` in a clone holds for a model made outside it; and
    class state written through a device class once it is made (``cls.count += 1`` in a
    class method) goes to the host class, as the call on the CPU writes it (dunder names,
    which class creation and ``abc`` write, stay on the device class). A class the call
    itself derives from a device class (``class Tuned(Model)`` in the function) is of this
    metaclass too, but stands for no host class: it answers as any class does."""

    def __instancecheck__(cls, instance: Any) -> bool:
        host = vars(cls).get(HOST_CLASS)
        return super().__instancecheck__(instance) if host is None else \
            isinstance(instance, host)

    def __subclasscheck__(cls, subclass: type) -> bool:
        host = vars(cls).get(HOST_CLASS)
        return super().__subclasscheck__(subclass) if host is None else \
            issubclass(subclass, host)

    def _host_state(cls, name: str) -> bool:
        return _READY in vars(cls) and not (name.startswith("__") and name.endswith("__"))

    def __setattr__(cls, name: str, value: Any) -> None:
        if cls._host_state(name):
            setattr(vars(cls)[HOST_CLASS], name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(cls, name: str) -> None:
        if cls._host_state(name):
            delattr(vars(cls)[HOST_CLASS], name)
        else:
            super().__delattr__(name)


class _DeviceABCClass(_DeviceClass, abc.ABCMeta):
    """:class:`_DeviceClass` for a host class of ``abc.ABCMeta``."""


# Each comparison and the one Python tries the other way round (``a < b`` as ``b > a``).
_REFLECTED = {"__eq__": "__eq__", "__ne__": "__ne__", "__lt__": "__gt__", "__gt__": "__lt__",
              "__le__": "__ge__", "__ge__": "__le__"}


def _compared_as_one_class(host: type) -> bool:
    """Whether objects of ``host`` can be compared as objects of its device class sharing
    their attributes: they keep them all in a ``__dict__`` (no slots), ``object.__new__``
    makes them, and freeing one runs nothing (no ``__del__``, which would run on the shared
    attributes)."""
    has_dict = False
    for klass in host.__mro__[:-1]:
        names = vars(klass).get("__slots__", ())
        if set((names,) if isinstance(names, str) else names) - {"__dict__", "__weakref__"}:
            return False
        has_dict = has_dict or "__dict__" in vars(klass)
    return has_dict and host.__new__ is object.__new__ and getattr(host, "__del__", None) is None


def _twin(self: Any, other: Any) -> Any:
    """``other`` as an object of the device class of ``self`` sharing its attributes (the
    comparison only reads them) when ``other`` is an object of that class's host class, else
    None."""
    device = type(self)
    host = vars(device).get(HOST_CLASS)
    if host is None or type(other) is not host:
        return None
    twin = object.__new__(device)
    object.__setattr__(twin, "__dict__", other.__dict__)  # past a frozen __setattr__
    return twin


def _comparing_as_one_class(compare: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``compare``, a comparison method of a device class, taking an object of the host
    class (made outside the call) as an object of the device class: the methods dataclasses
    generate compare only objects of one ``__class__`` (``made == DEFAULT`` was False,
    ``made < DEFAULT`` raised), and Python tries a comparison between the two the device
    class's way round first (it is a subclass)."""
    def comparing(self: Any, other: Any) -> Any:
        twin = _twin(self, other)
        return compare(self, other if twin is None else twin)
    functools.update_wrapper(comparing, compare)
    return comparing


def _reflecting(compare: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The reflection of ``compare`` (``__gt__`` of a class defining ``__lt__`` only) for a
    device class: ``outside < made`` is tried as ``made > outside`` first, which answers
    ``outside < made`` as between two objects of the device class; anything else is left
    to the other object."""
    def reflected(self: Any, other: Any) -> Any:
        twin = _twin(self, other)
        return NotImplemented if twin is None else compare(twin, self)
    return reflected


def _compare_as_one_class(host: type, namespace: dict[str, Any]) -> None:
    """Wrap the comparison methods of the device class of ``host`` being made in
    ``namespace`` (:func:`_comparing_as_one_class`), adding the reflections the class lacks
    (:func:`_reflecting`)."""
    if not _compared_as_one_class(host):
        return
    compares = {name: namespace[name] for name in _REFLECTED
                if type(namespace.get(name)) is types.FunctionType}
    for name, compare in compares.items():
        namespace[name] = _comparing_as_one_class(compare)
    for name, compare in compares.items():
        reflection = _REFLECTED[name]
        if reflection not in namespace and getattr(host, reflection) is getattr(object,
                                                                                 reflection):
            namespace[reflection] = _reflecting(compare)


def _qualified_name(value: Any) -> str:
    """``module.qualname`` of a reached function or class, as reasons and reports name it."""
    return f"{value.__module__}.{value.__qualname__}"


def _made_from(value: Any) -> tuple[Any, ...]:
    """What the clone of a reached function or the device class of a reached class is made
    from, flat so that comparing two is one tuple comparison: a function's code and defaults;
    a class's methods and their code along its bases (other class attributes, a counter, may
    change without a new device class)."""
    if type(value) is types.FunctionType:
        return (value.__code__, value.__defaults__, value.__kwdefaults__)
    made_from: list[Any] = []
    for klass in value.__mro__[:-1]:
        for name, attribute in vars(klass).items():
            if isinstance(attribute, _METHOD_TYPES):
                made_from += (name, attribute, getattr(attribute, "__code__", None))
    return tuple(made_from)


class _DeviceSuper:
    """What :meth:`Reach._super` returns: attributes are looked up as ``real`` (a real super
    object of ``owner`` and ``first``) looks them up, and a function, static or class method
    or property found in a reached class is taken from that class's device class."""

    __slots__ = ("_real", "_owner", "_first", "_reach", "_depth")

    def __init__(self, real: Any, owner: type, first: Any, reach: Reach, depth: int) -> None:
        for name, value in (("_real", real), ("_owner", owner), ("_first", first),
                            ("_reach", reach), ("_depth", depth)):
            object.__setattr__(self, name, value)

    def __getattribute__(self, name: str) -> Any:
        real = object.__getattribute__(self, "_real")
        owner = object.__getattribute__(self, "_owner")
        first = object.__getattribute__(self, "_first")
        kind = first if isinstance(first, type) and issubclass(first, owner) else type(first)
        mro = kind.__mro__
        for found_in in mro[mro.index(owner) + 1:]:
            if name in vars(found_in):
                break
        else:
            return getattr(real, name)
        device = object.__getattribute__(self, "_reach").device_value(
            found_in, object.__getattribute__(self, "_depth"))
        attribute = vars(device).get(name) if device is not found_in else None
        if attribute is None:
            return getattr(real, name)
        get = getattr(type(attribute), "__get__", None)
        if get is None:
            return attribute
        return get(attribute, None if first is kind else first, kind)

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_real"))


class _ReachedModule:
    """A user's module as a clone sees it (``import estimators as est``): its functions and
    classes through the clone's Reach, everything else as it is; assignments and deletions
    (``est.last_size = n``) go to the module itself."""

    def __init__(self, module: types.ModuleType, reach: Reach, depth: int) -> None:
        object.__setattr__(self, "_ReachedModule__module", module)
        object.__setattr__(self, "_ReachedModule__reach", reach)
        object.__setattr__(self, "_ReachedModule__depth", depth)
        object.__setattr__(self, "__name__", module.__name__)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__module, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.__module, name)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__module, name)
        if not isinstance(value, _REACHABLE):
            return value
        return self.__reach.device_value(value, self.__depth)

    def __repr__(self) -> str:
        return f"<{self.__name__} as a device clone sees it>"


class Reach:
    """The helpers one decorated function's clone reaches (see the module docstring): their
    device clones and device classes, made on first use, cached (made again when a function's
    code or defaults, or a class's methods, change), at most ``REACH_DEPTH`` calls deep and
    ``REACH_FUNCTIONS`` functions in all. ``home``: the decorated function's module, whose
    package is reached whether or not it binds NumPy. Thread-safe."""

    def __init__(self, mapper: ModuleMapper, home: str) -> None:
        self._mapper = mapper
        self.builtins = _hooked_builtins(mapper)
        self.builtins["super"] = self._super
        self._home_package = home.partition(".")[0]
        self._lock = threading.RLock()
        renew_in_child(self, "_lock")
        # value -> (what a clone sees for it, what that was made from (:func:`_made_from`;
        # None for a value seen as it is): made again when that changes)
        self._known: dict[Any, tuple[Any, tuple[Any, ...] | None]] = {}
        # The qualified names of the helper functions cloned: a function defined again (a
        # module reloaded, a notebook cell run again) is made anew but not counted again.
        self._cloned: set[str] = set()
        # The globals of the clones made (helpers and methods) that substitute names.
        self._substituting: list[_CloneGlobals] = []
        self._binds_numpy: dict[tuple[str, bool], bool] = {}
        # The qualified names of the helper functions and classes that ran as clones.
        self.names: tuple[str, ...] = ()

    @classmethod
    def of(cls, func: Callable[..., Any], mapper: ModuleMapper) -> Reach:
        """The Reach of decorated callable ``func`` (of the function a bound method or a
        ``functools.partial`` wraps), its home the module that function is defined in."""
        home = getattr(_innermost(func), "__module__", None)
        return cls(mapper, home if isinstance(home, str) else "__main__")

    def device_value(self, value: Any, depth: int) -> Any:
        """What the name bound to ``value`` (a function, class or module) means in a clone
        ``depth`` calls deep: the device clone of a reached function, the device class of a
        reached class, a reached module seen through this Reach, else ``value``."""
        known = self._known.get(value)  # without the lock: clones read globals often
        if known is not None and (known[1] is None or known[1] == _made_from(value)):
            return known[0]
        if depth > REACH_DEPTH:
            return value
        with self._lock:
            if not self._reaches(value):
                self._known[value] = (value, None)
                return value
            made_from = None
            if isinstance(value, types.ModuleType):
                result: Any = _ReachedModule(value, self, depth)
            elif isinstance(value, type):
                result, made_from = self._device_class(value, depth), _made_from(value)
            else:
                name = _qualified_name(value)
                if name not in self._cloned and len(self._cloned) >= REACH_FUNCTIONS:
                    return value
                self._cloned.add(name)
                result, made_from = self.clone(value, depth), _made_from(value)
            if not isinstance(value, types.ModuleType):
                self._name(value)
            self._known[value] = (result, made_from)
            return result

    def drop_stale(self) -> None:
        """Once a module has rebound a name one of the clones substituted since it was made
        (``mock.patch("mod.np", ...)``), mark every clone stale: each is made again when next
        looked up. Called before each GPU run of the decorated function, not on every lookup,
        which a helper called in a loop makes (a check there cost 90-320 ns a lookup); a name
        rebound during a run is seen at the next run."""
        if all(each.current() for each in self._substituting):
            return
        with self._lock:  # rebinding is rare: every clone is made again, and counted once
            self._known = {value: (result, made_from if made_from is None else _STALE)
                           for value, (result, made_from) in self._known.items()}
            self._substituting = []

    def clone(self, func: types.FunctionType, depth: int) -> Any:
        """``func`` run with the device namespace, reaching on from ``depth``; ``func`` itself
        when it assigns module globals."""
        clone = _clone_function(func, self._mapper, self.builtins, self, depth)
        if clone is not func and clone.__globals__.substitutes:
            self._substituting.append(clone.__globals__)
        return clone

    def _reaches(self, value: Any) -> bool:
        # A function is judged by the module whose globals its code reads: functools.wraps
        # copies __module__ onto wrappers defined elsewhere (@veda.gpu's among them).
        module = value.__name__ if isinstance(value, types.ModuleType) else \
            value.__globals__.get("__name__") if type(value) is types.FunctionType else \
            getattr(value, "__module__", None)
        if not isinstance(module, str):
            return False
        root = module.partition(".")[0]
        if (root in _NEVER_REACHED and module not in _USER_CODE_IN_VEDART) \
                or root in self._mapper.device_roots:
            return False
        if isinstance(value, type) and (
                type(value) not in _PLAIN_METACLASSES
                or issubclass(value, (BaseException, enum.Enum))
                # Subclassing it runs code of its own (a registry of subclasses, say).
                or any("__init_subclass__" in vars(klass) for klass in value.__mro__[:-1])):
            return False
        return root == self._home_package or self._module_binds_numpy(module)

    def _module_binds_numpy(self, name: str, reexports: bool = True) -> bool:
        """Whether module ``name`` binds NumPy or SciPy names, or, with ``reexports``, a
        function or class of another module that does (a package's ``__init__`` that
        imports its helpers from its submodules: ``lib.h`` where ``h`` is ``lib.core``'s)."""
        known = self._binds_numpy.get((name, reexports))
        if known is None:
            module = sys.modules.get(name)
            values = list(vars(module).values()) if module is not None else []
            known = any(self._mapper.twin_of_value(value) is not value for value in values) \
                or reexports and any(
                    isinstance(value, (types.FunctionType, type))
                    and isinstance(home := getattr(value, "__module__", None), str)
                    and home != name and self._module_binds_numpy(home, reexports=False)
                    for value in values)
            self._binds_numpy[name, reexports] = known
        return known

    def _device_class(self, host: type, depth: int) -> type:
        """A subclass of ``host`` whose methods (its own and its reached bases') are clones,
        which answers ``isinstance`` as ``host`` does (objects made outside the call are
        instances of it) and whose objects get ``host`` back as results."""
        namespace: dict[str, Any] = {"__module__": host.__module__,
                                     "__qualname__": host.__qualname__,
                                     "__doc__": host.__doc__, "__slots__": (),
                                     HOST_CLASS: host}
        for klass in host.__mro__:
            if klass is object or not self._reaches(klass):
                continue
            for name, attribute in vars(klass).items():
                if name not in namespace and name not in _CLASS_MACHINERY:
                    cloned = self._clone_attribute(attribute, depth)
                    if cloned is not attribute:
                        namespace[name] = cloned
        if "__eq__" in namespace and "__hash__" not in namespace:
            namespace["__hash__"] = host.__hash__  # a class defining __eq__ alone gets None
        _compare_as_one_class(host, namespace)
        metaclass = _DeviceClass if type(host) is type else _DeviceABCClass
        device = metaclass(host.__name__, (host,), namespace)
        type.__setattr__(device, _READY, True)
        return device

    def _super(self, *args: Any) -> Any:
        """``super`` as clones see it: what the real one finds, except that a method of a
        reached base class is its clone (``super().__init__(n)`` in a reached class's
        ``__init__`` runs the base's ``__init__`` on the device too)."""
        if len(args) == 1:  # an unbound super: nothing is looked up through it here
            return builtins.super(*args)
        if args:
            owner, first = args
            # super(Model, self) in a clone names Model's device class: start after Model.
            owner = vars(owner).get(HOST_CLASS, owner) if isinstance(owner, type) else owner
            depth = REACH_DEPTH
        else:  # the zero-argument form: what the compiler gives the calling method
            frame = sys._getframe(1)
            code, frame_locals = frame.f_code, frame.f_locals
            owner = frame_locals.get("__class__")
            if not code.co_argcount:
                raise RuntimeError("super(): no arguments")
            if not isinstance(owner, type):
                raise RuntimeError("super(): __class__ cell not found")
            first = frame_locals[code.co_varnames[0]]
            clone_globals = frame.f_globals
            depth = clone_globals.depth + 1 if isinstance(clone_globals, _CloneGlobals) \
                else REACH_DEPTH
        return _DeviceSuper(builtins.super(owner, first), owner, first, self, depth)

    def _name(self, value: Any) -> None:
        name = _qualified_name(value)
        if name not in self.names:
            self.names = tuple(sorted((*self.names, name)))

    def _clone_attribute(self, attribute: Any, depth: int) -> Any:
        if type(attribute) is types.FunctionType:
            return self.clone(attribute, depth)
        if isinstance(attribute, (staticmethod, classmethod)) and \
                type(attribute.__func__) is types.FunctionType:
            return type(attribute)(self.clone(attribute.__func__, depth))
        if type(attribute) is property:
            parts = [None if part is None or type(part) is not types.FunctionType
                     else self.clone(part, depth)
                     for part in (attribute.fget, attribute.fset, attribute.fdel)]
            return property(*parts, doc=attribute.__doc__)
        if type(attribute) is functools.cached_property and \
                type(attribute.func) is types.FunctionType:
            cached = functools.cached_property(self.clone(attribute.func, depth))
            cached.attrname = attribute.attrname  # what __set_name__ gave the original
            return cached
        return attribute


def helper_of(error: BaseException) -> str | None:
    """The qualified name of the innermost helper clone (not the decorated function's own)
    the traceback of ``error`` passes through, or None."""
    helper = None
    traceback = error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        names = frame.f_globals
        if isinstance(names, _CloneGlobals) and names.depth > 0:
            helper = f"{names.get('__name__', '?')}.{frame.f_code.co_qualname}"
        traceback = traceback.tb_next
    return helper


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    nested = [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return [code] + [inner for const in nested for inner in _code_objects(const)]


def assigns_globals(func: types.FunctionType) -> bool:
    """Whether ``func`` (or code nested in it) stores or deletes a module global."""
    return any(instruction.opname in _GLOBAL_WRITES
               for code in _code_objects(func.__code__)
               for instruction in dis.get_instructions(code))


def _clone_function(func: types.FunctionType, mapper: ModuleMapper,
                    hooked_builtins: dict[str, Any], reach: Reach | None = None,
                    depth: int = 0) -> types.FunctionType:
    if assigns_globals(func):
        return func
    module_globals = func.__globals__
    names = {name for code in _code_objects(func.__code__) for name in code.co_names}
    substituted: dict[str, Any] = {"__builtins__": hooked_builtins}
    sources = []
    for name in names & module_globals.keys():
        value = module_globals[name]
        twin = mapper.twin_of_value(value)
        if twin is not value:
            substituted[name] = twin
            sources.append((name, value))
    for key in ("__name__", "__package__", "__spec__", "__file__"):
        if key in module_globals:
            substituted[key] = module_globals[key]
    clone = types.FunctionType(func.__code__, _CloneGlobals(substituted, func, reach, depth,
                                                            tuple(sources)),
                               func.__name__, func.__defaults__, func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__qualname__ = func.__qualname__
    clone.__module__ = func.__module__
    return clone


def _innermost(func: Any) -> Any:
    """The function a bound method or ``functools.partial`` (of one) runs, else ``func``."""
    while isinstance(func, (types.MethodType, functools.partial)):
        func = func.__func__ if isinstance(func, types.MethodType) else func.func
    return func


def clone_is_current(clone: Any) -> bool:
    """Whether ``clone`` (a device clone, a bound method or partial of one, or anything
    else) still substitutes what its module binds (:meth:`_CloneGlobals.current`)."""
    clone_globals = getattr(_innermost(clone), "__globals__", None)
    return not isinstance(clone_globals, _CloneGlobals) or clone_globals.current()


def device_clone(func: Callable[..., Any], mapper: ModuleMapper,
                 reach: Reach | None = None) -> Callable[..., Any]:
    """Return a callable that runs ``func`` with device substitution, reaching the helpers it
    calls through ``reach`` (see :meth:`Reach.of`; None: its own code only).

    Plain functions and lambdas are cloned; bound methods and ``functools.partial`` objects
    are rebuilt around a clone of the function they wrap; any other callable is returned
    unchanged (dispatch only).
    """
    hooked_builtins = reach.builtins if reach is not None else _hooked_builtins(mapper)
    return _clone_any(func, mapper, hooked_builtins, reach)


def _hooked_builtins(mapper: ModuleMapper) -> dict[str, Any]:
    hooked_builtins = dict(vars(builtins))
    hooked_builtins["__import__"] = mapper.import_hook(builtins.__import__)
    return hooked_builtins


def _clone_any(func: Callable[..., Any], mapper: ModuleMapper,
               hooked_builtins: dict[str, Any], reach: Reach | None) -> Callable[..., Any]:
    if isinstance(func, types.FunctionType):
        return _clone_function(func, mapper, hooked_builtins, reach)
    if isinstance(func, types.MethodType):
        return types.MethodType(_clone_any(func.__func__, mapper, hooked_builtins, reach),
                                func.__self__)
    if isinstance(func, functools.partial):
        return functools.partial(_clone_any(func.func, mapper, hooked_builtins, reach),
                                 *func.args, **func.keywords)
    return func
