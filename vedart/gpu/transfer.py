"""Host <-> device transfers: the one code path every part of vedart moves arrays through.

Measured on an H100 80GB HBM3 (2026-11-22): ``cupy.asarray`` from pageable memory runs at 6-9 GB/s
and ``.get()`` at 3-11 GB/s, while pinned memory reaches 54 GB/s both ways. So:

- host -> device: arrays of at least ``Tuning.pool_from`` bytes go through a staging ring:
  the calling thread and the ring's crew of threads each copy pieces of the array into their
  own pinned slots (with non-temporal stores below ``Tuning.nontemporal_below``) and queue the
  copies from those slots to the device, in a compiled loop that runs without the interpreter
  lock (:mod:`vedart.gpu.staging_loop`). Each slot has a CUDA event, and a slot is refilled
  only after the copy out of it has completed. The loop is loaded in the background from the
  creation of a runtime with a GPU, or else from first use (:class:`LoopLoader`); until then
  such arrays go through four pinned slots on the calling thread (:mod:`vedart.gpu.bounce`),
  which the runtime pins first, or direct where it has none. Smaller arrays go direct
  (``cupy.asarray``): from 1.5 to 12 MB, staging them through a ring on the calling thread
  measured 0.95-1.05x its speed on the H100. A caller that holds a list until its stream has
  been waited for (a @gpu call, ``upload(value, keep)``) has them copied into pooled pinned
  memory instead and sent by one asynchronous copy: what ``cupy.asarray`` does through CuPy's
  pinned pool, in fewer steps (16 KB: 23.5 against 30.7 us; 94.8 against 141.6 us after a
  NumPy pass over 64 MB; H100, 2026-11-27).
- host -> device, staged ahead: :meth:`TransferEngine.stage` copies a mid-size array (from
  ``Tuning.stage_from`` up to ``Tuning.pool_from``) into pooled pinned memory on one of the
  staging threads, ahead of time, and :meth:`TransferEngine.upload` later sends it to the
  device with one asynchronous copy. par_iter's GPU lanes stage the next items this way while
  the current ones compute, so the lane thread does not copy mid-size inputs itself.
- device -> host: results land in pooled pinned memory by one asynchronous copy, and are handed
  out as ordinary ``numpy.ndarray`` objects (the memory returns to the pool when they are
  garbage-collected), up to ``Config.pinned_memory_limit``; past it, ``.get()`` copies them
  into pageable memory.

Every dtype CuPy supports round-trips byte-exactly; C- and Fortran-ordered arrays keep their
order; other layouts are made C-contiguous; non-native byte order is converted on the way in.
The caller's array is only ever read. Concurrent transfers each take their own staging ring
(one per device and transfer in flight), so threads and devices never share a buffer.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from vedart import lifecycle
from vedart.gpu.bounce import SWITCH_INTERVAL, BounceBuffers, CupySide, pinned_slots
from vedart.gpu.pinned import PinnedPool
from vedart.locks import renew_in_child
from vedart.tasks import Task, TaskThreads, at_thread_exit

if TYPE_CHECKING:
    from vedart.gpu.staging_loop import DriverCalls

MIB = 2**20
RING_MADE_WITHIN_S = 5.0  # how long a copy waits for the ring prepare() is making (26-56 ms)
HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable (CuPy names no constant for it)
# The interpreter's switch interval while the loop loads. Loading releases the interpreter lock
# thousands of times (each file an import reads, the compiler's calls) and takes it back each
# time only after the interval while the caller's thread runs Python: with the default 5 ms, a
# caller looping in Python kept the loop from loading for 12-30 s and more, cache or not; with
# 0.1 ms it was ready 2.5-2.9 s after the import, against 2.1-2.3 s beside an idle caller
# (H100 80GB HBM3, 2026-11-27). The interval is the process's: for those seconds any thread
# waiting for the lock takes it after 0.1 ms, the program's own threads among them.
LOADING_SWITCH_S = 100e-6
T = TypeVar("T")


def default_workers() -> int:
    """Workers per transfer unless told: 12, or fewer where this process may run on fewer CPUs
    (more workers than CPUs only take turns)."""
    return min(12, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


@dataclass(frozen=True)
class Tuning:
    """Transfer parameters, chosen on an H100 80GB HBM3 (2026-11-23: pieces growing from
    128 KiB to 1 MiB, 2 slots per worker and 12 workers; the measurements are in the git
    history of docs/performance.md)."""

    stage_from: int = 1 * MIB          # stage() copies arrays ahead from this size
    pinned_result_from: int = 64 * 1024  # device -> host: from this size results are pinned
    pool_from: int = 16 * MIB         # to_device: the staging ring from here, cupy.asarray below
    piece_bytes: int = 1 * MIB        # the most one worker copies and sends in one step
    min_piece_bytes: int = 128 * 1024  # the first pieces, so the first copy starts early
    nontemporal_below: int = 256 * MIB  # arrays below this are staged with non-temporal stores
    slots: int = 2                    # pinned slots of piece_bytes per worker
    threads: int = field(default_factory=default_workers)  # per transfer: caller and crew

    def __post_init__(self) -> None:
        for name in ("pool_from", "piece_bytes", "min_piece_bytes", "slots", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"Tuning.{name}: got {getattr(self, name)}; allowed: >= 1")
        if self.min_piece_bytes > self.piece_bytes:  # a first piece would overflow its slot
            raise ValueError(f"Tuning.min_piece_bytes: got {self.min_piece_bytes}; allowed: at "
                             f"most piece_bytes ({self.piece_bytes})")


def native_byte_order(array: np.ndarray) -> np.ndarray:
    """``array``, or a native-byte-order copy of it (CuPy only handles native order)."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def contiguous_layout(array: Any) -> str | None:
    """"C" or "F" when ``array`` (NumPy or CuPy) is contiguous in that order, else None."""
    if array.flags.c_contiguous:
        return "C"
    if array.flags.f_contiguous:
        return "F"
    return None


@dataclass(frozen=True, eq=False)
class Staged:
    """A host array's contents in pinned memory (native byte order, C or Fortran order), ready
    for :meth:`TransferEngine.upload`. The pinned block returns to the pool when this object
    is dropped: keep it until the upload has completed (its stream synchronised)."""

    pinned: np.ndarray


class StagingRing:
    """Pinned slots for one device's transfers: ``tuning.slots`` blocks of
    ``tuning.piece_bytes`` per worker, each with a CUDA event, a stream the pieces are sent on,
    the device's CUDA context, and the crew of ``tuning.threads - 1`` threads that send them
    with the calling thread (:class:`vedart.gpu.staging_loop.Crew`). Serves one transfer at a
    time."""

    def __init__(self, pinned: PinnedPool, device: int, tuning: Tuning,
                 driver: DriverCalls) -> None:
        import cupy

        from vedart.gpu.staging_loop import Crew

        self.device = device
        self.blocks: list[Any] = []
        self.crew: Crew | None = None
        try:
            for _ in range(tuning.threads * tuning.slots):
                block = pinned.take(tuning.piece_bytes)
                if block is None:
                    raise MemoryError("pinned memory limit reached")
                self.blocks.append(block)
            with cupy.cuda.Device(device):
                self.events = [cupy.cuda.Event(disable_timing=True) for _ in self.blocks]
                self.stream = cupy.cuda.Stream(non_blocking=True)
                # Made current by creating the events. The thread of a later transfer may have
                # none current yet: CUDA binds a context to a thread only when that thread
                # first needs one.
                self.context = driver.current_context()
            addresses = np.array([block.ptr for block in self.blocks], dtype=np.int64)
            events = np.array([event.ptr for event in self.events], dtype=np.int64)
            count = tuning.slots
            # (slot addresses, slot events) of each worker
            self.crew = Crew([(addresses[start:start + count], events[start:start + count])
                              for start in range(0, len(self.blocks), count)],
                             driver.addresses)
        except BaseException:
            self.release_to(pinned)
            raise

    def release_to(self, pinned: PinnedPool) -> None:
        """Stop the crew and give the slots back (no transfer may be running)."""
        if self.crew is not None:
            self.crew.close()
        for block in self.blocks:
            pinned.give_back(block)
        self.blocks = []


class LoopLoader:
    """Loads the compiled staging loop (:mod:`vedart.gpu.staging_loop`) on a background thread,
    so that no transfer waits for it: on an H100 80GB HBM3 (2026-11-23) importing Numba and reading
    the loop from its cache took 0.84 s, and compiling it 2.2 s, against 2.5 ms for the 64 MB
    copy it serves. A runtime with a GPU starts the loading when it is created
    (:class:`vedart.gpu.context.GPUContext`); otherwise the first array that would be staged
    starts it. Until it is loaded, and where it cannot be (no Numba, no CUDA driver library),
    such arrays go through the bounce slots :meth:`TransferEngine.prepare` pins, or direct
    where there are none. Thread-safe."""

    def __init__(self, load: Callable[[], DriverCalls | None]) -> None:
        self._load = load
        self.forget()

    def forget(self) -> None:
        """Start afresh, as if never loaded: in a forked child, whose copy of a loading thread
        does not exist and would never say it has ended."""
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._thread: threading.Thread | None = None
        self._calls: DriverCalls | None = None
        self._began: float | None = None  # time.perf_counter() when the loading began
        self._ended: float | None = None  # and when it ended (loaded or given up)

    def calls(self) -> DriverCalls | None:
        """The loop's C calls once it is loaded; None before that (the first call starts the
        loading) or where it could not be loaded."""
        if self._loaded.is_set():
            return self._calls
        self.start()
        return None

    def loaded(self) -> bool:
        """Whether the loading has ended (loaded, or given up); starts nothing."""
        return self._loaded.is_set()

    def wait(self, timeout: float | None = None) -> DriverCalls | None:
        """:meth:`calls`, after starting the loading if need be and waiting up to ``timeout``
        seconds (None: until it ends) for it. Benchmarks wait so that they time the loop."""
        self.start()
        self._loaded.wait(timeout)
        return self._calls if self._loaded.is_set() else None

    def start(self) -> None:
        """Begin loading on a background thread, unless begun already; returns at once."""
        with self._lock:
            if self._thread is not None:
                return
            self._began = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="vedart-loop-loader",
                                            daemon=True)
            try:
                self._thread.start()
            except RuntimeError as error:  # no thread to be had (a process limit, exiting)
                _warn_not_loaded(error)
                self._finish()

    def loading_within(self, seconds: float = 0.0) -> bool:
        """Whether the loop is loading now, or was at any moment of the last ``seconds``
        seconds: a GPU call timed over that span may have sent large arrays direct, at a third
        of the loop's speed or less, so its time is not what the GPU path costs."""
        began, ended = self._began, self._ended
        if began is None:
            return False
        return ended is None or time.perf_counter() - ended < seconds

    def _run(self) -> None:
        try:
            with SWITCH_INTERVAL.lowered(LOADING_SWITCH_S):
                self._calls = self._load()
        except Exception as error:
            _warn_not_loaded(error)
        finally:
            self._finish()

    def _finish(self) -> None:
        self._ended = time.perf_counter()
        self._loaded.set()


def _warn_not_loaded(error: BaseException) -> None:
    """Copies still work without the loop, only slower: say so, never raise."""
    warnings.warn(f"vedart: the compiled staging loop could not be loaded ({error!r}); "
                  "large host-to-device copies use cupy.asarray", RuntimeWarning, stacklevel=1)


def _load_staging_loop() -> DriverCalls | None:
    """:func:`vedart.gpu.staging_loop.load`, after CuPy's error modes; None without Numba
    (large arrays then go direct). Every GPU call sets those modes
    (:mod:`vedart.offload.linalg_status`), and importing them imports all of ``cupyx``, SciPy's
    sparse matrices among it: in a fresh process's first GPU call, beside Numba's import here,
    that took the call 0.6-0.8 s (H100, 2026-11-27); imported here first, before Numba, a call
    made a moment after ``init`` waits for what is left of it."""
    try:
        import cupyx._ufunc_config  # noqa: F401
    except Exception:  # the GPU call that needs them imports them again and reports the error
        pass
    try:
        from vedart.gpu.staging_loop import load
    except ImportError:
        return None
    return load()


STAGING_LOOP = LoopLoader(_load_staging_loop)  # one per process: what it loads is process-wide
os.register_at_fork(after_in_child=STAGING_LOOP.forget)


class _RingMaking:
    """Rings made ahead (:meth:`TransferEngine.prepare`) are made one at a time, and none once
    the interpreter exits: exit waits (up to ``RING_MADE_WITHIN_S``) for the one being made, so
    that no thread is inside CUDA calls while CUDA shuts down."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        renew_in_child(self, "lock")  # a child forked while a ring was being made
        self.exiting = False
        at_thread_exit(self._exit)

    def _exit(self) -> None:
        self.exiting = True  # makers read it holding the lock: wait for the one that holds it
        if self.lock.acquire(timeout=RING_MADE_WITHIN_S):
            self.lock.release()


RING_MAKING = _RingMaking()


def _closed_error() -> RuntimeError:
    return RuntimeError("the transfer engine is closed (its runtime shut down)")


class TransferEngine:
    """Moves arrays between host and devices (see the module docstring). Thread-safe."""

    def __init__(self, pinned_limit: int, tuning: Tuning | None = None,
                 loop: LoopLoader = STAGING_LOOP) -> None:
        self.tuning = tuning or Tuning()
        self.loop = loop
        self.pinned = PinnedPool(pinned_limit)
        self._lock = threading.Lock()
        self._idle_rings: dict[int, list[StagingRing]] = defaultdict(list)
        self._staging_threads: TaskThreads | None = None
        self._closed = False
        self._registered: list[tuple[int, int]] = []  # [start, end) of register_host ranges
        self._preparing: dict[int, threading.Event] = {}  # device -> set once its ring is made
        # Pinned slots large arrays go through while the loop loads (made by prepare()).
        self._bounce: dict[int, BounceBuffers] = {}

    def _fill_pool(self) -> TaskThreads:
        """The staging threads (started on first use); RuntimeError once closed."""
        with self._lock:
            if self._closed:
                raise _closed_error()
            if self._staging_threads is None:
                self._staging_threads = TaskThreads(self.tuning.threads, "vedart-staging",
                                                    finish_at_exit=True)
            return self._staging_threads

    def prepare(self, device: int) -> None:
        """Make ready, on a background thread, what the first copy of a large array to
        ``device`` needs: start loading the compiled loop; pin the slots that large arrays go
        through until it is loaded (:mod:`vedart.gpu.bounce`); once it is loaded, make a
        staging ring for ``device``, keep it idle and give the slots back. A new ring's pinned
        slots and crew took 26-56 ms on the H100, more than :meth:`to_device` takes to send
        64 MB through it. A copy that needs a ring of ``device`` while it is being made waits
        for it rather than make a second. Returns at once; :meth:`wait_prepared` waits."""
        self.loop.start()
        with self._lock:
            if self._closed or device in self._preparing:
                return
            made = self._preparing[device] = threading.Event()
        maker = threading.Thread(target=self._prepare_ring, args=(device, made),
                                 name="vedart-ring-maker", daemon=True)
        try:
            maker.start()
        except RuntimeError:  # no thread to be had: the first large copy makes its ring
            self._prepared(device, made)

    def _prepare_ring(self, device: int, made: threading.Event) -> None:
        try:
            if not self.loop.loaded():
                self._make_bounce(device)
            driver = self.loop.wait()
            with RING_MAKING.lock:
                if driver is None or self._closed or RING_MAKING.exiting:
                    return
                ring = self._new_ring(device, driver)
            if ring is not None:
                self._return_ring(ring)
                self._drop_bounce(device)
        except Exception as error:  # nothing is lost: the first large copy makes its own
            if not self._closed:
                warnings.warn(f"vedart: no staging ring made ahead ({error!r}); the first "
                              "large host-to-device copy makes one", RuntimeWarning,
                              stacklevel=1)
        finally:
            self._prepared(device, made)

    def _make_bounce(self, device: int) -> None:
        """Pin the bounce slots of ``device`` (none when the pinned limit leaves too little)."""
        import cupy

        with RING_MAKING.lock:
            if self._closed or RING_MAKING.exiting:
                return
            try:
                slots = pinned_slots(self.pinned.array)
                if slots is None:
                    return
                with cupy.cuda.Device(device):
                    bounce = BounceBuffers(slots, CupySide(len(slots)))
            except Exception:  # large arrays then go direct until the loop loads, as before
                return
        with self._lock:
            if not self._closed:
                self._bounce[device] = bounce

    def _drop_bounce(self, device: int | None = None) -> None:
        """Give back the bounce slots of ``device`` (None: of every device) once no copy runs
        out of them (their arrays return to the pinned pool when collected)."""
        with self._lock:
            dropped = [self._bounce.pop(ordinal) for ordinal in list(self._bounce)
                       if device is None or ordinal == device]
        for bounce in dropped:
            bounce.retire()

    def _bounced(self, array: np.ndarray) -> Any:
        """A CuPy copy of the contiguous ``array`` through the current device's bounce slots,
        ordered on the current stream; ``cupy.asarray`` where there are none, while another
        copy uses them, or for other layouts."""
        import cupy

        bounce = self._bounce.get(cupy.cuda.Device().id)
        layout = contiguous_layout(array)
        if bounce is None or layout is None:
            return cupy.asarray(array)
        target = cupy.empty(array.shape, array.dtype, order=layout)
        if not bounce.try_copy(target.data.ptr, array):
            return cupy.asarray(array)
        return target

    def has_idle_ring(self, device: int) -> bool:
        """Whether a staging ring of ``device`` is made and idle (benchmarks report it)."""
        with self._lock:
            return bool(self._idle_rings.get(device))

    def _prepared(self, device: int, made: threading.Event) -> None:
        with self._lock:
            self._preparing.pop(device, None)
        made.set()

    def wait_prepared(self, timeout: float | None = None) -> None:
        """Wait until the rings :meth:`prepare` began are made (up to ``timeout`` seconds for
        each; None: however long it takes)."""
        with self._lock:
            pending = list(self._preparing.values())
        for made in pending:
            made.wait(timeout)

    def _take_ring(self, device: int, driver: DriverCalls) -> StagingRing | None:
        """An idle ring of ``device`` (the one :meth:`prepare` is making, once made), or a new
        one; None when the pinned limit or the crew's threads leave none to be had.
        RuntimeError once the engine is closed."""
        with self._lock:
            if self._closed:
                raise _closed_error()
            being_made = self._preparing.get(device)
        if being_made is not None:
            being_made.wait(RING_MADE_WITHIN_S)
        with self._lock:
            if self._closed:
                raise _closed_error()
            if self._idle_rings[device]:
                return self._idle_rings[device].pop()
        return self._new_ring(device, driver)

    def _new_ring(self, device: int, driver: DriverCalls) -> StagingRing | None:
        """A new ring of ``device``; None when the pinned limit or the crew's threads leave none
        to be had."""
        from vedart.gpu.staging_loop import CrewUnavailable

        try:
            return StagingRing(self.pinned, device, self.tuning, driver)
        except MemoryError:  # the pinned limit
            return None
        except CrewUnavailable as error:
            warnings.warn(f"vedart: no staging crew ({error}); large host-to-device copies use "
                          "cupy.asarray", RuntimeWarning, stacklevel=4)
            return None

    def _return_ring(self, ring: StagingRing) -> None:
        """Keep ``ring`` for the next transfer, after stopping a transfer it was left with
        (something failed between its start and its finish); release it if the engine closed
        meanwhile."""
        assert ring.crew is not None
        ring.crew.cancel()
        with self._lock:
            if not self._closed:
                self._idle_rings[ring.device].append(ring)
                return
        self._release(ring)

    def _release(self, ring: StagingRing) -> None:
        """Stop ``ring``'s crew and give its slots back once the copies out of them are done."""
        for event in ring.events:
            event.synchronize()
        ring.release_to(self.pinned)

    def register_host(self, address: int, nbytes: int) -> None:
        """Page-lock ``nbytes`` of host memory at ``address``, which the caller owns and keeps
        until :meth:`close` (a worker process's shared input ring): arrays inside it go to the
        device in one asynchronous copy, never staged. The caller must not change such an
        array before the stream its upload was ordered on has been synchronised."""
        import cupy

        cupy.cuda.runtime.hostRegister(address, nbytes, HOST_REGISTER_PORTABLE)
        with self._lock:
            self._registered.append((address, address + nbytes))

    def _in_registered(self, array: np.ndarray) -> bool:
        if not self._registered:
            return False
        start = array.__array_interface__["data"][0]
        return any(low <= start and start + array.nbytes <= high
                   for low, high in self._registered)

    def to_device(self, array: np.ndarray) -> Any:
        """A CuPy copy of ``array`` on the current device, ordered on the current stream."""
        import cupy

        if not array.dtype.isnative:
            array = native_byte_order(array)
        if self._registered and self._in_registered(array) and \
                (layout := contiguous_layout(array)) is not None:
            target = cupy.empty(array.shape, array.dtype, order=layout)
            cupy.cuda.runtime.memcpyAsync(target.data.ptr, array.ctypes.data, array.nbytes,
                                          cupy.cuda.runtime.memcpyHostToDevice,
                                          cupy.cuda.get_current_stream().ptr)
            return target
        if array.nbytes < self.tuning.pool_from:
            return cupy.asarray(array)
        driver = self.loop.calls()
        if driver is None:  # no compiled loop (yet)
            return self._bounced(array)
        ring = None
        try:  # taking the ring inside, so that no interrupt can come between taking and keeping
            ring = self._take_ring(cupy.cuda.Device().id, driver)
            if ring is None:  # none to be had
                return cupy.asarray(array)
            layout = contiguous_layout(array)
            if layout is None:
                array, layout = np.ascontiguousarray(array), "C"
            return self._send(ring, driver, array, layout)
        finally:
            if ring is not None:
                self._return_ring(ring)

    def stages(self, array: np.ndarray) -> bool:
        """Whether :meth:`stage` would copy ``array`` ahead (a mid-size array outside
        :meth:`register_host` memory; smaller ones go direct and larger ones stream through
        the staging ring at upload)."""
        return (self.tuning.stage_from <= array.nbytes < self.tuning.pool_from
                and not self._in_registered(array))

    def stage(self, array: np.ndarray) -> Staged | np.ndarray:
        """A pinned copy of ``array`` when :meth:`stages` says so and the pinned limit allows,
        else ``array`` itself (:meth:`upload` moves either). Blocking; NumPy releases the GIL
        while it copies. The caller's array is only read."""
        if not self.stages(array):
            return array
        return self._pinned_copy(array) or array

    def _pinned_copy(self, array: np.ndarray) -> Staged | None:
        """``array`` copied into pooled pinned memory (None past the pinned limit)."""
        pinned = self.pinned.array(array.shape, array.dtype.newbyteorder("="),
                                   order=contiguous_layout(array) or "C")
        if pinned is None:
            return None
        np.copyto(pinned, array, casting="equiv")  # any layout, any byte order
        return Staged(pinned)

    def submit_staging(self, work: Callable[[], T]) -> Task[T]:
        """Run ``work`` (typically :meth:`stage` calls) on the staging threads; a thread that
        waits for the task's result while it is still queued runs it itself. RuntimeError
        once the engine is closed, also when it closed meanwhile."""
        queued = self._fill_pool().submit(Task(work))
        if queued.is_cancelled():
            raise _closed_error()
        return queued

    def upload(self, value: Staged | np.ndarray, keep: list[Staged] | None = None) -> Any:
        """A CuPy copy, on the current device and ordered on the current stream, of a
        :meth:`stage` result: one asynchronous copy for a Staged (keep it alive until the stream
        has been synchronised), :meth:`to_device` for an array. ``keep``: a list the caller
        holds until the current stream has been synchronised; a non-empty array below
        ``Tuning.pool_from`` (outside :meth:`register_host` memory) is then copied into pooled
        pinned memory, kept there as a Staged, and sent by one asynchronous copy: what
        ``cupy.asarray`` does through CuPy's own pinned pool, with fewer steps per array (see
        the module docstring); past the pinned limit it goes through :meth:`to_device`."""
        if not isinstance(value, Staged):
            if keep is None or not 0 < value.nbytes < self.tuning.pool_from or \
                    self._in_registered(value):
                return self.to_device(value)
            staged = self._pinned_copy(value)
            if staged is None:  # the pinned limit
                return self.to_device(value)
            keep.append(staged)  # before the copy is queued: no interrupt can drop it between
            value = staged
        import cupy

        pinned = value.pinned
        target = cupy.empty(pinned.shape, pinned.dtype, order=contiguous_layout(pinned) or "C")
        cupy.cuda.runtime.memcpyAsync(target.data.ptr, pinned.ctypes.data, pinned.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice,
                                      cupy.cuda.get_current_stream().ptr)
        return target

    def _send(self, ring: StagingRing, driver: DriverCalls, source: np.ndarray,
              layout: str) -> Any:
        """A CuPy copy, in ``layout`` order, of the ``layout``-contiguous ``source``, sent
        through ``ring`` and ordered on the current stream: the calling thread and up to
        ``tuning.threads - 1`` of the ring's crew each run the compiled loop of
        :mod:`vedart.gpu.staging_loop` on their own slots. The crew is woken first, so it
        fills its slots while this thread allocates the copy; if that fails, the crew is still
        under way, and returning the ring stops it (:meth:`_return_ring`). Raises the first
        failing CUDA call's error once every worker has stopped; the ring stays usable."""
        import cupy

        assert ring.crew is not None
        tuning, nbytes = self.tuning, source.nbytes
        ring.crew.start(nbytes, tuning.piece_bytes, tuning.min_piece_bytes,
                        nbytes < tuning.nontemporal_below, source.ctypes.data, ring.stream.ptr,
                        ring.context, driver.addresses,
                        min(tuning.threads, -(-nbytes // tuning.piece_bytes)))
        target = cupy.empty(source.shape, source.dtype, order=layout)
        current = cupy.cuda.get_current_stream()
        # The target may reuse memory that work queued on the current stream still uses.
        ring.stream.wait_event(current.record())
        try:
            status = ring.crew.finish(target.data.ptr)
        finally:
            # Until the pieces have landed, the target must not be freed or read.
            current.wait_event(ring.stream.record())
        if status:
            raise driver.error(status)
        return target

    def to_host(self, array: Any) -> np.ndarray:
        """A NumPy copy of the CuPy ``array``: pinned (pooled) when large enough and within the
        pinned limit, pageable otherwise. Synchronises the current stream of the array's
        device, whichever device is current."""
        import cupy

        if array.nbytes < self.tuning.pinned_result_from:
            device = array.data.device_id
            if device == cupy.cuda.runtime.getDevice():
                return array.get(order="A")  # "A": a Fortran-ordered array stays so
            # get() copies on the current device's current stream (CuPy 14.2), not on the
            # array's device's, which its work was ordered on.
            with cupy.cuda.Device(device):
                return array.get(stream=cupy.cuda.get_current_stream(), order="A")
        with array.device:
            layout = contiguous_layout(array)
            if layout is None:
                array, layout = cupy.ascontiguousarray(array), "C"
            result = self.pinned.array(array.shape, array.dtype, order=layout)
            if result is None:
                return array.get(order="A")
            stream = cupy.cuda.get_current_stream()
            try:
                cupy.cuda.runtime.memcpyAsync(result.ctypes.data, array.data.ptr, array.nbytes,
                                              cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
                stream.synchronize()
            except BaseException:
                # An interrupt between the two calls would drop ``result``, and its block
                # would go back to the pool with the copy into it still running.
                with contextlib.suppress(Exception):
                    stream.synchronize()
                raise
        return result

    def stats(self) -> dict[str, float]:
        return {"pinned_used_mb": self.pinned.used_bytes / MIB,
                "pinned_cached_mb": self.pinned.cached_bytes / MIB}

    def empty_cache(self) -> None:
        """Free idle staging rings and cached pinned blocks."""
        with self._lock:
            rings = [ring for idle in self._idle_rings.values() for ring in idle]
            self._idle_rings.clear()
        for ring in rings:
            self._release(ring)
        self.pinned.empty_cache()

    def close(self) -> None:
        """Stop the staging threads and the idle rings' crews, and free pinned memory not held
        by result arrays (those free theirs when they go); a transfer still running releases
        its ring when it ends, and so does a ring :meth:`prepare` is making, once made. Later
        transfers of arrays the ring would take raise RuntimeError, and later results are
        pageable."""
        with self._lock:
            threads, self._staging_threads, self._closed = self._staging_threads, None, True
        if threads is not None:
            threads.close(cancel_queued=False)
            threads.join()
        self._drop_bounce()
        self.empty_cache()
        self.pinned.close()
        with self._lock:
            registered, self._registered = self._registered, []
        if registered:
            import cupy

            for address, _ in registered:
                cupy.cuda.runtime.hostUnregister(address)


def current_engine() -> TransferEngine | None:
    """The current runtime's transfer engine, or None without a usable GPU."""
    runtime = lifecycle.current
    gpu = None if runtime is None else runtime.gpu
    return gpu.transfers if gpu is not None and gpu.unavailable_reason is None else None


def to_device(array: np.ndarray) -> Any:
    """A CuPy copy of ``array`` on the current device (through the current runtime's engine;
    a plain ``cupy.asarray`` when no runtime manages a GPU). The caller's array is never
    modified."""
    engine = current_engine()
    if engine is not None:
        return engine.to_device(array)
    import cupy

    return cupy.asarray(native_byte_order(array))


def staging_loop_loading(host_bytes: int, within_s: float) -> bool:
    """Whether a GPU call that moved ``host_bytes`` bytes of host arrays to the device, timed
    over the last ``within_s`` seconds, may have copied one of them direct because the current
    runtime's staging loop was loading (:meth:`LoopLoader.loading_within`; calls below the
    staging cutoff never use the loop). Such a time is no measure of the GPU path: the adaptive
    model does not learn it. False when no runtime manages a GPU."""
    engine = current_engine()
    return (engine is not None and host_bytes >= engine.tuning.pool_from
            and engine.loop.loading_within(within_s))


def upload(value: Staged | np.ndarray, keep: list[Staged] | None = None) -> Any:
    """:meth:`TransferEngine.upload` through the current runtime's engine (a plain copy when
    no runtime manages a GPU, which leaves ``keep`` as it is)."""
    engine = current_engine()
    if engine is not None:
        return engine.upload(value, keep)
    return to_device(value.pinned if isinstance(value, Staged) else value)


def to_host(array: Any) -> np.ndarray:
    """A NumPy copy of the CuPy ``array`` (synchronous with the current stream)."""
    engine = current_engine()
    return array.get() if engine is None else engine.to_host(array)
