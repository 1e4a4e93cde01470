"""``@gpu_kernel``: handles for Numba CUDA kernels, the process-wide registry, ``get_kernel``.

A handle is made when a kernel is decorated -- often at import, before any runtime exists --
so registration is process-wide (:data:`KERNELS`): it survives ``veda.init()`` and
``shutdown()``, and every runtime exposes it as ``runtime.kernels``. The registry holds
handles weakly: a kernel is listed while its handle is alive.

The path of one call (``add(a, b, out)`` or ``add[grid, block](a, b, out)``):

1. Route, computed once per runtime: a usable GPU -> "gpu"; else ``cpu=`` -> "cpu"; else
   ``fallback="raise"`` -> "raise" (GPUUnavailableError); else "simulator" (warned once).
   A launch that loses the CUDA context raises CUDA's error and makes the GPU unusable; a
   launch of NumPy arrays that finds it lost by another (before or during its own) is routed
   anew, once.
2. Validate before any work (:func:`~vedart.kernels.arguments.bind`, the launch dimensions,
   the device's limits): KernelLaunchError names the problem.
3. Run through a backend -- the one device code path: NumPy arrays to the device, launch
   (:class:`~vedart.backends.CUDABackend`; on :class:`~vedart.backends.CPUBackend` "to the
   device" is a copy and the launch is the simulator or ``cpu=``), outputs copied back.
4. Telemetry: launches by path, first-call compile seconds, kernel seconds by CUDA events when
   ``Config.profiling`` is on.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from vedart import lifecycle
from vedart._logging import logger
from vedart.backends import Backend, CPUBackend
from vedart.backends.dims import CUDA_LIMITS, LaunchDims, launch_dims
from vedart.config import checked_bool, checked_int, parameter_names
from vedart.errors import (
    ConfigError,
    GPUUnavailableError,
    KernelLaunchError,
    SimulatorWarning,
)
from vedart.gpu.context import DISABLED_BY_CONFIG
from vedart.kernels.arguments import (
    BoundCall,
    KernelParameters,
    NoDeviceArrays,
    bind,
    run_with_copies,
    sizing_shape,
)
from vedart.kernels.autotune import Autotuner
from vedart.kernels.launch_config import auto_dims
from vedart.locks import renew_in_child
from vedart.offload.failures import loses_context, lost_context_reason
from vedart.telemetry import KernelStats

_NEVER_CURRENT: Any = object()  # a route "runtime" that is never lifecycle.current
_CONFIGURED_CACHE_LIMIT = 256
_HOST = CPUBackend()
_warning_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_warning_lock")


def cuda_backend(ordinal: int) -> Backend:
    """The current runtime's backend for CUDA device ``ordinal`` (``runtime.gpu.device_backend``),
    shared by every kernel. The seam through which tests give kernels a stand-in device."""
    gpu = lifecycle.get_runtime().gpu
    if not gpu:
        raise GPUUnavailableError("no GPU: the runtime has no usable GPU for this kernel launch")
    return gpu.device_backend(ordinal)


@dataclass(frozen=True)
class KernelOptions:
    """The validated options of one @gpu_kernel."""

    threads_per_block: int = 256
    size_from: str | None = None
    outputs: tuple[str, ...] | None = None
    cpu: Callable[..., Any] | None = None
    autotune: bool = False

    @staticmethod
    def validated(threads_per_block: Any, size_from: Any, outputs: Any, cpu: Any,
                  autotune: Any) -> KernelOptions:
        most = CUDA_LIMITS.max_threads_per_block
        threads = checked_int("threads_per_block", threads_per_block, 1,
                              f"an int from 1 to {most}", maximum=most)
        if size_from is not None and not isinstance(size_from, str):
            raise ConfigError(f"size_from: got {size_from!r}; allowed: None or a parameter name")
        if outputs is not None:
            outputs = parameter_names("outputs", outputs, "None (every NumPy array argument) "
                                      "or a tuple of parameter names")
        if cpu is not None and not callable(cpu):
            raise ConfigError(f"cpu: got {cpu!r}; allowed: None or a function taking the "
                              f"kernel's arguments")
        return KernelOptions(threads, size_from, outputs, cpu, checked_bool("autotune", autotune))


@dataclass(frozen=True)
class _Route:
    """How this kernel's calls run under one runtime."""

    runtime: Any
    path: str = "simulator"       # "gpu", "cpu", "raise" or "simulator"
    reason: str = ""              # why not on a GPU
    stats: KernelStats | None = None
    profiling: bool = False
    default_device: int = 0       # for calls without device arrays
    device_type: type = NoDeviceArrays
    adopt: Callable[[Any], Any] | None = None  # other __cuda_array_interface__ arrays -> CuPy
    gpu: Any = None               # the runtime's GPUContext, on path "gpu": lost -> new route


def _stale(route: _Route) -> bool:
    """Whether ``route`` is not the current runtime's (after init or shutdown) or its GPU was
    lost since it was made."""
    return route.runtime is not lifecycle.current or \
        route.gpu is not None and route.gpu.unavailable_reason is not None


class KernelHandle:
    """A registered ``@cuda.jit`` kernel.

    ``kernel(*args)`` launches one thread per element of the sizing array (``size_from=``, else
    the largest array argument), ``threads_per_block`` a block; ``kernel[grid, block](*args)``
    launches with that configuration. Calls return None; results are in the arrays.
    ``dispatcher`` is the Numba kernel; ``name`` its ``__name__``, ``qualified_name`` adds the
    module. Safe to call from many threads.
    """

    def __init__(self, dispatcher: Any, options: KernelOptions) -> None:
        functools.update_wrapper(self, dispatcher, updated=())
        self.dispatcher = dispatcher
        self.options = options
        self.name: str = dispatcher.__name__
        self.qualified_name = f"{dispatcher.__module__}.{dispatcher.__qualname__}"
        self.parameters = KernelParameters.of(self.name, dispatcher.py_func, options.size_from,
                                              options.outputs)
        self._route = _Route(runtime=_NEVER_CURRENT)
        self._configured: dict[Any, _ConfiguredKernel] = {}
        self._autotuner = Autotuner(self.name, dispatcher)
        self._warned_simulator = False

    def __repr__(self) -> str:
        return f"<gpu_kernel {self.qualified_name}{self.parameters.names}>"

    def __call__(self, *args: Any) -> None:
        self._launch(args, None)

    def __getitem__(self, configuration: Any) -> _ConfiguredKernel:
        try:
            return self._configured[configuration]
        except (KeyError, TypeError):  # new, or unhashable (lists)
            pass
        if not isinstance(configuration, tuple) or len(configuration) != 2:
            raise KernelLaunchError(f"{self.name}[...]: got {configuration!r}; allowed: "
                                    f"kernel[grid, block]")
        configured = _ConfiguredKernel(self, launch_dims(self.name, *configuration))
        if len(self._configured) >= _CONFIGURED_CACHE_LIMIT:
            self._configured.clear()
        with contextlib.suppress(TypeError):  # a configuration with lists is not cached
            self._configured[configuration] = configured
        return configured

    def _launch(self, args: tuple[Any, ...], dims: LaunchDims | None) -> None:
        route = self._route
        met: BaseException | None = None  # what sent this launch off its GPU route, if anything
        try:
            while True:  # twice at most: a second pass never reroutes
                if _stale(route):
                    route = self._refresh()  # after init or shutdown, or a lost CUDA context
                call = bind(self.parameters, args, route.device_type, route.adopt, route.reason)
                if route.path != "gpu":
                    self._on_host(route, call, dims)
                    return
                met = self._on_gpu_unless_lost(route, call, dims, rerouted=met is not None)
                if met is None:
                    return
        except BaseException as failure:
            if met is not None and failure is not met and failure.__context__ is None:
                failure.__context__ = met  # the rerouted launch failed: say what sent it
            raise
        finally:
            met = None  # its traceback holds this frame: no cycle left behind

    def _on_gpu_unless_lost(self, route: _Route, call: BoundCall, dims: LaunchDims | None,
                            rerouted: bool) -> BaseException | None:
        """Run ``call`` on ``route``'s GPU: None once it ran. Where another launch lost the
        CUDA context, before this one started or during it, the error met, for the launch to
        be routed anew: not once ``rerouted`` already, nor with device arrays, which the
        kernel may have written to; those raise, as does the launch that lost the context."""
        ordinal = route.default_device if call.device_ordinal is None else call.device_ordinal
        try:
            backend = cuda_backend(ordinal)
        except GPUUnavailableError as error:
            # The GPU went away after this launch read its route (another thread's launch
            # lost the context, or init or shutdown ran): nothing has run, and the launch goes
            # where it would have gone a moment later.
            if rerouted or not _stale(route):
                raise
            return error
        try:
            self._on_gpu(route, backend, call, dims)
        except Exception as error:
            if not loses_context(error):
                raise
            # Nothing more runs on this GPU: every caller's own route turns to where a missing
            # GPU sends it. Copies back come only after success, so a launch routed anew finds
            # its caller's arrays as they were.
            first = route.gpu.disable(lost_context_reason(error, f"kernel {self.qualified_name}"))
            if first or call.device or rerouted:
                raise
            return error
        return None

    def _refresh(self) -> _Route:
        """Rebuild the route for the current runtime (first call, after init or shutdown)."""
        runtime = lifecycle.get_runtime()
        stats = runtime.telemetry.kernel(self.qualified_name) if runtime.telemetry.enabled \
            else None
        gpu = runtime.gpu
        if gpu is not None and gpu.is_available():
            import cupy

            route = _Route(runtime, "gpu", "", stats, runtime.config.profiling,
                           gpu.devices[0].ordinal, cupy.ndarray, cupy.asarray, gpu)
        else:
            reason = DISABLED_BY_CONFIG if gpu is None else \
                f"no GPU: {gpu.unavailable_reason}"
            path = "cpu" if self.options.cpu is not None else \
                "raise" if runtime.config.fallback == "raise" else "simulator"
            route = _Route(runtime, path, reason, stats)
        self._route = route
        return route

    def _on_host(self, route: _Route, call: BoundCall, dims: LaunchDims | None) -> None:
        if dims is None:
            dims = auto_dims(sizing_shape(self.parameters, call), self.options.threads_per_block)
        dims = CUDA_LIMITS.check(self.name, dims)
        if route.path == "raise":
            raise GPUUnavailableError(f"{self.name}: {route.reason}; fallback='raise' and the "
                                      f"kernel has no cpu= implementation")
        cpu = self.options.cpu
        if cpu is not None:
            run_with_copies(_HOST, call, lambda values: cpu(*values))
        else:
            self._warn_simulator(route.reason)
            run_with_copies(_HOST, call,
                            lambda values: _HOST.launch(self.dispatcher, dims, values))
        if route.stats is not None:
            next(route.stats.launches[route.path])

    def _warn_simulator(self, reason: str) -> None:
        with _warning_lock:
            if self._warned_simulator:
                return
            self._warned_simulator = True
        message = (f"{self.name}: {reason}; running in Numba's CUDA simulator (correct, but "
                   f"slow); give @gpu_kernel a cpu= implementation to run on the CPU instead")
        logger.warning(message)
        warnings.warn(message, SimulatorWarning, stacklevel=5)

    def _on_gpu(self, route: _Route, backend: Backend, call: BoundCall,
                dims: LaunchDims | None) -> None:
        shape = None
        if dims is None:
            shape = sizing_shape(self.parameters, call)
            dims = auto_dims(shape, self.options.threads_per_block)
        dims = backend.launch_limits.check(self.name, dims)
        tuned_shape = shape if self.options.autotune else None

        def run(values: Sequence[Any]) -> float:
            if tuned_shape is None:
                return self._launch_on(backend, route, dims, values)
            chosen, tuning_compile_seconds = self._autotuner.dims_for(
                backend, tuned_shape, values, call.host + call.device)
            return tuning_compile_seconds + self._launch_on(backend, route, chosen, values)

        compile_seconds = run_with_copies(backend, call, run)
        stats = route.stats
        if stats is not None:
            next(stats.launches["gpu"])
            if compile_seconds:
                stats.add_compile(compile_seconds)

    def _launch_on(self, backend: Backend, route: _Route, dims: LaunchDims,
                   values: Sequence[Any]) -> float:
        stats = route.stats
        if not route.profiling or stats is None:
            return backend.launch(self.dispatcher, dims, values)
        import cupy

        with cupy.cuda.Device(backend.device_id):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            compile_seconds = backend.launch(self.dispatcher, dims, values)
            end.record()
            end.synchronize()
            if not compile_seconds:  # the events of a compiling launch would time the compiler
                stats.add_kernel_time(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return compile_seconds


class _ConfiguredKernel:
    """``kernel[grid, block]``: the kernel with an explicit launch configuration."""

    __slots__ = ("_handle", "dims")

    def __init__(self, handle: KernelHandle, dims: LaunchDims) -> None:
        self._handle = handle
        self.dims = dims

    def __call__(self, *args: Any) -> None:
        self._handle._launch(args, self.dims)


class KernelRegistry(Mapping[str, KernelHandle]):
    """Every live @gpu_kernel handle of the process, by name. Thread-safe.

    A kernel is found by its ``__name__`` while that is unique, and always by its qualified name
    (module and qualname); iteration lists each kernel once, qualified where names clash.
    Decorating a function with the same qualified name again replaces the earlier handle.
    """

    def __init__(self) -> None:
        self._handles: weakref.WeakValueDictionary[str, KernelHandle] = \
            weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    def register(self, handle: KernelHandle) -> None:
        with self._lock:
            self._handles[handle.qualified_name] = handle

    def _live(self) -> list[KernelHandle]:
        with self._lock:
            return list(self._handles.values())

    def __getitem__(self, name: str) -> KernelHandle:
        handle = self._handles.get(name)
        if handle is not None:
            return handle
        matches = [handle for handle in self._live() if handle.name == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise KeyError(f"kernel name {name!r} is ambiguous; use one of "
                           f"{sorted(handle.qualified_name for handle in matches)}")
        raise KeyError(f"no kernel named {name!r}; registered: {sorted(self)}")

    def __iter__(self) -> Iterator[str]:
        handles = self._live()
        counts: dict[str, int] = {}
        for handle in handles:
            counts[handle.name] = counts.get(handle.name, 0) + 1
        return iter([handle.name if counts[handle.name] == 1 else handle.qualified_name
                     for handle in handles])

    def __len__(self) -> int:
        return len(self._live())


KERNELS = KernelRegistry()


def get_kernel(name: str) -> KernelHandle:
    """The registered kernel ``name`` (its ``__name__`` while unique, or ``module.qualname``);
    KeyError listing the registered names otherwise."""
    return KERNELS[name]


def _kernel_problem(kernel: Any) -> str | None:
    if not hasattr(kernel, "py_func") or isinstance(kernel, KernelHandle):
        return "not a @cuda.jit kernel (decorate the function with @cuda.jit first)"
    if getattr(kernel, "targetoptions", {}).get("device") or getattr(kernel, "_device", False):
        return "a device function (@cuda.jit(device=True)), not a kernel"
    return None


def _register(kernel: Any, options: KernelOptions) -> KernelHandle:
    problem = _kernel_problem(kernel)
    if problem is not None:
        raise TypeError(f"@gpu_kernel needs a @cuda.jit kernel; got {kernel!r}: {problem}")
    handle = KernelHandle(kernel, options)
    KERNELS.register(handle)
    return handle


@overload
def gpu_kernel(kernel: Any, /) -> KernelHandle: ...
@overload
def gpu_kernel(*, threads_per_block: int = 256, size_from: str | None = None,
               outputs: Iterable[str] | None = None, cpu: Callable[..., Any] | None = None,
               autotune: bool = False) -> Callable[[Any], KernelHandle]: ...


def gpu_kernel(kernel: Any = None, /, *, threads_per_block: int = 256,
               size_from: str | None = None, outputs: Iterable[str] | None = None,
               cpu: Callable[..., Any] | None = None, autotune: bool = False) -> Any:
    """Register a ``@cuda.jit`` kernel and return its :class:`KernelHandle`.

    Options (validated at decoration; a bad value raises ConfigError naming the option):
      threads_per_block: threads a block in automatic launches, 1 to 1024.
      size_from: the parameter whose array sizes automatic launches (default: the largest
        array argument).
      outputs: parameters whose NumPy arrays are copied back after a launch (default: every
        writable NumPy array argument).
      cpu: a function with the kernel's parameters run instead when no GPU is usable.
      autotune: time 128, 256, 512 and 1024 threads a block once per (device, size bucket) and
        use the fastest (automatic launches on a GPU only).
    """
    options = KernelOptions.validated(threads_per_block, size_from, outputs, cpu, autotune)
    if kernel is None:
        return lambda inner: _register(inner, options)
    return _register(kernel, options)
