"""The loop that moves one large host array to the device through pinned staging slots, run by
several threads at once with the interpreter lock released.

Each worker of a transfer (the calling thread and the threads of its staging ring's
:class:`Crew`) runs :func:`copy_and_send` once. Until the array is used up, it claims the next
piece from a counter the workers share (an atomic add), waits until the copy out of its own
next slot has completed (the slot's CUDA event), copies the piece into the slot, queues the
copy from the slot to the device on the ring's stream and records the slot's event. A slot
belongs to one worker, so no slot is refilled before its own worker has queued the copy out of
it. Pieces start at ``min_piece`` and grow to ``piece`` (at most half of what was claimed
before them), so the first copy to the device starts early.

The crew's threads wait for work inside compiled code, each on a POSIX semaphore, and the
calling thread wakes them from compiled code too. On an H100 80GB HBM3 (2026-11-23) workers handed
their work as Python tasks entered the loop one interpreter-lock hand-over (about 33 us) after
another, the last some 300 us into a 1.8 ms transfer of 64 MB, and the copies to the device
went short of pieces meanwhile; woken together, a 64 MB transfer went from 0.60-0.72 to 0.76
of the pinned peak in alternating processes.

The crew is woken before the device memory it copies to exists (:meth:`Crew.start`): the
calling thread then spends 100-250 us in Python allocating it and ordering the ring's stream
after the current one (timed on the H100, 2026-11-23), and meanwhile the crew fills its slots
and holds the pieces in them until :meth:`Crew.finish` gives the target, or stops without
sending anything after :meth:`Crew.cancel`. A worker whose slots are all full spins briefly,
then sleeps on its semaphore, so a caller held up (by the interpreter lock, say) does not keep
a dozen threads busy waiting for it.

Arrays below ``Tuning.nontemporal_below`` (256 MiB) are copied into the slots with
non-temporal stores (:func:`copy_piece`), larger ones with ``memcpy``. On an H100 80GB HBM3
(2026-11-23), non-temporal stores lifted the copy alone from 36 to 49 GB/s (8 threads, 64 MB)
and a whole 64 MB transfer from 0.54-0.56 to 0.65-0.67 of the pinned peak, but from 512 MB
they lost 10-20% against ``memcpy``. Pieces used to shrink again towards the end so that the
workers finish together; that made many small copies to the device, each with its own fixed
cost, and dropping it gave 0.72-0.74 at 64 MB.

Why compiled: on an H100 80GB HBM3 (2026-11-23) the same scheme with the per-piece steps in Python
reached 14-19 GB/s, and the engine before this one, whose staging threads filled chunks that
the calling thread sent, 22-25 GB/s at 64 MB; this loop reached 29-32 GB/s on the same
machine. Python's per-piece work runs under the one interpreter lock, so it serialises the
workers; here the only Python is one call per transfer.

The C functions (``memcpy``, four CUDA driver calls, ``sem_wait`` and ``sem_post``) are called
through addresses passed in ``calls``, so the compiled loop holds no address of this process
and Numba caches it on disk; tests pass stand-ins.
"""

from __future__ import annotations

import ctypes
import platform
import threading
import time
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from vedart.errors import CUDADriverError

# Positions in the ``calls`` array (see :class:`DriverCalls`).
MEMCPY, SET_CONTEXT, EVENT_SYNCHRONIZE, COPY_TO_DEVICE, EVENT_RECORD, SEM_WAIT, SEM_POST = range(7)
STREAM_BLOCK = 64  # bytes: what one step of the non-temporal copy moves (a cache line)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


@intrinsic
def _fetch_add(typingctx: Any, counter: Any, amount: Any) -> Any:
    """``counter[0] += amount`` as one atomic step; the value before the add."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", array.data, args[1], "seq_cst")

    return types.int64(counter, types.int64), codegen


@intrinsic
def _load_acquire(typingctx: Any, cell: Any) -> Any:
    """``cell[0]``, read atomically and never from a stale register: what another thread
    stored there with :func:`_store_release`, and everything it wrote before."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(array.data, "acquire", 8)

    return types.int64(cell), codegen


@intrinsic
def _store_release(typingctx: Any, cell: Any, value: Any) -> Any:
    """``cell[0] = value`` as one atomic step, after every write before it."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        builder.store_atomic(context.cast(builder, args[1], signature.args[1], types.int64),
                             array.data, "release", 8)
        return context.get_dummy_value()

    return types.void(cell, value), codegen


@intrinsic
def _pause(typingctx: Any) -> Any:
    """A hint that the thread is spinning (x86 ``pause``; nothing elsewhere)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if _X86:
            pause = builder.module.declare_intrinsic(
                "llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(pause, [])
        return context.get_dummy_value()

    return types.void(), codegen


def _call_codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
    """Call the C function at address ``args[0]`` with the other arguments as 64-bit ints."""
    word = ir.IntType(64)
    function_type = ir.FunctionType(ir.IntType(32), [word] * (len(args) - 1))
    function = builder.inttoptr(args[0], function_type.as_pointer())
    return builder.call(function, [context.cast(builder, value, kind, types.int64)
                                   for value, kind in zip(args[1:], signature.args[1:])])


@intrinsic
def _stream_blocks(typingctx: Any, target: Any, source: Any, blocks: Any) -> Any:
    """Copy ``blocks`` x 64 bytes from host address ``source`` to host address ``target``,
    which must be 64-byte aligned, with non-temporal stores, then fence them: they bypass the
    cache, so the copy neither reads the target first nor evicts what the other workers read.
    """
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        word = ir.IntType(64)
        target, source, blocks = (context.cast(builder, value, kind, types.int64)
                                  for value, kind in zip(args, signature.args))
        vector = ir.VectorType(word, 4)  # 32 bytes: two per block
        pointer = vector.as_pointer()
        nontemporal = builder.module.add_metadata([ir.IntType(32)(1)])
        with cgutils.for_range(builder, builder.mul(blocks, word(2))) as loop:
            offset = builder.mul(loop.index, word(32))
            value = builder.load(builder.inttoptr(builder.add(source, offset), pointer), align=1)
            store = builder.store(value, builder.inttoptr(builder.add(target, offset), pointer),
                                  align=32)
            store.set_metadata("nontemporal", nontemporal)
        if _X86:  # non-temporal stores are weakly ordered: drain them before the device reads
            sfence = builder.module.declare_intrinsic(
                "llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _call1(typingctx: Any, address: Any, a: Any) -> Any:
    return types.int32(types.int64, a), _call_codegen


@intrinsic
def _call2(typingctx: Any, address: Any, a: Any, b: Any) -> Any:
    return types.int32(types.int64, a, b), _call_codegen


@intrinsic
def _call3(typingctx: Any, address: Any, a: Any, b: Any, c: Any) -> Any:
    return types.int32(types.int64, a, b, c), _call_codegen


@intrinsic
def _call4(typingctx: Any, address: Any, a: Any, b: Any, c: Any, d: Any) -> Any:
    return types.int32(types.int64, a, b, c, d), _call_codegen


@numba.njit(nogil=True, cache=True)
def copy_piece(memcpy: int, target: int, source: int, size: int,
               nontemporal: bool) -> None:  # pragma: no cover - compiled
    """Copy ``size`` bytes from ``source`` to ``target`` with the C ``memcpy`` at address
    ``memcpy`` or, when ``nontemporal``, the 64-byte-aligned middle of the target with
    :func:`_stream_blocks` and only the unaligned ends with ``memcpy``."""
    if not nontemporal:
        _call3(memcpy, target, source, size)
        return
    head = min(size, -target % STREAM_BLOCK)
    blocks = (size - head) // STREAM_BLOCK
    tail = size - head - blocks * STREAM_BLOCK
    if head:
        _call3(memcpy, target, source, head)
    if blocks:
        _stream_blocks(target + head, source + head, blocks)
    if tail:
        _call3(memcpy, target + size - tail, source + size - tail, tail)


NOT_YET, CANCELLED = 0, -1  # a transfer's target cell before its target is known; given up


SPIN_CHECKS = 2000  # looks at the target cell before sleeping on the semaphore


@numba.njit(nogil=True, cache=True)
def _await_target(target_cell: np.ndarray, go: int,
                  calls: np.ndarray) -> tuple[int, bool]:  # pragma: no cover - compiled
    """What ``target_cell`` holds once it no longer holds ``NOT_YET``, and whether the worker
    took its "go" post to learn it. It spins for ``SPIN_CHECKS`` looks (the caller's Python
    between start and finish usually takes 100-250 us), then sleeps on semaphore ``go``, which
    :func:`crew_finish` and :func:`crew_cancel` post after storing the cell, so a slow caller
    (waiting for the interpreter lock, say) does not keep the crew busy. ``go`` 0: spin."""
    checks = 0
    target = _load_acquire(target_cell)
    while target == NOT_YET:
        if go != 0 and checks == SPIN_CHECKS:
            _wait(calls, go)
            return _load_acquire(target_cell), True
        _pause()
        checks += 1
        target = _load_acquire(target_cell)
    return target, False


@numba.njit(nogil=True, cache=True)
def _send_held(target: int, turn: int, held: int, offsets: np.ndarray, sizes: np.ndarray,
               slot_addresses: np.ndarray, slot_events: np.ndarray, stream: int,
               calls: np.ndarray) -> int:  # pragma: no cover - compiled
    """Queue the copies to the device of the ``held`` pieces in the slots filled before turn
    ``turn``, oldest first, each followed by its slot's event; 0 or the first failing status."""
    status = 0
    for filled in range(turn - held, turn):
        slot = filled % slot_addresses.size
        status = _call4(calls[COPY_TO_DEVICE], target + offsets[slot], slot_addresses[slot],
                        sizes[slot], stream)
        if status == 0:
            status = _call2(calls[EVENT_RECORD], slot_events[slot], stream)
        if status != 0:
            break
    return status


@numba.njit(nogil=True, cache=True)
def copy_and_send(counter: np.ndarray, nbytes: int, piece: int, min_piece: int,
                  nontemporal: bool, source: int, target_cell: np.ndarray,
                  slot_addresses: np.ndarray, slot_events: np.ndarray, stream: int, context: int,
                  calls: np.ndarray, go: int = 0) -> int:  # pragma: no cover - compiled
    """One worker's share of sending ``nbytes`` from host address ``source`` to the device
    address in ``target_cell`` (see the module docstring). ``counter`` is a one-element int64
    array shared by the transfer's workers, 0 at the start. ``target_cell`` is one too, and may
    hold ``NOT_YET`` when the worker starts: it then fills its slots, holding the pieces in
    them, until the target is stored there (:func:`_store_release`) or every slot is full
    (:func:`_await_target`), and stops without sending anything if ``CANCELLED`` is stored
    instead. ``go`` is the worker's semaphore, posted once the cell is stored (0 where it is
    stored before the worker starts): whether or not the worker slept on it, it takes that one
    post before returning. ``slot_addresses`` and ``slot_events`` are this worker's pinned
    slots (each of at least ``piece`` bytes) and their CUDA events; ``nontemporal`` chooses how
    pieces are copied (:func:`copy_piece`). Returns 0 (also when cancelled), or the first
    failing CUDA call's status, after which every worker claims no further piece (a worker
    holding pieces still sends them once the target is known).
    """
    status, took_go = _share_of(counter, nbytes, piece, min_piece, nontemporal, source,
                                target_cell, slot_addresses, slot_events, stream, context,
                                calls, go)
    if go != 0 and not took_go:
        _wait(calls, go)
    return status


@numba.njit(nogil=True, cache=True)
def _share_of(counter: np.ndarray, nbytes: int, piece: int, min_piece: int, nontemporal: bool,
              source: int, target_cell: np.ndarray, slot_addresses: np.ndarray,
              slot_events: np.ndarray, stream: int, context: int, calls: np.ndarray,
              go: int) -> tuple[int, bool]:  # pragma: no cover - compiled
    """:func:`copy_and_send` but for taking the "go" post: its status, and whether
    :func:`_await_target` took it."""
    status = _call1(calls[SET_CONTEXT], context)
    slots = slot_addresses.size
    offsets, sizes = np.zeros(slots, np.int64), np.zeros(slots, np.int64)  # per slot
    turn = held = 0  # pieces copied so far; of those, the last ``held`` are not sent yet
    target, took_go = NOT_YET, False
    while status == 0:
        if target == NOT_YET:
            if held == slots:
                target, took_go = _await_target(target_cell, go, calls)
            else:
                target = _load_acquire(target_cell)
        if target == CANCELLED:
            break
        if target != NOT_YET and held:
            status = _send_held(target, turn, held, offsets, sizes, slot_addresses, slot_events,
                                stream, calls)
            held = 0
            if status != 0:
                break
        claimed = _fetch_add(counter, 0)
        size = max(min_piece, min(piece, claimed // 2))
        offset = _fetch_add(counter, size)
        if offset >= nbytes:
            if held == 0:
                return 0, took_go
            if target == NOT_YET:
                target, took_go = _await_target(target_cell, go, calls)
            if target == CANCELLED:
                return 0, took_go
            return _send_held(target, turn, held, offsets, sizes, slot_addresses, slot_events,
                              stream, calls), took_go
        slot = turn % slots
        status = _call1(calls[EVENT_SYNCHRONIZE], slot_events[slot])
        if status == 0:
            offsets[slot], sizes[slot] = offset, min(size, nbytes - offset)
            copy_piece(calls[MEMCPY], slot_addresses[slot], source + offset, sizes[slot],
                       nontemporal)
            held += 1
            turn += 1
    _fetch_add(counter, nbytes)  # the other workers stop at their next claim
    return status, took_go


def _address(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


class DriverCalls:
    """The C functions the compiled loop calls, resolved once: ``addresses`` holds, in the
    positions named above, the C library's ``memcpy``, the CUDA driver's ``cuCtxSetCurrent``,
    ``cuEventSynchronize``, ``cuMemcpyHtoDAsync_v2`` and ``cuEventRecord``, and the C library's
    ``sem_wait`` and ``sem_post``."""

    def __init__(self, libc: ctypes.CDLL, driver: ctypes.CDLL) -> None:
        self.addresses = np.array([_address(libc.memcpy), _address(driver.cuCtxSetCurrent),
                                   _address(driver.cuEventSynchronize),
                                   _address(driver.cuMemcpyHtoDAsync_v2),
                                   _address(driver.cuEventRecord), _address(libc.sem_wait),
                                   _address(libc.sem_post)], dtype=np.int64)
        self._get_context = driver.cuCtxGetCurrent
        self._error_name, self._error_text = driver.cuGetErrorName, driver.cuGetErrorString

    def current_context(self) -> int:
        """The CUDA context current on the calling thread (its handle as an int, 0 if none)."""
        handle = ctypes.c_void_p()
        status = self._get_context(ctypes.byref(handle))
        if status != 0:
            raise self.error(status, "cuCtxGetCurrent failed")
        return handle.value or 0

    def error(self, status: int, what: str = "copying to the device failed") -> CUDADriverError:
        """The error to raise for a failed CUDA driver call's ``status``: ``what`` failed, and
        the status as the driver names it."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self._error_name(status, ctypes.byref(name))
        self._error_text(status, ctypes.byref(text))
        return CUDADriverError(f"{what}: CUDA driver status {status} "
                               f"({(name.value or b'unknown').decode()}: "
                               f"{(text.value or b'no description').decode()})")


# Fields of a crew's board (an int64 array): the transfer, the stop flag, how many members the
# transfer under way woke (NONE_WOKEN when none is under way), then one status per worker. The
# transfer's target is not among them: it has a cell of its own (see Crew.start).
NBYTES, PIECE, MIN_PIECE, NONTEMPORAL, SOURCE, STREAM, CONTEXT, STOP, WOKEN, STATUSES = range(10)
NONE_WOKEN = -1
SEMAPHORE_BYTES = 64  # per sem_t (glibc's is 32 bytes; 64 keeps each on a cache line of its own)


@numba.njit(nogil=True, cache=True)
def semaphore_address(semaphores: np.ndarray, worker: int) -> int:  # pragma: no cover - compiled
    """The address of semaphore ``worker`` in a crew's ``semaphores`` array (0 is "done",
    ``w`` wakes worker ``w``)."""
    return semaphores.ctypes.data + worker * SEMAPHORE_BYTES


@numba.njit(nogil=True, cache=True)
def _wait(calls: np.ndarray, semaphore: int) -> None:  # pragma: no cover - compiled
    """``sem_wait``, again after a signal interrupted it. Its one other error, EINVAL, needs a
    semaphore that was never initialised, and a crew's are initialised before its threads
    start and destroyed only after they have ended."""
    while _call1(calls[SEM_WAIT], semaphore) != 0:
        pass


@numba.njit(nogil=True, cache=True)
def _share(board: np.ndarray, counter: np.ndarray, target_cell: np.ndarray, worker: int,
           slot_addresses: np.ndarray, slot_events: np.ndarray, go: int,
           calls: np.ndarray) -> None:  # pragma: no cover - compiled
    """Worker ``worker``'s :func:`copy_and_send` of the transfer on ``board`` (``go``: its
    semaphore, 0 for the calling thread); its status goes to the board."""
    board[STATUSES + worker] = copy_and_send(
        counter, board[NBYTES], board[PIECE], board[MIN_PIECE], board[NONTEMPORAL] != 0,
        board[SOURCE], target_cell, slot_addresses, slot_events, board[STREAM], board[CONTEXT],
        calls, go)


@numba.njit(nogil=True, cache=True)
def crew_member(board: np.ndarray, counter: np.ndarray, target_cell: np.ndarray, worker: int,
                slot_addresses: np.ndarray, slot_events: np.ndarray, semaphores: np.ndarray,
                calls: np.ndarray) -> None:  # pragma: no cover - compiled; tested through Crew
    """A crew thread's whole life: post the shared "done" semaphore once to say it is parked,
    then wait on its own semaphore, take its share of the transfer on ``board`` and post
    "done", until ``board[STOP]`` is set. Each transfer posts its own semaphore twice: to wake
    it, and once the target is known (its "go", see :func:`copy_and_send`)."""
    own, done = semaphore_address(semaphores, worker), semaphore_address(semaphores, 0)
    _call1(calls[SEM_POST], done)
    while True:
        _wait(calls, own)
        if board[STOP] != 0:
            return
        _share(board, counter, target_cell, worker, slot_addresses, slot_events, own, calls)
        _call1(calls[SEM_POST], done)


@numba.njit(nogil=True, cache=True)
def _post_woken(board: np.ndarray, semaphores: np.ndarray,
                calls: np.ndarray) -> None:  # pragma: no cover - compiled
    """Post the semaphore of each member the transfer on ``board`` wakes or woke: its wake-up,
    or its "go" once the target cell is stored."""
    for worker in range(1, board[WOKEN] + 1):
        _call1(calls[SEM_POST], semaphore_address(semaphores, worker))


@numba.njit(nogil=True, cache=True)
def crew_wake(board: np.ndarray, members: int, semaphores: np.ndarray,
              calls: np.ndarray) -> None:  # pragma: no cover - compiled; tested through Crew
    """Wake crew members 1..``members`` to take their shares of the transfer on ``board``, and
    note on it that they were woken (one compiled call, so no Python exception can come
    between the two)."""
    board[WOKEN] = members
    _post_woken(board, semaphores, calls)


@numba.njit(nogil=True, cache=True)
def _join(board: np.ndarray, semaphores: np.ndarray,
          calls: np.ndarray) -> int:  # pragma: no cover - compiled
    """Wait until the members the transfer woke are done and note that none is under way; 0,
    or the first failing status on the board (the caller's, worker 0, included)."""
    members = board[WOKEN]
    done = semaphore_address(semaphores, 0)
    for _ in range(members):
        _wait(calls, done)
    board[WOKEN] = NONE_WOKEN
    for worker in range(members + 1):
        if board[STATUSES + worker] != 0:
            return board[STATUSES + worker]
    return 0


@numba.njit(nogil=True, cache=True)
def crew_finish(board: np.ndarray, counter: np.ndarray, target_cell: np.ndarray, target: int,
                slot_addresses: np.ndarray, slot_events: np.ndarray, semaphores: np.ndarray,
                calls: np.ndarray) -> int:  # pragma: no cover - compiled; tested through Crew
    """The calling thread's side once the transfer's device address ``target`` is known: give
    it to the woken members, take share 0 itself, and :func:`_join` them."""
    _store_release(target_cell, target)
    _post_woken(board, semaphores, calls)
    _share(board, counter, target_cell, 0, slot_addresses, slot_events, 0, calls)
    return _join(board, semaphores, calls)


@numba.njit(nogil=True, cache=True)
def crew_cancel(board: np.ndarray, target_cell: np.ndarray, semaphores: np.ndarray,
                calls: np.ndarray) -> None:  # pragma: no cover - compiled; tested through Crew
    """Give up a woken transfer before its target is known: the members stop without sending
    anything; returns once they are all done."""
    _store_release(target_cell, CANCELLED)
    _post_woken(board, semaphores, calls)
    _join(board, semaphores, calls)


class CrewUnavailable(Exception):
    """A crew could not be set up (no semaphore, no thread to be had, a thread that ended
    before it parked); transfers go direct instead."""


class Crew:
    """The threads that send one staging ring's arrays, parked in compiled code between
    transfers. Each of ``len(worker_slots)`` workers has its own slots; worker 0 is whichever
    thread calls :meth:`finish`, and workers 1.. are this crew's threads, each waiting on a
    POSIX semaphore of its own.

    A transfer is :meth:`start`, then :meth:`finish` or :meth:`cancel`, from one thread.
    :meth:`start` writes the transfer's parameters to a board (an int64 array) and wakes the
    workers it needs from compiled code, so they start together rather than one
    interpreter-lock hand-over apart, and before the device memory they copy to exists: they
    fill their slots while the caller allocates the target, and send once :meth:`finish`
    gives its address. The constructor returns once every thread is parked, so a transfer
    never waits for a thread that is not there. A ring serves one transfer at a time."""

    def __init__(self, worker_slots: list[tuple[np.ndarray, np.ndarray]], calls: np.ndarray
                 ) -> None:
        """CrewUnavailable when the crew cannot be set up (nothing is left running then)."""
        self._libc = ctypes.CDLL(None, use_errno=True)
        workers = len(worker_slots)
        self._slots = [(np.ascontiguousarray(addresses, np.int64),
                        np.ascontiguousarray(events, np.int64))
                       for addresses, events in worker_slots]
        self._board = np.zeros(STATUSES + workers, np.int64)
        self._board[WOKEN] = NONE_WOKEN
        self._counter = np.zeros(1, np.int64)  # bytes claimed so far
        self._target = np.zeros(1, np.int64)  # the target address, NOT_YET or CANCELLED
        self._calls = np.array(calls, np.int64)  # each transfer's driver calls, read by the crew
        self._semaphores = np.zeros(workers * SEMAPHORE_BYTES // 8, np.int64)
        self._threads: list[threading.Thread] = []
        self._initialised = 0  # semaphores, destroyed by close()
        self._closed = False
        try:
            for worker in range(workers):
                if self._libc.sem_init(ctypes.c_void_p(self._semaphore(worker)), 0, 0) != 0:
                    raise CrewUnavailable(f"sem_init failed (errno {ctypes.get_errno()})")
                self._initialised += 1
            for worker in range(1, workers):
                thread = threading.Thread(
                    target=crew_member, name=f"vedart-staging-crew-{worker}", daemon=True,
                    args=(self._board, self._counter, self._target, worker, *self._slots[worker],
                          self._semaphores, self._calls))
                try:
                    thread.start()
                except RuntimeError as error:  # a thread limit
                    raise CrewUnavailable(f"cannot start a crew thread: {error}") from error
                self._threads.append(thread)
            self._wait_until_parked()
        except BaseException:
            self.close()
            raise

    def _wait_until_parked(self) -> None:
        """Take each thread's first "done" post; CrewUnavailable if a thread ends before it
        posts (its first call failed, to compile for one)."""
        done = ctypes.c_void_p(self._semaphore(0))
        parked = 0
        while parked < len(self._threads):
            deadline = time.clock_gettime(time.CLOCK_REALTIME) + 0.1
            wait_until = _Timespec(int(deadline), int(deadline % 1 * 1e9))
            if self._libc.sem_timedwait(done, ctypes.byref(wait_until)) == 0:
                parked += 1
            elif not all(thread.is_alive() for thread in self._threads):
                raise CrewUnavailable("a crew thread ended before it parked")

    @property
    def workers(self) -> int:
        return len(self._slots)

    def _semaphore(self, worker: int) -> int:
        return int(semaphore_address(self._semaphores, worker))

    def start(self, nbytes: int, piece: int, min_piece: int, nontemporal: bool, source: int,
              stream: int, context: int, calls: np.ndarray, workers: int) -> None:
        """Begin copying ``nbytes`` from host address ``source`` with the first ``workers``
        workers (at most :attr:`workers`), to be sent on ``stream`` (in CUDA ``context``)
        through ``calls`` (:class:`DriverCalls` addresses) once :meth:`finish` names the
        target; until then nothing is sent. ValueError for a bad ``workers``; RuntimeError once
        closed or while a transfer is under way."""
        if self._closed:
            raise RuntimeError("the staging crew is closed")
        if self.under_way:
            raise RuntimeError("the staging crew is already running a transfer")
        workers = int(workers)
        if not 1 <= workers <= self.workers:
            raise ValueError(f"workers: got {workers}; allowed: 1 to {self.workers}")
        self._board[:STOP] = (nbytes, piece, min_piece, nontemporal, source, stream, context)
        self._counter[0] = 0
        self._target[0] = NOT_YET
        self._calls[:] = calls
        crew_wake(self._board, workers - 1, self._semaphores, self._calls)

    @property
    def under_way(self) -> bool:
        """Whether a transfer was started and has not been finished or cancelled."""
        return bool(self._board[WOKEN] != NONE_WOKEN)

    def finish(self, target: int) -> int:
        """Send the started transfer to device address ``target``, taking worker 0's share on
        the calling thread: 0, or the first failing CUDA call's status, once every worker has
        stopped. RuntimeError when no transfer is under way; ValueError for a ``target`` that
        cannot be a device address (the transfer stays under way: cancel it)."""
        if not self.under_way:
            raise RuntimeError("the staging crew has no transfer under way")
        target = int(target)
        if target <= 0:  # 0 and -1 are what the target cell holds for NOT_YET and CANCELLED
            raise ValueError(f"target: got {target}; allowed: a device address (> 0)")
        return int(crew_finish(self._board, self._counter, self._target, target,
                               *self._slots[0], self._semaphores, self._calls))

    def cancel(self) -> None:
        """Give up the transfer under way, if any: nothing more of it is sent; returns once its
        workers have stopped. Cancelling after :meth:`finish` does nothing."""
        if self.under_way:
            crew_cancel(self._board, self._target, self._semaphores, self._calls)

    def send(self, nbytes: int, piece: int, min_piece: int, nontemporal: bool, source: int,
             target: int, stream: int, context: int, calls: np.ndarray, workers: int) -> int:
        """:meth:`start` and :meth:`finish` in one: a transfer whose target is known."""
        self.start(nbytes, piece, min_piece, nontemporal, source, stream, context, calls,
                   workers)
        return self.finish(target)

    def close(self) -> None:
        """Stop the crew's threads and destroy its semaphores (idempotent), cancelling a
        transfer started and left unfinished. Not while another thread finishes one."""
        if self._closed:
            return
        self.cancel()
        self._closed = True
        self._board[STOP] = 1
        for worker in range(1, len(self._threads) + 1):
            self._libc.sem_post(ctypes.c_void_p(self._semaphore(worker)))
        for thread in self._threads:
            thread.join()
        self._threads = []
        for worker in range(self._initialised):
            self._libc.sem_destroy(ctypes.c_void_p(self._semaphore(worker)))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def load() -> DriverCalls | None:
    """:func:`open_driver_calls`, with the compiled loop made ready by two transfers of two
    workers that move nothing, one sent and one cancelled (Numba compiles the loop, or reads it
    from its on-disk cache, on the first call of a process); None where the libraries cannot
    be opened."""
    calls = open_driver_calls()
    if calls is not None:
        no_slots = np.zeros(1, dtype=np.int64)
        crew = Crew([(no_slots, no_slots)] * 2, calls.addresses)
        try:
            # Nothing to claim, so each worker only makes the context current: none (0) will do,
            # and nothing is sent to the target (any address will do).
            crew.send(0, 1, 1, True, 0, 1, 0, 0, calls.addresses, 2)
            crew.start(0, 1, 1, True, 0, 0, 0, calls.addresses, 2)
            crew.cancel()
        finally:
            crew.close()
    return calls


def open_driver_calls() -> DriverCalls | None:
    """:class:`DriverCalls` from the C library and ``libcuda.so.1``; None where they cannot be
    opened by those names (only Linux names are tried)."""
    try:
        return DriverCalls(ctypes.CDLL(None), ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None
