"""Decisions that see the work: heavy calls with small arguments, scalar sizes, exploration
budget, untimed settled calls, and a profile that starts a new runtime settled. The GPU's
timings are injected through the model's interface (``observe``); the CPU's are real."""

from __future__ import annotations

import enum
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.offload import call_wrapper, decorator, imports
from vedart.offload.adaptive import (
    ADAPTIVE_FLOOR,
    EXPLORE_BUDGET,
    EXPLORE_TRIES,
    HEAVY_AT_ONCE_S,
    HEAVY_CONFIRM_CALLS,
    LIGHT_S,
    SAMPLES_KEPT,
    TIMED_FIRST_CALLS,
    TIMED_ONE_IN,
    AdaptiveModel,
    function_key,
    rechecks_deferred,
)
from vedart.offload.arguments import call_key, keyed, scan
from vedart.offload.force import forced_path as veda_forced
from vedart.offload.force import prefer_device


class NoDevice:
    """No argument is one."""


def sleepy_pi(n_samples: int) -> float:
    """Stands in for monte_carlo_pi: an int argument, and CPU time well above LIGHT_S."""
    time.sleep(2 * LIGHT_S)
    return 3.14


def light(n: int) -> int:
    return n + 1


def runtime_with_profile(tmp_path: Path, **options: Any) -> veda.Runtime:
    builder = veda.Config.builder().profile_path(str(tmp_path / "profile.json"))
    for name, value in options.items():
        builder = getattr(builder, name)(value)
    return veda.init(builder.build(), device_probe=FakeProbe())


def key_of(function: Any) -> str:
    return function_key(function, f"{function.__module__}.{function.__qualname__}")


def teach_gpu(model: AdaptiveModel, key: str, signature: str, seconds: float) -> None:
    for _ in range(EXPLORE_TRIES + 1):  # the first, a switch of path, is not learned
        model.observe(key, signature, 0, "gpu", seconds)


def test_scalar_arguments_size_the_bucket() -> None:
    small = scan((100,), {}, NoDevice, ("n",))
    large = scan((10**7,), {}, NoDevice, ("n",))
    assert small.signature == ";n~2^6" and large.signature == ";n~2^23"
    mixed = scan((np.ones(4, np.float32), 2.5), {"steps": np.int64(1000), "flag": True},
                 NoDevice, ("x", "alpha"))
    assert mixed.signature == "<f4:1;alpha~2^1,steps~2^9"  # bools do not size work
    assert scan((float("nan"), 0.001), {}, NoDevice, ()).signature == ";arg1~2^0"
    durations = scan((np.timedelta64(5, "s"), np.timedelta64("NaT")), {}, NoDevice, ())
    assert durations.signature == ""  # not sizes (int() does not take them)


def test_a_heavy_call_with_small_arguments_reaches_the_model_and_moves_to_the_gpu(
        tmp_path: Path) -> None:
    runtime = runtime_with_profile(tmp_path)
    model = runtime.cost_model
    assert model is not None
    pi = veda.gpu(sleepy_pi)
    assert pi.explain(20_000_000).reason == "below threshold: 0 B < 65.5 KB"
    assert pi(20_000_000) == 3.14  # on the fast path, timed: heavy, or a stall
    assert pi.explain(20_000_000).reason == "below threshold: 0 B < 65.5 KB"
    assert pi(20_000_000) == 3.14  # heavy again: work, not a stall
    key = key_of(sleepy_pi)
    signature = ";n_samples~2^24"
    # The model has the CPU's real time, and the GPU is next (predicted far faster).
    assert model.choose(key, signature, 0, peek=True).path == "gpu"
    assert pi.explain(20_000_000).reason == \
        f"adaptive: exploring gpu for n_samples~2^24 (0 of {EXPLORE_TRIES} tries)"
    teach_gpu(model, key, signature, 2e-5)
    decision = pi.explain(20_000_000)
    assert decision.path == "gpu" and decision.model == "adaptive"
    assert decision.reason.startswith("adaptive: gpu 0.02 ms vs cpu ")
    assert decision.reason.endswith(f" for n_samples~2^24 ({EXPLORE_TRIES + 1} samples)")
    # Learned apart: a far smaller n has its own bucket, not yet explored.
    assert "n_samples~2^6" in pi.explain(100).reason


stalls: dict[int, float] = {}  # call number -> seconds that call waits
calls_made: list[int] = [0]


def stalls_at(n: int) -> int:
    """A light function whose calls numbered in ``stalls`` are slow (a stall, not work)."""
    wait = stalls.pop(calls_made[0], 0.0)
    calls_made[0] += 1
    if wait:
        time.sleep(wait)
    return n + 1


def stalling(calls: dict[int, float]) -> Any:
    stalls.clear()
    stalls.update(calls)
    calls_made[0] = 0
    return veda.gpu(stalls_at)


@pytest.mark.parametrize(("first_s", "heavy"), [(2 * LIGHT_S, False),
                                                 (HEAVY_AT_ONCE_S * 1.5, True)])
def test_one_slow_call_makes_a_function_heavy_only_when_it_is_long(
        tmp_path: Path, first_s: float, heavy: bool) -> None:
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    f = stalling({0: first_s})
    for _ in range(3 * HEAVY_CONFIRM_CALLS):
        assert f(7) == 8
    below = f.explain(7).reason == "below threshold: 0 B < 65.5 KB"
    assert below is not heavy
    assert (key_of(stalls_at) in runtime.cost_model._data["functions"]) is heavy


def test_a_second_stall_makes_a_function_heavy_only_soon_after_the_first(
        tmp_path: Path) -> None:
    runtime_with_profile(tmp_path)
    late = TIMED_FIRST_CALLS + 5 * TIMED_ONE_IN  # a timed call more than 64 after call 0
    assert late > HEAVY_CONFIRM_CALLS
    f = stalling({0: 2 * LIGHT_S, late: 2 * LIGHT_S, late + TIMED_ONE_IN: 2 * LIGHT_S})
    for _ in range(late + 1):
        f(1)
    assert f.explain(1).reason == "below threshold: 0 B < 65.5 KB"
    for _ in range(TIMED_ONE_IN):  # the next timed call stalls too, within the window
        f(1)
    assert f.explain(1).reason.startswith("adaptive: "), f.explain(1).reason


@pytest.fixture
def slow_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes a module whose import takes ``seconds`` (a lazy import's stall), to be imported
    by name; removed from ``sys.modules`` afterwards."""
    made: list[str] = []
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def make(seconds: float) -> str:
        name = f"vd_lazy_{len(made)}_{os.getpid()}"
        (folder / f"{name}.py").write_text(f"import time\ntime.sleep({seconds})\nONE = 1\n")
        made.append(name)
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


def importing(module: str, work_s: float, stall_at: int | None = None) -> Any:
    """A function that imports ``module`` on its first call and works ``work_s`` a call; its
    call number ``stall_at`` also stalls for 2 * LIGHT_S."""
    made = [0]

    def work(n: int, x: Any = None) -> int:
        one = importlib.import_module(module).ONE
        if made[0] == stall_at:
            time.sleep(2 * LIGHT_S)
        made[0] += 1
        if work_s:
            time.sleep(work_s)
        return n + one
    work.__qualname__ = f"work_{module}"  # a key of its own
    return work


def cpu_samples(model: AdaptiveModel, function: Any, signature: str, nbytes: int) -> list[float]:
    buckets = model._data["functions"].get(key_of(function), {})
    samples = buckets.get(f"{signature}|{max(nbytes, 1).bit_length() - 1}", {"cpu": []})
    return [seconds for seconds, _ in samples["cpu"]]


def test_imports_are_counted_for_the_thread_that_makes_them(slow_import: Any) -> None:
    before = imports.imports_so_far()
    assert not imports.imported_since(before)
    other = threading.Thread(target=importlib.import_module, args=(slow_import(0.0),))
    other.start()
    other.join()
    assert not imports.imported_since(before)  # another thread's import
    importlib.import_module(slow_import(0.0))
    assert imports.imported_since(before)
    before = imports.imports_so_far()
    with pytest.raises(ImportError):
        importlib.import_module("vd_no_such_module")
    assert imports.imported_since(before)  # asked the finders all the same
    before = imports.imports_so_far()
    importlib.import_module("json")  # loaded already: nothing to find
    assert not imports.imported_since(before)


def test_a_first_call_that_imports_does_not_make_a_light_function_heavy(
        tmp_path: Path, slow_import: Any) -> None:
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    # One stall soon after is one stall: the import is not the first of two.
    function = importing(slow_import(3 * HEAVY_AT_ONCE_S), 0.0, stall_at=5)
    f = veda.gpu(function)
    for _ in range(3 * HEAVY_CONFIRM_CALLS):
        assert f(7) == 8
    assert f.explain(7).reason == "below threshold: 0 B < 65.5 KB"
    assert key_of(function) not in runtime.cost_model._data["functions"]


@pytest.mark.parametrize("above_floor", [False, True])
def test_a_heavy_function_whose_first_call_imports_learns_its_work_not_the_import(
        tmp_path: Path, slow_import: Any, above_floor: bool) -> None:
    # Below the floor the fast path times the calls; above it, the model's exploring CPU calls.
    runtime = runtime_with_profile(tmp_path)
    model = runtime.cost_model
    assert model is not None
    function = importing(slow_import(0.2), 2 * LIGHT_S)
    f = veda.gpu(function)
    x = np.random.default_rng(3).random(2 * ADAPTIVE_FLOOR // 8)
    args, signature = ((7, x), "<f8:1;n~2^2") if above_floor else ((7,), ";n~2^2")
    nbytes = x.nbytes if above_floor else 0
    if above_floor:
        assert f.explain(*args).exploring
    assert f(*args) == 8  # imported: a stall, not learned
    assert cpu_samples(model, function, signature, nbytes) == []
    if not above_floor:
        assert f(*args) == 8  # under HEAVY_AT_ONCE_S: one more confirms it
    assert f(*args) == 8
    assert f.explain(*args).reason.startswith("adaptive: "), f.explain(*args).reason
    learned = cpu_samples(model, function, signature, nbytes)
    assert len(learned) == 1 and learned[0] < 0.1, learned  # not the 0.2 s import


def test_an_import_that_recurs_is_work(tmp_path: Path) -> None:
    runtime_with_profile(tmp_path)

    def tries_an_optional_module(n: int) -> int:
        try:
            importlib.import_module("vd_optional_accelerator")  # asks the finders every call
        except ImportError:
            time.sleep(1.5 * HEAVY_AT_ONCE_S)
        return n + 1

    f = veda.gpu(tries_an_optional_module)
    for _ in range(imports.SET_ASIDE_AT_MOST):
        assert f(7) == 8
    assert f.explain(7).reason == "below threshold: 0 B < 65.5 KB"
    assert f(7) == 8
    assert f.explain(7).reason.startswith("adaptive: "), f.explain(7).reason


@pytest.mark.parametrize("exploring", [True, False])
def test_a_recheck_that_imports_is_learned_all_the_same(tmp_path: Path, exploring: bool
                                                        ) -> None:
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    f = veda.gpu(light)
    site = f.__globals__["_vd_site"]
    facts = scan((3,), {}, NoDevice, ("n",))
    decision = decorator.Decision("cpu", "adaptive: ...", model="adaptive",
                                  exploring=exploring)
    site.learn(runtime, decision, facts, 1e-3, imported=True)
    learned = cpu_samples(runtime.cost_model, light, ";n~2^1", 0)
    assert learned == ([] if exploring else [1e-3])


@pytest.mark.parametrize("telemetry", [True, False])
def test_the_fast_path_times_the_first_calls_then_one_in_a_few(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, telemetry: bool) -> None:
    runtime_with_profile(tmp_path, telemetry=telemetry)
    clock_reads: list[None] = []
    real_clock = time.perf_counter
    monkeypatch.setattr(call_wrapper.time, "perf_counter",
                        lambda: clock_reads.append(None) or real_clock())
    f = veda.gpu(light)
    for _ in range(TIMED_FIRST_CALLS):  # calls of n + 1 never take LIGHT_S
        f(3)
    assert len(clock_reads) == 2 * TIMED_FIRST_CALLS
    for _ in range(10 * TIMED_ONE_IN):
        f(3)
    assert len(clock_reads) == 2 * (TIMED_FIRST_CALLS + 10)


def test_a_light_function_never_explores(tmp_path: Path) -> None:
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    f = veda.gpu(light)
    for n in (1, 10**3, 10**9):
        for _ in range(50):
            assert f(n) == n + 1
    assert runtime.telemetry.recent() == []  # every call took the fast path
    assert key_of(light) not in runtime.cost_model._data["functions"]


def test_settled_calls_are_neither_timed_nor_learned(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = runtime_with_profile(tmp_path, telemetry=False)
    model = runtime.cost_model
    assert model is not None
    pi = veda.gpu(sleepy_pi)
    pi(20_000_000)
    pi(20_000_000)  # heavy twice: the model decides its calls from now on
    key, signature = key_of(sleepy_pi), ";n_samples~2^12"
    for _ in range(EXPLORE_TRIES + 1):  # settle n~2^12 on the CPU (the GPU far slower)
        model.observe(key, signature, 0, "cpu", 1e-3)
    teach_gpu(model, key, signature, 1.0)
    assert pi.explain(5000).timed is False and pi.explain(5000).path == "cpu"
    clock_reads: list[None] = []
    observed: list[tuple[Any, ...]] = []
    real_clock = time.perf_counter
    monkeypatch.setattr(decorator.time, "perf_counter",
                        lambda: clock_reads.append(None) or real_clock())
    monkeypatch.setattr(model, "observe", lambda *args: observed.append(args))
    for _ in range(100):
        assert pi(5000) == 3.14
    assert observed == [] and clock_reads == []


def test_exploring_a_slower_path_stays_within_the_budget() -> None:
    model = AdaptiveModel()
    times = {"cpu": 1e-3, "gpu": 1.3e-3}  # the gpu 30% slower: worth a try, not three

    def call() -> bool:
        path, _, timed, _ = model.choose("f", "<f4:1", 16 * 2**20)
        if timed:
            model.observe("f", "<f4:1", 16 * 2**20, path, times[path])
        return timed

    while call():
        pass
    assert len(model._samples("f", "<f4:1", 24)["gpu"]) < EXPLORE_TRIES
    ledger = model._ledgers["f"]
    for _ in range(5000):  # re-checks included
        call()
        assert ledger.extra <= EXPLORE_BUDGET * ledger.total + max(times.values())
    assert ledger.extra > 0


def test_a_saved_profile_starts_a_new_runtime_settled(tmp_path: Path) -> None:
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    pi = veda.gpu(sleepy_pi)
    pi(20_000_000)
    pi(20_000_000)  # heavy twice
    teach_gpu(runtime.cost_model, key_of(sleepy_pi), ";n_samples~2^24", 2e-5)
    veda.shutdown()  # saves the profile
    runtime_with_profile(tmp_path)
    decision = pi.explain(20_000_000)
    assert decision.path == "gpu" and decision.timed is False
    assert decision.reason.endswith(f"({EXPLORE_TRIES + 1} samples, from profile)")
    # Its small calls reach the model at once: no first call runs on the fast path.
    assert pi.explain(10).reason.startswith("adaptive: ")
    assert pi.explain(10).reason != f"below threshold: 0 B < {ADAPTIVE_FLOOR}"


def test_a_process_that_never_shuts_down_saves_what_it_learned_at_exit(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    program = (
        "import vedart as veda\n"
        f"runtime = veda.init(veda.Config.builder().profile_path({str(profile)!r}).build())\n"
        "runtime.cost_model.observe('m.f@0', '<f8:1', 4096, 'cpu', 0.01)\n"
    )  # and no veda.shutdown()
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    saved = json.loads(profile.read_text())
    assert saved["functions"]["m.f@0"]["<f8:1|12"]["cpu"] == [[0.01, 4096]]


def scaled_head(x: np.ndarray, k: int, scale: float = 1.0) -> np.ndarray:
    """Light work on a 1 MB argument, with numbers among the arguments: the learned CPU
    ceiling ends at such sizes, so every call reaches the slow path."""
    return x[:4] * (k * scale)


def settled_on_the_cpu(model: AdaptiveModel, function: Any, args: tuple[Any, ...],
                       gpu_s: float = 1.0) -> tuple[str, str]:
    """Teach ``model`` that the bucket of these arguments (as the wrapper passes them) is
    settled on the CPU at 1 ms, the GPU taking ``gpu_s``; its key and signature."""
    facts = scan(args, {}, NoDevice, ("x", "k", "scale"))
    key = key_of(function)
    for path, seconds in (("cpu", 1e-3), ("gpu", gpu_s)):
        for _ in range(EXPLORE_TRIES + 1):  # the first, a switch of path, is not learned
            model.observe(key, facts.signature, facts.host_bytes, path, seconds)
    return key, facts.signature


def scaled_head_on_a_fake_gpu(tmp_path: Path) -> tuple[veda.Runtime, AdaptiveModel, Any,
                                                       np.ndarray]:
    """A runtime learning into a profile under ``tmp_path``, its model, ``scaled_head``
    decorated, and a fresh 1 MB argument for it."""
    runtime = runtime_with_profile(tmp_path)
    assert runtime.cost_model is not None
    return runtime, runtime.cost_model, veda.gpu(scaled_head), \
        np.random.default_rng().random(2**17)


def counting_choices(model: AdaptiveModel, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``model.choose`` answers from now on, one entry per call."""
    choices: list[str] = []
    real_choose = model.choose

    def choose(*args: Any, **kwargs: Any) -> Any:
        choice = real_choose(*args, **kwargs)
        choices.append(choice.path)
        return choice
    monkeypatch.setattr(model, "choose", choose)
    return choices


def test_settled_cpu_calls_run_on_a_lease_without_asking_the_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, model, f, x = scaled_head_on_a_fake_gpu(tmp_path)
    settled_on_the_cpu(model, scaled_head, (x, 3, 1.0))  # the default, as the wrapper passes it
    reason = f.explain(x, 3).reason
    assert reason.startswith("adaptive: gpu 1 s vs cpu 1 ms at ~1.0 MB, k~2^1, scale~2^0 (")
    assert f.explain(x, k=3, scale=1.0).reason == f.plan_call(x, 3).decision.reason == reason
    choices = counting_choices(model, monkeypatch)
    recorded = len(runtime.telemetry.recent())
    for _ in range(200):
        np.testing.assert_array_equal(f(x, 3), x[:4] * 3.0)
    assert choices == ["cpu"]  # the first call asked, and took a lease the others ran on
    assert len(runtime.telemetry.recent()) == recorded + 1  # as the fast path: no records
    stats = runtime.telemetry.function(f"{__name__}.scaled_head")
    assert stats.last_decision() == ("cpu", reason)
    assert stats.totals()["calls"]["cpu"] == 200
    # Another bucket (k~2^9), or another type of argument, is not on the lease.
    settled_on_the_cpu(model, scaled_head, (x, 1000, 1.0))
    f(x, 1000)
    f(x, np.int64(3))
    assert choices == ["cpu"] * 3


def test_a_lease_ends_when_its_bucket_changes_and_never_holds_under_force(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, model, f, x = scaled_head_on_a_fake_gpu(tmp_path)
    key, signature = settled_on_the_cpu(model, scaled_head, (x, 3, 0.5))
    choices = counting_choices(model, monkeypatch)
    f(x, 3, scale=0.5)
    model.observe("another", signature, x.nbytes, "cpu", 1e-2)  # learning elsewhere
    f(x, 3, scale=0.5)
    assert choices == ["cpu"]  # the second call ran on the lease the first took
    with pytest.warns(veda.OffloadWarning, match="GPU failed"):  # tried: the fake GPU fails
        with veda.force("gpu"):
            f(x, 3, scale=0.5)
    for _ in range(EXPLORE_TRIES + 1):  # the GPU is now measured far faster
        model.observe(key, signature, x.nbytes, "gpu", 1e-5)
    f(x, 3, scale=0.5)  # asks the model (and, the forced try having failed, runs on the CPU)
    assert choices == ["cpu", "gpu"]


def until_rechecked(model: AdaptiveModel, monkeypatch: pytest.MonkeyPatch, leases: bool,
                    step: Any, calls: int) -> tuple[int, int]:
    """Run ``step(call)`` for calls 1, 2, ... until the model answers one with the GPU (a
    re-check): that call's number, and how many calls asked the model. Without ``leases``
    the model lends none."""
    if not leases:
        monkeypatch.setattr(model, "lease", lambda *args: None)
    choices = counting_choices(model, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)  # the fake GPU fails
        for call in range(1, calls):
            step(call)
            if choices[-1:] == ["gpu"]:
                return call, len(choices)
    raise AssertionError(f"no re-check in {calls} calls")


def test_leases_keep_the_recheck_schedule_whatever_holds_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two call keys of one bucket (scale 0.25 and 0.75 are both scale~2^0) alternate, and
    another function learns between calls: the re-check comes on the same call as when the
    model decides every call."""
    def first_recheck(leases: bool) -> int:
        _, model, f, x = scaled_head_on_a_fake_gpu(tmp_path / str(leases))
        _, signature = settled_on_the_cpu(model, scaled_head, (x, 3, 0.25), gpu_s=16e-3)

        def step(call: int) -> None:
            f(x, 3, 0.25 if call % 2 else 0.75)
            model.observe("another", signature, 4 * x.nbytes, "cpu", 1e-3 * call)
        return until_rechecked(model, monkeypatch, leases, step, 2000)[0]

    rechecked_at = first_recheck(leases=False)
    assert rechecked_at > 100  # a path 16x slower: re-checked hundreds of calls apart
    assert first_recheck(leases=True) == rechecked_at


def test_leased_calls_from_many_threads_are_each_counted_once(tmp_path: Path) -> None:
    _, model, f, x = scaled_head_on_a_fake_gpu(tmp_path)
    key, signature = settled_on_the_cpu(model, scaled_head, (x, 3, 0.25))
    f(x, 3, 0.25)
    revisit, ledger = model._buckets[key, signature, 20].revisit, model._ledger(key)
    assert revisit is not None
    calls_left, total = revisit.calls_left, ledger.total

    def caller(scale: float) -> None:
        for _ in range(250):
            f(x, 3, scale)

    threads = [threading.Thread(target=caller, args=(scale,))
               for scale in (0.25, 0.375, 0.75, 0.875) * 2]  # four call keys, one bucket
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert revisit.calls_left == calls_left - 2000
    assert ledger.total == pytest.approx(total + 2000 * 1e-3)


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    @veda.gpu
    def head(self, x: np.ndarray, k: int) -> np.ndarray:
        return x[:4] * (k * self.factor)


def test_a_decorated_method_runs_on_leases(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = runtime_with_profile(tmp_path)
    model = runtime.cost_model
    assert model is not None
    scaler, x = Scaler(0.5), np.random.default_rng().random(2**17)
    facts = scan((scaler, x, 3), {}, NoDevice, ("self", "x", "k"))
    key = function_key(Scaler.head.__wrapped__, f"{__name__}.Scaler.head")
    for path, seconds in (("cpu", 1e-3), ("gpu", 1.0)):
        for _ in range(EXPLORE_TRIES + 1):
            model.observe(key, facts.signature, facts.host_bytes, path, seconds)
    choices = counting_choices(model, monkeypatch)
    for _ in range(50):
        np.testing.assert_array_equal(scaler.head(x, 3), x[:4] * 1.5)
    assert choices == ["cpu"]


def test_a_lease_ends_with_its_runtime_and_when_the_gpu_is_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, model, f, x = scaled_head_on_a_fake_gpu(tmp_path / "first")
    settled_on_the_cpu(model, scaled_head, (x, 3, 1.0))
    f(x, 3)
    f(x, 3)
    veda.shutdown()
    runtime = runtime_with_profile(tmp_path / "second")
    assert runtime.cost_model is not None
    choices = counting_choices(runtime.cost_model, monkeypatch)
    f(x, 3)
    assert choices == ["cpu"]  # the new runtime's model decided it (exploring)
    settled_on_the_cpu(runtime.cost_model, scaled_head, (x, 3, 1.0))
    f(x, 3)
    f(x, 3)
    assert choices == ["cpu", "cpu"]
    with prefer_device(5):  # a device the runtime lacks: refused, as the call decides
        f(x, 3)
    assert choices == ["cpu", "cpu"]
    stats = runtime.telemetry.function(f"{__name__}.scaled_head")
    assert stats.last_decision() == ("cpu", "device 5 is not available (runtime devices: [0])")
    runtime.gpu.disable("context lost (simulated)")  # type: ignore[union-attr]
    f(x, 3)
    assert stats.last_decision() == ("cpu", "no GPU: context lost (simulated)")


def test_leased_calls_leave_the_fast_path_timing_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock_reads: list[None] = []
    real_clock = time.perf_counter
    monkeypatch.setattr(call_wrapper.time, "perf_counter",
                        lambda: clock_reads.append(None) or real_clock())
    _, model, f, x = scaled_head_on_a_fake_gpu(tmp_path)
    settled_on_the_cpu(model, scaled_head, (x, 3, 1.0))
    small = np.ones(16)
    f(x, 3)  # takes the lease
    clock_reads.clear()
    for _ in range(TIMED_FIRST_CALLS):
        f(small, 3)
        f(x, 3)  # leased: not a fast-path call
    assert len(clock_reads) == 2 * TIMED_FIRST_CALLS
    for _ in range(TIMED_ONE_IN):  # then one fast-path call in TIMED_ONE_IN is timed
        f(small, 3)
        f(x, 3)
    assert len(clock_reads) == 2 * TIMED_FIRST_CALLS + 2


def settled_on_the_fits(model: AdaptiveModel, x: np.ndarray) -> str:
    """Teach ``model`` both paths of ``head_of(x, k)`` at k = 8 and 32 and the CPU alone at
    k = 128, whose GPU time the fits over the other two predict (far slower): the signature
    of k = 8."""
    for k, seconds in ((8, {"cpu": 1e-4, "gpu": 1e-2}), (32, {"cpu": 4e-4, "gpu": 1.1e-2}),
                       (128, {"cpu": 1.6e-3})):
        facts = scan((x, k), {}, NoDevice, ("x", "k"))
        for path, each in seconds.items():
            for _ in range(EXPLORE_TRIES + 1):
                model.observe(key_of(head_of), facts.signature, facts.host_bytes, path, each)
    return scan((x, 8), {}, NoDevice, ("x", "k")).signature


def head_of(x: np.ndarray, k: int) -> np.ndarray:
    return x[:4] * k


def test_a_bucket_settled_on_the_fits_runs_on_a_lease_while_they_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-check of a bucket settled against a predicted time comes on the same call with
    leases as without, while learning at another size moves the fits."""
    def first_recheck(leases: bool) -> tuple[int, int]:
        runtime = runtime_with_profile(tmp_path / str(leases))
        model = runtime.cost_model
        assert model is not None
        f, x = veda.gpu(head_of), np.random.default_rng().random(2**17)
        other = settled_on_the_fits(model, x)
        decision = f.explain(x, 128)
        assert decision.path == "cpu" and not decision.timed

        def step(call: int) -> None:
            f(x, 128)
            if call % 37 == 0:  # learning at another size moves the fits
                model.observe(key_of(head_of), other, x.nbytes, "gpu", 1e-2 * (1 + call % 3))
        return until_rechecked(model, monkeypatch, leases, step, 3000)

    leased_at, asked_leased = first_recheck(leases=True)
    rechecked_at, asked = first_recheck(leases=False)
    assert leased_at == rechecked_at > 100 and asked == rechecked_at
    assert asked_leased < asked / 4  # the model asked only when the fits had moved
    # Fits that come to predict the GPU faster end the lease: the model chooses again.
    runtime = runtime_with_profile(tmp_path / "moved")
    model = runtime.cost_model
    assert model is not None
    f, x = veda.gpu(head_of), np.random.default_rng().random(2**17)
    settled_on_the_fits(model, x)
    choices = counting_choices(model, monkeypatch)
    f(x, 128)
    f(x, 128)
    assert choices == ["cpu"]
    for k in (8, 32):
        facts = scan((x, k), {}, NoDevice, ("x", "k"))
        for _ in range(SAMPLES_KEPT):
            model.observe(key_of(head_of), facts.signature, facts.host_bytes, "gpu", 1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)  # tried: the fake GPU fails
        f(x, 128)
    assert choices == ["cpu", "gpu"]


def test_a_lease_counts_each_call_as_the_model_counts_a_settled_one() -> None:
    model, twin = AdaptiveModel(), AdaptiveModel()
    for each in (model, twin):
        assert each.lease("f", SETTLED_SIG, 2**20, "cpu") is None  # never seen
        settle(each)
        assert each.choose("f", SETTLED_SIG, 2**20).timed is False
    assert model.lease("f", SETTLED_SIG, 2**20, "gpu") is None  # settled on the CPU
    lease = model.lease("f", SETTLED_SIG, 2**20, "cpu")
    assert lease is not None and lease.reason == twin.choose("f", SETTLED_SIG, 2**20,
                                                             peek=True).reason
    with rechecks_deferred():  # a settled call counts the same, deferred or not
        assert lease.take()
        assert twin.choose("f", SETTLED_SIG, 2**20).path == "cpu"
    taken = 0
    while lease.take():
        taken += 1
        assert twin.choose("f", SETTLED_SIG, 2**20).path == "cpu"
    assert taken > 0 and model._ledger("f").total == pytest.approx(twin._ledger("f").total)
    # Due: the model decides the re-check, as the twin does.
    assert model.choose("f", SETTLED_SIG, 2**20) == twin.choose("f", SETTLED_SIG, 2**20)
    assert model.choose("f", SETTLED_SIG, 2**20).path == "gpu"
    assert not lease.take() and model.lease("f", SETTLED_SIG, 2**20, "cpu") is None


SETTLED_SIG = "<f8:1;n~2^2"


def settle(model: AdaptiveModel) -> None:
    """Settle SETTLED_SIG at 1 MB on the CPU, the GPU twice as slow."""
    for path, seconds in (("cpu", 1e-3), ("gpu", 2e-3)):
        for _ in range(EXPLORE_TRIES + 1):  # the first, a switch of path, is not learned
            model.observe("f", SETTLED_SIG, 2**20, path, seconds)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2**20


PLAIN_VALUES = [np.ones(4), np.ones(5), np.ones(4, np.float32), np.ones((2, 2)), np.ones(10**5),
                np.ones(4, ">f8"), 0, 1, 3, -3, 4, 2**70, 2**71, True, False, 0.0, 0.4, 0.6,
                -1.5, 3.0, 1e300, float("inf"), float("nan"), None, "f8", b"x",
                np.float64(1.0), np.float64(3.0), np.float64("nan"), np.int64(3), np.int64(9),
                np.bool_(True), Level.LOW, Level.HIGH, np.dtype("f8"), np.float64, object()]
OTHER_VALUES = [[np.ones(4)], (1,), {"a": 1}, np.matrix([[1.0]])]


def two_named(a: Any, b: Any) -> None:
    """Named parameters: the wrapper builds the call key inline."""


def one_named_and_more(a: Any, *more: Any, **rest: Any) -> None:
    """Variadic parts: the wrapper builds the call key with call_key."""


class KeylessSite:
    plan = None
    leases: dict[Any, Any] = {}


@pytest.mark.parametrize("function", [two_named, one_named_and_more])
def test_call_keys_are_equal_only_for_calls_of_one_signature_and_size_bucket(
        function: Any) -> None:
    key_of_call = call_wrapper.build_wrapper(function, KeylessSite(), veda_forced).call_key
    facts: dict[tuple[Any, ...], set[tuple[str, int]]] = {}
    for first in PLAIN_VALUES:
        for second in PLAIN_VALUES:
            for args, kwargs in (((first, second), {}), ((first,), {"b": second})):
                key = key_of_call(*args, **kwargs)
                assert keyed(key)
                assert key == call_key(args, kwargs) or function is two_named
                scanned = scan(args, kwargs, NoDevice, ("a", "b"))
                bucket = max(scanned.host_bytes, 1).bit_length() - 1
                facts.setdefault(key, set()).add((scanned.signature, bucket))
    assert all(len(found) == 1 for found in facts.values())
    assert len(facts) > 1000  # the values were told apart, not all lumped together
    for value in OTHER_VALUES:
        assert not keyed(key_of_call(np.ones(4), value))
        assert not keyed(key_of_call(np.ones(4), b=value))
