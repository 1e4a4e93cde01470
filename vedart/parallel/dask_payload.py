"""What crosses the network when par_iter runs on Dask: a fused chain of stages and batches of
items, pickled with cloudpickle, and the batch a worker sends back.

On the client, before anything is sent:
1. :func:`encode_steps` pickles the chain once per pipeline; a function that cannot be
   pickled raises ParIterError naming its stage. A @veda.gpu wrapper travels by reference
   when its module exports it, else as its function and options (:class:`GpuRecipe`), rebuilt
   into a @gpu wrapper by the worker's own runtime.
2. :func:`check_batch` pickles each batch as Dask will (array buffers out of band, as Dask
   sends them), so an item that cannot be pickled raises ParIterError naming its source
   index instead of failing inside Dask.
A batch of an embedded cluster may instead travel through shared memory
(:mod:`.dask_shared`). In the worker, :func:`run_batch` (the Dask task) loads the chain (once
per pipeline and process), runs it on the batch under the caller's ``veda.force`` path (@gpu steps through the
worker's own gpu_map lanes when it has a GPU) and returns the result
with the seconds it took; a result or exception that cannot be pickled and loaded back
becomes that item's failure, the batch's other items unharmed.
"""

from __future__ import annotations

import io
import operator
import pickle
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, reduce
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from vedart.errors import ParIterError
from vedart.lifecycle import get_runtime
from vedart.offload.arguments import PLAIN_TYPES
from vedart.offload.decorator import OffloadOptions, is_gpu_wrapper, rewrapped
from vedart.offload.force import forced_path
from vedart.parallel.batch import Batch, ItemFailure, Reader
from vedart.parallel.dask_shared import SharedBatch
from vedart.parallel.elementwise import Step, fuse
from vedart.parallel.gpu_map import GpuFunction, GpuMapReader, gpu_lanes_for
from vedart.parallel.scheduler import ChunkPolicy

if TYPE_CHECKING:
    from vedart.runtime import Runtime

SHOWN_CHARACTERS = 200  # of an unpicklable result's repr, in its failure
LOADED_CHAINS = 16      # pipelines whose loaded chain a worker keeps


def _dump(value: Any, buffers: list[pickle.PickleBuffer] | None = None) -> bytes:
    """``value`` pickled with cloudpickle (protocol 5; array buffers out of band in
    ``buffers`` when given, uncopied), except that a @veda.gpu wrapper of the main script it
    reaches (a stage's function calling one, say), which cloudpickle would copy with the
    wrapper's own machinery, travels as its function and options, rebuilt by the worker, and
    that an array NumPy would pickle in band goes as :func:`_reduced_array` says."""
    buffer = io.BytesIO()
    _pickler_class()(buffer, protocol=5,
                     buffer_callback=None if buffers is None else buffers.append).dump(value)
    return buffer.getvalue()


@lru_cache(maxsize=1)
def _pickler_class() -> type:
    import cloudpickle  # comes with the dask extra; this module is imported without it

    class VedartPickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is types.FunctionType and is_gpu_wrapper(obj) \
                    and obj.__module__ == "__main__":
                return _rebuilt, (GpuRecipe(obj.__wrapped__, obj.gpu_options),)
            if type(obj) is np.ndarray:
                reduced = _reduced_array(obj)
                if reduced is not None:
                    return reduced
            return super().reducer_override(obj)

    return VedartPickler


def _rebuilt(recipe: GpuRecipe) -> Callable[..., Any]:
    """In the worker: the @veda.gpu wrapper ``recipe`` describes."""
    return recipe.build()


def _reduced_array(array: np.ndarray) -> tuple[Any, ...] | None:
    """How to pickle an array of another byte order than this machine's that NumPy would
    pickle in band, where it loses its byte order (NumPy 2.4.6: one that is not contiguous,
    or of a datetime kind): its bytes out of band (copied only when not contiguous), with its
    dtype, shape and memory order. None for any other array (subclasses are NumPy's)."""
    if array.dtype.isnative or array.dtype.hasobject or (
            array.dtype.kind not in "mM" and (array.flags.c_contiguous
                                              or array.flags.f_contiguous)):
        return None
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    data = array.ravel(order=order).view(np.uint8)
    return _array_of, (data, array.dtype, array.shape, order)


def _array_of(data: np.ndarray, dtype: np.dtype[Any], shape: tuple[int, ...],
              order: str) -> np.ndarray:
    """The array of :func:`_reduced_array`."""
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order)


def _check_picklable(value: Any) -> None:
    """Pickle ``value`` with cloudpickle (:func:`_dump`), to raise what sending it would."""
    _dump(value, [])


def _check_travels(value: Any) -> None:
    """:func:`_check_picklable`, and load the pickle back: what a worker sends must load in
    the client (an exception whose ``__init__`` takes other arguments than it keeps pickles
    but does not load). Items are not checked so (loading a CuPy array back would copy it on
    its device)."""
    buffers: list[pickle.PickleBuffer] = []
    pickle.loads(_dump(value, buffers), buffers=buffers)


@dataclass(frozen=True)
class GpuRecipe:
    """A @veda.gpu wrapper as its plain function and options, for a worker to rebuild."""

    function: Callable[..., Any]
    options: OffloadOptions

    def build(self) -> Callable[..., Any]:
        return rewrapped(self.function, self.options)


def _portable(function: Callable[..., Any]) -> Any:
    """What a worker gets for ``function`` (see the module docstring)."""
    if not is_gpu_wrapper(function):
        return function
    if getattr(function, "__module__", "__main__") != "__main__":
        try:
            pickle.dumps(function)  # by reference: the worker imports its module
            return function
        except Exception:  # noqa: BLE001  # any failure means: not by reference
            pass
    return GpuRecipe(function.__wrapped__, function.gpu_options)  # type: ignore[attr-defined]


def encode_steps(steps: Sequence[Step]) -> bytes:
    """The chain, pickled; ParIterError naming the first stage whose function cannot be."""
    portable = []
    for step in steps:
        function = _portable(step.function)
        try:
            _dump(function)
        except Exception as error:
            raise ParIterError(
                f"par_iter stage {step.label} cannot run on Dask workers: its function "
                f"{function!r} cannot be pickled ({type(error).__name__}: {error}); define it "
                "at the top level of a module, without references to locks, files or other "
                "process-bound objects", stage=step.label) from error
        portable.append((step.kind, function, step.label))
    return _dump(tuple(portable))


def check_batch(batch: Batch, stage: str) -> None:
    """ParIterError naming the first item of ``batch`` that cannot be pickled, or (unless
    every item is plain data, which loads as it pickles) loaded back: one item a worker cannot
    load fails every task of its submission."""
    check = _check_picklable if all(map(_plain, batch.items)) else _check_travels
    try:
        check(batch)
    except Exception as error:
        index, culprit = _first_unpicklable(batch, error, check)
        raise ParIterError(
            f"par_iter item {index} cannot be sent to a Dask worker for stage {stage}: it "
            f"cannot be pickled and loaded back ({type(culprit).__name__}: {culprit})",
            index=index, stage=stage) from culprit


def _plain(item: Any) -> bool:
    """Whether ``item`` is a number, string, None or an array of numbers (NumPy's or CuPy's,
    which loading back would copy on its device)."""
    kind = type(item)
    return kind in PLAIN_TYPES or (kind is np.ndarray and not item.dtype.hasobject) \
        or kind.__module__.startswith("cupy")


def _first_unpicklable(batch: Batch, error: Exception, check: Callable[[Any], None]
                       ) -> tuple[int, Exception]:
    for item, origin in zip(batch.items, batch.origins):
        try:
            check(item)
        except Exception as culprit:  # noqa: BLE001  # reported with its item
            return origin, culprit
    return batch.origins[0], error


class KeptInClient(Exception):
    """Stands in a sent batch for an item that failed upstream, whose failure stays in the
    client (its exception need not pickle): number ``slot`` of :func:`without_failures`."""

    def __init__(self, slot: int) -> None:
        super().__init__(slot)
        self.slot = slot


def without_failures(batch: Batch) -> tuple[Batch, list[ItemFailure]]:
    """``batch`` with each item that failed upstream replaced by a stand-in failure (which
    every stage passes through untouched, in its place), and those failures."""
    if not batch.failures:
        return batch, []
    kept = [batch.failures[position] for position in sorted(batch.failures)]
    stand_ins = {position: ItemFailure(failure.index, failure.stage, KeptInClient(slot))
                 for slot, (position, failure) in enumerate(sorted(batch.failures.items()))}
    items = [stand_ins.get(position, item) for position, item in enumerate(batch.items)]
    return Batch(items, batch.origins, stand_ins), kept


def with_failures(batch: Batch, kept: list[ItemFailure]) -> Batch:
    """``batch`` (a stage's output) with the stand-ins of :func:`without_failures` replaced by
    the failures ``kept``."""
    if not kept:
        return batch
    items = list(batch.items)
    failures = dict(batch.failures)
    for position, failure in batch.failures.items():
        if isinstance(failure.error, KeptInClient):
            items[position] = failures[position] = kept[failure.error.slot]
    return Batch(items, batch.origins, failures)


def failed_batch(batch: Batch, stage: str, error: BaseException) -> Batch:
    """``batch`` with every item replaced by its failure in ``stage`` (a task that failed as a
    whole: the batch's worker died too often, say)."""
    failures = {position: batch.failures.get(position) or ItemFailure(origin, stage, error)
                for position, origin in enumerate(batch.origins)}
    return Batch(list(failures.values()), batch.origins, failures)


@lru_cache(maxsize=LOADED_CHAINS)
def _loaded(steps: bytes) -> tuple[Step, ...]:
    return tuple(Step(kind, function.build() if isinstance(function, GpuRecipe) else function,
                      label) for kind, function, label in pickle.loads(steps))


def _run(steps: tuple[Step, ...], batch: Batch) -> Batch:
    """``steps`` over ``batch``: on a worker with a usable GPU each @gpu step runs as a
    gpu_map stage (its device lanes overlap copies and compute), the steps between them fused;
    elsewhere all of them fused."""
    runtime = get_runtime()
    if not runtime.gpu:
        return fuse(steps)(batch)
    pending: list[Step] = []
    for step in steps:
        if not is_gpu_wrapper(step.function):
            pending.append(step)
            continue
        if pending:
            batch, pending = fuse(pending)(batch), []
        batch = _on_lanes(step, batch, runtime)
    return fuse(pending)(batch) if pending else batch


class _Given(Reader):
    """One batch, then the end."""

    def __init__(self, batch: Batch) -> None:
        super().__init__()
        self._batch: Batch | None = batch

    def _next_batch(self, limit: int | None) -> Batch | None:
        batch, self._batch = self._batch, None
        return batch


def _on_lanes(step: Step, batch: Batch, runtime: Runtime) -> Batch:
    reader = GpuMapReader(_Given(batch), cast(GpuFunction, step.function), step.label, runtime,
                          runtime.scheduler, gpu_lanes_for(runtime, runtime.scheduler),
                          ChunkPolicy(None), None)
    parts = []
    try:
        while (part := reader.read()) is not None:
            parts.append(part)
    finally:
        reader.close()
    return reduce(operator.add, parts, Batch([], []))


# The pickled result batch, its array buffers, the seconds it took, an interrupt to raise.
Answer = tuple[bytes, list[np.ndarray], float, BaseException | None]


def held(data: bytes) -> bytes:
    """The Dask task that holds a pipeline's pickled chain for its other tasks: ``data``."""
    return data


def run_batch(steps: bytes, batch: Batch | SharedBatch, forced: str | None) -> Answer:
    """The Dask task: the chain ``steps`` over ``batch`` (loaded first when it came through
    shared memory) under ``veda.force(forced)``: the result batch as :func:`_packed` gives it,
    the seconds it took, and a KeyboardInterrupt or SystemExit a function raised (None, else;
    the batch is then empty), for :func:`received` to raise as the thread scheduler does:
    raised in the worker, it killed the worker, again on each retry (four times, 8.5 s), and
    the pipeline failed with KilledWorker."""
    chain = _loaded(steps)
    if isinstance(batch, SharedBatch):  # views for uploads to a GPU, else a copy (load())
        batch = batch.load(private=not (get_runtime().gpu and any(
            is_gpu_wrapper(step.function) for step in chain)))
    token = forced_path.set(forced)
    started = time.perf_counter()
    try:
        result = _run(chain, batch)
    except (KeyboardInterrupt, SystemExit) as interrupt:
        return b"", [], time.perf_counter() - started, interrupt
    finally:
        forced_path.reset(token)
    seconds = time.perf_counter() - started
    try:
        payload, buffers = _packed(result)
    except Exception:  # noqa: BLE001  # some result or exception cannot travel: find which
        payload, buffers = _packed(_sendable(result, chain[-1].label))
    return payload, buffers, seconds, None


def _packed(batch: Batch) -> tuple[bytes, list[np.ndarray]]:
    """``batch``'s items, origins and failures pickled (:func:`_dump`), with their array
    buffers out of band as byte arrays, which Dask sends uncopied; loaded back once when it
    holds failures or more than plain data (what a worker sends must load in the client), as
    :func:`check_batch` does. Pickled here, not by Dask: an array inside another object, or in
    a list whose first element is no array, came back to the client in native byte order
    (distributed 2026.8)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = _dump((batch.items, batch.origins, batch.failures), buffers)
    if batch.failures or not all(map(_plain, batch.items)):
        pickle.loads(payload, buffers=buffers)
    return payload, [np.frombuffer(buffer.raw(), np.uint8) for buffer in buffers]


def received(answer: Answer) -> tuple[Batch, float]:
    """The result batch and seconds of a :func:`run_batch` answer; raises the interrupt a
    function raised in the worker."""
    payload, buffers, seconds, interrupt = answer
    if interrupt is not None:
        raise interrupt
    items, origins, failures = pickle.loads(payload, buffers=buffers)
    return Batch(items, origins, failures), seconds


def _sendable(batch: Batch, last_stage: str) -> Batch:
    """``batch`` with each item that cannot be pickled replaced by a failure saying so."""
    items: list[Any] = []
    failures = dict(batch.failures)
    for position, (item, origin) in enumerate(zip(batch.items, batch.origins)):
        try:
            _check_travels(item)
            items.append(item)
        except Exception as error:  # noqa: BLE001  # reported as the item's failure
            failure = batch.failures.get(position)
            kind = "exception" if failure is not None else "result"
            shown = repr(failure.error if failure is not None else item)[:SHOWN_CHARACTERS]
            stage = last_stage if failure is None else failure.stage
            replaced = ItemFailure(origin, stage, RuntimeError(
                f"the item's {kind} cannot be sent back from its Dask worker "
                f"({type(error).__name__}: {error}); it was {shown}"))
            failures[position] = replaced
            items.append(replaced)
    return Batch(items, batch.origins, failures)
