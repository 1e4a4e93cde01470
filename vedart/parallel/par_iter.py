"""``par_iter(iterable)``: lazy parallel pipelines over any iterable, with GPU stages.

Adapters (``map``, ``filter``, ``flat_map``, ``async_map``, ``enumerate``, ``zip``, ``take``,
``skip``, ``chunk``, ``gpu_map``) only describe the pipeline and return a new :class:`ParIter`; nothing
runs until a terminal (``collect``, ``fold``, ``reduce``, ``sum``, ``count``, ``min``, ``max``,
``any``, ``all``, ``for_each``, ``to_dict``) is called. Then, on the current runtime's scheduler:

- results come in input order, and every item read from the source is processed at most once
  (exactly once for items that reach the terminal);
- the source is read lazily, only as far as the bounded windows of the stages reach, so
  ``take(n)`` on an endless generator returns and a huge generator runs in bounded memory;
- consecutive map/filter/flat_map stages are fused and run on the worker pool in automatically
  sized chunks; enumerate, zip, take, skip and chunk run in order on the calling thread;
  async_map awaits its calls on an event loop of the pipeline's own (:mod:`.async_map`);
- an item that raises makes the terminal raise :class:`~vedart.errors.ParIterError` naming its
  source index and stage, chained to the original exception, and cancels the work still queued
  (``collect(errors="skip" | "return")`` keeps going instead).

Terminals apply their own functions the same way: ``for_each``'s ``f``, the predicates of
``any``/``all`` and the keys of ``min``/``max``/``to_dict`` run in parallel like ``map``;
``fold``/``reduce`` apply ``op`` in input order on the calling thread (any op, associative or not).
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from vedart.config import checked_bool, checked_int
from vedart.errors import ConfigError, OffloadError, OffloadWarning
from vedart.lifecycle import get_runtime
from vedart.offload.force import forced_path
from vedart.parallel.adapters import Chunk, Enumerate, Skip, Take, Zip
from vedart.parallel.async_map import DEFAULT_CONCURRENCY, AsyncMapReader
from vedart.parallel.batch import Batch, ItemFailure, Reader, SourceReader
from vedart.parallel.dask_scheduler import DASK_TASK_SECONDS, DaskReader
from vedart.parallel.device_workers import DeviceWorkers, function_payload
from vedart.parallel.elementwise import KINDS, Step, fuse
from vedart.parallel.gpu_lanes import current_lane
from vedart.parallel.gpu_map import GpuFunction, GpuMapReader, gpu_lanes_for, offloaded
from vedart.parallel.process_gpu_map import ProcessGpuMapReader
from vedart.parallel.progress import Progress, open_progress
from vedart.parallel.scheduler import ChunkPolicy, ParallelReader

if TYPE_CHECKING:
    from vedart.runtime import Runtime

T = TypeVar("T")
U = TypeVar("U")
K = TypeVar("K", bound=Hashable)

ERROR_MODES = ("raise", "skip", "return")
_ONE_TO_ONE = frozenset({"map", "async_map", "gpu_map", "enumerate"})  # stages that keep the item count
_NO_VALUE: Any = object()


@dataclass(frozen=True)
class _Stage:
    """One described stage: its kind, the label errors name it by (``"#2 map(parse)"``), its
    function and its other argument (enumerate's start, zip's iterables, a count, a size, or
    gpu_map's device)."""

    kind: str
    label: str
    function: Callable[..., Any] | None = None
    argument: Any = None


_POSITIONAL: dict[str, Callable[[Reader, _Stage], Reader]] = {
    "enumerate": lambda upstream, stage: Enumerate(upstream, stage.argument),
    "zip": lambda upstream, stage: Zip(upstream, stage.argument, stage.label),
    "take": lambda upstream, stage: Take(upstream, stage.argument),
    "skip": lambda upstream, stage: Skip(upstream, stage.argument),
    "chunk": lambda upstream, stage: Chunk(upstream, stage.argument),
}


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__name__", type(function).__name__)


def _check_callable(where: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{where}: got {value!r} of type {type(value).__name__}; "
                        "allowed: a callable")


def _iterable(value: Any) -> bool:
    """Whether ``iter(value)`` works: ``__iter__``, or the sequence protocol (``__getitem__``
    from 0), as the builtins accept, and not a 0-d array. ``iter`` is called only on objects
    without ``__iter__``, for which it reads nothing (a NumPy scalar has ``__getitem__`` but
    is no sequence)."""
    if isinstance(value, Iterable):
        return getattr(value, "ndim", None) != 0  # a 0-d array has __iter__ but raises
    try:
        iter(value)
    except TypeError:
        return False
    return True


def par_iter(iterable: Iterable[T], chunk_size: int | None = None) -> ParIter[T]:
    """A lazy parallel pipeline over ``iterable``.

    ``chunk_size``: items per scheduled task; None (default) sizes tasks automatically from
    measured item times, so tiny items share a task and costly ones get one each.
    """
    if not _iterable(iterable):
        raise TypeError(f"par_iter: got {iterable!r} of type {type(iterable).__name__}; "
                        "allowed: an iterable")
    if chunk_size is not None:
        chunk_size = checked_int("chunk_size", chunk_size, 1, "None (automatic) or an int >= 1")
    return ParIter(iterable, chunk_size, ())


class ParIter(Generic[T]):
    """A described pipeline; see the module docstring for the guarantees. Immutable: each
    adapter returns a new ParIter. Running a terminal iterates the source once (a generator
    source is consumed by the first terminal)."""

    def __init__(self, source: Iterable[Any], chunk_size: int | None,
                 stages: tuple[_Stage, ...]) -> None:
        self._source = source
        self._chunk_size = chunk_size
        self._stages = stages

    def __repr__(self) -> str:
        stages = ", ".join(stage.label for stage in self._stages)
        return f"ParIter({type(self._source).__name__}{', ' if stages else ''}{stages})"

    # --- adapters -----------------------------------------------------------------------

    def _then(self, kind: str, name: str, function: Callable[..., Any] | None = None,
              argument: Any = None) -> ParIter[Any]:
        label = f"#{len(self._stages) + 1} {name}"
        return ParIter(self._source, self._chunk_size,
                       self._stages + (_Stage(kind, label, function, argument),))

    def _element_wise(self, kind: str, function: Callable[..., Any]) -> ParIter[Any]:
        _check_callable(f"{kind}(f)", function)
        return self._then(kind, f"{kind}({_name(function)})", function)

    def map(self, f: Callable[[T], U]) -> ParIter[U]:
        """``f(item)`` for each item, in parallel."""
        return self._element_wise("map", f)

    def filter(self, pred: Callable[[T], Any]) -> ParIter[T]:
        """The items for which ``pred(item)`` is true, in parallel."""
        return self._element_wise("filter", pred)

    def flat_map(self, f: Callable[[T], Iterable[U]]) -> ParIter[U]:
        """The items of each ``f(item)`` (an iterable, consumed on the worker), in order."""
        return self._element_wise("flat_map", f)

    def async_map(self, f: Callable[[T], Any], concurrency: int = DEFAULT_CONCURRENCY
                  ) -> ParIter[Any]:
        """``f(item)`` for each item, awaited when it returns an awaitable (``async def``
        functions), at most ``concurrency`` items at a time on one event loop per pipeline run;
        results in input order. A plain ``f`` runs on the loop's thread and holds the others up
        while it runs (use ``map`` for CPU work)."""
        _check_callable("async_map(f)", f)
        concurrency = checked_int("async_map(concurrency)", concurrency, 1)
        return self._then("async_map", f"async_map({_name(f)})", f, concurrency)

    def enumerate(self, start: int = 0) -> ParIter[tuple[int, T]]:
        """``(count, item)`` pairs, count from ``start``."""
        return self._then("enumerate", "enumerate",
                          argument=checked_int("enumerate(start)", start))

    def zip(self, *others: Iterable[Any]) -> ParIter[tuple[Any, ...]]:
        """``(item, other_1_item, ...)`` tuples, ending with the shortest input."""
        for number, other in enumerate(others, 1):
            if not _iterable(other):
                raise TypeError(f"zip(*others): argument {number} is {other!r} of type "
                                f"{type(other).__name__}; allowed: iterables")
        return self._then("zip", "zip", argument=others)

    def take(self, n: int) -> ParIter[T]:
        """The first ``n`` items; reading stops there (work read ahead is cancelled)."""
        return self._then("take", f"take({n})", argument=checked_int("take(n)", n, 0))

    def skip(self, n: int) -> ParIter[T]:
        """All items after the first ``n`` (failed items among those are dropped too)."""
        return self._then("skip", f"skip({n})", argument=checked_int("skip(n)", n, 0))

    def chunk(self, size: int) -> ParIter[list[T]]:
        """Lists of ``size`` consecutive items (the last may be shorter)."""
        return self._then("chunk", f"chunk({size})", argument=checked_int("chunk(size)", size, 1))

    def gpu_map(self, f: Callable[[T], U], device: int | None = None,
                force: str | None = None) -> ParIter[U]:
        """``f(item)`` through the @veda.gpu machinery: the per-item cost model decides GPU or
        CPU (``force="gpu" | "cpu"`` overrides); GPU items run on the device lanes
        (``device=``: only that device), CPU items on the worker pool. ``f`` is wrapped with
        ``@veda.gpu(force=force)`` unless it already is a @veda.gpu function."""
        _check_callable("gpu_map(f)", f)
        if device is not None:
            device = checked_int("gpu_map(device)", device, 0, "None or a CUDA ordinal >= 0")
        return self._then("gpu_map", f"gpu_map({_name(f)})", offloaded(f, force), device)

    # --- terminals ----------------------------------------------------------------------

    def collect(self, errors: str = "raise", progress: bool | None = None) -> list[Any]:
        """The items as a list. ``errors``: "raise" (ParIterError for the first failed item),
        "skip" (drop failed items) or "return" (the item's exception in its place).
        ``progress``: show a progress bar (None: ``Config.progress``)."""
        if errors not in ERROR_MODES:
            raise ConfigError(f"collect(errors): got {errors!r}; allowed: "
                              + ", ".join(repr(mode) for mode in ERROR_MODES))
        if progress is not None:
            progress = checked_bool("collect(progress)", progress, "None (the runtime's "
                                    "Config.progress), True or False")
        with self._batches(progress=progress, past_failures=errors != "raise") as batches:
            if errors == "raise":
                return list(_items(batches))
            results: list[Any] = []
            for batch in batches:
                if not batch.failures:
                    results.extend(batch.items)
                elif errors == "skip":
                    results.extend(item for position, item in enumerate(batch.items)
                                   if position not in batch.failures)
                else:
                    results.extend(item.error if position in batch.failures else item
                                   for position, item in enumerate(batch.items))
            return results

    def fold(self, identity: U, op: Callable[[U, T], U]) -> U:
        """``op(...op(op(identity, item0), item1)..., itemN)``, applied in input order on the
        calling thread (like ``functools.reduce(op, items, identity)``)."""
        _check_callable("fold(op)", op)
        folded: U = self._fold(identity, op, f"fold({_name(op)})")
        return folded

    def reduce(self, op: Callable[[T, T], T]) -> T:
        """Like :meth:`fold` starting from the first item; TypeError for an empty pipeline."""
        _check_callable("reduce(op)", op)
        reduced: T = self._fold(_NO_VALUE, op, f"reduce({_name(op)})")
        return reduced

    def sum(self, start: Any = 0) -> Any:
        """``builtins.sum(items, start)``."""
        with self._batches() as batches:
            return builtins.sum(_items(batches), start)

    def count(self) -> int:
        """The number of items."""
        with self._batches() as batches:
            return builtins.sum(len(batch) for batch in _checked(batches))

    def min(self, key: Callable[[T], Any] | None = None, default: Any = _NO_VALUE) -> Any:
        """``builtins.min(items, key=key[, default=default])``; ``key`` runs in parallel."""
        return self._extreme(builtins.min, "min", key, default)

    def max(self, key: Callable[[T], Any] | None = None, default: Any = _NO_VALUE) -> Any:
        """``builtins.max(items, key=key[, default=default])``; ``key`` runs in parallel."""
        return self._extreme(builtins.max, "max", key, default)

    def any(self, pred: Callable[[T], Any] | None = None) -> bool:
        """Whether ``pred(item)`` (default: the item itself) is true for some item; stops at
        the first, cancelling work queued after it."""
        return self._test(builtins.any, "any", pred)

    def all(self, pred: Callable[[T], Any] | None = None) -> bool:
        """Whether ``pred(item)`` (default: the item itself) is true for every item; stops at
        the first false one, cancelling work queued after it."""
        return self._test(builtins.all, "all", pred)

    def for_each(self, f: Callable[[T], Any]) -> None:
        """Call ``f(item)`` for each item, in parallel (in no particular order)."""
        _check_callable("for_each(f)", f)
        with self._batches(self._terminal_step("for_each", f, f)) as batches:
            for _ in _checked(batches):
                pass

    def to_dict(self, key: Callable[[T], K]) -> dict[K, T]:
        """``{key(item): item}`` (a later item wins a repeated key); ``key`` runs in parallel."""
        _check_callable("to_dict(key)", key)
        with self._batches(self._terminal_step("to_dict", _Keyed(key), key)) as batches:
            return dict(_items(batches))

    # --- running ------------------------------------------------------------------------

    def _terminal_step(self, terminal: str, function: Callable[..., Any],
                       named: Callable[..., Any]) -> Step:
        """A map step run by a terminal; errors name it ``terminal(named)``."""
        return Step("map", function, f"#{len(self._stages) + 1} {terminal}({_name(named)})")

    def _fold(self, identity: Any, op: Callable[[Any, Any], Any], name: str) -> Any:
        label = f"#{len(self._stages) + 1} {name}"
        accumulated = identity
        with self._batches() as batches:
            for batch in _checked(batches):
                for item, origin in zip(batch.items, batch.origins):
                    if accumulated is _NO_VALUE:
                        accumulated = item
                        continue
                    try:
                        accumulated = op(accumulated, item)
                    except Exception as error:
                        raise ItemFailure(origin, label, error).to_error() from error
        if accumulated is _NO_VALUE:
            raise TypeError("reduce() of an empty pipeline with no initial value")
        return accumulated

    def _extreme(self, builtin: Callable[..., Any], name: str,
                 key: Callable[[Any], Any] | None, default: Any) -> Any:
        defaults = {} if default is _NO_VALUE else {"default": default}
        if key is None:
            with self._batches() as batches:
                return builtin(_items(batches), **defaults)
        _check_callable(f"{name}(key)", key)
        with self._batches(self._terminal_step(name, _Keyed(key), key)) as batches:
            pair = builtin(_items(batches), key=itemgetter(0), default=_NO_VALUE)
        if pair is _NO_VALUE:
            return builtin((), **defaults)  # raises the builtin's error without a default
        return pair[1]

    def _test(self, builtin: Callable[[Iterable[Any]], bool], name: str,
              pred: Callable[[Any], Any] | None) -> bool:
        if pred is None:
            with self._batches() as batches:
                return builtin(_items(batches))
        _check_callable(f"{name}(pred)", pred)
        with self._batches(self._terminal_step(name, pred, pred)) as batches:
            return builtin(_items(batches))

    @contextmanager
    def _batches(self, terminal: Step | None = None, progress: bool | None = None,
                 past_failures: bool = False) -> Iterator[Iterator[Batch]]:
        """The pipeline's batches, shown on a progress bar (``progress``; None:
        ``Config.progress``) as they reach the terminal: up to the first failed item, unless
        the terminal goes ``past_failures`` (``collect(errors="skip" | "return")``)."""
        runtime = get_runtime()
        reader = self._build(runtime, terminal)
        shown = runtime.config.progress if progress is None else progress
        try:
            display = open_progress(shown, self._known_length() if shown else None)
        except BaseException:
            reader.close()
            raise
        try:
            yield _displayed(reader, display, past_failures)
        finally:
            reader.close()
            display.close()

    def _build(self, runtime: Runtime, terminal: Step | None) -> Reader:
        """The stages as a chain of readers; each run of element-wise stages (with the
        terminal's own step) is fused into one ParallelReader."""
        reader: Reader = SourceReader(self._source)
        steps: list[Step] = []
        try:
            for stage in self._stages:
                step = _as_step(stage, runtime)
                if step is not None:
                    steps.append(step)
                    continue
                reader = self._fused(reader, steps, runtime)
                steps = []
                reader = self._positional_or_gpu(reader, stage, runtime)
            return self._fused(reader, steps + ([terminal] if terminal is not None else []),
                               runtime)
        except BaseException:
            reader.close()  # the stages built so far (device workers held by one, say)
            raise

    def _fused(self, upstream: Reader, steps: list[Step], runtime: Runtime) -> Reader:
        if not steps:
            return upstream
        if runtime.dask is not None:
            return DaskReader(upstream, steps, runtime.dask,
                              ChunkPolicy(self._chunk_size, DASK_TASK_SECONDS), runtime.telemetry)
        return ParallelReader(upstream, fuse(steps), runtime.scheduler,
                              ChunkPolicy(self._chunk_size))

    def _positional_or_gpu(self, upstream: Reader, stage: _Stage, runtime: Runtime) -> Reader:
        if stage.kind == "async_map":
            assert stage.function is not None
            return AsyncMapReader(upstream, stage.function, stage.label, stage.argument,
                                  ChunkPolicy(self._chunk_size), runtime.attach)
        if stage.kind != "gpu_map":
            return _POSITIONAL[stage.kind](upstream, stage)
        assert runtime.gpu
        if stage.argument is not None:
            runtime.gpu.device(stage.argument)  # DeviceError naming the runtime's devices
        wrapper = cast(GpuFunction, stage.function)
        if stage.argument is None and len(runtime.gpu.devices) > 1 \
                and runtime.config.device_processes and forced_path.get() is None:
            payload = function_payload(wrapper)
            workers = device_workers_for(runtime) if payload is not None else None
            if payload is not None and workers is not None and workers.acquire():
                try:
                    return ProcessGpuMapReader(upstream, wrapper, stage.label, runtime, workers,
                                               payload, ChunkPolicy(self._chunk_size))
                except OffloadError as error:
                    workers.release()
                    warnings.warn(f"{error}; its lanes run in this process", OffloadWarning,
                                  stacklevel=4)
                except BaseException:
                    workers.release()
                    raise
        return GpuMapReader(upstream, wrapper, stage.label, runtime, runtime.scheduler,
                            gpu_lanes_for(runtime, runtime.scheduler),
                            ChunkPolicy(self._chunk_size), stage.argument)

    def _known_length(self) -> int | None:
        """The number of items, where the source tells it and every stage keeps it (None
        otherwise, or when ``len`` cannot say, as for ``range(2**63)``)."""
        if isinstance(self._source, Sized) and all(stage.kind in _ONE_TO_ONE
                                                   for stage in self._stages):
            try:
                return len(self._source)
            except OverflowError:
                return None
        return None


def device_workers_for(runtime: Runtime) -> DeviceWorkers:
    """The runtime's device worker processes, started on first use (see DeviceWorkers)."""
    assert runtime.gpu
    ordinals = list(runtime.gpu.ordinals)
    return runtime.scheduler.lanes("processes",
                                   lambda: DeviceWorkers(ordinals, runtime.config))


def _as_step(stage: _Stage, runtime: Runtime) -> Step | None:
    """The element-wise step ``stage`` runs as, or None for a positional or lane stage.

    gpu_map is a plain map of its @gpu function when no GPU is usable (the function then runs
    on the CPU), inside a lane's item (so lanes never wait on lanes; each item is still
    decided by @gpu), and on Dask (each worker's runtime decides and uses its own GPU)."""
    if stage.kind in KINDS:
        assert stage.function is not None
        return Step(stage.kind, stage.function, stage.label)
    if stage.kind == "gpu_map" and runtime.dask is not None:
        if stage.argument is not None:
            raise ConfigError(f"gpu_map(device): got {stage.argument!r} under "
                              "scheduler='dask'; allowed: None (each Dask worker uses the "
                              "GPUs it sees)")
        assert stage.function is not None
        return Step("map", stage.function, stage.label)
    if stage.kind == "gpu_map" and not (runtime.gpu and current_lane() is None):
        assert stage.function is not None
        return Step("map", stage.function, stage.label)
    return None


@dataclass(frozen=True)
class _Keyed:
    """``item -> (key(item), item)``: computes a terminal's key on the workers."""

    key: Callable[[Any], Any]

    def __call__(self, item: Any) -> tuple[Any, Any]:
        return self.key(item), item


def _displayed(reader: Reader, display: Progress, past_failures: bool) -> Iterator[Batch]:
    while (batch := reader.read()) is not None:
        # A terminal that stops at a failure never takes the items after it.
        display.update(len(batch) if past_failures or not batch.failures
                       else min(batch.failures))
        yield batch


def _checked(batches: Iterable[Batch]) -> Iterator[Batch]:
    """The batches up to the first failed item, whose ParIterError is raised then."""
    for batch in batches:
        failure = batch.first_failure()
        if failure is None:
            yield batch
            continue
        yield batch.slice(0, min(batch.failures))
        raise failure.to_error() from failure.error


def _items(batches: Iterable[Batch]) -> Iterator[Any]:
    return chain.from_iterable(batch.items for batch in _checked(batches))
