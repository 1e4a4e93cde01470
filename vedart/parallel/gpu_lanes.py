"""GPU lanes: worker threads bound to one device and one CUDA stream each.

Per device, ``streams`` lanes (default 2) take items from one shared queue and run one item at
a time on their own stream, so with the transfer engine's asynchronous staging, moving item
i+1 on one stream overlaps computing item i on the other. A device admits a new item while
fewer than ``ITEMS_PER_LANE x streams`` are in flight and ``headroom x`` the in-flight input
bytes fit in its free memory (an idle device always admits one: the @gpu decision has checked
that item's memory itself). ``gpu_map`` spreads items over devices by items in flight.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from vedart.parallel.task import Task

STREAMS_PER_DEVICE = 2
ITEMS_PER_LANE = 2  # one running, one ready, so a lane never idles between items


class LaneBinding(Protocol):
    """How a lane gets its stream and makes device and stream current for one item."""

    def new_stream(self, device: int) -> Any: ...

    def activate(self, device: int, stream: Any) -> AbstractContextManager[None]: ...


class CudaBinding:
    """Lanes on CuPy devices, each with a non-blocking stream of its own."""

    def new_stream(self, device: int) -> Any:
        import cupy

        with cupy.cuda.Device(device):
            return cupy.cuda.Stream(non_blocking=True)

    @contextmanager
    def activate(self, device: int, stream: Any) -> Iterator[None]:
        import cupy

        with cupy.cuda.Device(device), stream:
            yield


@dataclass(frozen=True)
class Lane:
    """One lane: ``index`` among its device's lanes, and the stream it owns."""

    device: int
    index: int
    stream: Any
    binding: LaneBinding

    def activate(self) -> AbstractContextManager[None]:
        """Make this lane's device and stream current (CuPy's current stream is per thread)."""
        return self.binding.activate(self.device, self.stream)


_local = threading.local()


def current_lane() -> Lane | None:
    """The lane the calling thread serves, or None on any other thread."""
    return getattr(_local, "lane", None)


class DeviceLanes:
    """The lanes of one device, their queue, and the device's admission count."""

    def __init__(self, device: int, streams: int, binding: LaneBinding,
                 fits: Callable[[int], bool]) -> None:
        self.device = device
        self.streams = streams
        self.capacity = ITEMS_PER_LANE * streams
        self._fits = fits
        self._queue: queue.SimpleQueue[tuple[Task[Any], int] | None] = queue.SimpleQueue()
        self._admission = threading.Condition()
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._closed = False
        lanes = [Lane(device, index, binding.new_stream(device), binding)
                 for index in range(streams)]
        self._threads = [threading.Thread(target=self._serve, args=(lane,), daemon=True,
                                          name=f"vedart-gpu{device}-lane{lane.index}")
                         for lane in lanes]
        for thread in self._threads:
            thread.start()

    @property
    def in_flight(self) -> int:
        """Items admitted and not yet finished (queued or running)."""
        return self._in_flight

    def submit(self, task: Task[Any], nbytes: int, *, wait: bool) -> bool:
        """Admit ``task`` (an item with ``nbytes`` input bytes; not helpable, only a lane may
        run it) and queue it. When the device is full: False, task untouched, if not ``wait``;
        else wait for a lane to finish an item. After shutdown the task is cancelled."""
        with self._admission:
            if wait:
                self._admission.wait_for(lambda: self._closed or self._has_room(nbytes))
            if self._closed:
                task.cancel()
                return True
            if not self._has_room(nbytes):
                return False
            self._in_flight += 1
            self._in_flight_bytes += nbytes
            self._queue.put((task, nbytes))
            return True

    def _has_room(self, nbytes: int) -> bool:
        return not self._in_flight or (self._in_flight < self.capacity
                                       and self._fits(self._in_flight_bytes + nbytes))

    def _release(self, nbytes: int) -> None:
        with self._admission:
            self._in_flight -= 1
            self._in_flight_bytes -= nbytes
            self._admission.notify_all()

    def _serve(self, lane: Lane) -> None:
        _local.lane = lane
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            task, nbytes = entry
            try:
                if task.claim():
                    task.run()
            finally:
                self._release(nbytes)

    def shutdown(self) -> None:
        """Cancel queued items, let running ones finish, join the lanes. Idempotent."""
        with self._admission:
            if self._closed:
                return
            self._closed = True
            self._admission.notify_all()
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is not None:
                entry[0].cancel()
                self._release(entry[1])
        for _ in self._threads:
            self._queue.put(None)
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()


class GpuLanes:
    """The lanes of every device the runtime uses. ``fits(device, nbytes)`` says whether
    ``nbytes`` of in-flight inputs fit that device's memory."""

    def __init__(self, devices: Sequence[int], streams: int, binding: LaneBinding,
                 fits: Callable[[int, int], bool]) -> None:
        self.devices: dict[int, DeviceLanes] = {}
        try:
            for device in devices:
                self.devices[device] = DeviceLanes(device, streams, binding,
                                                   partial(fits, device))
        except BaseException:
            self.shutdown()
            raise

    def least_loaded(self) -> DeviceLanes:
        """The device with the fewest items in flight (the lowest ordinal among equals)."""
        return min(self.devices.values(), key=lambda lanes: (lanes.in_flight, lanes.device))

    def shutdown(self) -> None:
        for lanes in self.devices.values():
            lanes.shutdown()
