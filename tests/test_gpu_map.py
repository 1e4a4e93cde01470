"""gpu_map without a GPU: routing over fake devices and lanes (device facts from FakeProbe, lanes
bound to fake streams), per-item decisions, exploration by the adaptive model (times injected),
spreading by load, the memory bound on items in flight, hybrid CPU help, placements in
telemetry, errors, nesting and shutdown."""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.errors import DeviceError, ParIterError
from vedart.offload.adaptive import AdaptiveModel, Choice
from vedart.offload.cost import Decision
from vedart.offload.decorator import OffloadOptions
from vedart.offload.force import preferred_device
from vedart.parallel import device_workers, gpu_map
from vedart.parallel.gpu_lanes import (
    REFILL_AT,
    STREAMS_PER_DEVICE,
    DeviceLanes,
    Lane,
    current_lane,
)
from vedart.parallel.gpu_map import HYBRID_SAMPLES, HybridRating
from vedart.parallel.par_iter import par_iter

MB = 1_000_000
_active = threading.local()


class FakeBinding:
    """Lanes bound to fake streams; ``activate`` marks the thread as on (device, stream)."""

    def __init__(self) -> None:
        self._numbers = itertools.count()

    def new_stream(self, device: int) -> str:
        return f"stream of device {device} #{next(self._numbers)}"

    def activate(self, device: int, stream: str) -> None:
        _active.on = (device, stream)


class FakeCall:
    """A decided call of :class:`FakeOffload`, run in the phases a lane runs a PlannedCall."""

    alive: weakref.WeakSet[FakeCall] = weakref.WeakSet()  # a PlannedCall holds staged memory

    def __init__(self, offload: FakeOffload, item: np.ndarray, decision: Decision) -> None:
        FakeCall.alive.add(self)
        self.offload, self.item, self.decision = offload, item, decision
        self.host_bytes = item.nbytes
        self.device_inputs = offload.device_inputs
        self.staged_on: str | None = None
        self._outcome: tuple[bool, Any] | None = None

    def stages(self, engine: object) -> bool:
        return True

    def stage(self, engine: object) -> None:
        self.staged_on = threading.current_thread().name

    def launch(self) -> None:
        self.offload.starts(self)
        self._outcome = self.offload.run(self.item, self.staged_on)

    def run(self) -> Any:
        """Run as decided, on the calling thread (a CPU decision of the adaptive model)."""
        self.offload.starts(self)
        with self.offload.lock:
            self.offload.decided_runs.append(int(self.item[0]))
        value = self.offload.__wrapped__(self.item)
        self.offload.ran(self)
        return value

    def land(self) -> Any:
        assert self._outcome is not None, "land before launch"
        with self.offload.lock:
            self.offload.on_device -= 1
        self.offload.ran(self)
        succeeded, value = self._outcome
        if not succeeded:
            raise value
        return value


class FakeOffload:
    """A @veda.gpu stand-in: items of at least ``threshold`` bytes are decided for the GPU on
    the preferred device; each run records where it ran. ``gpu_seconds`` is the time a launch
    takes on a lane (the raw function, run on CPU workers, takes none). ``most_on_device``
    counts items launched and not yet landed."""

    def __init__(self, function: Callable[[np.ndarray], Any], *, threshold: int = MB,
                 force: str | None = None, gpu_seconds: float = 0.0,
                 cpu_model: str = "static", device_inputs: bool = False) -> None:
        self.__wrapped__ = function
        self.__name__ = function.__name__
        self.gpu_options = OffloadOptions(threshold=threshold, force=force)
        self.gpu_seconds = gpu_seconds
        self.calls: list[tuple[int, Any, int | None, str, str | None]] = []
        self.lock = threading.Lock()
        self.on_device = 0
        self.most_on_device = 0
        self.cpu_model = cpu_model  # the model that decides small items for the CPU
        self.device_inputs = device_inputs  # whether its items stand for device arrays
        self.decided_runs: list[int] = []

    def plan_call(self, item: np.ndarray) -> FakeCall:
        if item.nbytes >= self.gpu_options.threshold or self.gpu_options.force == "gpu":
            device = preferred_device.get()
            assert device is not None
            free = veda.get_runtime().gpu.free_memory(device)  # as the static rule reads it
            return FakeCall(self, item, Decision("gpu", "fake", device, free_bytes=free))
        return FakeCall(self, item, Decision("cpu", "fake: small", model=self.cpu_model))

    def starts(self, call: FakeCall) -> None:
        """``call`` starts as decided (on a CPU worker, or launched on a lane)."""

    def ran(self, call: FakeCall) -> None:
        """``call`` ran as decided (on a CPU worker, or landed from a lane)."""

    def run(self, item: np.ndarray, staged_on: str | None) -> tuple[bool, Any]:
        with self.lock:
            self.on_device += 1
            self.most_on_device = max(self.most_on_device, self.on_device)
            self.calls.append((int(item[0]), getattr(_active, "on", None),
                               preferred_device.get(), threading.current_thread().name,
                               staged_on))
        time.sleep(self.gpu_seconds)
        try:
            return True, self.__wrapped__(item)
        except Exception as error:
            return False, error

    def __call__(self, item: np.ndarray) -> Any:
        with self.lock:
            self.calls.append((int(item[0]), None, preferred_device.get(),
                               threading.current_thread().name, None))
        return self.__wrapped__(item)


class LearningOffload(FakeOffload):
    """A FakeOffload decided by a real AdaptiveModel, as @veda.gpu decides above its floor on the
    default configuration, learning injected times: ``cpu_seconds`` for a run on the CPU,
    ``gpu_seconds`` for one on a lane (whose launch sleeps that long; the function should
    take ``cpu_seconds`` off the lanes, see :func:`costly_on_cpu`). ``running_at_decision``
    lists, per decision, how many of the calls the model was timing had not finished: all
    (``"timed"``), those it was exploring with, and those on the CPU; ``choices``, the
    model's choice of each decision; ``beside``, per timed call as it starts, its path and how
    many other timed calls were running then, per path."""

    def __init__(self, function: Callable[[np.ndarray], Any], *, cpu_seconds: float,
                 gpu_seconds: float) -> None:
        super().__init__(function, threshold=0, gpu_seconds=gpu_seconds, cpu_model="adaptive")
        self.model = AdaptiveModel()
        self.cpu_seconds = cpu_seconds
        self.running = {"timed": 0, "exploring": 0, "cpu": 0}
        self.running_at_decision: dict[str, list[int]] = {kind: [] for kind in self.running}
        self.choices: list[Choice] = []
        self.timed_running = {"cpu": 0, "gpu": 0}
        self.beside: list[tuple[str, dict[str, int]]] = []

    def plan_call(self, item: np.ndarray) -> FakeCall:
        choice = self.model.choose("f", "|u1:1", item.nbytes)
        with self.lock:
            for kind, count in self.running.items():
                self.running_at_decision[kind].append(count)
            self.choices.append(choice)
            self._count(choice.timed, choice.exploring, choice.path, 1)
        flags = {"timed": choice.timed, "exploring": choice.exploring}
        if choice.path == "cpu":
            decision = Decision("cpu", choice.reason, model="adaptive", **flags)
        else:
            device = preferred_device.get()
            assert device is not None
            decision = Decision("gpu", choice.reason, device, model="adaptive",
                                free_bytes=veda.get_runtime().gpu.free_memory(device), **flags)
        return FakeCall(self, item, decision)

    def starts(self, call: FakeCall) -> None:
        if call.decision.timed:
            with self.lock:
                self.beside.append((call.decision.path, dict(self.timed_running)))
                self.timed_running[call.decision.path] += 1

    def ran(self, call: FakeCall) -> None:
        if not call.decision.timed:
            return
        path = call.decision.path
        with self.lock:
            self.timed_running[path] -= 1
        self.model.observe("f", "|u1:1", call.host_bytes, path,
                           self.cpu_seconds if path == "cpu" else self.gpu_seconds)
        with self.lock:
            self._count(True, call.decision.exploring, path, -1)

    def _count(self, timed: bool, exploring: bool, path: str, step: int) -> None:
        if timed:
            self.running["timed"] += step
            self.running["exploring"] += step * exploring
            self.running["cpu"] += step * (path == "cpu")


def first_times_ten(item: np.ndarray) -> int:
    return int(item[0]) * 10


def costly_on_cpu(seconds: float) -> Callable[[np.ndarray], int]:
    """:func:`first_times_ten`, taking ``seconds`` wherever it runs off the GPU lanes."""

    def first_times_ten_slowly(item: np.ndarray) -> int:
        if current_lane() is None:
            time.sleep(seconds)
        return first_times_ten(item)

    return first_times_ten_slowly


def items(count: int, nbytes: int) -> list[np.ndarray]:
    return [np.full(nbytes, i % 256, dtype=np.uint8) for i in range(count)]


@pytest.fixture(autouse=True)
def fake_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_map, "CudaBinding", FakeBinding)


def fake_gpus(count: int = 2, threads: int = 2, **probe_options: Any) -> veda.Runtime:
    """Fake devices with every lane in this process (tests/test_device_workers.py covers the
    worker processes of several devices)."""
    return veda.init(veda.Config.builder().threads(threads).device_processes(False).build(),
                     device_probe=FakeProbe(count, **probe_options))


def placements(runtime: veda.Runtime) -> dict[tuple[str, int | None], int]:
    return {(path, device): count
            for (_, path, device), count in runtime.telemetry.placement_counts().items()}


def test_items_are_spread_over_devices_and_run_in_their_lane() -> None:
    runtime = fake_gpus(count=2)
    wrapper = FakeOffload(first_times_ten, gpu_seconds=0.003)
    assert par_iter(items(40, 2 * MB)).gpu_map(wrapper).collect() == [10 * i for i in range(40)]
    counts = placements(runtime)
    assert set(counts) == {("gpu", 0), ("gpu", 1)} and sum(counts.values()) == 40
    assert min(counts.values()) >= 5  # by load: neither device takes nearly everything
    for _, (device, stream), preferred, thread, staged_on in wrapper.calls:
        assert preferred == device and thread == f"vedart-gpu{device}-lane"
        assert stream.startswith(f"stream of device {device}")
        # On a staging thread, or on the lane when it reached the item before any staging
        # thread had started it (the lane copies then rather than wait).
        assert staged_on is not None
        assert staged_on.startswith("vedart-staging") or staged_on == thread
    recorded = runtime.telemetry.placements()
    assert sorted(p.item for p in recorded) == list(range(40))
    assert all(p.stage == "#1 gpu_map(first_times_ten)" and p.lane in (0, 1) for p in recorded)


def test_a_lane_stages_an_item_itself_when_every_staging_thread_is_busy() -> None:
    from vedart.tasks import Task

    runtime = fake_gpus(count=1)
    engine = runtime.gpu.transfers
    release = threading.Event()
    busy = [engine.submit_staging(release.wait) for _ in range(engine.tuning.threads)]
    wrapper = FakeOffload(first_times_ten)
    returned: list[list[int]] = []
    pipeline = threading.Thread(target=lambda: returned.append(
        par_iter(items(3, 2 * MB)).gpu_map(wrapper).collect()))
    pipeline.start()
    pipeline.join(timeout=10)  # a lane waiting for the busy threads would hang until release
    finished = not pipeline.is_alive()
    release.set()
    pipeline.join()
    assert finished and returned == [[0, 10, 20]]
    assert [staged_on for *_, staged_on in wrapper.calls] == ["vedart-gpu0-lane"] * 3
    assert all(isinstance(task, Task) and task.result() is True for task in busy)


def test_small_items_run_on_cpu_workers_in_order() -> None:
    runtime = fake_gpus(count=1)
    wrapper = FakeOffload(first_times_ten)
    mixed = [np.full(2 * MB if i % 3 == 0 else 100, i, dtype=np.uint8) for i in range(30)]
    assert par_iter(mixed).gpu_map(wrapper).collect() == [10 * i for i in range(30)]
    assert placements(runtime) == {("gpu", 0): 10, ("cpu", None): 20}
    on_lanes = {index for index, active, _, _, _ in wrapper.calls if active is not None}
    assert on_lanes == set(range(0, 30, 3))


def test_cpu_items_the_adaptive_model_chose_run_as_decided_not_decided_again() -> None:
    # Deciding again on the worker could undo a re-check of the CPU (the model's count moved
    # on) and run the item on the GPU outside its lane.
    runtime = fake_gpus(count=1)
    wrapper = FakeOffload(first_times_ten, cpu_model="adaptive")
    mixed = [np.full(2 * MB if i % 3 == 0 else 100, i, dtype=np.uint8) for i in range(30)]
    assert par_iter(mixed).gpu_map(wrapper).collect() == [10 * i for i in range(30)]
    assert sorted(wrapper.decided_runs) == [i for i in range(30) if i % 3]
    assert all(active is not None for _, active, _, _, _ in wrapper.calls)  # lanes only
    assert placements(runtime) == {("gpu", 0): 10, ("cpu", None): 20}


def test_a_lane_keeps_one_item_per_stream_on_the_device() -> None:
    runtime = fake_gpus(count=1)
    wrapper = FakeOffload(first_times_ten, gpu_seconds=0.002)
    assert par_iter(items(12, 2 * MB)).gpu_map(wrapper).collect() == [10 * i for i in range(12)]
    assert wrapper.most_on_device == STREAMS_PER_DEVICE  # launched before the previous landed
    streams = [active[1] for _, active, _, _, _ in sorted(wrapper.calls)]
    assert all(a != b for a, b in zip(streams, streams[1:]))  # round robin over the streams
    assert {p.lane for p in runtime.telemetry.placements()} == set(range(STREAMS_PER_DEVICE))


def test_items_in_flight_are_bounded_by_device_memory() -> None:
    fake_gpus(count=1, free=10 * MB)  # one 4 MB item needs 8 MB (headroom 2.0): one at a time
    wrapper = FakeOffload(first_times_ten, gpu_seconds=0.005)
    assert par_iter(items(6, 4 * MB)).gpu_map(wrapper).collect() == [10 * i for i in range(6)]
    assert wrapper.most_on_device == 1  # two streams, but the memory admits one item at a time


def test_the_model_decides_each_item_knowing_the_times_of_those_it_explored() -> None:
    """A GPU-friendly plain function on the default configuration: the model's first call of
    a size runs on the CPU, and its time must reach the model before the next item is
    decided, or a whole window of items goes to the CPU to explore."""
    runtime = fake_gpus(count=1, threads=2)
    wrapper = LearningOffload(costly_on_cpu(0.2), cpu_seconds=0.2, gpu_seconds=0.002)
    assert par_iter(items(40, 2 * MB)).gpu_map(wrapper).collect() == [10 * i for i in range(40)]
    assert wrapper.running_at_decision["exploring"] == [0] * 40
    counts = placements(runtime)
    # On the CPU: the model's first call, and at most one re-check of the CPU (two calls).
    assert counts.get(("cpu", None), 0) <= 3 and ("hybrid", None) not in counts
    assert counts[("gpu", 0)] >= 37 and sum(counts.values()) == 40
    assert sorted(wrapper.decided_runs) == sorted(
        p.item for p in runtime.telemetry.placements() if p.path == "cpu")


def test_a_settled_sizes_recheck_holds_up_no_item_after_it() -> None:
    """Once the model has settled a size, its re-checks' items are decided and run like the
    others: waiting for each before deciding the next drained the lanes, which made a pipeline
    on the default configuration twice as slow as under the static rule. While a re-check's
    CPU item runs, the items decided are the settled path's, untimed; no timed item starts
    beside a timed CPU item (it would read its interference), even one of a new size decided
    meanwhile."""
    runtime = fake_gpus(count=1, threads=2)
    wrapper = LearningOffload(costly_on_cpu(0.02), cpu_seconds=0.02, gpu_seconds=0.01)
    sizes = [2 * MB] * 80
    for index in range(24, 80, 3):  # new sizes, once 2 MB has settled
        sizes[index] = 2 * MB << (1 + index % 6)
    data = [np.full(size, index, dtype=np.uint8) for index, size in enumerate(sizes)]
    assert par_iter(data).gpu_map(wrapper).collect() == [10 * i for i in range(80)]
    assert wrapper.running_at_decision["exploring"] == [0] * 80
    assert max(wrapper.running_at_decision["timed"]) >= 1  # a re-check's GPU item was running
    beside_cpu = [choice for choice, running in zip(
        wrapper.choices, wrapper.running_at_decision["cpu"]) if running]
    assert any(choice.path == "gpu" and not choice.timed for choice in beside_cpu)
    assert any(choice.timed for choice in beside_cpu)  # a new size, decided meanwhile
    assert all(running["cpu"] == 0 for _, running in wrapper.beside)
    assert all(running["gpu"] == 0 for path, running in wrapper.beside if path == "cpu")
    rechecks = [p for p in runtime.telemetry.placements() if p.path == "cpu"
                and sizes[p.item] == 2 * MB][1:]
    assert len(rechecks) >= 2 and wrapper.model.choose("f", "|u1:1", 2 * MB).path == "gpu"


def test_a_cpu_settled_sizes_recheck_times_the_cpu_after_its_gpu_items() -> None:
    """A size settled on the CPU re-checks the GPU first (two timed lane items), then times
    the CPU: its CPU item starts once those have finished, not beside them."""
    fake_gpus(count=1, threads=2)
    # The CPU runs take less than the model learns, so the workers are idle when a re-check
    # comes: its CPU item would start at once.
    wrapper = LearningOffload(costly_on_cpu(0.0005), cpu_seconds=0.005, gpu_seconds=0.012)
    assert par_iter(items(120, 2 * MB)).gpu_map(wrapper).collect() == [
        10 * i for i in range(120)]
    assert wrapper.model.choose("f", "|u1:1", 2 * MB).path == "cpu"
    assert any(choice.reason.startswith("adaptive: re-checking gpu") for choice in wrapper.choices)
    assert all(running == {"cpu": 0, "gpu": 0} for path, running in wrapper.beside
               if path == "cpu")
    assert all(running["cpu"] == 0 for _, running in wrapper.beside)


def test_idle_cpu_workers_take_items_of_a_size_the_cpu_keeps_up_with() -> None:
    """Items the model sends to the GPU while the CPU, measured on items of the same size in
    this stage, finishes one sooner than a full lane would."""
    runtime = fake_gpus(count=1, threads=2)
    wrapper = FakeOffload(costly_on_cpu(0.001), threshold=900_000, gpu_seconds=0.01)
    # Items 0-2 are below the threshold, in the size bucket of the others (2^19-2^20): the
    # HYBRID_SAMPLES CPU times a worker needs before it takes an item of that size.
    below = HYBRID_SAMPLES
    mixed = [np.full(600_000 if i < below else MB, i, dtype=np.uint8) for i in range(60)]
    assert par_iter(mixed).gpu_map(wrapper).collect() == [10 * i for i in range(60)]
    counts = placements(runtime)
    assert counts[("cpu", None)] == below and counts[("gpu", 0)] >= 1
    assert counts[("hybrid", None)] >= 1 and sum(counts.values()) == 60
    hybrid_items = {p.item for p in runtime.telemetry.placements() if p.path == "hybrid"}
    lane_items = {index for index, active, _, _, _ in wrapper.calls if active is not None}
    assert hybrid_items.isdisjoint(lane_items) and hybrid_items | lane_items == set(
        range(below, 60))


def test_idle_cpu_workers_never_take_items_of_a_size_not_yet_timed_on_the_cpu() -> None:
    """Neither items near the threshold before any CPU time is known, nor items whose CPU time
    was measured only at another size (per input byte, small items said nothing of these)."""
    runtime = fake_gpus(count=1, threads=2)
    near_threshold = items(24, int(1.5 * MB))
    par_iter(near_threshold).gpu_map(FakeOffload(first_times_ten, gpu_seconds=0.03)).collect()
    mixed = [np.full(100_000 if i % 2 else 4 * MB, i, dtype=np.uint8) for i in range(40)]
    par_iter(mixed).gpu_map(FakeOffload(costly_on_cpu(0.001), gpu_seconds=0.03)).collect()
    assert runtime.telemetry.placement_counts() == {
        ("#1 gpu_map(first_times_ten)", "gpu", 0): 24,
        ("#1 gpu_map(first_times_ten_slowly)", "gpu", 0): 20,
        ("#1 gpu_map(first_times_ten_slowly)", "cpu", None): 20}


def test_a_hybrid_item_must_finish_before_the_lane_would_finish_it() -> None:
    rating = HybridRating()
    assert not rating.take(MB, in_flight=16)  # nothing measured
    for _ in range(HYBRID_SAMPLES):
        rating.observe_lane(MB, 0.001)
    assert not rating.take(MB, in_flight=16)  # no CPU time of this size yet
    rating.observe_cpu(64 * MB, 0.0001, hybrid=False)  # another size's says nothing
    assert not rating.take(MB, in_flight=16)
    rating.observe_cpu(MB, 0.0001, hybrid=False)
    assert not rating.take(MB, in_flight=16)  # one CPU item is no measure
    rating.observe_cpu(MB, 0.0059, hybrid=False)
    # 3 ms on the CPU against 1 ms per lane item: the lane's items overlap on the device, so
    # however many are in flight, the CPU must beat one item's lane time.
    assert not rating.take(MB, in_flight=16)
    rating.observe_cpu(MB, 0.0001, hybrid=False)  # now about 2.03 ms per item on the CPU
    assert not rating.take(MB, in_flight=16)
    for _ in range(12):
        rating.observe_cpu(MB, 0.0001, hybrid=False)  # 0.47 ms per item
    assert rating.take(MB, in_flight=0)  # one worker takes it
    assert rating.take(MB, in_flight=16)  # a second shares the CPU: 0.94 ms, still faster
    assert not rating.take(MB, in_flight=16)  # a third: 1.41 ms
    rating.observe_cpu(MB, 0.0001, hybrid=True)
    assert rating.take(MB, in_flight=16)


def test_items_whose_inputs_are_on_the_device_never_go_to_idle_cpu_workers() -> None:
    """The function as written would get the device arrays as they are (CuPy results, or a
    TypeError mixing them with NumPy), on no device made current."""
    runtime = fake_gpus(count=1, threads=2)
    wrapper = FakeOffload(first_times_ten, gpu_seconds=0.03, device_inputs=True)
    near_threshold = items(24, int(1.5 * MB))  # competitive, were they host arrays
    assert par_iter(near_threshold).gpu_map(wrapper).collect() == [10 * i for i in range(24)]
    assert placements(runtime) == {("gpu", 0): 24}


def test_items_far_above_the_threshold_and_forced_items_stay_on_the_gpu() -> None:
    runtime = fake_gpus(count=1)
    par_iter(items(12, 4 * MB)).gpu_map(FakeOffload(first_times_ten, gpu_seconds=0.01)).collect()
    par_iter(items(12, int(1.5 * MB))).gpu_map(
        FakeOffload(first_times_ten, force="gpu", gpu_seconds=0.01)).collect()
    assert placements(runtime) == {("gpu", 0): 24}


def test_force_cpu_keeps_real_gpu_functions_on_the_cpu() -> None:
    runtime = fake_gpus(count=1)

    def total(a: np.ndarray) -> float:
        return float(a.sum())

    arrays = [np.random.default_rng(i).random(300_000) for i in range(6)]
    expected = [float(a.sum()) for a in arrays]
    with veda.force("cpu"):
        assert par_iter(arrays).gpu_map(total).collect() == expected
    assert par_iter(arrays).gpu_map(total, force="cpu").collect() == expected
    assert placements(runtime) == {("cpu", None): 12}


def test_device_argument_pins_items_to_one_device() -> None:
    runtime = fake_gpus(count=2)
    wrapper = FakeOffload(first_times_ten)
    par_iter(items(10, 2 * MB)).gpu_map(wrapper, device=1).collect()
    assert placements(runtime) == {("gpu", 1): 10}
    with pytest.raises(DeviceError, match="device: got 5; allowed: one of the runtime's CUDA "
                                          "ordinals \\[0, 1\\]"):
        par_iter(items(1, 2 * MB)).gpu_map(wrapper, device=5).collect()


def test_item_error_on_a_lane_names_index_and_stage() -> None:
    fake_gpus(count=1)

    def fail_on_three(item: np.ndarray) -> int:
        if int(item[0]) == 3:
            raise ArithmeticError("bad matrix")
        return int(item[0])

    pipeline = par_iter(items(8, 2 * MB)).gpu_map(FakeOffload(fail_on_three))
    with pytest.raises(ParIterError) as caught:
        pipeline.collect()
    assert (caught.value.index, caught.value.stage) == (3, "#1 gpu_map(fail_on_three)")
    assert isinstance(caught.value.__cause__, ArithmeticError)
    assert pipeline.collect(errors="skip") == [0, 1, 2, 4, 5, 6, 7]


def test_gpu_map_inside_a_lane_item_does_not_wait_on_lanes() -> None:
    runtime = fake_gpus(count=1)
    inner = FakeOffload(first_times_ten)

    def nested(item: np.ndarray) -> int:
        return sum(par_iter(items(3, 2 * MB)).gpu_map(inner).collect()) + int(item[0])

    assert par_iter(items(6, 2 * MB)).gpu_map(FakeOffload(nested)).collect() == \
        [30 + i for i in range(6)]
    assert len(inner.calls) == 18
    assert runtime.telemetry.placement_counts() == {("#1 gpu_map(nested)", "gpu", 0): 6}


def test_without_a_gpu_gpu_map_is_a_map_of_the_gpu_function() -> None:
    runtime = veda.init(veda.Config.builder().gpu(False).build())

    def total(a: np.ndarray) -> float:
        return float(a.sum())

    arrays = [np.random.default_rng(i).random(1000) for i in range(50)]
    assert par_iter(arrays).gpu_map(total).collect() == [float(a.sum()) for a in arrays]
    stats = runtime.telemetry.function(f"{__name__}.{total.__qualname__}").as_dict()
    assert stats["cpu_calls"] == 50 and runtime.telemetry.placement_counts() == {}


def test_telemetry_off_records_no_placements() -> None:
    runtime = veda.init(veda.Config.builder().telemetry(False).build(),
                        device_probe=FakeProbe(1))
    par_iter(items(4, 2 * MB)).gpu_map(FakeOffload(first_times_ten)).collect()
    assert runtime.telemetry.placement_counts() == {} and runtime.telemetry.placements() == []


def test_lanes_stop_with_their_runtime() -> None:
    fake_gpus(count=2)
    par_iter(items(4, 2 * MB)).gpu_map(FakeOffload(first_times_ten)).collect()
    lanes = [t for t in threading.enumerate() if t.name.startswith("vedart-gpu")]
    assert sorted(t.name for t in lanes) == ["vedart-gpu0-lane", "vedart-gpu1-lane"]
    veda.init(veda.Config.builder().gpu(False).build())
    assert not any(t.is_alive() for t in lanes)


class HeldWork:
    """Lane work that stays on the device until ``released`` is set."""

    def __init__(self, released: threading.Event) -> None:
        self.released = released
        self.finished = threading.Event()

    def claim(self) -> bool:
        return True

    def begin(self, lane: Lane) -> None:
        pass

    def finish(self) -> None:
        self.released.wait(5)
        self.finished.set()

    def cancel(self) -> None:
        pass

    def fail(self, lane: Lane, error: BaseException) -> None:
        raise AssertionError(f"unexpected failure on {lane}: {error!r}")


def test_a_full_device_admits_again_once_drained_to_its_refill_level() -> None:
    lanes = DeviceLanes(0, STREAMS_PER_DEVICE, FakeBinding(), lambda nbytes, free: True)
    try:
        gates = [threading.Event() for _ in range(lanes.capacity)]
        works = [HeldWork(gate) for gate in gates]
        for work in works:
            assert lanes.admit(MB, None, wait=False)
            lanes.enqueue(work, MB)
        assert not lanes.admit(MB, None, wait=False)  # full: capacity items in flight
        admitted = threading.Event()
        waiter = threading.Thread(target=lambda: lanes.admit(MB, None, wait=True)
                                  and admitted.set())
        waiter.start()
        refill_at = int(REFILL_AT * lanes.capacity)
        for count, (gate, work) in enumerate(zip(gates, works), start=1):
            gate.set()
            assert work.finished.wait(5)
            if lanes.capacity - count > refill_at:
                assert not admitted.wait(0.02), f"woken with {lanes.capacity - count} in flight"
            else:
                break
        assert admitted.wait(5) and lanes.in_flight == refill_at + 1
        waiter.join()
        for gate in gates:
            gate.set()
    finally:
        lanes.shutdown()


def test_a_failed_pipeline_drops_the_calls_it_cancelled() -> None:
    import gc

    runtime = fake_gpus(count=1)

    def fail_first(item: np.ndarray) -> int:
        if int(item[0]) == 0:
            raise ArithmeticError("item zero")
        return int(item[0])

    pipeline = par_iter(items(40, 2 * MB)).gpu_map(FakeOffload(fail_first, gpu_seconds=0.005))
    with pytest.raises(ParIterError) as caught:
        pipeline.collect()
    assert caught.value.index == 0
    del caught  # its frames hold the failed call
    lanes = runtime.scheduler.lanes("threads", lambda: None).devices[0]
    deadline = time.monotonic() + 5
    while lanes.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    gc.collect()
    assert lanes.in_flight == 0 and not FakeCall.alive, len(FakeCall.alive)  # pipeline still held


class FailingBinding(FakeBinding):
    """Fake lanes whose ``failing``-th activation (making device and stream current) raises."""

    failing = 0

    def __init__(self) -> None:
        super().__init__()
        self._activations = itertools.count(1)

    def activate(self, device: int, stream: str) -> None:
        if next(self._activations) == self.failing:
            raise RuntimeError("activation failed")
        super().activate(device, stream)


@pytest.mark.parametrize("failing", [1, 3], ids=["to-begin", "to-finish"])
def test_a_lane_survives_a_device_it_cannot_make_current(monkeypatch: pytest.MonkeyPatch,
                                                         failing: int) -> None:
    monkeypatch.setattr(FailingBinding, "failing", failing)  # 1: item 0 begins, 3: it finishes
    monkeypatch.setattr(gpu_map, "CudaBinding", FailingBinding)
    fake_gpus(count=1)
    wrapper = FakeOffload(first_times_ten)
    returned = par_iter(items(12, 2 * MB)).gpu_map(wrapper).collect(errors="return")
    failed = [i for i, value in enumerate(returned) if isinstance(value, Exception)]
    assert len(failed) == 1 and str(returned[failed[0]]) == "activation failed"
    assert [v for i, v in enumerate(returned) if i not in failed] == [
        10 * i for i in range(12) if i not in failed]
    assert par_iter(items(6, 2 * MB)).gpu_map(wrapper).collect() == [10 * i for i in range(6)]


def test_an_idle_lane_keeps_no_results_alive() -> None:
    import gc

    runtime = fake_gpus(count=1)
    results = par_iter(items(6, 2 * MB)).gpu_map(FakeOffload(lambda item: item * 2)).collect()
    alive = [weakref.ref(result) for result in results]
    del results
    lanes = runtime.scheduler.lanes("threads", lambda: None).devices[0]
    deadline = time.monotonic() + 5
    while lanes.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    gc.collect()
    assert [ref() for ref in alive] == [None] * 6


class _Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    @veda.gpu(returns="host")
    def scale(self, a: np.ndarray) -> np.ndarray:
        return a * self.factor

    @veda.gpu
    @classmethod
    def doubled(cls, a: np.ndarray) -> np.ndarray:
        return a * 2


def test_a_bound_gpu_method_keeps_its_object_in_every_path() -> None:
    # The lanes plan calls, and hybrid CPU workers call __wrapped__: both must bind the object.
    item = np.arange(3.0)
    for method, expected in ((_Scaler(3.0).scale, item * 3), (_Scaler.doubled, item * 2)):
        wrapper = gpu_map.offloaded(method, None)
        np.testing.assert_array_equal(wrapper.plan_call(item).run(), expected)
        np.testing.assert_array_equal(wrapper.__wrapped__(item), expected)
        np.testing.assert_array_equal(wrapper(item), expected)
        assert wrapper.gpu_options == method.gpu_options  # type: ignore[attr-defined]
        results = par_iter([item, item + 1]).gpu_map(method).collect()
        np.testing.assert_array_equal(results[1], expected + (expected[1] - expected[0]))
        # As a device worker gets it: pickle rebuilds the bound method as the wrapper's.
        loaded = device_workers._load_function(device_workers.function_payload(wrapper))
        np.testing.assert_array_equal(loaded.plan_call(item).run(), expected)  # type: ignore
