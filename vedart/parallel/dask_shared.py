"""Batches of items handed to the workers of an embedded Dask cluster through shared memory.

A batch sent as a task argument is pickled by the client, carried through the scheduler and
over a socket to the worker: on one host, 64 matrices of 4 MB took 7-8x the time of the thread
scheduler that way (H100 and H200, 2026-11-24). The workers of a ``LocalCluster`` (the
runtime's own, or the one a caller's client was made with) run on this host, so a batch whose array buffers total ``SHARED_MIN_BYTES`` or more goes
instead as a :class:`SharedBatch`: the rest of it pickled (protocol 5), the buffers copied
once into a span of the cluster's :class:`SharedRing`, a POSIX shared-memory segment whose
name travels with the task.

The ring is one segment per cluster for as long as the cluster lives (runtimes made with the
same client share it), its spans handed out in order: the client releases a batch's span when
its task's result has arrived, failed or was cancelled, and a span is reused once it and every
older one are released. A fresh segment per batch cost more than the copy itself: writing
96 MB into new shared pages took about 80 ms (page faults), against ~10 ms into pages already
there (H100, 2026-11-24). A task Dask re-runs after its worker died finds its span unchanged.
The worker maps the segment once (page-locked where it has a GPU) and rebuilds the items around
views of it where the chain sends them to a GPU (no copy; a result that is a view of its item
is pickled back when the task ends, before the span can be reused), and around a private copy
of the batch's span where the chain runs on the CPU: the client releases a cancelled task's
span at once, but Dask does not stop a task already running, and a function writing into its
items would write into the next batch given that span.

A batch that does not pickle with the standard pickler (a lambda among its items) or names
something of the caller's ``__main__`` (which cloudpickle sends by value and the standard
pickler by a name the worker cannot resolve), or one for which the ring has no room now, is
sent as before. No ring is made where ``/dev/shm`` is missing or has less than twice
``RING_BYTES`` free (writing past it is SIGBUS).
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
import threading
import weakref
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from vedart.gpu.transfer import TransferEngine, current_engine
from vedart.locks import renew_in_child
from vedart.parallel.batch import Batch
from vedart.parallel.byte_ring import ByteRing, aligned
from vedart.parallel.device_workers import (
    buffer_address,
    decode,
    encode_for_worker,
    payload_bytes,
    shared_memory_free,
    write_buffers,
)

SHARED_MIN_BYTES = 1 << 20   # below, pickling the buffers costs less than a copy into the ring
RING_BYTES = 512 << 20       # the window of in-flight batches of 4 MB matrices, with room
SHM_DIRECTORY = "/dev/shm"   # where shm_open's segments appear (Linux)
MAPPED_RINGS = 4             # segments a worker keeps mapped (one per cluster that used it)
COPY_THREADS = 4             # threads copying a batch's buffers into the ring

_mapped: OrderedDict[str, memoryview] = OrderedDict()  # in a worker: ring name -> its mapping
# In a worker: ring name -> the transfer engine that page-locked it (it unlocks at its close).
_registered_by: weakref.WeakValueDictionary[str, TransferEngine] = weakref.WeakValueDictionary()
_mapped_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_mapped_lock")


@dataclass(frozen=True)
class SharedBatch:
    """What a task carries for a batch in the ring: the segment's name, the batch pickled
    without its buffers, and each buffer's (start, size) in the segment."""

    name: str
    meta: bytes
    spans: list[tuple[int, int]]

    def load(self, private: bool = False) -> Batch:
        """The batch, its arrays views of the mapped segment (in the worker), or with
        ``private`` of a copy of the batch's part of it: a task the client cancelled may still
        be running when its span is reused, and a function that writes into its items would
        then write into another batch's."""
        mapping = _mapping(self.name)
        if not private or not self.spans:
            return decode(self.meta, mapping, self.spans)  # type: ignore[no-any-return]
        start = min(begin for begin, _ in self.spans)
        end = max(begin + size for begin, size in self.spans)
        copied = np.empty(end - start, dtype=np.uint8)  # aligned as numpy allocates
        copied[:] = np.frombuffer(mapping, dtype=np.uint8, count=end - start, offset=start)
        batch: Batch = decode(self.meta, memoryview(copied),
                              [(begin - start, size) for begin, size in self.spans])
        return batch


def _mapping(name: str) -> memoryview:
    """Segment ``name`` mapped into this process, once, and page-locked by the current
    runtime's transfer engine, if it has a GPU, so that items go to the device in one copy
    each, never staged; the oldest of more than ``MAPPED_RINGS`` is dropped (unmapped when no
    array views it any more)."""
    with _mapped_lock:
        view = _mapped.get(name)
        if view is None:
            with open(os.path.join(SHM_DIRECTORY, name.lstrip("/")), "r+b") as segment:
                view = _mapped[name] = memoryview(mmap.mmap(segment.fileno(), 0))
            while len(_mapped) > MAPPED_RINGS:
                _mapped.popitem(last=False)
        _mapped.move_to_end(name)
        engine = current_engine()
        if engine is not None and _registered_by.get(name) is not engine:
            # The client writes a span again only after the task that read it has returned,
            # when its uploads are done (as the engine requires of registered memory).
            engine.register_host(buffer_address(view), len(view))
            _registered_by[name] = engine
        return view


class SharedRing:
    """The client's ring for one cluster (see the module docstring). Thread-safe: pipelines
    running at once share it, each releasing its own spans; a span is freed once it and every
    span shipped before it are released."""

    def __init__(self, memory: SharedMemory) -> None:
        self._memory: SharedMemory | None = memory
        self._bytes: np.ndarray | None = np.ndarray((memory.size,), np.uint8, memory.buf)
        self._ring = ByteRing(memory.size)
        self._lock = threading.Lock()
        self._tickets = itertools.count()
        self._held: deque[int] = deque()  # tickets of the spans in the ring, oldest first
        self._released: set[int] = set()  # tickets released while an older one is held
        self._copiers = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="vedart-ring-copy")

    @classmethod
    def create(cls) -> SharedRing | None:
        """A new ring, or None where shared memory is missing or short."""
        free = shared_memory_free() if os.path.isdir(SHM_DIRECTORY) else None
        if free is None or free < 2 * RING_BYTES:
            return None
        return cls(SharedMemory(create=True, size=RING_BYTES))

    def ship(self, batch: Batch) -> tuple[SharedBatch, int] | None:
        """``batch`` copied into the next span and the ticket to :meth:`release` it with once
        its task is over, or None when it goes as a task argument."""
        encoded = encode_for_worker(batch)  # None: it does not pickle, or it names __main__
        if encoded is None:
            return None
        meta, buffers = encoded
        size = payload_bytes(buffers)
        with self._lock:
            ring, memory = self._bytes, self._memory
            if ring is None or memory is None or size < SHARED_MIN_BYTES \
                    or not self._ring.fits(size):
                return None
            offset = self._ring.allocate(size)
            if offset is None:
                return None
            ticket = next(self._tickets)
            self._held.append(ticket)
        # Outside the lock (the span is ours), a buffer per copying thread: one thread copied
        # 48 MB of matrices in about 15 ms, longer than the worker took to compute on them
        # (H100, 2026-11-24).
        offsets = itertools.accumulate((aligned(buffer.nbytes) for buffer in buffers[:-1]),
                                       initial=offset)
        spans = [span for written in self._copiers.map(
            lambda start, buffer: write_buffers(ring, start, [buffer]), offsets, buffers)
            for span in written]
        return SharedBatch(memory.name, meta, spans), ticket

    def release(self, ticket: int) -> None:
        """Release the span of ``ticket``; free every released span at the ring's oldest end."""
        with self._lock:
            self._released.add(ticket)
            while self._held and self._held[0] in self._released:
                self._released.discard(self._held.popleft())
                self._ring.release()

    def close(self) -> None:
        """Unlink the segment (workers' mappings stay valid until they drop them)."""
        with self._lock:
            memory, self._memory, self._bytes = self._memory, None, None
        self._copiers.shutdown(wait=True)
        if memory is not None:
            try:
                memory.close()
            except BufferError:  # a copy into it still under way: unmapped at exit instead
                pass
            memory.unlink()
