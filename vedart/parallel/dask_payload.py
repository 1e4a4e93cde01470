"""What crosses the network when par_iter runs on Dask: a fused chain of stages and batches of
items, pickled with cloudpickle, and the batch a worker sends back.

On the client, before anything is sent:
1. :func:`encode_steps` pickles the chain once per pipeline; a function that cannot be
   pickled raises ParIterError naming its stage. A @veda.gpu wrapper travels by reference
   when its module exports it, else as its function and options (:class:`GpuRecipe`), rebuilt
   into a @gpu wrapper by the worker's own runtime.
2. :func:`encode_batch` pickles each batch; an item that cannot be pickled raises ParIterError
   naming its source index.
In the worker, :func:`run_batch` (the Dask task) loads the chain (once per pipeline and
process), runs it on the batch under the caller's ``veda.force`` path and pickles the result
with the seconds it took; a result that cannot be pickled becomes that item's failure.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from vedart.errors import ParIterError
from vedart.offload.decorator import OffloadOptions, gpu
from vedart.offload.force import forced_path
from vedart.parallel.batch import Batch, ItemFailure
from vedart.parallel.elementwise import Step, fuse
from vedart.parallel.gpu_map import is_gpu_wrapper

def _dumps(value: Any) -> bytes:
    import cloudpickle  # comes with the dask extra; this module is imported without it

    return cloudpickle.dumps(value)  # type: ignore[no-any-return]


SHOWN_CHARACTERS = 200  # of an unpicklable result's repr, in its failure
LOADED_CHAINS = 16      # pipelines whose loaded chain a worker keeps


@dataclass(frozen=True)
class GpuRecipe:
    """A @veda.gpu wrapper as its plain function and options, for a worker to rebuild."""

    function: Callable[..., Any]
    options: OffloadOptions

    def build(self) -> Callable[..., Any]:
        return gpu(**dataclasses.asdict(self.options))(self.function)  # type: ignore[no-any-return]


def _portable(function: Callable[..., Any]) -> Any:
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
            _dumps(function)
        except Exception as error:
            raise ParIterError(
                f"par_iter stage {step.label} cannot run on Dask workers: its function "
                f"{function!r} cannot be pickled ({type(error).__name__}: {error}); define it "
                "at the top level of a module, without references to locks, files or other "
                "process-bound objects", stage=step.label) from error
        portable.append((step.kind, function, step.label))
    return _dumps(tuple(portable))


def encode_batch(batch: Batch, stage: str) -> bytes:
    """The batch, pickled; ParIterError naming the first item that cannot be."""
    try:
        return _dumps(batch)
    except Exception as error:
        index, culprit = _first_unpicklable(batch, error)
        raise ParIterError(
            f"par_iter item {index} cannot be sent to a Dask worker for stage {stage}: it "
            f"cannot be pickled ({type(culprit).__name__}: {culprit})", index=index,
            stage=stage) from culprit


def _first_unpicklable(batch: Batch, error: Exception) -> tuple[int, Exception]:
    for item, origin in zip(batch.items, batch.origins):
        try:
            _dumps(item)
        except Exception as culprit:  # noqa: BLE001  # reported with its item
            return origin, culprit
    return batch.origins[0], error


def failed_batch(batch: Batch, stage: str, error: BaseException) -> Batch:
    """``batch`` with every item replaced by its failure in ``stage`` (a task that failed as a
    whole: the batch's worker died too often, say)."""
    failures = {position: batch.failures.get(position) or ItemFailure(origin, stage, error)
                for position, origin in enumerate(batch.origins)}
    return Batch(list(failures.values()), batch.origins, failures)


@lru_cache(maxsize=LOADED_CHAINS)
def _loaded(steps: bytes) -> tuple[Callable[[Batch], Batch], str]:
    """The chain as one Batch -> Batch function, and the label of its last stage."""
    chain = pickle.loads(steps)
    return fuse([Step(kind, function.build() if isinstance(function, GpuRecipe) else function,
                      label) for kind, function, label in chain]), chain[-1][2]


def run_batch(steps: bytes, batch: bytes, forced: str | None) -> bytes:
    """The Dask task: the chain ``steps`` over ``batch`` under ``veda.force(forced)``, pickled
    with the seconds it took, as ``(Batch, seconds)``."""
    work, last_stage = _loaded(steps)
    items: Batch = pickle.loads(batch)
    token = forced_path.set(forced)
    try:
        started = time.perf_counter()
        result = work(items)
        seconds = time.perf_counter() - started
    finally:
        forced_path.reset(token)
    try:
        return _dumps((result, seconds))
    except Exception:  # noqa: BLE001  # some result or exception cannot travel: find which
        return _dumps((_sendable(result, last_stage), seconds))


def _sendable(batch: Batch, last_stage: str) -> Batch:
    """``batch`` with each item that cannot be pickled replaced by a failure saying so."""
    items: list[Any] = []
    failures = dict(batch.failures)
    for position, (item, origin) in enumerate(zip(batch.items, batch.origins)):
        try:
            _dumps(item)
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
