"""``@veda.gpu``: decide per call, run on the GPU with NumPy-to-CuPy substitution, return host
results, and fall back to the CPU when the GPU fails.

The path of one call:
1. Fast path (call_wrapper.py), no NVML query, no logging: GPU disabled or absent, or
   host-array bytes below the threshold with no device array -> call the function as written.
2. Otherwise scan the arguments, ask the cost model (the static rule, or the adaptive model's
   choice once the static checks allow the GPU) for a Decision (with a reason).
3. GPU: with device d current, copy host arrays to the device, run the substituted
   clone without waiting for the copies, synchronise, copy results (and the arguments it
   writes into: ``writes=``, and those found in its code, :mod:`~vedart.offload.inplace`)
   back, record telemetry.
4. An exception of any type on the GPU attempt re-runs the function on the CPU with the
   caller's original arguments (``fallback="cpu"``): the caller gets the CPU's result or the
   CPU's own exception, and once the CPU has succeeded where the GPU failed, later calls with
   the same argument signature run on the CPU. ``fallback="raise"`` or
   ``@gpu(idempotent=False)`` re-run nothing: a GPU-specific failure raises OffloadError, the
   user's own exception propagates unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import linecache
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from vedart import lifecycle
from vedart.config import (
    FIELD_SPECS,
    checked_bool,
    checked_int,
    one_of,
    parameter_names,
)
from vedart.errors import ConfigError, GPUUnavailableError, OffloadError
from vedart.gpu.context import DISABLED_BY_CONFIG
from vedart.gpu.transfer import (
    Staged,
    TransferEngine,
    current_engine,
    staging_loop_loading,
    to_host,
    upload,
)
from vedart.locks import renew_in_child
from vedart.offload.adaptive import (
    ADAPTIVE_FLOOR,
    HEAVY_AT_ONCE_S,
    HEAVY_CONFIRM_CALLS,
    Lease,
    function_key,
)
from vedart.offload.arguments import (
    CONTAINER_DEPTH,
    ArgumentFacts,
    iter_arrays,
    keyed,
    map_arrays,
    scan,
)
from vedart.offload.assigned import ArgumentState, bound_arguments
from vedart.offload.call_wrapper import build_wrapper
from vedart.offload.cost import Decision, Forcing, decide
from vedart.offload.failures import (
    WarnOnce,
    depends_on_the_moment,
    depends_on_the_values,
    failure_summary,
    is_gpu_failure,
    loses_context,
    lost_context_reason,
)
from vedart.offload.force import check_path, forced_path, preferred_device
from vedart.offload.imports import SET_ASIDE_AT_MOST, imported_since, imports_so_far
from vedart.offload.inplace import analysed_function, found_writes
from vedart.offload.linalg_status import raise_errors_here
from vedart.offload.results import (
    HOST_LEAVES,
    RESULT_DEPTH,
    made_recording,
    results_to_host,
    unconverted_paths,
)
from vedart.offload.substitute import (
    DEVICE_PACKAGES,
    ModuleMapper,
    Reach,
    clone_is_current,
    device_clone,
    helper_of,
)
from vedart.telemetry import CallRecord, FunctionStats

if TYPE_CHECKING:
    from vedart.gpu.context import GPUContext
    from vedart.runtime import Runtime

F = TypeVar("F", bound=Callable[..., Any])
RETURNS = ("host", "device")
HOST_INPUTS = (np.ndarray, Staged)  # what upload() moves to the device
_warn_once = WarnOnce()
_mapper_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_mapper_lock")
_mapper: ModuleMapper | None = None


_NEVER_CURRENT: Any = object()  # a plan "runtime" that is never lifecycle.current, not even None


class _NoDeviceArray:
    """Stands in for ``cupy.ndarray`` while no GPU is usable (no argument is ever one)."""


@dataclass(frozen=True)
class OffloadOptions:
    """The validated options of one @gpu function."""

    device: int | None = None
    threshold: int | None = None
    force: str | None = None
    fallback: str | None = None
    writes: tuple[str, ...] = ()
    returns: str = "host"
    idempotent: bool = True
    reach: bool = True

    @staticmethod
    def validated(device: Any, threshold: Any, force: Any, fallback: Any, writes: Any,
                  returns: Any, idempotent: Any = True, reach: Any = True) -> OffloadOptions:
        if device is not None:
            device = checked_int("device", device, 0, "None or a CUDA ordinal >= 0")
        if threshold is not None:
            threshold = replace(FIELD_SPECS["offload_threshold"],
                                name="threshold").validate(threshold)
        if fallback is not None:
            fallback = FIELD_SPECS["fallback"].validate(fallback)
        writes = parameter_names("writes", writes, "a tuple of parameter names")
        try:
            returns = one_of(returns, RETURNS)
        except ValueError:
            raise ConfigError(f"returns: got {returns!r}; allowed: 'host' or 'device'") from None
        idempotent = checked_bool("idempotent", idempotent)
        reach = checked_bool("reach", reach, "True (helper functions and classes the function "
                             "calls run on the device too) or False (its own code only)")
        return OffloadOptions(device, threshold, check_path("force", force), fallback,
                              writes, returns, idempotent, reach)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the fast path needs, computed once per runtime (see call_wrapper's rules)."""

    runtime: Runtime | None  # never None after refresh; a fresh _Offload holds _NEVER_CURRENT
    always_cpu: str | None = None     # a fixed reason when no call of this function can use a GPU
    threshold: int = 0  # the size rule's threshold (static, or the adaptive model's floor)
    # Host bytes below which a call runs on the CPU without a decision: the threshold, raised
    # to the size under which the adaptive model has settled this function on the CPU; 0 when
    # @gpu(force="gpu") sends every call to the decision, or when the function is heavy.
    cutoff: int = 0
    # Host bytes below which such a call is timed, so that a heavy one (LIGHT_S or more) is
    # seen: the adaptive floor while the model decides for this function, else 0.
    watch: int = 0
    # Whether a call below the floor was heavy: the model then decides every call.
    heavy: bool = False
    # Counts fast-path calls: the function's telemetry counter, or one of its own without.
    ticks: Iterator[int] = field(default_factory=itertools.count)
    stats: FunctionStats | None = None
    device_type: type = _NoDeviceArray


LEASES_KEPT = 64  # call keys a call site holds leases for; more start afresh


def _device_mapper() -> ModuleMapper:
    global _mapper
    with _mapper_lock:
        if _mapper is None:
            _mapper = ModuleMapper(DEVICE_PACKAGES)
        return _mapper


def _positional_names(func: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``func``'s positional parameters (reasons name scalar arguments by them),
    or none where its signature cannot be read."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(parameter.name for parameter in parameters
                 if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                       inspect.Parameter.POSITIONAL_OR_KEYWORD))


def _runs(func: Callable[..., Any]) -> Callable[..., Any]:
    """What ``func`` runs: a partial's function, else ``func`` itself."""
    return func.func if isinstance(func, functools.partial) else func


def _qualified_name(func: Callable[..., Any]) -> str:
    target = _runs(func)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(target).__name__)}"


def _display_name(func: Callable[..., Any], qualified_name: str) -> str:
    """``qualified_name``, with its line for a lambda (lambdas of one scope share a qualified
    name, and the report would count them as one function), and the column its body starts
    at where its line holds another lambda."""
    if not qualified_name.endswith("<lambda>"):
        return qualified_name
    code = getattr(inspect.unwrap(_runs(func)), "__code__", None)
    if code is None:
        return qualified_name
    line = code.co_firstlineno
    if linecache.getline(code.co_filename, line).count("lambda") < 2:
        return f"{qualified_name} (line {line})"
    column = min((start for first, _, start, _ in code.co_positions()
                  if first == line and start), default=None)
    where = f"line {line}" if column is None else f"line {line}, column {column + 1}"
    return f"{qualified_name} ({where})"


class _Offload:
    """The per-function state behind a @gpu wrapper."""

    def __init__(self, func: Callable[..., Any], options: OffloadOptions) -> None:
        self.func = func
        self.options = options
        self._returns_host = options.returns == "host"
        qualified_name = _qualified_name(func)
        self.name = _display_name(func, qualified_name)
        self.key = function_key(func, qualified_name)  # kept when the code only moves
        self._gpu_warm = False
        self._floor_revision = -1  # the model revision plan.cutoff was derived at
        self.plan = _Plan(runtime=_NEVER_CURRENT)
        self._clone: Callable[..., Any] | None = None
        self.reach: Reach | None = None  # the helpers its clone reaches, once it is made
        self._heavy_suspect: int | None = None  # the fast-path call a possible stall was seen at
        self._importing_calls_left = SET_ASIDE_AT_MOST  # timed calls that imported, set aside
        # Leases on CPU-settled buckets, with the plan and GPU context each was taken under,
        # by call key: the wrapper runs a call on one (call_wrapper), slow_call takes them.
        self.leases: dict[tuple[Any, ...], tuple[Lease, _Plan, GPUContext]] = {}
        self.positional_names = _positional_names(func)
        self.bound_arguments = bound_arguments(func)  # objects whose attributes a run may set
        # Argument signatures whose GPU attempt failed where the CPU re-run succeeded, with
        # the failure: their calls go to the CPU unless forced.
        self.gpu_failures: dict[str, str] = {}
        try:  # what a call binds against (a functools.wraps wrapper's own parameters)
            self._own_signature: inspect.Signature | None = inspect.signature(
                func, follow_wrapped=False)
        except (TypeError, ValueError):  # a callable without one: the call itself will tell
            self._own_signature = None
        # The parameters copied back after a GPU run: the ``writes=`` names and those the
        # function's code writes into, found at its first GPU decision (reading its source
        # and its helpers' takes milliseconds, tens for long code, and most calls stay on
        # the CPU); None until then. Once it holds any, ``_signature`` binds them to a
        # call's arguments.
        self._signature: inspect.Signature | None = None
        self.writes: tuple[str, ...] | None = None
        # The function that runs, and the code of it ``writes`` was read from: read again
        # when that function's code is replaced, as a reload in place does.
        self._analysed = analysed_function(func)
        self._read_code: types.CodeType | None = None
        if options.writes:
            signature = inspect.signature(func)
            unknown = [n for n in options.writes if n not in signature.parameters]
            if unknown:
                raise ConfigError(f"writes: got {list(options.writes)}; allowed: parameter names "
                                  f"of {self.name} {list(signature.parameters)} "
                                  f"(unknown: {unknown})")
            self._signature = signature
        # What users call, the (args, kwargs) it hands on, and its call key (call_wrapper).
        self.wrapper, self.binding, self.key_of_call = build_wrapper(func, self, forced_path)

    def refresh(self) -> _Plan:
        """Rebuild the plan for the current runtime (first call, after init or shutdown)."""
        runtime = lifecycle.get_runtime()
        config = runtime.config
        self.leases = {}
        always_cpu = None
        if self.options.force == "cpu":
            always_cpu = 'forced by @gpu(force="cpu")'
        elif self.options.force is None:
            if runtime.gpu is None:
                always_cpu = DISABLED_BY_CONFIG
            elif not runtime.gpu.is_available():
                always_cpu = f"no GPU: {runtime.gpu.unavailable_reason}"
        device_type: type = _NoDeviceArray
        if runtime.gpu is not None and runtime.gpu.is_available():
            import cupy

            device_type = cupy.ndarray
        watch = 0
        if self.options.threshold is not None:
            threshold = self.options.threshold
        elif runtime.cost_model is not None and config.sources["offload_threshold"] == "default":
            threshold = ADAPTIVE_FLOOR
            watch = threshold if self.options.force is None else 0
        else:
            threshold = config.offload_threshold
        stats = runtime.telemetry.function(self.name, threshold) if runtime.telemetry.enabled \
            else None
        self.plan = _Plan(
            runtime=runtime,
            always_cpu=always_cpu,
            threshold=threshold,
            cutoff=threshold if self.options.force is None else 0,
            watch=watch,
            ticks=itertools.count() if stats is None else stats.fast_cpu_calls,
            stats=stats,
            device_type=device_type,
        )
        self._update_learned_floor(runtime)
        return self.plan

    def _update_learned_floor(self, runtime: Runtime) -> None:
        """Set the plan's cutoff from what the adaptive model learned: 0 once a call below the
        floor was heavy (every call then reaches the model), else the floor; raised to the size
        under which the model has settled this function on the CPU, so the fast path skips the
        model there."""
        model = runtime.cost_model
        self._floor_revision = -1 if model is None else model.revision  # read before deriving
        if model is None or self.options.threshold is not None or self.options.force is not None:
            return
        plan = self.plan
        heavy = model.seen_below(self.key, plan.threshold)
        cutoff = max(0 if heavy else plan.threshold, model.cpu_ceiling(self.key))
        if cutoff == plan.cutoff and heavy == plan.heavy:
            return
        self.plan = replace(plan, cutoff=cutoff, heavy=heavy)
        if plan.stats is not None:
            plan.stats.threshold, plan.stats.below_rule = (
                (cutoff, "adaptive: cpu learned faster below") if cutoff > plan.threshold
                else (plan.threshold, "below threshold"))

    def heavy_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float,
                   call_index: int, imports_before: int) -> None:
        """Fast-path call number ``call_index``, below the floor, took ``seconds`` (at least
        ``LIGHT_S``) on the CPU, begun when :func:`imports_so_far` was ``imports_before``:
        teach the model that time, so this function's calls reach it from now on; a call under
        ``HEAVY_AT_ONCE_S`` only when another came within ``HEAVY_CONFIRM_CALLS`` calls before
        it. A call that imported modules is set aside (:meth:`_set_aside`): neither learned nor
        a stall another can confirm."""
        if self._set_aside(imported_since(imports_before)):
            return
        if seconds < HEAVY_AT_ONCE_S:
            suspect, self._heavy_suspect = self._heavy_suspect, call_index
            if suspect is None or not 0 < call_index - suspect <= HEAVY_CONFIRM_CALLS:
                return
        runtime = self.plan.runtime
        model = runtime.cost_model if runtime is not _NEVER_CURRENT else None
        if model is None:
            return
        facts = scan(args, kwargs, self.plan.device_type, self.positional_names)
        model.observe(self.key, facts.signature, facts.host_bytes, "cpu", seconds)
        self._update_learned_floor(runtime)

    def _set_aside(self, imported: bool) -> bool:
        """Whether a timed call that ``imported`` modules is set aside as a stall: the
        function's first ``SET_ASIDE_AT_MOST`` such calls are (an import that recurs is
        work)."""
        if not imported or self._importing_calls_left <= 0:
            return False
        self._importing_calls_left -= 1
        return True

    def current_plan(self) -> _Plan:
        """The plan for the current runtime (rebuilt after init or shutdown)."""
        return self.plan if self.plan.runtime is lifecycle.current else self.refresh()

    def bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``args`` and ``kwargs`` as the wrapper hands them on (``binding``: defaults filled
        in), so that every way in decides on one signature; as given where they do not bind
        (the call raises its own TypeError when it runs)."""
        try:
            return self.binding(*args, **kwargs)
        except TypeError:
            return args, kwargs

    def plan_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PlannedCall:
        """A call with these arguments, decided now and not yet run."""
        return PlannedCall(self, self.current_plan(), *self.bound(args, kwargs))

    def explain(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Decision:
        """The decision a call with these arguments would get now; nothing runs and nothing
        is counted (the adaptive model's re-check interval counts calls). A GPU decision
        names the helpers earlier GPU calls ran as device clones (``helpers``). Arguments the
        function does not take (an unknown keyword, one too many, one given twice) raise a
        TypeError, as the call would; missing ones do not. Reached through an instance,
        ``explain`` gets no ``self`` and takes the first argument for it, so there it catches
        unknown keywords only."""
        if self._own_signature is not None:
            try:
                self._own_signature.bind_partial(*args, **kwargs)
            except TypeError as error:  # named as the call's own TypeError names it
                target = _runs(self.func)
                name = getattr(target, "__qualname__", type(target).__qualname__)
                raise TypeError(f"{name}(): {error}") from None
        plan = self.current_plan()
        args, kwargs = self.bound(args, kwargs)
        decision = self.decide(plan, scan(args, kwargs, plan.device_type,
                                          self.positional_names), args, kwargs, peek=True)
        if decision.path == "gpu" and self.reach is not None and self.reach.names:
            decision = replace(decision, helpers=self.reach.names)
        return decision

    def slow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Decide one call the fast path did not settle, and run it. A call the model
        answers with a settled CPU choice takes a lease on its bucket for the calls after it
        with the same key (the wrapper runs those as the fast path runs: asking the model
        cost a settled CPU call 7 us more than a direct one, AMD EPYC, 2026-11-27)."""
        plan = self.plan  # current_plan(), inline: every GPU call comes here
        if plan.runtime is not lifecycle.current:
            plan = self.refresh()
        call = PlannedCall(self, plan, args, kwargs)
        decision = call.decision
        if decision.path == "cpu" and decision.model == "adaptive" and not decision.timed:
            self._lease(plan, call.facts, args, kwargs)
        return call.run()

    def _lease(self, plan: _Plan, facts: ArgumentFacts, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        """Hold a lease of the model's on the CPU-settled bucket of ``facts`` for calls with
        the key of these arguments, if they have one, the model gives one and ``plan`` is
        current."""
        runtime = plan.runtime
        assert runtime is not None and runtime.cost_model is not None and runtime.gpu is not None
        where = self.key_of_call(*args, **kwargs)
        if not keyed(where):
            return
        lease = runtime.cost_model.lease(self.key, facts.signature, facts.host_bytes, "cpu")
        if lease is not None and self.plan is plan:
            if len(self.leases) >= LEASES_KEPT:
                self.leases = {}
            self.leases[where] = (lease, plan, runtime.gpu)

    def forcing(self) -> Forcing | None:
        in_context = forced_path.get()
        if in_context is not None:
            return Forcing(in_context, f'veda.force("{in_context}")')
        if self.options.force is not None:
            return Forcing(self.options.force, f'@gpu(force="{self.options.force}")')
        return None

    def decide(self, plan: _Plan, facts: ArgumentFacts, args: tuple[Any, ...],
               kwargs: dict[str, Any], *, peek: bool = False) -> Decision:
        runtime = plan.runtime
        assert runtime is not None
        model = runtime.cost_model
        in_context = forced_path.get()
        forcing = None if in_context is None and self.options.force is None else self.forcing()
        decision = decide(
            facts, gpu=runtime.gpu, threshold=0 if plan.heavy else plan.threshold,
            headroom=runtime.config.memory_headroom,
            device=self.options.device if self.options.device is not None or facts.device_ordinals
            else preferred_device.get(),
            forcing=forcing, model=model, key=self.key, peek=peek)
        if decision.path == "gpu" and forcing is None and self.gpu_failures:
            failure = self.gpu_failures.get(facts.signature)
            if failure is not None:  # the model still learns the CPU time of what it chose
                return Decision("cpu", f"GPU failed before for arguments {facts.signature} "
                                       f"({failure}); the CPU ran them", model=decision.model)
        if decision.path == "gpu":
            if self.writes is None or (self._analysed is not None and
                                       self._read_code is not self._analysed.__code__):
                self._find_writes()
            if self.writes:
                problem = self._writes_problem(args, kwargs)
                if problem is not None:
                    return Decision("cpu", problem, refused=forcing is not None)
        return decision

    def _find_writes(self) -> None:
        """Set ``writes``: the ``writes=`` names, then the parameters the function's code
        writes into in place (:func:`~vedart.offload.inplace.found_writes`)."""
        if self._analysed is not None:
            self._read_code = self._analysed.__code__  # (before reading: a change reads again)
        found = found_writes(self.func)
        signature = self._signature
        if found and signature is None:
            try:
                signature = inspect.signature(self.func)
            except (TypeError, ValueError):  # (a plain function has one)
                signature = None
        found = () if signature is None else \
            tuple(name for name in found if name in signature.parameters)
        if found:
            self._signature = signature  # (before writes: other threads read it then)
        self.writes = (*self.options.writes,
                       *(name for name in found if name not in self.options.writes))

    def _writes_problem(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why a call whose arguments named in ``writes`` could not be copied back as the CPU
        path writes them stays on the CPU, or None. A parameter the code writes into that
        holds no array here is no problem: only arrays are copied back. Arguments that do not
        bind are none either: the call raises its own TypeError when it runs (``explain``
        reached through an instance has no ``self``: see :meth:`explain`)."""
        assert self._signature is not None and self.writes is not None
        try:
            bound = self._signature.bind(*args, **kwargs).arguments
        except TypeError:
            return None
        arrays = [*iter_arrays(args, np.ndarray, CONTAINER_DEPTH + 1),
                  *iter_arrays(kwargs, np.ndarray, CONTAINER_DEPTH + 1)]
        for name in self.writes:
            value = bound.get(name)
            if name in self.options.writes:
                if type(value) is not np.ndarray:
                    return (f"writes= argument {name!r} is a {type(value).__name__}, not an "
                            "ndarray")
                problem = _written_array_problem(value, arrays, stated=True)
                if problem is not None:
                    return f"writes= argument {name!r} {problem}"
                continue
            # Found in the code: the array, or the arrays its list, dict or tuple holds
            # (for a in arrays: a -= 1).
            for array in iter_arrays(value, np.ndarray, CONTAINER_DEPTH):
                if type(array) is not np.ndarray:
                    return (f"argument {name!r}, which the function writes into in place, "
                            f"holds a {type(array).__name__}, not an ndarray")
                problem = _written_array_problem(array, arrays, stated=False)
                if problem is not None:
                    where = "" if array is value else "holds an array that "
                    return (f"argument {name!r}, which the function writes into in place, "
                            f"{where}{problem}")
        return None

    def learn(self, runtime: Runtime, decision: Decision, facts: ArgumentFacts,
               seconds: float, *, imported: bool = False) -> None:
        """Feed the adaptive model the end-to-end time of a call it chose to time (exploring or
        re-checking); the first GPU run of each function (clone, kernel compilation) is warm-up
        and not learned from, nor is an exploring call that ``imported`` modules (a stall:
        :mod:`~vedart.offload.imports`; a re-check is learned all the same, since the next
        is 16 calls away or more)."""
        if runtime.cost_model is None or not decision.learned:
            return
        if decision.exploring and self._set_aside(imported):  # it woke its path all the same
            runtime.cost_model.woke(self.key, facts.signature, facts.host_bytes, decision.path)
            return
        if decision.path == "gpu" and (
                not self._gpu_warm
                # a large array may have gone direct, at a third of the loop's speed
                or staging_loop_loading(facts.host_bytes, within_s=seconds)):
            self._gpu_warm = True
            # It woke the GPU path all the same: the next GPU call is learned from.
            runtime.cost_model.woke(self.key, facts.signature, facts.host_bytes, "gpu")
            return
        runtime.cost_model.observe(self.key, facts.signature, facts.host_bytes,
                                   decision.path, seconds)
        if runtime.cost_model.revision != self._floor_revision:
            self._update_learned_floor(runtime)

    def run_on_cpu(self, plan: _Plan, path: str, reason: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        if plan.stats is None:
            return self.func(*args, **kwargs)
        started = time.perf_counter()
        result = self.func(*args, **kwargs)
        assert plan.runtime is not None
        plan.runtime.telemetry.record(CallRecord(
            self.name, path, reason, seconds_compute=time.perf_counter() - started,
            timestamp=time.time()))
        return result

    def _device_function(self) -> Callable[..., Any]:
        """The function's device clone, made again when its module has rebound a name it
        substituted since (a stale clone would run the device twin of the old value), and
        so are the helper clones it reaches (:meth:`Reach.drop_stale`)."""
        clone = self._clone
        if clone is None or not clone_is_current(clone):
            mapper = _device_mapper()
            if self.reach is None and self.options.reach:
                self.reach = Reach.of(self.func, mapper)
            clone = self._clone = device_clone(self.func, mapper, self.reach)
        if self.reach is not None:
            self.reach.drop_stale()
        return clone

    def launch(self, device: int, args: tuple[Any, ...], kwargs: dict[str, Any],
               uploads: bool = True) -> _Launch:
        """Move the host inputs (arrays or Staged copies) to ``device`` and run the substituted
        clone there, on that device's current stream, without waiting for the device: the
        tail of an upload overlaps the clone's own Python work (waiting for it measured
        30-100 us per call on the H100), so ``moved_in`` marks when the host had handed the
        inputs over. ``device`` is made current only when it is not already (a lane has made
        its own current; entering a device context costs a few microseconds a call).
        ``uploads=False``: the arguments hold no host input, and are not walked. Attributes
        the clone assigns to the objects among the arguments are put back when it raises
        (:mod:`~vedart.offload.assigned`)."""
        import cupy

        device_function = self._device_function()
        if cupy.cuda.runtime.getDevice() != device:
            with cupy.cuda.Device(device):
                return self.launch(device, args, kwargs, uploads)
        stream = cupy.cuda.get_current_stream()
        engine = current_engine()
        started = time.perf_counter()
        made_arrays: list[Any] = []  # 0-d arguments stay 0-d arrays
        pinned_inputs: list[Staged] = []  # copies of small inputs, until the stream is waited for
        state: ArgumentState | None = None
        token = made_recording.set(made_arrays)
        try:
            device_args, device_kwargs = args, kwargs
            if uploads:
                upload_one = upload if engine is None else engine.upload

                def upload_noted(value: Staged | np.ndarray) -> Any:
                    device_array = upload_one(value, pinned_inputs)
                    if device_array.ndim == 0:
                        made_arrays.append(device_array)
                    return device_array

                device_args = map_arrays(args, HOST_INPUTS, upload_noted, CONTAINER_DEPTH + 1)
                if kwargs:
                    device_kwargs = map_arrays(kwargs, HOST_INPUTS, upload_noted,
                                               CONTAINER_DEPTH + 1)
            state = ArgumentState((*self.bound_arguments, *device_args,
                                   *device_kwargs.values()), cupy.ndarray)
            moved_in = time.perf_counter()
            error_modes, linalg_mode = raise_errors_here()  # CuPy's checks in unreached code
            try:
                result = device_function(*device_args, **device_kwargs)
            finally:
                error_modes.linalg = linalg_mode  # a store: no call an interrupt could precede
            state.launched()
        except BaseException:
            if state is not None:
                state.restore()
            if pinned_inputs:  # their blocks go back to the pool: let the copies out end first
                _settle(device, stream)
            raise
        finally:
            made_recording.reset(token)
        return _Launch(device, stream, engine, device_args, device_kwargs, result, started,
                       moved_in, made_arrays, pinned_inputs, state)

    def land(self, launch: _Launch, reason: str, bytes_to_device: int, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[Any, CallRecord]:
        """Wait for a launch, bring its results (and ``writes=`` arguments, and device arrays
        it assigned to the argument objects' attributes) to the host, and only then copy the
        writes into the caller's ``args``/``kwargs``; on a failure, put the objects'
        attributes back. Whatever device is current: each result comes back through its own
        device's current stream, which is the launch's (a lane keeps its stream current for
        both phases)."""
        try:
            return self._land(launch, reason, bytes_to_device, args, kwargs)
        except BaseException:
            launch.state.restore()
            if launch.pinned_inputs:  # as in launch: the copies out of them end first
                _settle(launch.device, launch.stream)
            raise

    def _land(self, launch: _Launch, reason: str, bytes_to_device: int, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> tuple[Any, CallRecord]:
        import cupy

        result, bytes_to_host, write_backs = launch.result, 0, None
        # A small result is copied back without waiting for the device first: the copy waits
        # for it anyway, and a wait of its own before it is one more round trip to the device
        # on every small call. The device's remaining work then counts in seconds_to_host; a
        # larger result is waited for first, so that its copy is timed apart, and so is an
        # empty one, whose copy moves nothing and waits for nothing.
        copy_waits = self._returns_host and not self.writes and \
            type(result) is cupy.ndarray and 0 < result.nbytes < WAIT_APART_BYTES
        if not copy_waits:
            _wait_for(launch.device, launch.stream)
        computed = time.perf_counter()
        if self.writes:  # (its GPU decision set it)
            write_backs = self._fetch_writes(args, kwargs, launch.device_args,
                                             launch.device_kwargs, launch.state)
            bytes_to_host = sum(host.nbytes for _, _, host in write_backs)
        state = launch.state
        twins = state.twins(args, kwargs, launch.device_args, launch.device_kwargs) \
            if state else {}
        if twins and not self._returns_host:  # device arrays stay: only containers stand in
            twins = {key: value for key, value in twins.items()
                     if type(value) is not np.ndarray}
        held = state.held(twins) if state else []
        values: Sequence[Any] = [value for _, _, value in held]  # returns="device": as they are
        # What both the bound values and the result hold is converted once (nothing to
        # share when nothing was bound and the result is one array: the commonest call).
        memo = state.stand_ins(twins, (*self.bound_arguments, *args, *kwargs.values())) \
            if state and self._returns_host and (held or type(result) is not cupy.ndarray) \
            else None
        if self._returns_host:
            copy = to_host if launch.engine is None else launch.engine.to_host
            writes = {id(device): (device, original) for original, device, _ in write_backs} \
                if write_backs else None
            if held:  # first: the result may hold what they hold (return self)
                values, attribute_bytes = results_to_host(
                    tuple(values), cupy.ndarray, made_arrays=launch.made_arrays, writes=writes,
                    copy=copy, memo=memo, depth=RESULT_DEPTH + 1)  # each as deep as a result
                bytes_to_host += attribute_bytes
        if state:
            state.bind(held, values, twins)
        if self._returns_host:  # (a copy of the caller's list or dict in it: the caller's)
            if memo is not None:
                state.as_bound(memo)
            try:
                result, result_bytes = results_to_host(
                    result, cupy.ndarray, made_arrays=launch.made_arrays, writes=writes,
                    copy=copy, memo=memo)
            finally:
                if memo is not None:
                    memo.give_host_classes()  # (once both are walked: see Memo)
            bytes_to_host += result_bytes
            unconverted = [] if isinstance(result, HOST_LEAVES) else \
                unconverted_paths(result, cupy.ndarray)
            if unconverted:
                _warn_once.warn(self.name, "unconverted", (
                    f"{self.name}: returned device arrays vedart does not convert, handed back "
                    f"as CuPy arrays: {', '.join(unconverted[:5])}; return them in a tuple, "
                    "list, dict, dataclass or SimpleNamespace, or call veda.to_host"))
        finished = time.perf_counter()
        if write_backs:
            for original, _, host in write_backs:  # only after everything else succeeded
                np.copyto(original, host)
        record = CallRecord(self.name, "gpu", reason, launch.device, bytes_to_device,
                            bytes_to_host, launch.moved_in - launch.started,
                            computed - launch.moved_in, finished - computed, time.time())
        return result, record

    def _fetch_writes(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                      device_args: tuple[Any, ...], device_kwargs: dict[str, Any],
                      state: ArgumentState | None) -> list[tuple[np.ndarray, Any, np.ndarray]]:
        """(caller's array, device array, host copy of the device array) per name in
        ``writes`` that holds an array, and per array in a list, dict or tuple one holds
        (their copies as the run began: ``state``) (a function with ``writes`` only)."""
        assert self._signature is not None and self.writes is not None
        host_bound = self._signature.bind(*args, **kwargs).arguments
        device_bound = self._signature.bind(*device_args, **device_kwargs).arguments
        pairs: list[tuple[np.ndarray, Any]] = []
        for name in self.writes:
            value = host_bound.get(name)
            if type(value) is np.ndarray:
                pairs.append((value, device_bound[name]))
            elif isinstance(value, (list, tuple, dict)) and state is not None:
                pairs += state.array_twins(value, device_bound[name])
        return [(host, device, to_host(device)) for host, device in pairs]


def _written_array_problem(array: np.ndarray, arrays: list[np.ndarray], *, stated: bool
                           ) -> str | None:
    """Why a GPU run could not leave ``array``, which the function writes into, as the CPU
    path does (``stated``: named in ``writes=``), or None; ``arrays``: all the call's."""
    if not array.flags.writeable:
        return "is read-only"
    if not stated and not ((array.flags.c_contiguous or array.flags.f_contiguous) and
                           array.dtype.isnative):
        # Its device copy is contiguous and native: code that copies the caller's array on
        # the CPU for its layout (x.reshape(-1)), or tests it (x.dtype.isnative), could
        # write into the device copy where NumPy writes into a copy of its own.
        layout = "strided" if array.dtype.isnative else "byte-swapped"
        return f"is {layout} (its device copy would not be)"
    # Each argument goes to the device as a copy of its own, so a write through one would
    # not show through the other there, as it does on the CPU.
    if sum(np.may_share_memory(array, other) for other in arrays) > 1:
        return "shares memory with another argument"
    return None


# A one-array result below this is copied back without a separate wait for the device (land).
WAIT_APART_BYTES = 1 << 20


def _wait_for(device: int, stream: Any = None) -> None:
    """Wait until ``stream`` of ``device`` (None: the current one there) has done its work. A
    direct call's launch made its device current only while it ran, and CuPy's null stream
    stands for the current device's: waiting on it from another device's context returned
    before the work was done (two H200, 2026-11-26), and the copy back then held the compute
    time."""
    import cupy

    if cupy.cuda.runtime.getDevice() != device:
        with cupy.cuda.Device(device):
            _wait_for(device, stream)
        return
    (cupy.cuda.get_current_stream() if stream is None else stream).synchronize()


def _settle(device: int, stream: Any = None) -> None:
    """:func:`_wait_for`, whatever it raises: after a failure, before pinned inputs whose
    copies ``stream`` queued go back to the pool (the failure being handled reports a broken
    device already)."""
    with contextlib.suppress(Exception):
        _wait_for(device, stream)


@dataclass
class _Launch:
    """Device work of one call, enqueued on ``stream`` of ``device``; ``result`` holds device
    arrays that are complete once the stream is synchronised."""

    device: int
    stream: Any
    engine: TransferEngine | None  # the runtime's, which copies the results back
    device_args: tuple[Any, ...]
    device_kwargs: dict[str, Any]
    result: Any
    started: float
    moved_in: float
    made_arrays: list[Any]  # 0-d device arrays that come back as 0-d arrays
    pinned_inputs: list[Staged]  # pinned copies the uploads read: kept until the stream is done
    state: ArgumentState  # the arguments' objects and containers around the launch


class PlannedCall:
    """One call of a @gpu function, decided when created, then run either at once
    (:meth:`run`, a direct call's slow path) or in phases by par_iter's GPU lanes:

    1. :meth:`stage` (any thread, e.g. the transfer engine's staging threads): copy mid-size
       host inputs into pinned memory ahead of time;
    2. :meth:`launch` (a lane, with its device and stream current): upload the inputs and
       enqueue the device work without waiting; never raises (a failure is kept for step 3);
    3. :meth:`land` (the same stream current for that device): wait for the device, return
       host results, fall back to the CPU on a GPU failure exactly as a direct call does,
       record telemetry and feed the adaptive model.

    Phases run one at a time, in order (a thread hands the call on through a queue or future).
    The caller's arrays are only read, and ``writes=`` copy-backs happen after success;
    attributes the GPU run assigns to argument objects are converted or put back
    (:mod:`~vedart.offload.assigned`).
    """

    def __init__(self, offload: _Offload, plan: _Plan, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._offload = offload
        self._plan = plan
        self.args = args
        self.kwargs = kwargs
        self.facts = scan(args, kwargs, plan.device_type, offload.positional_names)
        self.decision = offload.decide(plan, self.facts, args, kwargs)
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = (args, kwargs)
        self._launch: _Launch | None = None
        self._failure: Exception | None = None
        # This call's own time in stage/launch/land: what the adaptive model learns (on a lane,
        # the span from launch to land also holds the neighbouring items' work).
        self._own_seconds = 0.0

    @property
    def host_bytes(self) -> int:
        """Bytes of the host arrays among the arguments."""
        return self.facts.host_bytes

    @property
    def device_inputs(self) -> bool:
        """Whether any argument is already a device array."""
        return bool(self.facts.device_ordinals)

    @property
    def _runtime(self) -> Runtime:
        runtime = self._plan.runtime
        assert runtime is not None
        return runtime

    @property
    def _fallback(self) -> str:
        return self._offload.options.fallback or self._runtime.config.fallback

    def run(self) -> Any:
        """Run where decided, on this thread, and return the result."""
        decision = self.decision
        if decision.refused and self._fallback == "raise":
            raise GPUUnavailableError(f"{self._offload.name}: {decision.reason} "
                                      "(fallback='raise')")
        if decision.path == "cpu":
            if not decision.learned:  # settled: no clock
                return self._offload.run_on_cpu(self._plan, "cpu", decision.reason, self.args,
                                                 self.kwargs)
            imports, started = imports_so_far(), time.perf_counter()
            result = self._offload.run_on_cpu(self._plan, "cpu", decision.reason, self.args,
                                               self.kwargs)
            self._offload.learn(self._runtime, decision, self.facts,
                                 time.perf_counter() - started,
                                 imported=imported_since(imports))
            return result
        # One thread runs both phases: no phase bookkeeping (see launch and land for lanes).
        offload, started = self._offload, time.perf_counter()
        failure: Exception | None = None
        try:
            result, record = offload.land(
                offload.launch(decision.device, self.args, self.kwargs,
                               bool(self.facts.host_arrays)),
                decision.reason, self.facts.host_bytes, self.args, self.kwargs)
        except Exception as error:
            failure = error
        self._inputs = None
        if failure is not None:
            return self._recover(failure, started)
        return self._landed(result, record, time.perf_counter() - started)

    def stages(self, engine: TransferEngine) -> bool:
        """Whether :meth:`stage` would copy anything ahead with ``engine``."""
        return any(engine.stages(array) for array in self.facts.host_arrays)

    def stage(self, engine: TransferEngine) -> None:
        """Copy the host inputs :meth:`TransferEngine.stages` picks into pinned memory (a GPU
        decision only; a failure is kept for :meth:`land`)."""
        assert self._inputs is not None and self.decision.path == "gpu"
        started = time.perf_counter()
        args, kwargs = self._inputs
        try:
            self._inputs = (map_arrays(args, np.ndarray, engine.stage, CONTAINER_DEPTH + 1),
                            map_arrays(kwargs, np.ndarray, engine.stage, CONTAINER_DEPTH + 1))
        except Exception as error:
            self._failure = error
        self._own_seconds += time.perf_counter() - started

    def launch(self) -> None:
        """Upload and enqueue the device work on the current stream (see the class doc)."""
        assert self._inputs is not None and self.decision.device is not None
        if self._failure is not None:
            return
        started = time.perf_counter()
        try:
            self._launch = self._offload.launch(self.decision.device, *self._inputs,
                                                uploads=bool(self.facts.host_arrays))
        except Exception as error:
            self._failure = error
        self._own_seconds += time.perf_counter() - started

    def land(self) -> Any:
        """The launched call's result (see the class doc, and :meth:`_recover` for a GPU
        attempt that raised)."""
        offload, decision = self._offload, self.decision
        landing = time.perf_counter()
        failure: Exception | None = None
        try:
            if self._failure is not None:
                raise self._failure
            assert self._launch is not None, "land() needs launch() first"
            result, record = offload.land(self._launch, decision.reason, self.facts.host_bytes,
                                          self.args, self.kwargs)
        except Exception as error:
            failure = error
        finally:
            if self._failure is not None:
                self._settle_uploads()
            self._inputs = self._launch = self._failure = None  # staged and device memory
        if failure is not None:
            return self._recover(failure, landing)
        return self._landed(result, record, self._own_seconds + time.perf_counter() - landing)

    def _landed(self, result: Any, record: CallRecord, seconds: float) -> Any:
        """``result`` of a GPU call that succeeded in ``seconds`` of its own time, after the
        model learned that time (a timed call) and telemetry recorded ``record``."""
        runtime, stats = self._plan.runtime, self._plan.stats
        assert runtime is not None
        if self.decision.timed:  # a settled call is not learned from
            self._offload.learn(runtime, self.decision, self.facts, seconds)
        if stats is not None:
            runtime.telemetry.record(record, stats)
            reach = self._offload.reach
            if reach is not None:
                stats.helpers = reach.names
        return result

    def _recover(self, error: Exception, landing: float) -> Any:
        """After the GPU attempt raised ``error``: re-run on the CPU (outside the handler, so a
        CPU exception is raised as it would be without vedart, not chained to the GPU's);
        with ``fallback="raise"`` or ``idempotent=False`` raise instead."""
        offload, decision = self._offload, self.decision
        summary = failure_summary(error)
        helper = helper_of(error)
        where = "" if helper is None else f" in helper {helper}"
        lost = loses_context(error)
        if lost:  # nothing more can run on this GPU in this process: say so once, use the CPU
            gpu = self._runtime.gpu
            assert gpu is not None
            gpu.disable(lost_context_reason(error, offload.name + where))
            _warn_once.warn(offload.name, "context lost", (
                f"{offload.name}: {summary}{where}: the CUDA context is lost; every @gpu call "
                "runs on the CPU from now on (restart the process to use the GPU)"))
        if self._fallback == "raise" or not offload.options.idempotent:
            if not is_gpu_failure(error):
                raise error
            why = ("fallback='raise'" if self._fallback == "raise" else
                   "not re-run on the CPU: @gpu(idempotent=False) says the function must not "
                   "run twice, and the failed attempt may have done part of its work")
            raise OffloadError(f"{offload.name}: GPU execution failed on device "
                               f"{decision.device}{where} ({summary}); {why}") from error
        reason = f"GPU failed{where} ({summary}); re-ran on CPU"
        kind = type(error).__name__
        remember = not depends_on_the_moment(error) and not depends_on_the_values(error)
        # The failed attempt's frames hold its device and staged inputs; an exception of the
        # re-run would keep them alive through this frame.
        error.__traceback__ = None
        result = offload.run_on_cpu(self._plan, "fallback", reason, self.args, self.kwargs)
        # The CPU ran what the GPU could not: warn, and send this signature to the CPU.
        _warn_once.warn(offload.name, kind, f"{offload.name}: {reason}")
        if remember and not self.facts.device_ordinals:
            offload.gpu_failures[self.facts.signature] = summary
        # A failed GPU attempt costs its time plus the re-run: learn it as the GPU's time
        # (not when the context was lost: the GPU of a fresh process is not slow).
        if not lost:
            offload.learn(self._runtime, decision, self.facts,
                          self._own_seconds + time.perf_counter() - landing)
        return result

    def _settle_uploads(self) -> None:
        """Before staged (pinned) inputs go back to the pool after a failed launch, wait for
        any copy the launch queued from them."""
        assert self._inputs is not None
        assert self.decision.device is not None
        if any(True for container in self._inputs
               for _ in iter_arrays(container, Staged, CONTAINER_DEPTH + 1)):
            _settle(self.decision.device)


def is_gpu_wrapper(function: Any) -> bool:
    """Whether ``function`` is a @veda.gpu wrapper, or one bound to an object."""
    return hasattr(function, "gpu_options") and hasattr(function, "__wrapped__")


def rewrapped(function: Callable[..., Any], options: OffloadOptions) -> Callable[..., Any]:
    """``function`` under @veda.gpu with ``options``. A @veda.gpu method bound to an object
    (as pickle rebuilds a bound method) is taken as its plain function bound to the object:
    the wrapper's own ``plan_call`` and ``__wrapped__`` would take an argument for ``self``."""
    if isinstance(function, types.MethodType) and is_gpu_wrapper(function.__func__):
        function = types.MethodType(function.__func__.__wrapped__, function.__self__)
    return gpu(**asdict(options))(function)  # type: ignore[no-any-return]


def _wrap(func: Callable[..., Any], options: OffloadOptions) -> Callable[..., Any]:
    if isinstance(func, (staticmethod, classmethod)):  # @veda.gpu above the method decorator
        return type(func)(_wrap(func.__func__, options))  # type: ignore[return-value]
    if not callable(func):
        raise TypeError(f"@veda.gpu needs a callable; got {func!r} of type {type(func).__name__}")
    name = getattr(func, "__qualname__", type(func).__qualname__)
    if is_gpu_wrapper(func):
        # Two decisions a call would each count it, and the outer's options would hide the
        # inner's (a lost writes= leaves the caller's array unwritten).
        raise TypeError(f"@veda.gpu: {name} is already a @veda.gpu function; decorate it "
                        f"once, with every option (for other options, wrap its __wrapped__)")
    lazy = "a generator function" if inspect.isgeneratorfunction(func) else \
        "an async function" if inspect.iscoroutinefunction(func) or \
        inspect.isasyncgenfunction(func) else None
    if lazy is not None:
        # Its body runs after the call has returned, outside the decision: on the GPU path
        # it would hand out device arrays.
        raise TypeError(f"@veda.gpu: {name} is {lazy}, whose body runs after the call "
                        f"returns; allowed: a plain function (decorate the function it calls "
                        f"per item)")
    offload = _Offload(func, options)
    gpu_wrapper = offload.wrapper

    def plan_call(*args: Any, **kwargs: Any) -> PlannedCall:
        """A call with these arguments, decided now and not yet run (see PlannedCall)."""
        return offload.plan_call(args, kwargs)

    def explain(*args: Any, **kwargs: Any) -> Decision:
        """The Decision a call with these arguments would get now, without running anything;
        TypeError, as the call would raise, for arguments the function does not take."""
        return offload.explain(args, kwargs)

    gpu_wrapper.explain = explain  # type: ignore[attr-defined]
    gpu_wrapper.plan_call = plan_call  # type: ignore[attr-defined]
    gpu_wrapper.gpu_options = options  # type: ignore[attr-defined]
    gpu_wrapper.display_name = offload.name  # type: ignore[attr-defined]
    return gpu_wrapper


@overload
def gpu(func: F, /) -> F: ...
@overload
def gpu(*, device: int | None = None, threshold: int | str | None = None,
        force: str | None = None, fallback: str | None = None, writes: Iterable[str] = (),
        returns: str = "host", idempotent: bool = True, reach: bool = True
        ) -> Callable[[F], F]: ...


def gpu(func: Callable[..., Any] | None = None, /, *, device: int | None = None,
        threshold: int | str | None = None, force: str | None = None,
        fallback: str | None = None, writes: Iterable[str] = (),
        returns: str = "host", idempotent: bool = True, reach: bool = True) -> Any:
    """Run ``func`` on the GPU when the cost model says it pays, else on the CPU as written.

    Options (validated at decoration; a bad value raises ConfigError naming the option):
      device: CUDA ordinal to use (default: a CuPy argument's device, else the configured
        device with the most free memory).
      threshold: bytes or size string overriding ``Config.offload_threshold`` for this function.
      force: "cpu" or "gpu" for every call (``veda.force`` blocks take precedence).
      fallback: "cpu" or "raise", overriding ``Config.fallback``.
      writes: names of array parameters the function modifies in place; after a GPU run they
        are copied back into the caller's arrays. Parameters the function's code writes into
        (``x -= m``, ``x[i] = v``, ``out=x``, and in helpers it calls by name; docs/offload.md,
        Mutation) are copied back without being named; name those a method writes into.
      returns: "host" (NumPy results) or "device" (CuPy arrays kept on the device).
      idempotent: False for a function that must not run twice (it appends to a file, sends a
        message): a GPU failure then raises OffloadError instead of re-running on the CPU.
      reach: True (default): on the GPU path, the helper functions and classes the function
        calls (from its own package, or from modules that use NumPy or SciPy) run with the
        device namespace too (docs/offload.md); False: only the function's own code does.

    The wrapper keeps the function's name, docstring, signature and ``__wrapped__``; binds as a
    method; is safe to call from many threads; pickles by reference; and has
    ``explain(*args, **kwargs)`` returning the Decision a call would get, and
    ``display_name``, the name reasons, warnings and the report give it (module and
    qualified name; a lambda's with its line, and its column where the line holds two).
    """
    options = OffloadOptions.validated(device, threshold, force, fallback, writes, returns,
                                       idempotent, reach)
    if func is None:
        return lambda inner: _wrap(inner, options)
    return _wrap(func, options)
