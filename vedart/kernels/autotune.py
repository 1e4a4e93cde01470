"""``autotune=True``: the fastest threads-per-block, measured once per (device, size bucket).

A size bucket is the sizing array's dimensionality and the bit length of its element count
(sizes within a factor of two share one). Each candidate the device and the compiled kernel can
take is launched on scratch copies of the call's device arrays -- so kernels that accumulate
into their outputs stay correct -- once to warm up (and compile), then timed with CUDA events.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vedart._logging import logger
from vedart.backends import Backend
from vedart.backends.dims import LaunchDims
from vedart.errors import KernelLaunchError
from vedart.kernels.launch_config import auto_dims
from vedart.locks import renew_in_child

CANDIDATES = (128, 256, 512, 1024)
TIMED_LAUNCHES = 3

SizeBucket = tuple[int, int]


def size_bucket(shape: tuple[int, ...]) -> SizeBucket:
    """(dimensions, bit length of the element count) of an array of ``shape``."""
    return len(shape), math.prod(shape).bit_length()


def event_seconds(launch: Callable[[], object], repeats: int = TIMED_LAUNCHES) -> float:
    """Mean seconds of ``launch()`` on the current CuPy device and stream, by CUDA events,
    after one untimed warm-up launch."""
    import cupy

    launch()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        launch()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / repeats


class Autotuner:
    """The best threads-per-block of one kernel per (device, size bucket). Thread-safe; two
    threads meeting a new bucket at once may both measure it (the last result is kept)."""

    def __init__(self, kernel: str, dispatcher: Any) -> None:
        self._kernel = kernel
        self._dispatcher = dispatcher
        self._best: dict[tuple[int, SizeBucket], int] = {}
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    def best(self, device: int, bucket: SizeBucket) -> int | None:
        """The threads-per-block chosen for ``bucket`` on ``device``, or None before tuning."""
        return self._best.get((device, bucket))

    def tune(self, device: int, bucket: SizeBucket, candidates: Iterable[int],
             seconds_for: Callable[[int], float]) -> int:
        """Measure ``seconds_for(threads_per_block)`` for each candidate, keep and return the
        fastest (the smallest on a tie)."""
        timings = {threads: seconds_for(threads) for threads in candidates}
        fastest = min(sorted(timings), key=lambda threads: timings[threads])
        with self._lock:
            self._best[(device, bucket)] = fastest
        logger.info("%s: autotuned %d threads per block on device %d for bucket %s: %s",
                    self._kernel, fastest, device, bucket,
                    ", ".join(f"{t}: {s * 1e6:.1f} us" for t, s in sorted(timings.items())))
        return fastest

    def dims_for(self, backend: Backend, shape: tuple[int, ...], values: Sequence[Any],
                 arrays: Iterable[int]) -> tuple[LaunchDims, float]:
        """The tuned launch covering ``shape`` on ``backend``'s device, measuring it with
        ``values`` (``arrays``: positions of their device arrays) the first time; and the
        seconds compilation took during the measurement."""
        bucket = size_bucket(shape)
        threads = self.best(backend.device_id, bucket)
        compile_seconds = 0.0
        if threads is None:
            threads, compile_seconds = self._measure(backend, shape, bucket, values, arrays)
        return backend.launch_limits.check(self._kernel, auto_dims(shape, threads)), \
            compile_seconds

    def _measure(self, backend: Backend, shape: tuple[int, ...], bucket: SizeBucket,
                 values: Sequence[Any], arrays: Iterable[int]) -> tuple[int, float]:
        import cupy

        candidates = []
        for threads in CANDIDATES:
            try:
                backend.launch_limits.check(self._kernel, auto_dims(shape, threads))
            except KernelLaunchError:
                continue
            candidates.append(threads)
        compile_seconds: list[float] = []
        with cupy.cuda.Device(backend.device_id):
            scratch = list(values)
            for position in arrays:
                scratch[position] = values[position].copy()

            def seconds_for(threads: int) -> float:
                most = self._thread_limit(scratch)
                if most is not None and threads > most:
                    return math.inf
                trial = auto_dims(shape, threads)
                return event_seconds(lambda: compile_seconds.append(
                    backend.launch(self._dispatcher, trial, scratch)))

            threads = self.tune(backend.device_id, bucket, candidates or [CANDIDATES[0]],
                                seconds_for)
        return threads, sum(compile_seconds)

    def _thread_limit(self, values: Sequence[Any]) -> int | None:
        """The compiled kernel's own threads-per-block limit (registers, shared memory) for
        these argument types, or None before it is compiled."""
        types = tuple(self._dispatcher.typeof_pyval(value) for value in values)
        compiled = self._dispatcher.overloads.get(types)
        return None if compiled is None else int(compiled.max_threads_per_block)
