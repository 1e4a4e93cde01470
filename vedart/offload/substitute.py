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
- Only the decorated function's own code (and functions and lambdas defined inside it) sees the
  substituted names; functions it calls run on CuPy arrays through dispatch alone.
- A name whose device twin lacks an attribute falls back to the NumPy attribute (then dispatch,
  or a GPU failure that re-runs the call on the CPU).
- A function that assigns or deletes module globals (``global x; x = ...``) is not cloned; it
  runs with dispatch only, so its assignments reach the real module.
- Some device functions are adjusted to answer as NumPy's do (:func:`_as_numpy_does`): named
  tuples from ``numpy.linalg``, CuPy's linear algebra raising what cuSOLVER reports (a singular
  matrix), 0-d arrays from array makers, NumPy's own exception where CuPy accepts a dtype NumPy
  rejects, ``np.histogram`` of integers counted as NumPy counts them.
"""

from __future__ import annotations

import builtins
import dis
import functools
import importlib
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy

from vedart.offload.results import (
    ARRAY_KEEPERS,
    ARRAY_MAKERS,
    is_array_to_numpy,
    note_made_array,
)

# Host package -> the package that holds its device twins (``scipy.ndimage`` -> ``cupyx.scipy.ndimage``).
DEVICE_PACKAGES: dict[str, str] = {"numpy": "cupy", "scipy": "cupyx.scipy"}
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})


class ModuleMapper:
    """Finds the device twin of a host module by name; ``device_packages`` maps host root
    packages to device packages (``{"numpy": "cupy"}``). Twins are imported on first use."""

    def __init__(self, device_packages: Mapping[str, str]) -> None:
        self._device_packages = dict(device_packages)
        self._twins: dict[str, DeviceNamespace | None] = {}

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


def _as_numpy_does(device_function: Any, host_function: Any, host_module: str,
                   name: str, device_module: str) -> Any:
    """``device_function`` (the device twin of ``host_module.name``, from ``device_module``),
    adjusted where CuPy's answer would differ from NumPy's; other attributes pass through."""
    if not callable(device_function):
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
        adjusted = _raising_linalg_errors(adjusted)
    rejected = _NUMPY_REJECTS.get(host_module, {}).get(name)
    if rejected is None or not callable(host_function):
        return adjusted

    @functools.wraps(device_function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if args and getattr(getattr(args[0], "dtype", None), "char", None) in rejected:
            host_function(*map(_stand_in, args),
                          **{key: _stand_in(value) for key, value in kwargs.items()})
        return adjusted(*args, **kwargs)

    return checked


def _raising_linalg_errors(device_function: Any) -> Any:
    """``device_function`` run with CuPy told to raise what cuSOLVER and cuBLAS report (a
    singular matrix to ``inv`` or ``solve``, a matrix ``cholesky`` cannot factor), as NumPy
    raises ``LinAlgError``; by default CuPy returns what the routine left (each check waits for
    the device)."""
    import cupyx

    @functools.wraps(device_function)
    def raising(*args: Any, **kwargs: Any) -> Any:
        with cupyx.errstate(linalg="raise"):
            return device_function(*args, **kwargs)

    return raising


def _stand_in(value: Any) -> Any:
    """A small host array of ``value``'s dtype and rank, for an array; else ``value``."""
    dtype, ndim = getattr(value, "dtype", None), getattr(value, "ndim", None)
    if isinstance(dtype, numpy.dtype) and isinstance(ndim, int):
        return numpy.zeros((2,) * ndim, dtype)
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


class _CloneGlobals(dict):  # type: ignore[type-arg]
    """Clone globals: substituted names are stored; every other name is read live from the
    function's real module globals (CPython consults ``__missing__`` for non-exact dicts)."""

    def __init__(self, substituted: dict[str, Any], module_globals: dict[str, Any]) -> None:
        super().__init__(substituted)
        self._module_globals = module_globals

    def __missing__(self, name: str) -> Any:
        return self._module_globals[name]


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    nested = [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return [code] + [inner for const in nested for inner in _code_objects(const)]


def assigns_globals(func: types.FunctionType) -> bool:
    """Whether ``func`` (or code nested in it) stores or deletes a module global."""
    return any(instruction.opname in _GLOBAL_WRITES
               for code in _code_objects(func.__code__)
               for instruction in dis.get_instructions(code))


def _clone_function(func: types.FunctionType, mapper: ModuleMapper,
                    hooked_builtins: dict[str, Any]) -> types.FunctionType:
    if assigns_globals(func):
        return func
    module_globals = func.__globals__
    names = {name for code in _code_objects(func.__code__) for name in code.co_names}
    substituted: dict[str, Any] = {"__builtins__": hooked_builtins}
    for name in names & module_globals.keys():
        value = module_globals[name]
        twin = mapper.twin_of_value(value)
        if twin is not value:
            substituted[name] = twin
    for key in ("__name__", "__package__", "__spec__", "__file__"):
        if key in module_globals:
            substituted[key] = module_globals[key]
    clone = types.FunctionType(func.__code__, _CloneGlobals(substituted, module_globals),
                               func.__name__, func.__defaults__, func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__qualname__ = func.__qualname__
    clone.__module__ = func.__module__
    return clone


def device_clone(func: Callable[..., Any], mapper: ModuleMapper) -> Callable[..., Any]:
    """Return a callable that runs ``func`` with device substitution.

    Plain functions and lambdas are cloned; bound methods and ``functools.partial`` objects
    are rebuilt around a clone of the function they wrap; any other callable is returned
    unchanged (dispatch only).
    """
    hooked_builtins = dict(vars(builtins))
    hooked_builtins["__import__"] = mapper.import_hook(builtins.__import__)
    return _clone_any(func, mapper, hooked_builtins)


def _clone_any(func: Callable[..., Any], mapper: ModuleMapper,
               hooked_builtins: dict[str, Any]) -> Callable[..., Any]:
    if isinstance(func, types.FunctionType):
        return _clone_function(func, mapper, hooked_builtins)
    if isinstance(func, types.MethodType):
        return types.MethodType(_clone_any(func.__func__, mapper, hooked_builtins),
                                func.__self__)
    if isinstance(func, functools.partial):
        return functools.partial(_clone_any(func.func, mapper, hooked_builtins),
                                 *func.args, **func.keywords)
    return func
