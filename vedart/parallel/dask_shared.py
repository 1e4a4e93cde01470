"""Batches of items handed to the workers of an embedded Dask cluster through shared memory.

A batch sent as a task argument is pickled by the client, carried through the scheduler and
over a socket to the worker: on one host, 64 matrices of 4 MB took 8x the time of the thread
scheduler that way (H200, 2026-11-24). The workers of a cluster this runtime started run on
this host, so a batch whose array buffers total ``SHARED_MIN_BYTES`` or more goes instead as
a :class:`SharedBatch`: the rest of it pickled (protocol 5), the buffers copied once into a
POSIX shared-memory segment, whose name travels with the task.

Lifetime: the client creates the segment when it submits the task and unlinks it when the
task's result arrived, failed or was cancelled (:meth:`Shipment.release`); a task Dask re-runs
after its worker died finds the segment still there. The worker maps the segment and rebuilds
the items around views of it (no copy); the mapping lives as long as any of those arrays, so a
result that is a view of its item stays valid after the client unlinked the name. A batch
that does not pickle with the standard pickler (a lambda among its items) or names something
of the caller's ``__main__`` (which cloudpickle sends by value and the standard pickler by a
name the worker cannot resolve), or one that would not fit in the free shared memory twice
over (writing past it is SIGBUS), is sent as before.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from vedart.parallel.batch import Batch
from vedart.parallel.device_workers import (
    decode,
    encode_for_worker,
    payload_bytes,
    shared_memory_free,
    write_buffers,
)

SHARED_MIN_BYTES = 1 << 20  # below, pickling the buffers costs less than a segment
SHM_DIRECTORY = "/dev/shm"  # where shm_open's segments appear (Linux)


@dataclass(frozen=True)
class SharedBatch:
    """What a task carries for a batch in shared memory: the segment's name, the batch
    pickled without its buffers, and each buffer's (start, size) in the segment."""

    name: str
    meta: bytes
    spans: list[tuple[int, int]]

    def load(self) -> Batch:
        """The batch, its arrays views of the mapped segment (in the worker)."""
        with open(os.path.join(SHM_DIRECTORY, self.name.lstrip("/")), "r+b") as segment:
            mapped = mmap.mmap(segment.fileno(), 0)
        batch: Batch = decode(self.meta, memoryview(mapped), self.spans)
        return batch


class Shipment:
    """The client's side of one :class:`SharedBatch`: the segment, until :meth:`release`."""

    def __init__(self, memory: SharedMemory, shared: SharedBatch) -> None:
        self.memory: SharedMemory | None = memory
        self.shared = shared

    def release(self) -> None:
        """Unlink the segment (the worker's mapping, if any, stays valid); idempotent."""
        memory, self.memory = self.memory, None
        if memory is not None:
            memory.close()
            memory.unlink()


def ship(batch: Batch) -> Shipment | None:
    """``batch`` in a new shared-memory segment, or None when it goes as a plain argument
    (see the module docstring)."""
    if not os.path.isdir(SHM_DIRECTORY):
        return None
    encoded = encode_for_worker(batch)  # None: it does not pickle, or it names __main__
    if encoded is None:
        return None
    meta, buffers = encoded
    size = payload_bytes(buffers)
    free = shared_memory_free()
    if size < SHARED_MIN_BYTES or free is None or free < 2 * size:
        return None
    memory = SharedMemory(create=True, size=size)
    try:
        spans = write_buffers(np.ndarray((size,), np.uint8, memory.buf), 0, buffers)
    except BaseException:
        memory.close()
        memory.unlink()
        raise
    return Shipment(memory, SharedBatch(memory.name, meta, spans))
