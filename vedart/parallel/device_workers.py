"""One worker process per GPU, for a ``gpu_map`` over several devices.

In one process every lane thread shares the interpreter lock with the others and with the
staging threads, so on the H200x2 two GPUs ran a gpu_map at 0.81-0.89x the speed of one.
Here each device gets a process of its own (a fresh interpreter started with ``subprocess`` on
first use and kept until the runtime shuts down; not ``multiprocessing``, whose spawn re-runs
the caller's main script in the child), running vedart's ordinary ``gpu_map`` on that one
device. Its function travels by reference, so it must be importable by the worker: a function
of the main script (``__main__``) is not, and such a gpu_map keeps its lanes in-process.

Items travel through a shared-memory input ring per device (:class:`ByteRing` spans, the
worker having page-locked the ring with ``cudaHostRegister``): the parent pickles an item with
protocol 5, copies its array buffers into the ring on the transfer engine's staging threads
and sends the small rest through a pipe; the worker rebuilds the item around views of the
ring and uploads its arrays straight from there. Results come back pickled through the pipe,
with where the item ran. The parent copies each input once, as in-process staging does.

Protocol over a socket pair (parent -> worker): ``("start", visible device, config, ring
name)`` once, then ``("function", token, payload)`` sets the function of the items that follow
(the worker answers ``("function", token, None)``, or the error text when it cannot import it,
and the parent then keeps that pipeline in-process); ``("item", seq, meta, spans)`` sends one
item; ``("flush",)`` ends a segment (the worker finishes the items it holds and sends their
results); ``("cancel",)`` ends it at once (a pipeline closed early: the worker skips the
items it has not started, answering them as cancelled); ``("noop",)`` fills the place of an
item that never left the parent;
``("stats", token)`` asks for the per-function telemetry the worker recorded since it last
answered (``("stats", token, deltas)``: a pipeline's end merges them into this process's
telemetry, so ``veda.report()`` counts the workers' calls). The parent
stops a worker by shutting the socket down. Worker -> parent: ``("ready", pid)`` or
``("failed", text)`` once, then ``("result", seq, outcome)`` per item, the :class:`Outcome`
pickled on its own so one the parent cannot load still settles its item. A thread in the
worker drains the socket at all times, so the parent's sends never wait on the worker. The
worker's gpu_map reads items lazily, so the parent flushes before it waits for ring space or,
for ``STALL_S`` in process_gpu_map, for an item: otherwise a worker waiting for its next item
would hold back the results the parent waits for.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import pickle
import queue
import shutil
import socket
import subprocess
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vedart.errors import OffloadError, OffloadWarning
from vedart.offload.inplace import found_writes
from vedart.parallel.byte_ring import ByteRing, aligned

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from vedart.config import Config
    from vedart.parallel.batch import Batch
    from vedart.runtime import Runtime
    from vedart.telemetry import Telemetry

    # A worker's gpu_map over its items, as batches (device_worker_main gives par_iter's).
    GpuMapBatches = Callable[[Iterator[Any], Callable[[Any], Any]],
                             AbstractContextManager[Iterator[Batch]]]

logger = logging.getLogger("vedart")

MIB = 2**20
RING_BYTES = 256 * MIB    # per device: 64 items of 4 MB in flight
WORKER_THREADS = 4        # a worker's CPU threads (its CPU items and hybrid work)
START_TIMEOUT_S = 120.0   # a worker imports NumPy, CuPy and vedart and opens its device
MAIN_MODULE = b"__main__"  # in a pickle that names something of the main script


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one item in a worker: ``value`` is the result, or the exception when
    not ``ok``; ``where`` is (path, lane, started, finished) as the worker's telemetry placed
    it (None when it has none)."""

    ok: bool
    value: Any
    where: tuple[str, int | None, float, float] | None = None


def encode(item: Any) -> tuple[bytes, list[memoryview]]:
    """``item`` pickled (protocol 5) without its contiguous array buffers, and those buffers."""
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(item, protocol=5, buffer_callback=buffers.append)
    return meta, [buffer.raw() for buffer in buffers]


def encode_for_worker(item: Any) -> tuple[bytes, list[memoryview]] | None:
    """:func:`encode`, or None when a worker process could not load the item: it does not
    pickle, or its pickle names something of ``__main__`` (a class of the caller's script; the
    worker's ``__main__`` is not that script). The check looks for the module's name in the
    pickle, so an item merely holding the text "__main__" stays in this process too."""
    try:
        meta, buffers = encode(item)
    except Exception:  # noqa: BLE001  # whatever stops pickling keeps the item here
        return None
    return None if MAIN_MODULE in meta else (meta, buffers)


def payload_bytes(buffers: list[memoryview]) -> int:
    """Ring bytes the buffers take, each span aligned."""
    return sum(aligned(buffer.nbytes) for buffer in buffers)


def write_buffers(ring: np.ndarray, offset: int, buffers: list[memoryview]
                  ) -> list[tuple[int, int]]:
    """Copy ``buffers`` into the uint8 ``ring`` from ``offset``; their (start, size) spans."""
    spans = []
    for buffer in buffers:
        np.copyto(ring[offset:offset + buffer.nbytes], np.frombuffer(buffer, np.uint8))
        spans.append((offset, buffer.nbytes))
        offset += aligned(buffer.nbytes)
    return spans


def decode(meta: bytes, ring: memoryview, spans: list[tuple[int, int]]) -> Any:
    """The item of :func:`encode`, its arrays views of ``ring``."""
    return pickle.loads(meta, buffers=[ring[start:start + size] for start, size in spans])


def function_payload(wrapper: Any) -> bytes | None:
    """How a worker gets the @gpu ``wrapper`` of a gpu_map: the wrapper itself by reference (a
    module-level @veda.gpu function), else its function by reference with its options. None,
    and the items stay in this process, when neither pickles (a lambda, a closure), it lives
    in ``__main__``, it names a device (a worker sees only its own), or its results must reach
    this process's own arrays or device (``writes=``, an argument its code writes into in
    place, ``returns="device"``)."""
    function = getattr(wrapper, "__wrapped__", None)
    options = getattr(wrapper, "gpu_options", None)
    if getattr(function, "__module__", "__main__") == "__main__" or (options is not None and (
            options.writes or options.returns == "device" or options.device is not None)) \
            or found_writes(function):
        return None
    for candidate in (wrapper, (function, options)):
        try:
            return pickle.dumps(candidate)
        except Exception:  # noqa: BLE001  # any pickling failure means: not by reference
            continue
    return None


# --- the worker process ---------------------------------------------------------------------


def _attach(name: str) -> SharedMemory:
    """The parent's ring, without this process's resource tracker unlinking it at exit."""
    memory = SharedMemory(name=name)
    resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
    return memory


def _load_function(payload: bytes) -> Callable[[Any], Any]:
    from vedart.offload.decorator import rewrapped

    loaded = pickle.loads(payload)
    if isinstance(loaded, tuple):
        function, options = loaded
        return rewrapped(function, options)
    return loaded  # type: ignore[no-any-return]


def _drain_into(conn: Connection, inbox: queue.SimpleQueue[Any],
                cancelled: threading.Event) -> None:
    """The worker's socket reader: every message into ``inbox``, then None at the end; a
    cancel also sets ``cancelled`` at once, for a segment busy with its items."""
    try:
        while True:
            message = conn.recv()
            if message[0] == "cancel":
                cancelled.set()
            inbox.put(message)
    except (EOFError, OSError):
        inbox.put(None)


def worker_main(handle: int, gpu_map_batches: GpuMapBatches) -> None:
    """A worker process's life (``python -c`` with the socket's file descriptor ``handle``):
    the start message, the device it names only (``CUDA_VISIBLE_DEVICES``, before CUDA is
    loaded), a runtime from its config, then the protocol of the module docstring until the
    parent shuts the socket down."""
    conn = Connection(handle)
    _, visible, config, ring_name = conn.recv()
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        from vedart import lifecycle

        ring = _attach(ring_name)
        runtime = lifecycle.init(config)
        if runtime.gpu:
            assert runtime.gpu.transfers is not None
            runtime.gpu.transfers.register_host(buffer_address(ring.buf), ring.size)
    except BaseException as error:  # noqa: BLE001  # reported to the parent, which falls back
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", os.getpid()))
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    cancelled = threading.Event()
    threading.Thread(target=_drain_into, args=(conn, inbox, cancelled), daemon=True).start()
    stats = StatsFeed(runtime.telemetry)
    function: Callable[[Any], Any] | None = None
    try:
        while (message := inbox.get()) is not None:
            if message[0] == "function":
                _, token, payload = message
                try:
                    function, problem = _load_function(payload), None
                except Exception as error:  # noqa: BLE001  # the parent keeps it in-process
                    function, problem = None, f"{type(error).__name__}: {error}"
                conn.send(("function", token, problem))
            elif message[0] == "stats":
                conn.send(("stats", message[1], stats.deltas()))
            elif message[0] == "cancel":  # nothing was running
                cancelled.clear()
            elif message[0] == "item" and function is not None:
                if not _run_segment(conn, inbox, cancelled, function, ring.buf, runtime,
                                    gpu_map_batches, message):
                    break
    except OSError:  # the parent went away
        pass
    finally:
        lifecycle.shutdown()
        gc.collect()  # tracebacks of failed items may still hold views of the ring
        try:
            ring.close()
        except BufferError:  # a view survived: the process is ending anyway
            pass


def buffer_address(view: memoryview) -> int:
    """The address of the first byte of writable ``view``."""
    import ctypes

    anchor = ctypes.c_char.from_buffer(view)  # dropped on return, releasing the buffer
    return ctypes.addressof(anchor)


def _run_segment(conn: Connection, inbox: queue.SimpleQueue[Any], cancelled: threading.Event,
                 function: Callable[[Any], Any], ring: memoryview, runtime: Runtime,
                 gpu_map_batches: GpuMapBatches, first: tuple[Any, ...]) -> bool:
    """One gpu_map over the items from ``first`` up to the next flush or cancel, sending each
    result. A cancel stops it as a closed pipeline stops (queued items are not run; running
    ones finish) and answers every item it did not run as cancelled, so the parent's ring
    spans come back. False when the parent went away instead."""
    seqs: deque[int] = deque()
    last: list[tuple[Any, ...] | None] = []  # the message that ended the items

    def items() -> Iterator[Any]:
        message: tuple[Any, ...] | None = first
        while message is not None and message[0] not in ("flush", "cancel"):
            if message[0] == "item":
                _, seq, meta, spans = message
                try:
                    item = decode(meta, ring, spans)
                except Exception as error:  # noqa: BLE001  # that item fails, not the segment
                    _send_result(conn, seq, Outcome(False, error))
                else:
                    seqs.append(seq)
                    yield item
            message = inbox.get()
        last.append(message)

    placed = PlacementFeed(runtime.telemetry)
    with gpu_map_batches(items(), function) as batches:
        for batch in batches:
            for position, (value, origin) in enumerate(zip(batch.items, batch.origins)):
                failure = batch.failures.get(position)
                outcome = Outcome(True, value) if failure is None else Outcome(False,
                                                                              failure.error)
                _send_result(conn, seqs.popleft(), dataclasses.replace(
                    outcome, where=placed.take(origin)))
            if cancelled.is_set():
                break
    if cancelled.is_set():
        skipped = Outcome(False, OffloadError("cancelled: the pipeline was closed"))
        while seqs:
            _send_result(conn, seqs.popleft(), skipped)
        while not last or (last[-1] is not None and last[-1][0] != "cancel"):
            message = inbox.get()
            if message is not None and message[0] == "item":
                _send_result(conn, message[1], skipped)
            last.append(message)
        cancelled.clear()
    return last[-1] is not None


class PlacementFeed:
    """Where the items of one pipeline ran, by source index, as its gpu_map placed them in
    ``telemetry`` (placements made from now on). Lanes place items before they are
    delivered, often several batches ahead, so a placement waits here for its item."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._seen = sum(telemetry.placement_counts().values())
        self._where: dict[int, tuple[str, int | None, float, float]] = {}

    def take(self, origin: int) -> tuple[str, int | None, float, float] | None:
        """(path, lane, started, finished) of item ``origin``, or None when none was made."""
        if origin not in self._where:
            total = sum(self._telemetry.placement_counts().values())
            if total > self._seen:
                self._where.update((p.item, (p.path, p.lane, p.started, p.finished))
                                   for p in self._telemetry.placements()[-(total - self._seen):])
                self._seen = total
        return self._where.pop(origin, None)


class StatsFeed:
    """A worker's per-function telemetry as differences since the last :meth:`deltas`."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._sent: dict[str, dict[str, Any]] = {}

    def deltas(self) -> list[tuple[str, dict[str, Any]]]:
        """(function, what its FunctionStats.totals added since the last call) for each
        function with new calls."""
        changed = []
        for stats in self._telemetry.functions():
            now = stats.totals()
            before = self._sent.get(stats.name)
            delta = {group: {name: amount - (before[group][name] if before else 0)
                             for name, amount in now[group].items()}
                     for group in ("calls", "bytes", "seconds")}
            if any(delta["calls"].values()):
                delta["last"] = now["last"]
                changed.append((stats.name, delta))
                self._sent[stats.name] = now
        return changed


def _send_result(conn: Connection, seq: int, outcome: Outcome) -> None:
    try:
        data = pickle.dumps(outcome)
    except Exception as error:  # noqa: BLE001  # an unpicklable result or exception
        kind = "result" if outcome.ok else "exception"
        try:
            shown = repr(outcome.value)[:1000]
        except Exception:  # noqa: BLE001
            shown = f"a {type(outcome.value).__name__}"
        data = pickle.dumps(Outcome(False, RuntimeError(
            f"the item's {kind} cannot be sent back from its worker process: {error}; it was "
            f"{shown}"), outcome.where))
    conn.send(("result", seq, data))


# --- the parent's side ----------------------------------------------------------------------


def visible_device(ordinal: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of this process's device ``ordinal`` (under a job
    scheduler's ``CUDA_VISIBLE_DEVICES=2,3``, ordinal 0 is physical device 2)."""
    entries = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if entry.strip()]
    return entries[ordinal] if ordinal < len(entries) else str(ordinal)


class DeviceWorker:
    """The parent's handle on one worker process: its ring, its socket, the items in flight.

    Thread-safe: items are reserved by the pipeline's thread, written and sent from the
    staging threads (in reservation order), and their outcomes delivered by a receiver
    thread. Construction starts the process; :meth:`wait_ready` waits for it."""

    def __init__(self, ordinal: int, config: Config, ring_bytes: int | None = None) -> None:
        ring_bytes = RING_BYTES if ring_bytes is None else ring_bytes
        self.ordinal = ordinal
        self._memory = SharedMemory(create=True, size=ring_bytes)
        self._ring_bytes = np.ndarray((ring_bytes,), np.uint8, buffer=self._memory.buf)
        self._ring = ByteRing(ring_bytes)
        self._changed = threading.Condition()
        self._next_seq = 0
        self._next_send = 0
        self._outbox: dict[int, tuple[Any, ...]] = {}
        self._in_ring: deque[int] = deque()  # seqs holding ring spans, oldest first
        self._unsent: set[int] = set()  # reserved items no send has taken up yet
        self._arrived: set[int] = set()
        self._deliver: dict[int, Callable[[Outcome], None]] = {}
        self._unflushed = False  # items were reserved since the last flush
        self._acks: dict[int, Any] = {}  # answers to _ask, by token
        self.broken: str | None = None
        self._receiver: threading.Thread | None = None
        self._stopped = False
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", "from vedart.parallel.device_worker_main import "
                 f"main; main({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), env=_worker_environment(),
                start_new_session=True)  # a Ctrl-C in the terminal is the parent's to handle
            self._conn.send(("start", visible_device(ordinal), config, self._memory.name))
        except BaseException:
            self._stop()
            raise
        finally:
            theirs.close()

    def wait_ready(self) -> None:
        """Wait for the worker to start; OffloadError (the worker stopped) when it did not."""
        try:
            if not self._conn.poll(START_TIMEOUT_S):
                raise OffloadError(f"the worker process for device {self.ordinal} did not "
                                   f"start within {START_TIMEOUT_S:.0f} s")
            status, detail = self._conn.recv()
            if status != "ready":
                raise OffloadError(f"the worker process for device {self.ordinal} failed to "
                                   f"start: {detail}")
        except BaseException:
            self._stop()
            raise
        self._receiver = threading.Thread(target=self._receive, daemon=True,
                                          name=f"vedart-device-{self.ordinal}-results")
        self._receiver.start()

    @property
    def in_flight(self) -> int:
        """Items sent or being sent whose outcome has not arrived."""
        return len(self._deliver)

    def fits(self, nbytes: int) -> bool:
        return self._ring.fits(nbytes)

    def begin(self, payload: bytes) -> str | None:
        """Send the function of the items that follow (after the items before) and wait for
        the worker to load it: None, or why it could not (the pipeline then stays
        in-process)."""
        problem = self._ask("function", payload)
        return self.broken if self.broken is not None else problem

    def stats(self) -> list[tuple[str, dict[str, Any]]]:
        """The worker's per-function telemetry since it was last asked, once it has finished
        every item sent before (see StatsFeed); nothing from a broken worker."""
        deltas = self._ask("stats")
        return [] if deltas is None else deltas

    def _ask(self, kind: str, *payload: Any) -> Any:
        """Send ``(kind, token, *payload)`` after everything before and wait for the worker's
        answer (None when the worker broke meanwhile)."""
        with self._changed:
            token = self._next_seq
            self._queue((kind, token, *payload))
            while token not in self._acks and self.broken is None:
                self._changed.wait()
            return self._acks.pop(token, None)

    def reserve(self, nbytes: int, deliver: Callable[[Outcome], None]) -> tuple[int, int]:
        """(seq, ring offset) of ``nbytes`` for an item whose outcome goes to ``deliver``;
        waits for older items to free the ring (flushing first, see the module docstring).
        The caller must then :meth:`send` or :meth:`abandon` it. OffloadError when the worker
        is broken."""
        with self._changed:
            flushed = False
            while True:
                if self.broken is not None:
                    raise OffloadError(self.broken)
                offset = self._ring.allocate(nbytes)
                if offset is not None:
                    break
                if not flushed:
                    self._flush()
                    flushed = True
                self._changed.wait()
            seq = self._next_seq
            self._next_seq += 1
            self._unflushed = True
            self._in_ring.append(seq)
            self._deliver[seq] = deliver
            self._unsent.add(seq)
            return seq, offset

    def send(self, seq: int, offset: int, meta: bytes, buffers: list[memoryview]) -> None:
        """Copy a reserved item's buffers into the ring (NumPy releases the interpreter lock
        while it copies) and send it, after every item reserved before it. On failure the item
        gets that failure as its outcome. Nothing for an item abandoned meanwhile."""
        with self._changed:
            if seq not in self._unsent:
                return
            self._unsent.discard(seq)
        try:
            spans = write_buffers(self._ring_bytes, offset, buffers)
        except BaseException as error:
            self._settle(seq, Outcome(False, error), ("noop",))
            if not isinstance(error, Exception):
                raise
            return
        with self._changed:
            self._outbox[seq] = ("item", seq, meta, spans)
            self._drain()

    def abandon(self, seq: int, error: BaseException) -> None:
        """Settle a reserved item that will not be sent with ``error`` as its outcome (nothing
        once a send has taken it up)."""
        with self._changed:
            if seq not in self._unsent:
                return
            self._unsent.discard(seq)
        self._settle(seq, Outcome(False, error), ("noop",))

    def abandon_unsent(self, error: BaseException) -> None:
        """:meth:`abandon` every reserved item no send has taken up: a pipeline interrupted
        between reserving an item and handing it to a send must not leave a gap that holds
        back every later message to the worker."""
        with self._changed:
            unsent = sorted(self._unsent)
        for seq in unsent:
            self.abandon(seq, error)

    def cancel(self) -> None:
        """Have the worker drop the items it has not started (a pipeline closed early; after
        a pipeline's normal end it finds nothing to drop)."""
        with self._changed:
            self._queue(("cancel",))
            self._unflushed = False

    def flush(self) -> None:
        """Have the worker finish the items it holds (a pipeline's end, or a parent about to
        wait for them); nothing when no item was reserved since the last flush."""
        with self._changed:
            self._flush()

    def _flush(self) -> None:
        if self._unflushed:
            self._queue(("flush",))
            self._unflushed = False

    def _queue(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` after every item reserved so far (the caller holds the lock)."""
        self._outbox[self._next_seq] = message
        self._next_seq += 1
        self._drain()

    def _drain(self) -> None:
        while self._next_send in self._outbox and self.broken is None:
            try:
                self._conn.send(self._outbox.pop(self._next_send))
            except (OSError, ValueError) as error:
                self._break(self._gone(f"cannot be reached: {error}"))
                return
            self._next_send += 1

    def _receive(self) -> None:
        while True:
            try:
                kind, key, data = self._conn.recv()
            except (EOFError, OSError):
                self._exited()
                return
            if kind in ("function", "stats"):
                with self._changed:
                    self._acks[key] = data
                    self._changed.notify_all()
                continue
            try:
                outcome = pickle.loads(data)
            except Exception as error:  # noqa: BLE001  # settles the item all the same
                outcome = Outcome(False, RuntimeError(
                    f"the outcome of an item from device {self.ordinal}'s worker process could "
                    f"not be loaded here: {type(error).__name__}: {error}"))
            self._settle(key, outcome)

    def _exited(self) -> None:
        reason = self._gone("closed its socket")
        with self._changed:
            self._break(reason)

    def _gone(self, detail: str) -> str:
        """Why the worker cannot be used: its exit code when it has exited (a closed socket
        means it is exiting: waited for a few seconds), else ``detail``."""
        assert self._process is not None
        try:
            code: int | None = self._process.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        prefix = f"the worker process for device {self.ordinal}"
        return f"{prefix} exited (exit code {code})" if code is not None else f"{prefix} {detail}"

    def _settle(self, seq: int, outcome: Outcome, message: tuple[Any, ...] | None = None
                ) -> None:
        """Deliver an item's outcome, free ring spans in order, wake waiting reservations."""
        with self._changed:
            deliver = self._deliver.pop(seq, None)
            if message is not None:
                self._outbox[seq] = message
                self._drain()
            self._arrived.add(seq)
            while self._in_ring and self._in_ring[0] in self._arrived:
                self._arrived.discard(self._in_ring.popleft())
                self._ring.release()
            self._changed.notify_all()
        if deliver is not None:
            deliver(outcome)

    def _break(self, reason: str) -> None:
        """Mark the worker unusable and fail its items in flight (the caller holds the lock)."""
        if self.broken is not None:
            return
        self.broken = reason
        pending, self._deliver = self._deliver, {}
        self._changed.notify_all()
        for deliver in pending.values():
            deliver(Outcome(False, OffloadError(reason)))

    def shutdown(self) -> None:
        """Fail what is in flight, shut the socket down (the worker ends), reap the process,
        free the ring."""
        with self._changed:
            self._break("the runtime shut down")
        self._stop()

    def _stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            with socket.fromfd(self._conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as dup:
                dup.shutdown(socket.SHUT_RDWR)  # wakes both ends' blocked reads
        except OSError:
            pass
        if self._process is not None:
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        if self._receiver is not None and self._receiver is not threading.current_thread():
            self._receiver.join(5)
        self._conn.close()
        del self._ring_bytes  # the ring's one export: closing needs none left
        self._memory.close()
        self._memory.unlink()


def _worker_environment() -> dict[str, str]:
    """This process's environment, with this process's import path as the worker's (so the
    worker imports vedart and the gpu_map function's module from where this process did)."""
    environment = dict(os.environ)
    paths = [str(Path(entry or os.getcwd()).resolve()) for entry in sys.path
             if Path(entry or os.getcwd()).is_dir()]
    inherited = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = os.pathsep.join(paths + ([inherited] if inherited else []))
    return environment


def shared_memory_free() -> int | None:
    """Free bytes where shared memory lives (/dev/shm), or None when unknown."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return None


class DeviceWorkers:
    """The runtime's worker processes, one per device, started together on first use. One
    pipeline uses them at a time (:meth:`acquire`); another meanwhile runs in-process, as do
    all when they could not start (``unavailable`` says why, in an OffloadWarning)."""

    def __init__(self, ordinals: list[int], config: Config) -> None:
        worker_config = dataclasses.replace(
            config, devices=None, threads=min(WORKER_THREADS, config.threads),
            progress=False, device_processes=False)
        self.workers: list[DeviceWorker] = []
        self.unavailable: str | None = None
        self._busy = threading.Lock()
        self._owner = os.getpid()  # a forked child holds copies of the sockets and rings
        atexit.register(self.shutdown)  # a script that never shuts its runtime down
        free, needed = shared_memory_free(), RING_BYTES * len(ordinals)
        try:
            if free is not None and free < 2 * needed:  # writing past it would be SIGBUS
                raise OffloadError(f"/dev/shm has {free / MIB:.0f} MiB free; the input rings "
                                   f"need {needed / MIB:.0f} MiB (twice that is asked)")
            for ordinal in ordinals:  # all start at once, then each is waited for
                self.workers.append(DeviceWorker(ordinal, worker_config))
            for worker in self.workers:
                worker.wait_ready()
        except Exception as error:  # noqa: BLE001  # gpu_map keeps its lanes in-process
            self.unavailable = f"device worker processes unavailable: {error}"
            warnings.warn(f"{self.unavailable}; gpu_map runs every device's lane in this "
                          "process", OffloadWarning, stacklevel=2)
            self.shutdown()

    def acquire(self) -> bool:
        """Take the workers for one pipeline; False when another has them, they could not
        start, or one broke."""
        if self.unavailable is not None or not self._busy.acquire(blocking=False):
            return False
        if any(worker.broken is not None for worker in self.workers):
            self._busy.release()
            return False
        return True

    def release(self) -> None:
        self._busy.release()

    def least_loaded(self) -> DeviceWorker | None:
        """The usable worker with the fewest items in flight, None when every one broke."""
        usable = [worker for worker in self.workers if worker.broken is None]
        return min(usable, key=lambda worker: (worker.in_flight, worker.ordinal), default=None)

    def shutdown(self) -> None:
        """Stop every worker and free its ring (idempotent); nothing in a process forked from
        the one that started them (its exit must not stop its parent's workers)."""
        atexit.unregister(self.shutdown)
        if os.getpid() != self._owner:
            return
        for worker in self.workers:
            try:
                worker.shutdown()
            except Exception as error:  # noqa: BLE001  # the other workers still stop
                logger.warning("stopping device %d's worker process: %s", worker.ordinal, error)
