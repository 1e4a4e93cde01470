"""GPU lanes: per device, one thread that drives ``streams`` CUDA streams (default 2).

The lane thread takes the device's admitted items in order. For each it makes the device and
the next stream (round robin) current and calls ``begin`` (for a @gpu item: upload its staged
inputs and enqueue the computation, without waiting); it ``finish``es the oldest item (wait,
results to the host) once ``streams`` items are on the device, or as soon as no further item is
queued. So copying item i+1 to the device overlaps computing item i, and one thread per device
runs the Python side of all GPU work: measured on the H100 (2026-11-22), two or more threads
per device each doing whole items lost more to contention for the interpreter lock than they
gained (docs/performance.md).

A device admits a new item while fewer than ``ITEMS_PER_STREAM x streams`` (16) are admitted
and unfinished (queued, being staged, or on the device) and ``headroom x`` their input bytes fit
in the free memory the item's @gpu decision read (no memory query of its own: a query under the
admission lock would stall the lane; an idle device always admits one, the decision having
checked that item's memory itself). A dispatcher waiting for room is woken once the device has
drained to ``REFILL_AT`` of its capacity, so it admits items in bursts rather than one per
finished item. Admitted items waiting for the lane are what the staging threads copy into
pinned memory meanwhile. ``gpu_map`` spreads items over devices by items in flight.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vedart.tasks import drain

STREAMS_PER_DEVICE = 2
ITEMS_PER_STREAM = 8  # one on the device, the rest queued or staging ahead of it
REFILL_AT = 0.25  # the dispatcher is woken when a device has drained to this share of its capacity


class LaneBinding(Protocol):
    """How a lane gets its stream and makes device and stream current for one item."""

    def new_stream(self, device: int) -> Any: ...

    def activate(self, device: int, stream: Any) -> None:
        """Make ``device`` and ``stream`` current on the calling thread, which is the device's
        own lane thread: they stay current after the item, nothing is restored."""
        ...


class CudaBinding:
    """Lanes on CuPy devices, each with a non-blocking stream of its own."""

    def new_stream(self, device: int) -> Any:
        import cupy

        with cupy.cuda.Device(device):
            return cupy.cuda.Stream(non_blocking=True)

    def activate(self, device: int, stream: Any) -> None:
        # Checked per phase, not set once per thread: an item's function may have left another
        # device or stream current. Plain calls, not device and stream contexts: a lane thread
        # has nothing to restore, and the contexts cost microseconds per item.
        import cupy

        if cupy.cuda.runtime.getDevice() != device:
            cupy.cuda.runtime.setDevice(device)
        stream.use()


class LaneWork(Protocol):
    """One admitted item as a lane runs it. ``begin`` and ``finish`` never raise: a failure
    is delivered to whoever waits for the item's result."""

    def claim(self) -> bool:
        """Take the item for running; False when it was cancelled while queued."""
        ...

    def begin(self, lane: Lane) -> None:
        """Start the item on ``lane``'s stream (made current by the caller) without waiting."""
        ...

    def finish(self) -> None:
        """Wait for the item and deliver its result (``lane`` of ``begin`` is current)."""
        ...

    def cancel(self) -> None:
        """Drop the item unstarted (shutdown)."""
        ...

    def fail(self, lane: Lane, error: BaseException) -> None:
        """Deliver ``error`` as the outcome of a claimed item ``lane`` could not run or finish
        (its device could not be made current); nothing once the item has finished."""
        ...


@dataclass(frozen=True)
class Lane:
    """One stream of a device's lane thread: ``index`` among the device's streams."""

    device: int
    index: int
    stream: Any
    binding: LaneBinding

    def activate(self) -> None:
        """Make this lane's device and stream current on the calling lane thread (CuPy's
        current stream is per thread)."""
        self.binding.activate(self.device, self.stream)


_local = threading.local()


def current_lane() -> Lane | None:
    """The lane (device and stream) the calling thread is running an item on, or None on any
    thread but a lane thread."""
    return getattr(_local, "lane", None)


class DeviceLanes:
    """The lane thread of one device, its streams, queue and admission count."""

    def __init__(self, device: int, streams: int, binding: LaneBinding,
                 fits: Callable[[int, int], bool]) -> None:
        self.device = device
        self.streams = streams
        self.capacity = ITEMS_PER_STREAM * streams
        self._refill_at = int(REFILL_AT * self.capacity)
        self._fits = fits
        self._queue: queue.SimpleQueue[tuple[LaneWork, int] | None] = queue.SimpleQueue()
        self._admission = threading.Condition()
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._closed = False
        self._lanes = [Lane(device, index, binding.new_stream(device), binding)
                       for index in range(streams)]
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"vedart-gpu{device}-lane")
        self._thread.start()

    @property
    def in_flight(self) -> int:
        """Items admitted and not yet finished (queued, staging or on the device)."""
        return self._in_flight

    def admit(self, nbytes: int, free_bytes: int | None, *, wait: bool) -> bool:
        """Count in an item of ``nbytes`` input bytes whose decision read ``free_bytes`` free
        on the device (None: bound by count only). When the device is full: False if not
        ``wait``, else wait until the lane has drained the device to its refill level (or to
        where the bytes fit). False after shutdown."""
        with self._admission:
            if wait:
                self._admission.wait_for(
                    lambda: self._closed or self._has_room(nbytes, free_bytes))
            if self._closed or not self._has_room(nbytes, free_bytes):
                return False
            self._in_flight += 1
            self._in_flight_bytes += nbytes
            return True

    def enqueue(self, work: LaneWork, nbytes: int) -> None:
        """Queue an item :meth:`admit` counted in, for the lane to run in order (cancelled at
        once after shutdown)."""
        with self._admission:
            if not self._closed:
                self._queue.put((work, nbytes))
                return
        work.cancel()
        self._release(nbytes)

    def withdraw(self, nbytes: int) -> None:
        """Give back an admission that will not be enqueued (the item failed before)."""
        self._release(nbytes)

    def _has_room(self, nbytes: int, free_bytes: int | None) -> bool:
        return not self._in_flight or (
            self._in_flight < self.capacity
            and (free_bytes is None or self._fits(self._in_flight_bytes + nbytes, free_bytes)))

    def _release(self, nbytes: int) -> None:
        with self._admission:
            self._in_flight -= 1
            self._in_flight_bytes -= nbytes
            # Waking the dispatcher once the device has drained, not per item, lets it admit
            # items in bursts: each wake-up costs both threads an interpreter-lock hand-over.
            if self._in_flight <= self._refill_at:
                self._admission.notify_all()

    def _serve(self) -> None:
        on_device: deque[tuple[LaneWork, int, Lane]] = deque()
        turn = 0
        while True:
            try:
                entry = self._queue.get(block=not on_device)
            except queue.Empty:  # nothing more to start now: finish what runs
                self._finish(*on_device.popleft())
                continue
            if entry is None:
                break
            if self._begin(*entry, self._lanes[turn], on_device):
                turn = (turn + 1) % self.streams
            entry = None  # an idle lane must not keep its last item (and its results) alive
            if len(on_device) >= self.streams:
                self._finish(*on_device.popleft())
        while on_device:
            self._finish(*on_device.popleft())

    def _begin(self, work: LaneWork, nbytes: int, lane: Lane,
               on_device: deque[tuple[LaneWork, int, Lane]]) -> bool:
        """Begin ``work`` on ``lane`` unless it was cancelled; whether it was claimed."""
        if not work.claim():
            self._release(nbytes)
            return False
        _local.lane = lane
        try:
            lane.activate()
            work.begin(lane)
        except BaseException as error:  # the item fails; the lane lives on for the others
            work.fail(lane, error)
            self._release(nbytes)
            return True
        on_device.append((work, nbytes, lane))
        return True

    def _finish(self, work: LaneWork, nbytes: int, lane: Lane) -> None:
        _local.lane = lane
        try:
            lane.activate()
            work.finish()
        except BaseException as error:  # the item fails; the lane lives on for the others
            work.fail(lane, error)
        finally:
            self._release(nbytes)

    def shutdown(self) -> None:
        """Cancel queued items, let started ones finish, join the lane thread. Idempotent."""
        with self._admission:
            if self._closed:
                return
            self._closed = True
            self._admission.notify_all()
        for entry in drain(self._queue):
            if entry is not None:
                entry[0].cancel()
                self._release(entry[1])
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()


class GpuLanes:
    """The lanes of every device the runtime uses. ``fits(nbytes, free_bytes)`` says whether
    ``nbytes`` of in-flight inputs fit a device with ``free_bytes`` free."""

    def __init__(self, devices: Sequence[int], streams: int, binding: LaneBinding,
                 fits: Callable[[int, int], bool]) -> None:
        self.devices: dict[int, DeviceLanes] = {}
        try:
            for device in devices:
                self.devices[device] = DeviceLanes(device, streams, binding, fits)
        except BaseException:
            self.shutdown()
            raise

    def least_loaded(self) -> DeviceLanes:
        """The device with the fewest items in flight (the lowest ordinal among equals)."""
        return min(self.devices.values(), key=lambda lanes: (lanes.in_flight, lanes.device))

    def shutdown(self) -> None:
        for lanes in self.devices.values():
            lanes.shutdown()
