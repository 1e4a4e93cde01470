"""A device worker process's entry point (started by :mod:`vedart.parallel.device_workers`).

The worker runs its items through vedart's ordinary ``par_iter(...).gpu_map(f)`` on its one
device. par_iter starts the workers through device_workers, so the worker's side of that
module takes its pipeline as an argument, given here, in the layer above par_iter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from vedart.parallel.batch import Batch
from vedart.parallel.device_workers import worker_main
from vedart.parallel.par_iter import par_iter


def gpu_map_batches(items: Iterator[Any],
                    function: Callable[[Any], Any]) -> AbstractContextManager[Iterator[Batch]]:
    """``function`` over ``items`` through par_iter's gpu_map, as batches."""
    # One item per read: a larger chunk would wait for items the parent has not sent.
    return par_iter(items, chunk_size=1).gpu_map(function)._batches()


def main(handle: int) -> None:
    """The worker's life on socket ``handle`` (see device_workers.worker_main)."""
    worker_main(handle, gpu_map_batches)
