"""The wrapper a @gpu function is called through, compiled with the function's own parameters.

The fast path (a call that stays on the CPU without a decision) must cost well under a
microsecond. A ``*args, **kwargs`` wrapper spends most of that packing the arguments, looping
over them and calling a function to count their bytes, so for a plain Python function the wrapper
is generated from a template with the function's parameter list: each named parameter's bytes
are counted inline and the call is forwarded with the same binding (the parameter defaults are
the function's own default objects, passed on explicitly). Other callables (partials, bound
methods, callable objects) and functions whose parameters could clash with the template's names
get the same template with ``*args, **kwargs``.

Fast-path rules, read from the call site's plan (replaced, never mutated):
- ``plan.always_cpu`` set: call the function, record that reason as the last decision;
- else host-array bytes below ``plan.cutoff``: call the function, count it on ``plan.ticks``,
  record the byte count; below ``plan.watch`` too, time the function's first
  ``TIMED_FIRST_CALLS`` such calls and one in ``TIMED_ONE_IN`` after them, and hand a timed
  call of ``LIGHT_S`` or more to ``site.heavy_call(args, kwargs, seconds, call_index,
  imports_before)`` afterwards (the fast path must see a function of an ``int`` that runs for
  seconds; two clock reads on every call would double what the fast path adds), with the
  thread's import count from before the call (:mod:`~vedart.offload.imports`: a call that
  imported is a stall, not work);
- else, when ``site.leases`` holds a lease for the call's key (built inline from the named
  parameters, :func:`~vedart.offload.arguments.call_key`'s contract) taken under this plan,
  the GPU has not been lost since, no device is preferred (a lane's, which a decision checks)
  and ``lease.take()`` allows: call the function, count it
  as a leased call, record the lease's reason (a bucket the model settled on the CPU, whose
  calls need no decision; ``plan.ticks`` is left to the calls above, whose timing it paces);
- else, or under a ``veda.force`` block: ``site.slow_call(args, kwargs)`` decides and runs.
"""

from __future__ import annotations

import functools
import inspect
import time
import types
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, NamedTuple, Protocol

import numpy as np

from vedart import lifecycle
from vedart.offload.adaptive import LIGHT_S, TIMED_FIRST_CALLS, TIMED_ONE_IN, Lease
from vedart.offload.arguments import (
    PLAIN_TYPES,
    call_key,
    host_bytes,
    key_part,
    value_bytes,
)
from vedart.offload.force import preferred_device
from vedart.offload.imports import imports_so_far
from vedart.telemetry import FunctionStats

PREFIX = "_vd_"  # every name the template binds; a parameter starting with it disables inlining
_EMPTY: dict[str, Any] = {}

_TEMPLATE = """\
def gpu_wrapper({parameters}):
    _vd_plan = _vd_site.plan
    if _vd_plan.runtime is not _vd_lifecycle.current:
        _vd_plan = _vd_site.refresh()
    if _vd_forced.get() is None:
        _vd_stats = _vd_plan.stats
        if _vd_plan.always_cpu is None:
            _vd_nbytes = 0
{count}
            if _vd_nbytes < _vd_plan.cutoff:
                _vd_call = _vd_next(_vd_plan.ticks)
                if _vd_stats is not None:
                    _vd_stats.last = _vd_nbytes
                if _vd_nbytes < _vd_plan.watch and (_vd_call < _vd_timed_first
                                                    or not _vd_call & _vd_sample_mask):
                    _vd_imports = _vd_imports_so_far()
                    _vd_started = _vd_clock()
                    _vd_result = _vd_func({forward})
                    _vd_seconds = _vd_clock() - _vd_started
                    if _vd_seconds >= _vd_light:
                        _vd_site.heavy_call({positional}, {keywords}, _vd_seconds, _vd_call,
                                            _vd_imports)
                    return _vd_result
                return _vd_func({forward})
            if _vd_site.leases:
                _vd_held = _vd_site.leases.get({key})
                if _vd_held is not None and _vd_held[1] is _vd_plan \
                        and _vd_held[2].unavailable_reason is None \
                        and _vd_preferred.get() is None and _vd_held[0].take():
                    if _vd_stats is not None:
                        _vd_next(_vd_stats.leased_cpu_calls)
                        _vd_stats.last = _vd_held[0].reason
                    return _vd_func({forward})
        else:
            if _vd_stats is not None:
                _vd_next(_vd_stats.fast_cpu_calls)
                _vd_stats.last = _vd_plan.always_cpu
            return _vd_func({forward})
    return _vd_site.slow_call({positional}, {keywords})


def gpu_binding({parameters}):
    return {positional}, {keywords}


def gpu_call_key({parameters}):
    _vd_nbytes = {array_bytes}
    return {key}
"""

# A named parameter's part of the call key, inline (arguments.key_part's first two cases, which
# are most arguments, without a call): the same parts as the variadic call_key's.
_KEY_PART = ("({name}.dtype, {name}.ndim) if _vd_type({name}) is _vd_ndarray else "
             "{name}.bit_length() if _vd_type({name}) is _vd_int else _vd_key_part({name})")

_COUNT_NAMED = """\
            _vd_kind = _vd_type({name})
            if _vd_kind is _vd_ndarray:
                _vd_nbytes += {name}.nbytes
            elif _vd_kind not in _vd_plain:
                _vd_nbytes += _vd_value_bytes({name}, _vd_plan.device_type)"""

_COUNT_VARIADIC = "            _vd_nbytes += _vd_host_bytes({args}, {kwargs}, _vd_plan.device_type)"


class FastPlan(Protocol):
    """What the generated wrapper reads from a call site's plan."""

    runtime: Any
    always_cpu: str | None
    cutoff: int
    watch: int
    ticks: Iterator[int]
    stats: FunctionStats | None
    device_type: type


class CallSite(Protocol):
    """The per-function state a wrapper calls into."""

    plan: FastPlan
    # Leases on buckets settled on the CPU, by call key, each with the plan it was taken under
    # and the GPU context then: a call with that key runs as on the fast path while the GPU
    # has no ``unavailable_reason`` and ``lease.take()`` says so.
    leases: dict[tuple[Any, ...], tuple[Lease, Any, Any]]

    def refresh(self) -> FastPlan:
        """The plan for ``lifecycle.current`` (after init or shutdown)."""

    def slow_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Decide and run one call."""

    def heavy_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float,
                   call_index: int, imports_before: int) -> None:
        """Fast-path call number ``call_index`` took ``seconds`` (at least ``LIGHT_S``), begun
        when this thread's import count was ``imports_before``: learn from it."""


class _DefaultName:
    """Renders as the template variable holding one parameter default."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _own_parameters(func: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """``func``'s parameters when the template can take them over exactly, else None."""
    if not inspect.isfunction(func) or "__signature__" in vars(func):
        return None
    parameters = list(inspect.signature(func, follow_wrapped=False).parameters.values())
    if any(parameter.name.startswith(PREFIX) for parameter in parameters):
        return None
    return parameters


def _variadic() -> list[inspect.Parameter]:
    return [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]


@functools.lru_cache(maxsize=256)
def _compiled(source: str, filename: str) -> types.CodeType:
    """``source`` compiled: once per source and name, since compiling was most of making a
    wrapper (0.28 ms, then 0.06 ms for the same function again, AMD EPYC, 2026-11-27), which
    ``gpu_map`` of a plain function does per pipeline. The code holds only the template's
    names: what it calls is bound in each function's own namespace."""
    return compile(source, filename, "exec")


def generated(source: str, filename: str, namespace: dict[str, Any],
              name: str) -> Callable[..., Any]:
    """The function ``name`` that ``source`` defines, its globals ``namespace``: compiled once
    per source (:func:`_compiled`), with a code object of its own. The interpreter specialises
    a code object's global lookups for one globals dict, and functions sharing one, each with
    its own namespace, called in turn undid that on every call (a wrapper took 302 against 221
    ns a call, AMD EPYC, 2026-11-27)."""
    exec(_compiled(source, filename), namespace)  # noqa: S102
    function = namespace[name]
    function.__code__ = function.__code__.replace()
    return function  # type: ignore[no-any-return]


class Wrapper(NamedTuple):
    """What :func:`build_wrapper` makes, each taking ``func``'s arguments: ``wrapper``, what
    users call; ``binding``, the (args, kwargs) the wrapper hands ``func`` and the site
    (defaults filled in, by position where the parameter takes one): calls decided elsewhere
    (``explain``, a pipeline's items) bind through it, so the cost model sees one signature
    for them all (``f(x)`` and ``f(x, scale=1.0)`` are one bucket); ``call_key``, the key the
    wrapper finds the call's lease by (:func:`~vedart.offload.arguments.call_key`'s
    contract)."""

    wrapper: Callable[..., Any]
    binding: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]]
    call_key: Callable[..., tuple[Any, ...]]


def build_wrapper(func: Callable[..., Any], site: CallSite,
                  forced_path: ContextVar[str | None]) -> Wrapper:
    """A function with ``func``'s metadata that runs the fast-path rules above, then either
    calls ``func`` or ``site.slow_call``, with its binding and call key (:class:`Wrapper`)."""
    parameters = _own_parameters(func) or _variadic()
    namespace: dict[str, Any] = {
        "_vd_site": site, "_vd_func": func, "_vd_lifecycle": lifecycle,
        "_vd_forced": forced_path, "_vd_next": next, "_vd_type": type,
        "_vd_ndarray": np.ndarray, "_vd_plain": PLAIN_TYPES, "_vd_value_bytes": value_bytes,
        "_vd_host_bytes": host_bytes, "_vd_empty": _EMPTY, "_vd_clock": time.perf_counter,
        "_vd_light": LIGHT_S, "_vd_timed_first": TIMED_FIRST_CALLS,
        "_vd_sample_mask": TIMED_ONE_IN - 1, "_vd_int": int, "_vd_key_part": key_part,
        "_vd_call_key": call_key, "_vd_preferred": preferred_device, "_vd_sum": sum,
        "_vd_imports_so_far": imports_so_far,
    }
    rendered, count, forward, positional, keywords = [], [], [], [], []
    var_args = var_kwargs = None
    for index, parameter in enumerate(parameters):
        name, kind = parameter.name, parameter.kind
        if parameter.default is not inspect.Parameter.empty:
            default_name = f"{PREFIX}default_{index}"
            namespace[default_name] = parameter.default
            parameter = parameter.replace(default=_DefaultName(default_name))
        rendered.append(parameter.replace(annotation=inspect.Parameter.empty))
        if kind is inspect.Parameter.VAR_POSITIONAL:
            var_args = name
            forward.append(f"*{name}")
            positional.append(f"*{name}")
        elif kind is inspect.Parameter.VAR_KEYWORD:
            var_kwargs = name
            forward.append(f"**{name}")
            keywords.append(f"**{name}")
        else:
            count.append(_COUNT_NAMED.format(name=name))
            if kind is inspect.Parameter.KEYWORD_ONLY:
                forward.append(f"{name}={name}")
                keywords.append(f"{name!r}: {name}")
            else:
                forward.append(name)
                positional.append(name)
    positional_source = f"({', '.join(positional)},)" if positional else "()"
    keywords_source = "{" + ", ".join(keywords) + "}"
    named = [parameter.name for parameter in parameters if parameter.kind not in
             (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if var_args or var_kwargs:
        count.append(_COUNT_VARIADIC.format(args=var_args or "()",
                                            kwargs=var_kwargs or "_vd_empty"))
        key = f"_vd_call_key({positional_source}, {keywords_source})"
        array_bytes = "0"
    else:  # the named parameters' parts in order, then the bytes' bit length
        key = "(" + "".join(f"{_KEY_PART.format(name=name)}, " for name in named) + \
            "_vd_nbytes.bit_length())"
        array_bytes = "_vd_sum((" + "".join(  # a flat tuple: a long sum did not compile
            f"{name}.nbytes if _vd_type({name}) is _vd_ndarray else 0, " for name in named) + "))"
    source = _TEMPLATE.format(
        parameters=str(inspect.Signature(rendered))[1:-1],
        count="\n".join(count),
        forward=", ".join(forward),
        positional=positional_source,
        keywords=keywords_source,
        key=key,
        array_bytes=array_bytes)
    wrapper = generated(source, f"<@veda.gpu wrapper of {getattr(func, '__qualname__', func)!s}>",
                        namespace, "gpu_wrapper")
    functools.update_wrapper(wrapper, func)
    if not hasattr(func, "__name__"):  # a partial or a callable object: named after what it runs
        target = func.func if isinstance(func, functools.partial) else type(func)
        name = getattr(target, "__name__", None)
        if name is not None:
            wrapper.__name__ = name
            wrapper.__qualname__ = getattr(target, "__qualname__", name)
        if isinstance(func, functools.partial):
            wrapper.__doc__ = getattr(target, "__doc__", None)
    return Wrapper(wrapper, namespace["gpu_binding"], namespace["gpu_call_key"])
