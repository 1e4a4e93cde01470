"""The adaptive cost model on synthetic timing feeds, through its own interface."""

from __future__ import annotations

import importlib
import json
import math
import multiprocessing
import os
import threading
import time
import warnings
from typing import Any
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.offload import adaptive
from vedart.offload.adaptive import (
    ADAPTIVE_FLOOR,
    CALIBRATION_FIELDS,
    CLEARLY_WORSE,
    EXPLORE_TRIES,
    EXPLORE_BUDGET,
    RECHECK_CALLS,
    REVISIT_FIRST,
    SAMPLES_KEPT,
    SLOW_REVISIT_MIN,
    AdaptiveModel,
    Calibration,
    function_key,
    rechecks_deferred,
    size_bucket,
    typical,
)
from vedart.offload.arguments import scan, signature_of
from vedart.offload.profile import ProfileFile

MB = 10**6
SIG = "<f4:1"


def feed(model: AdaptiveModel, nbytes: int, times: dict[str, float], calls: int,
         key: str = "f", signature: str = SIG) -> list[str]:
    """Run ``calls`` decisions, answering each chosen path with its synthetic time where the
    model times the call (as @gpu does)."""
    chosen = []
    for _ in range(calls):
        path, _, timed, _ = model.choose(key, signature, nbytes)
        if timed:
            model.observe(key, signature, nbytes, path, times[path])
        chosen.append(path)
    return chosen


def test_explores_both_paths_boundedly_then_exploits_the_faster() -> None:
    model = AdaptiveModel()
    chosen = feed(model, 16 * MB, {"cpu": 0.010, "gpu": 0.008}, calls=20)
    # The first call runs as written; then each path's tries back to back, each after an
    # unlearned first call on it (the switch).
    explored = 2 * EXPLORE_TRIES + 2
    assert chosen[:explored] == ["cpu"] + ["gpu"] * (EXPLORE_TRIES + 1) + ["cpu"] * EXPLORE_TRIES
    assert set(chosen[explored:]) == {"gpu"}


def test_the_first_call_after_a_switch_of_path_is_not_learned_from() -> None:
    model = AdaptiveModel()
    model.observe("f", SIG, 16 * MB, "gpu", 0.003)
    model.observe("f", SIG, 16 * MB, "cpu", 0.050)  # the cpu path waking up
    model.observe("f", SIG, 16 * MB, "cpu", 0.009)
    model.observe("f", SIG, 4 * MB, "gpu", 0.002)  # another bucket: its own first call
    samples = model._samples("f", SIG, size_bucket(16 * MB))
    assert [seconds for seconds, _ in samples["cpu"]] == [0.009]
    assert [seconds for seconds, _ in samples["gpu"]] == [0.003]
    assert len(model._samples("f", SIG, size_bucket(4 * MB))["gpu"]) == 1


def test_explores_one_path_at_a_time_starting_with_the_predicted_faster() -> None:
    # a path's tries back to back: each is timed after itself, as it runs once chosen
    prior_cpu = AdaptiveModel(calibration=Calibration(cpu_bytes_per_s=1e12))
    chosen = feed(prior_cpu, 16 * MB, {"cpu": 0.0010, "gpu": 0.0012}, calls=2 * EXPLORE_TRIES)
    assert chosen[:EXPLORE_TRIES + 1] == ["cpu"] * EXPLORE_TRIES + ["gpu"]
    # Predicted at 16 ms on the CPU (above FIRST_ON_CPU_S), the first call goes to the GPU.
    prior_gpu = AdaptiveModel(calibration=Calibration(cpu_bytes_per_s=1e9))
    chosen = feed(prior_gpu, 16 * MB, {"cpu": 0.0010, "gpu": 0.0012}, calls=2 * EXPLORE_TRIES)
    assert chosen[:EXPLORE_TRIES] == ["gpu"] * EXPLORE_TRIES


def test_stops_exploring_a_clearly_worse_path_after_one_sample() -> None:
    model = AdaptiveModel(calibration=Calibration(cpu_bytes_per_s=1e12))  # prior: cpu first
    chosen = feed(model, 16 * MB, {"cpu": 0.001, "gpu": 0.001 * (CLEARLY_WORSE + 1)}, calls=10)
    assert chosen.count("gpu") == 2 and chosen[-1] == "cpu"  # an unlearned call, one sample


def test_one_stalled_sample_of_a_cheap_cpu_call_does_not_send_it_to_the_gpu() -> None:
    # A 0.08 ms call measured once at 6 ms (a stall): against a mere guess at the GPU it is
    # tried again, and the CPU, faster than the GPU measured at 0.25 ms, keeps the size.
    model = AdaptiveModel()
    times = iter([0.006] + [0.00008] * 20)
    chosen = []
    for _ in range(12):
        path, _, timed, _ = model.choose("f", SIG, 256 * 1024)
        if timed:
            model.observe("f", SIG, 256 * 1024, path,
                          next(times) if path == "cpu" else 0.00025)
        chosen.append(path)
    assert chosen[:2] == ["cpu", "cpu"] and chosen[-4:] == ["cpu"] * 4
    assert model.choose("f", SIG, 256 * 1024).reason.startswith(
        "adaptive: gpu 0.25 ms vs cpu 0.08 ms")
    # A call of 10 ms or more is not run again to confirm it (a heavy call).
    model = AdaptiveModel()
    model.observe("g", SIG, 256 * 1024, "cpu", 0.012)
    assert model.choose("g", SIG, 256 * 1024).path == "gpu"


def test_reason_strings() -> None:
    model = AdaptiveModel()
    assert model.choose("f", SIG, 16 * MB) == (
        "cpu", "adaptive: exploring cpu at ~16.0 MB (first call)", True, True)
    feed(model, 16 * MB, {"cpu": 0.0098, "gpu": 0.0031}, calls=2)
    assert model.choose("f", SIG, 16 * MB) == (
        "gpu", f"adaptive: exploring gpu at ~16.0 MB (0 of {EXPLORE_TRIES} tries)", True, True)
    feed(model, 16 * MB, {"cpu": 0.0098, "gpu": 0.0031}, calls=8)
    # The cpu, measured clearly worse twice (one sample of a cheap call confirmed), is not
    # explored further.
    assert model.choose("f", SIG, 16 * MB) == (
        "gpu", "adaptive: gpu 3.1 ms vs cpu 9.8 ms at ~16.0 MB (5 samples)", False, False)
    assert model.choose("g", "<f8:0;n~2^24", 0).reason == \
        "adaptive: exploring cpu for n~2^24 (first call)"


def test_a_bucket_with_both_paths_reuses_its_choice_until_its_samples_change_it() -> None:
    model = AdaptiveModel()
    # cpu 12 ms: one sample of a call that long is not confirmed (see the stalled sample)
    feed(model, 16 * MB, {"cpu": 0.012, "gpu": 0.0031}, calls=8)
    first = model.choose("f", SIG, 16 * MB)
    assert model.choose("f", SIG, 10 * MB) is first  # the same bucket: no new choice
    model.observe("f", SIG, 16 * MB, "gpu", 0.0035)  # a count in the reason changes
    assert model.choose("f", SIG, 16 * MB)[1].endswith("(5 samples)")
    for _ in range(SAMPLES_KEPT):
        model.observe("f", SIG, 16 * MB, "gpu", 0.0040)  # window full of slower samples
    settled = model.choose("f", SIG, 16 * MB)
    model.observe("f", SIG, 16 * MB, "gpu", 0.0045)  # neither count nor typical time changes
    assert model.choose("f", SIG, 16 * MB) is settled
    model.observe("f", SIG, 16 * MB, "cpu", 0.0010)  # a switch: not learned
    model.observe("f", SIG, 16 * MB, "cpu", 0.0010)  # a new cpu typical time: tried again
    assert model.choose("f", SIG, 16 * MB) == (
        "cpu", f"adaptive: exploring cpu at ~16.0 MB (2 of {EXPLORE_TRIES} tries)", True, True)


def test_a_settled_bucket_rechecks_its_other_path_at_doubling_intervals() -> None:
    model = AdaptiveModel()
    feed(model, 16 * MB, {"cpu": 0.0040, "gpu": 0.0031}, calls=13)
    assert "samples)" in model.choose("f", SIG, 16 * MB)[1]  # settled: the first counted call
    choices = [model.choose("f", SIG, 16 * MB) for _ in range(REVISIT_FIRST * 7 + 2)]
    rechecks = [index for index, choice in enumerate(choices) if choice.path == "cpu"]
    starts = rechecks[::RECHECK_CALLS]  # each re-check: RECHECK_CALLS calls in a row
    assert rechecks == [start + call for start in starts for call in range(RECHECK_CALLS)]
    assert len(starts) == 3 and starts[0] < REVISIT_FIRST
    # ... then RECHECK_CALLS timed calls of the chosen path, then the interval's calls.
    assert [b - a for a, b in zip(starts, starts[1:])] == [
        2 * REVISIT_FIRST + 2 * RECHECK_CALLS - 1, 4 * REVISIT_FIRST + 2 * RECHECK_CALLS - 1]
    assert [choices[index] for index in rechecks[:2]] == [  # timed, the size settled
        ("cpu", f"adaptive: re-checking cpu at ~16.0 MB, call {call} of {RECHECK_CALLS} "
                f"(gpu chosen; next check in {2 * REVISIT_FIRST} calls)", True, False)
        for call in (1, 2)]
    timed = [index for index, choice in enumerate(choices) if choice.timed]
    assert timed == [start + call for start in starts for call in range(2 * RECHECK_CALLS)
                     if start + call < len(choices)]


def test_a_deferred_recheck_waits_for_the_first_call_after_the_block() -> None:
    """A pipeline decides items under rechecks_deferred while a re-check's CPU item runs:
    they get the settled path, untimed, and the re-check goes on afterwards where it was."""
    model = AdaptiveModel()
    feed(model, 16 * MB, {"cpu": 0.0040, "gpu": 0.0031}, calls=13)
    choices = []
    while not choices or choices[-1].path != "cpu":
        choices.append(model.choose("f", SIG, 16 * MB))
    assert choices[-1].reason.startswith("adaptive: re-checking cpu") and "call 1 of" in \
        choices[-1].reason
    with rechecks_deferred():
        deferred = [model.choose("f", SIG, 16 * MB) for _ in range(5)]
    assert [(choice.path, choice.timed) for choice in deferred] == [("gpu", False)] * 5
    after = [model.choose("f", SIG, 16 * MB) for _ in range(2 * RECHECK_CALLS)]
    assert [(choice.path, choice.timed) for choice in after] == [
        ("cpu", True)] * (RECHECK_CALLS - 1) + [("gpu", True)] * RECHECK_CALLS + [("gpu", False)]
    assert "call 2 of" in after[0].reason
    revisit = model._bucket(("f", SIG, size_bucket(16 * MB))).revisit
    assert revisit is not None
    left = revisit.calls_left
    with rechecks_deferred():  # a settled bucket with no re-check due: counts as ever
        assert model.choose("f", SIG, 16 * MB) == after[-1]
    assert revisit.calls_left == left - 1
    while revisit.calls_left > 1:  # the next re-check due: deferred before it starts
        model.choose("f", SIG, 16 * MB)
    with rechecks_deferred():
        assert [model.choose("f", SIG, 16 * MB).path for _ in range(3)] == ["gpu"] * 3
    assert revisit.calls_left == 1 and "call 1 of" in model.choose("f", SIG, 16 * MB).reason


def test_a_much_slower_path_is_rechecked_within_the_exploration_budget() -> None:
    model = AdaptiveModel()
    feed(model, 0, {"cpu": 0.600, "gpu": 0.0015}, calls=8)  # monte_carlo_pi: 400x
    choices = [model.choose("f", SIG, 0) for _ in range(20_000)]
    starts = [index for index, choice in enumerate(choices)
              if choice.path == "cpu" and choices[index - 1].path == "gpu"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert starts and min(gaps, default=len(choices)) >= SLOW_REVISIT_MIN
    # The re-check's extra time stays within the budget of the calls between.
    interval = starts[0] if len(starts) == 1 else gaps[0]
    assert RECHECK_CALLS * (0.600 - 0.0015) <= EXPLORE_BUDGET * interval * 0.0015 * 1.01


def test_a_rechecks_first_call_is_not_learned_from() -> None:
    model = AdaptiveModel()
    feed(model, 16 * MB, {"cpu": 0.0098, "gpu": 0.0031}, calls=2 * EXPLORE_TRIES)
    cpu_samples = model._samples("f", SIG, size_bucket(16 * MB))["cpu"]
    before = [seconds for seconds, _ in cpu_samples]
    times = iter([0.050, 0.0097])  # the first call after many gpu calls wakes the cpu path
    for _ in range(4 * REVISIT_FIRST):  # one re-check (at most 3.2x slower: 44 calls apart)
        path = model.choose("f", SIG, 16 * MB).path
        model.observe("f", SIG, 16 * MB, path, next(times) if path == "cpu" else 0.0031)
    assert [seconds for seconds, _ in cpu_samples] == before + [0.0097]


def test_a_recheck_that_finds_the_other_path_faster_is_repeated_soon() -> None:
    model = AdaptiveModel()
    for path in ["gpu"] * (EXPLORE_TRIES + 1) + ["cpu"] * (EXPLORE_TRIES + 1):
        model.observe("f", SIG, MB, path, {"cpu": 4e-4, "gpu": 3e-4}[path])  # cpu: a slow spell
    assert model.choose("f", SIG, MB)[0] == "gpu"
    chosen = feed(model, MB, {"cpu": 8e-5, "gpu": 3e-4}, calls=8 * REVISIT_FIRST)  # spell over
    cpu_calls = [index for index, path in enumerate(chosen) if path == "cpu"]
    starts = [index for index in cpu_calls if index - 1 not in cpu_calls]
    # Three re-checks put two warm samples of three in the cpu's window: each follows the
    # last after REVISIT_FIRST calls, not 16, 33 and 66 as for a path that stays slower.
    assert [b - a for a, b in zip(starts, starts[1:3])] == \
        [REVISIT_FIRST + 2 * RECHECK_CALLS - 1] * 2
    assert chosen[-REVISIT_FIRST:].count("cpu") >= REVISIT_FIRST - RECHECK_CALLS  # cpu won


def test_peeking_answers_as_the_next_call_would_without_counting() -> None:
    model = AdaptiveModel()
    feed(model, 16 * MB, {"cpu": 0.0098, "gpu": 0.0031}, calls=2 * EXPLORE_TRIES)
    answers = []
    for _ in range(4 * REVISIT_FIRST):  # one re-check (as above)
        peeked = [model.choose("f", SIG, 16 * MB, peek=True) for _ in range(3)]
        answers.append(model.choose("f", SIG, 16 * MB))
        assert peeked == [answers[-1]] * 3  # explain() tells what the call then gets
    assert [choice.path for choice in answers].count("cpu") == RECHECK_CALLS


def test_a_path_timed_in_a_slow_spell_wins_back_once_rechecked() -> None:
    model = AdaptiveModel()
    # cpu in a slow spell (12 ms: one sample of a call that long is not confirmed)
    feed(model, MB, {"cpu": 12e-3, "gpu": 8e-4}, calls=2 * EXPLORE_TRIES)
    assert model.choose("f", SIG, MB)[0] == "gpu"
    # 15x slower: re-checked once the calls between pay for it (EXPLORE_BUDGET), >= 256 apart
    chosen = feed(model, MB, {"cpu": 3.2e-4, "gpu": 8e-4}, calls=400)  # spell over
    first_cpu = chosen.index("cpu")
    assert SLOW_REVISIT_MIN <= first_cpu <= math.ceil(RECHECK_CALLS * 14 / EXPLORE_BUDGET)
    assert chosen[first_cpu:].count("gpu") <= 2 * RECHECK_CALLS  # on the cpu; gpu re-checked


def test_generalises_to_an_unseen_size_from_fits_over_other_sizes() -> None:
    model = AdaptiveModel()
    for nbytes in (1 * MB, 4 * MB, 16 * MB):  # cpu 1 ms/MB; gpu 0.2 ms + 0.1 ms/MB
        feed(model, nbytes, {"cpu": nbytes / MB * 1e-3, "gpu": 2e-4 + nbytes / MB * 1e-4}, 6)
    path, reason, *_ = model.choose("f", SIG, 64 * MB)  # never seen: fits say gpu 10x faster
    assert path == "gpu" and "exploring" in reason
    model.observe("f", SIG, 64 * MB, "gpu", 2e-4 + 64 * 1e-4)
    feed(model, 64 * MB, {"cpu": 0.064, "gpu": 2e-4 + 64 * 1e-4}, calls=3)
    assert model.choose("f", SIG, 64 * MB)[0] == "gpu"
    # cpu was never tried at 64 MB: its fit predicts it clearly worse
    assert model._samples("f", SIG, size_bucket(64 * MB))["cpu"] == []


def test_a_bucket_with_samples_of_both_paths_fits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = AdaptiveModel()
    feed(model, 1 * MB, {"cpu": 0.010, "gpu": 0.008}, calls=10)
    feed(model, 64 * MB, {"cpu": 0.640, "gpu": 0.100}, calls=10)
    fitted: list[object] = []
    real_fit = adaptive._fit
    monkeypatch.setattr(adaptive, "_fit", lambda points, proportional=False:
                        fitted.append(points) or real_fit(points, proportional))
    model.observe("f", SIG, 1 * MB, "gpu", 0.001)  # a new best drops the cached fits
    assert model.choose("f", SIG, 1 * MB)[0] == "gpu" and model.cpu_ceiling("f") == 0
    assert fitted == []
    assert model.choose("f", SIG, 8 * MB)[0] == "gpu"  # an unseen size is predicted by fits
    assert len(fitted) == 2


def test_sizes_share_a_bucket_per_power_of_two() -> None:
    assert size_bucket(16 * 2**20) == size_bucket(31 * 2**20) != size_bucket(32 * 2**20)


def test_signature_and_function_key() -> None:
    assert signature_of([np.ones((2, 2), np.float32), np.ones(3)]) == "<f4:2,<f8:1"

    def f(x: np.ndarray) -> np.ndarray:
        return x

    def g(x: np.ndarray) -> np.ndarray:
        return x + 1

    assert function_key(f, "m.f") != function_key(g, "m.f")
    assert function_key(f, "m.f").startswith("m.f@")


def test_a_function_that_only_moved_keeps_its_key_and_an_edited_one_does_not() -> None:
    source = "def f(x):\n    return x * 2 + (lambda y: y + 1)(x)\n"

    def compiled(text: str, filename: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(compile(text, filename, "exec"), namespace)
        return namespace["f"]

    here = function_key(compiled(source, "/project/module.py"), "module.f")
    assert function_key(compiled("\n\n# a comment\n" + source, "module.py"), "module.f") == here
    assert function_key(compiled(source.replace("y + 1", "y + 2"), "/project/module.py"),
                        "module.f") != here  # the edit is in the nested lambda


def test_persistence_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    model = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(model, 16 * MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    model.set_calibration(Calibration(cpu_bytes_per_s=7e9))
    model.save()
    reloaded = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    assert reloaded.calibration.cpu_bytes_per_s == 7e9
    assert reloaded.choose("f", SIG, 16 * MB)[0] == "gpu"
    assert "exploring" not in reloaded.choose("f", SIG, 16 * MB)[1]
    assert not list(tmp_path.glob(".profile-*"))  # no temporary files left behind


def test_numbers_given_in_any_keyword_order_are_one_bucket_and_long_times_read_in_s() -> None:
    signatures = {scan(args, kwargs, type(None), ("rows", "cols")).signature for args, kwargs in
                  (((), {"rows": 4096, "cols": 64}), ((), {"cols": 64, "rows": 4096}),
                   ((4096,), {"cols": 64}), ((4096, 64), {}))}
    assert signatures == {";cols~2^6,rows~2^12"}
    model = AdaptiveModel()
    for _ in range(2 * EXPLORE_TRIES):
        path = model.choose("f", ";n~2^26", 0).path
        model.observe("f", ";n~2^26", 0, path, 3.0 if path == "cpu" else 0.0033)
    assert model.choose("f", ";n~2^26", 0).reason.startswith("adaptive: gpu 3.3 ms vs cpu 3 s")
    assert [adaptive._ms(seconds) for seconds in (0.000675, 0.326, 0.9996, 3.14)] == [
        "0.675 ms", "326 ms", "1 s", "3.14 s"]


def test_huge_numbers_among_the_arguments_count_at_most_2_to_the_64() -> None:
    """``f(2**1100)`` overflowed the model's work sizes after the call had run, and every
    later call of ``f`` raised too."""
    facts = scan((2**1100, 1e300, -(2**70)), {"k": np.float64(1e300)}, type(None),
                 ("n", "x", "m"))
    assert facts.signature == ";k~2^64,m~2^64,n~2^64,x~2^64"
    model = AdaptiveModel()
    for signature, cpu_s in ((";n~2^3,m~2^3", 1e-4), (";n~2^64,m~2^64", 2e-4)):
        for _ in range(2 * EXPLORE_TRIES):
            path = model.choose("f", signature, 0).path
            model.observe("f", signature, 0, path, cpu_s if path == "cpu" else 1e-3)
    assert model.choose("f", ";n~2^40,m~2^64", 0).path in ("cpu", "gpu")  # the fits read it


def test_one_gpu_time_at_a_small_number_is_not_scaled_up_to_a_large_one() -> None:
    """A GPU call of n = 2**15 is launch-bound (1 ms): scaled with n, it predicted 512 ms at
    n = 2**24, and 44 of 300 such calls ran on the CPU at 168 ms against 1.2 ms."""
    model = AdaptiveModel()
    cpu, gpu = (lambda n: 10e-9 * n), (lambda n: 1e-3 + 0.01e-9 * n)
    woken, paths = False, []
    for n in [2**21, 2**21, 2**15] + [2**24] * 100:
        signature = f";n~2^{n.bit_length() - 1}"
        choice = model.choose("f", signature, 0)
        paths.append(choice.path)
        if choice.timed and choice.path == "gpu" and not woken:
            woken = True
            model.woke("f", signature, 0, "gpu")
        elif choice.timed:
            model.observe("f", signature, 0, choice.path, (cpu if choice.path == "cpu"
                                                           else gpu)(n))
    assert paths[3:].count("cpu") <= 1, paths


def test_corrupted_profile_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring the cost-model profile .* unreadable"):
        model = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    assert "exploring" in model.choose("f", SIG, MB)[1]
    model.save()
    assert json.loads(path.read_text())["gpu"] == "Fake GPU"


GOOD_BUCKET = {"cpu": [[0.01, 1000]], "gpu": []}


@pytest.mark.parametrize(("calibration", "functions", "why"), [
    (None, {"f": []}, "function 'f' has no buckets"),
    (None, {"f": {"<f8:1": GOOD_BUCKET}}, "bucket named '<f8:1', not 'signature|int'"),
    (None, {"f": {"<f8:1|x": GOOD_BUCKET}}, "bucket named '<f8:1|x'"),
    (None, {"f": {"<f8:1|20": {"gpu": []}}}, "not {'cpu': \\[...\\], 'gpu': \\[...\\]}"),
    (None, {"f": {"<f8:1|20": {"cpu": [[0.01]], "gpu": []}}}, "not \\[seconds, bytes\\]"),
    (None, {"f": {"<f8:1|20": {"cpu": [["1", 2]], "gpu": []}}}, "not \\[seconds, bytes\\]"),
    (None, {"f": {";n~2^abc|0": GOOD_BUCKET}}, "whose numbers are not 'name~2\\^int,...'"),
    (None, {"f": {";n|0": GOOD_BUCKET}}, "whose numbers are not"),
    (None, {"f": {";n~2^5000|0": GOOD_BUCKET}}, "whose numbers are not"),
    ({"foo": 1.0}, {}, "its calibration is not positive numbers"),
    ({"cpu_bytes_per_s": 0}, {}, "its calibration is not positive numbers"),
    ({"cpu_bytes_per_s": None}, {}, "its calibration is not positive numbers"),
    ([1, 2], {}, "its calibration is not positive numbers"),
])
def test_a_profile_malformed_inside_is_ignored_with_a_warning_and_replaced(
        tmp_path: Path, calibration: Any, functions: Any, why: str) -> None:
    path = tmp_path / "profile.json"
    profile = ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS)
    path.write_text(json.dumps({"format": 1, **profile.identity, "calibration": calibration,
                                "functions": functions}))
    with pytest.warns(RuntimeWarning, match=f"ignoring the cost-model profile .*: .*{why}"):
        model = AdaptiveModel(profile)
    assert model.calibration == Calibration()
    assert model.choose("f", SIG, MB)[1].startswith("adaptive: exploring")
    feed(model, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    model.save()
    assert AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS)).choose(
        "f", SIG, MB)[0] == "gpu"


def test_a_save_drops_functions_unused_for_keep_days_and_marks_the_used_ones(
        tmp_path: Path) -> None:
    from datetime import date, timedelta

    from vedart.offload.profile import KEEP_DAYS

    path = tmp_path / "profile.json"
    seed = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    for key in ("edited away", "used again", "recent", "undated"):
        feed(seed, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6, key=key)
    seed.save()
    saved = json.loads(path.read_text())
    today = date.today()
    assert saved["used"] == dict.fromkeys(saved["functions"], today.isoformat())
    long_ago = (today - timedelta(days=KEEP_DAYS + 1)).isoformat()
    recently = (today - timedelta(days=KEEP_DAYS - 1)).isoformat()
    saved["used"] = {"edited away": long_ago, "used again": long_ago, "recent": recently}
    path.write_text(json.dumps(saved))  # "undated": a file of before days were kept

    model = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    choice = model.choose("used again", SIG, MB)
    assert choice[0] == "gpu" and "from profile" in choice[1]
    model.save()  # learned nothing: saved because a function was used on a day not recorded
    saved = json.loads(path.read_text())
    assert set(saved["functions"]) == {"used again", "recent", "undated"}
    assert saved["used"] == {"used again": today.isoformat(), "recent": recently,
                             "undated": today.isoformat()}


def test_a_function_in_use_is_written_back_where_another_process_dropped_it(
        tmp_path: Path) -> None:
    from datetime import date, timedelta

    from vedart.offload.profile import KEEP_DAYS

    path = tmp_path / "profile.json"
    seed = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(seed, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    feed(seed, 64 * MB, {"cpu": 0.500, "gpu": 0.020}, calls=6)
    seed.save()
    saved = json.loads(path.read_text())
    buckets = set(saved["functions"]["f"])
    saved["used"] = {"f": (date.today() - timedelta(days=KEEP_DAYS + 1)).isoformat(),
                     "g": "2999-01-01"}  # a day to come: a clock set wrong
    saved["functions"]["g"] = saved["functions"]["f"]
    path.write_text(json.dumps(saved))

    in_use = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    assert in_use.choose("f", SIG, MB)[0] == "gpu"  # settled: learns nothing, times nothing
    beside = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(beside, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6, key="h")
    beside.save()  # f unused there for KEEP_DAYS: dropped
    assert set(json.loads(path.read_text())["functions"]) == {"g", "h"}
    in_use.save()
    saved = json.loads(path.read_text())
    assert set(saved["functions"]) == {"f", "g", "h"} and set(saved["functions"]["f"]) == buckets
    assert saved["used"] == dict.fromkeys(("f", "g", "h"), date.today().isoformat())


@pytest.mark.parametrize("used", ["2026-11-27", {"f": "27/11/2026"}, {"f": 20261127},
                                  {"f": "2026-11-31"}])
def test_a_profile_whose_days_of_use_are_malformed_is_ignored_with_a_warning(
        tmp_path: Path, used: Any) -> None:
    path = tmp_path / "profile.json"
    profile = ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS)
    path.write_text(json.dumps({"format": 1, **profile.identity, "calibration": None,
                                "functions": {"f": {f"{SIG}|20": GOOD_BUCKET}}, "used": used}))
    with pytest.warns(RuntimeWarning, match="its 'used' is not function keys mapped to ISO "
                                            "dates"):
        model = AdaptiveModel(profile)
    assert model.choose("f", SIG, MB)[1].startswith("adaptive: exploring")


def test_a_save_that_fails_warns_once_and_is_tried_again(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    model = AdaptiveModel(ProfileFile(blocker / "profile.json", "Fake GPU",
                                      CALIBRATION_FIELDS))
    feed(model, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    with pytest.warns(RuntimeWarning, match="cannot save the cost-model profile .*a-file"):
        model.save()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save()  # fails again, quietly
    blocker.unlink()
    model.save()
    saved = json.loads((blocker / "profile.json").read_text())
    assert list(saved["functions"]) == ["f"]


def test_a_save_keeps_what_another_process_saved_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    first = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    second = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(first, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6, key="first")
    feed(second, MB, {"cpu": 0.001, "gpu": 0.002}, calls=6, key="second")
    feed(second, MB, {"cpu": 0.030, "gpu": 0.002}, calls=6, key="both")
    feed(first, MB, {"cpu": 0.001, "gpu": 0.002}, calls=6, key="both")
    second.save()
    first.save()
    assert set(json.loads(path.read_text())["functions"]) == {"first", "second", "both"}
    reloaded = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    assert reloaded.choose("first", SIG, MB)[0] == "gpu"
    second_choice = reloaded.choose("second", SIG, MB)
    assert second_choice[0] == "cpu" and "exploring" not in second_choice[1]
    assert reloaded.choose("both", SIG, MB)[0] == "cpu"  # the last save's own samples


def test_a_save_leaves_what_it_did_not_learn_as_another_process_saved_it(
        tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    seed = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(seed, MB, {"cpu": 0.010, "gpu": 0.002}, calls=1, key="shared")
    seed.save()
    bucket = f"{SIG}|{MB.bit_length() - 1}"
    first = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    second = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(second, MB, {"cpu": 0.010, "gpu": 0.002}, calls=4, key="shared")
    second.set_calibration(Calibration(cpu_bytes_per_s=1.23e9))
    second.save()
    feed(first, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6, key="other")
    first.save()  # knew "shared" only as loaded, and no calibration
    saved = json.loads(path.read_text())
    assert saved["functions"]["shared"] == json.loads(json.dumps(
        second._data["functions"]["shared"]))
    assert len(saved["functions"]["shared"][bucket]["cpu"]) + \
        len(saved["functions"]["shared"][bucket]["gpu"]) > 1
    assert saved["calibration"]["cpu_bytes_per_s"] == 1.23e9
    assert set(saved["functions"]) == {"shared", "other"}


def test_observe_saves_off_the_calling_thread(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    adaptive = importlib.import_module("vedart.offload.adaptive")
    monkeypatch.setattr(adaptive, "SAVE_INTERVAL_S", 0.0)
    profile = ProfileFile(tmp_path / "profile.json", "Fake GPU", CALIBRATION_FIELDS)
    saved_on: list[str] = []
    real_save = profile.save

    def recording_save(*arguments: Any) -> bool:
        saved_on.append(threading.current_thread().name)
        return real_save(*arguments)

    monkeypatch.setattr(profile, "save", recording_save)
    model = AdaptiveModel(profile)
    model.observe("f", SIG, MB, "cpu", 0.01)
    for thread in threading.enumerate():
        if thread.name == "vedart-profile-save":
            thread.join(10)
    assert saved_on == ["vedart-profile-save"]
    assert (tmp_path / "profile.json").exists()


@pytest.mark.parametrize(("bucket_name", "sample"), [("<f8:1|\u00b2", [0.01, 1000]),
                                                     ("<f8:1|20", [0.01, 10**400])])
def test_a_profile_with_odd_digits_or_huge_numbers_is_ignored_too(
        tmp_path: Path, bucket_name: str, sample: list[Any]) -> None:
    path = tmp_path / "profile.json"
    profile = ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS)
    path.write_text(json.dumps({"format": 1, **profile.identity, "calibration": None,
                                "functions": {"f": {bucket_name: {"cpu": [sample],
                                                                  "gpu": []}}}}))
    with pytest.warns(RuntimeWarning, match="ignoring the cost-model profile"):
        model = AdaptiveModel(profile)
    assert model.choose("f", SIG, MB)[1].startswith("adaptive: exploring")


def save_one_function(path: str, key: str, start: Any) -> None:
    """In a process of its own: learn ``key`` and save, once ``start`` lets every such
    process go at the same moment."""
    model = AdaptiveModel(ProfileFile(Path(path), "Fake GPU", CALIBRATION_FIELDS))
    feed(model, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6, key=key)
    start.wait()
    model.save()


def test_processes_saving_at_once_keep_every_ones_functions(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    path = tmp_path / "profile.json"
    start = context.Event()
    keys = [f"process-{number}" for number in range(6)]
    processes = [context.Process(target=save_one_function, args=(str(path), key, start))
                 for key in keys]
    for process in processes:
        process.start()
    time.sleep(1.0)  # each has loaded the (missing) file and learned
    start.set()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert set(json.loads(path.read_text())["functions"]) == set(keys)


def test_a_file_system_without_locks_still_saves(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fcntl = pytest.importorskip("fcntl")

    def no_locks(handle: Any, operation: int) -> None:
        raise OSError(37, "No locks available")  # ENOLCK, as on NFS without lockd

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "profile.json"
    model = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    feed(model, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.save()
    assert list(json.loads(path.read_text())["functions"]) == ["f"]


def test_a_save_that_raises_keeps_what_it_did_not_write(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "profile.json"
    profile = ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS)
    model = AdaptiveModel(profile)
    feed(model, MB, {"cpu": 0.010, "gpu": 0.002}, calls=6)
    real_save = profile.save
    monkeypatch.setattr(profile, "save", lambda *arguments: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        model.save()
    monkeypatch.setattr(profile, "save", real_save)
    model.save()
    assert list(json.loads(path.read_text())["functions"]) == ["f"]


def test_observe_saves_on_its_own_thread_when_no_thread_can_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adaptive = importlib.import_module("vedart.offload.adaptive")
    monkeypatch.setattr(adaptive, "SAVE_INTERVAL_S", 0.0)

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    model = AdaptiveModel(ProfileFile(tmp_path / "profile.json", "Fake GPU",
                                      CALIBRATION_FIELDS))
    model.observe("f", SIG, MB, "cpu", 0.01)
    assert list(json.loads((tmp_path / "profile.json").read_text())["functions"]) == ["f"]


def test_foreign_profile_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    ProfileFile(path, "Other GPU", CALIBRATION_FIELDS).save(
        {"calibration": None, "functions": {"f": {}}}, set(), calibration_changed=False)
    with pytest.warns(RuntimeWarning, match="written for 'Other GPU'"):
        model = AdaptiveModel(ProfileFile(path, "Fake GPU", CALIBRATION_FIELDS))
    assert model.choose("f", SIG, MB)[1].startswith("adaptive: exploring")


def test_concurrent_updates_keep_a_bounded_consistent_history(tmp_path: Path) -> None:
    model = AdaptiveModel(ProfileFile(tmp_path / "p.json", "Fake GPU", CALIBRATION_FIELDS))

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            nbytes = int(rng.integers(MB, 64 * MB))
            path = model.choose("f", SIG, nbytes).path
            model.observe("f", SIG, nbytes, path, float(rng.random()) * 1e-3)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    model.save()
    stored = json.loads((tmp_path / "p.json").read_text())["functions"]["f"]
    assert all(len(s["cpu"]) <= 8 and len(s["gpu"]) <= 8 for s in stored.values())


def adaptive_on_a_fake_gpu(tmp_path: Path) -> veda.Runtime:
    """A runtime with the adaptive model, learning into a profile under ``tmp_path``, on a fake
    GPU (whose calls fail: there is no driver)."""
    config = veda.Config.builder().cost_model("adaptive").profile_path(
        str(tmp_path / "p.json")).build()
    runtime = veda.init(config, device_probe=FakeProbe())
    assert runtime.cost_model is not None
    return runtime


def test_runtime_uses_the_adaptive_model_above_its_floor(tmp_path: Path) -> None:
    runtime = adaptive_on_a_fake_gpu(tmp_path)
    assert runtime.cost_model is not None
    f = veda.gpu(lambda x: x)
    below = f.explain(np.ones(ADAPTIVE_FLOOR // 8 - 1))
    assert below.model == "static" and below.reason.startswith("below threshold")
    above = f.explain(np.ones(ADAPTIVE_FLOOR // 8))
    assert above.model == "adaptive" and above.reason.startswith("adaptive: exploring")
    with veda.force("gpu"):
        assert f.explain(np.ones(ADAPTIVE_FLOOR // 8)).model == "static"


def test_the_default_configuration_learns_into_the_user_cache_profile() -> None:
    runtime = veda.init(device_probe=FakeProbe())  # no cost_model or profile_path given
    assert runtime.config.cost_model == "adaptive" and runtime.cost_model is not None
    f = veda.gpu(lambda x: x)
    assert f.explain(np.ones(3)).reason == "below threshold: 24 B < 65.5 KB"
    decision = f.explain(np.ones(10**6))
    assert decision.model == "adaptive" and decision.reason.startswith("adaptive: exploring")
    runtime.cost_model.observe("f", SIG, MB, "cpu", 1e-3)
    veda.shutdown()  # saves the profile
    [profile] = (Path(os.environ["XDG_CACHE_HOME"]) / "vedart").glob("profile-Fake-GPU-0-*.json")
    assert json.loads(profile.read_text())["functions"]["f"][f"{SIG}|{size_bucket(MB)}"]["cpu"] \
        == [[1e-3, MB]]


def test_explicit_threshold_is_kept_under_the_adaptive_model(tmp_path: Path) -> None:
    config = veda.Config.builder().cost_model("adaptive").offload_threshold("8MB").profile_path(
        str(tmp_path / "p.json")).build()
    veda.init(config, device_probe=FakeProbe())
    assert veda.gpu(lambda x: x).explain(np.ones(10**5)).reason == \
        "below threshold: 800.0 KB < 8.0 MB"


def test_cpu_calls_chosen_by_the_model_are_learned(tmp_path: Path) -> None:
    runtime = adaptive_on_a_fake_gpu(tmp_path)
    model = runtime.cost_model
    assert model is not None

    @veda.gpu
    def total(x: np.ndarray) -> float:
        return float(x.sum())

    # 80 MB: a CPU sum takes several times the GPU's predicted time, so the GPU is explored
    # (at 8 MB a fast CPU sum could beat the prediction and the GPU was never tried).
    x = np.ones(10**7)
    key = function_key(total.__wrapped__, f"{__name__}.{total.__qualname__}")
    with pytest.warns(veda.OffloadWarning):  # gpu tries fail for real here (no driver)
        for _ in range(30):  # usually 6; on a loaded machine exploration may take longer
            assert total(x) == 1e7
            samples = model._samples(key, signature_of([x]), size_bucket(x.nbytes))
            if samples["cpu"] and samples["gpu"]:
                break
    # Both paths were tried and timed: the CPU runs, and the failed GPU attempts (as the GPU's
    # time); the first GPU attempt is warm-up and not learned.
    assert len(samples["cpu"]) >= 1 and len(samples["gpu"]) >= 1
    assert all(seconds > 0 and nbytes == x.nbytes for seconds, nbytes in samples["cpu"])


def test_the_first_gpu_run_wakes_the_gpu_path_so_the_next_gpu_call_is_learned(
        tmp_path: Path) -> None:
    runtime = adaptive_on_a_fake_gpu(tmp_path)
    model = runtime.cost_model
    assert model is not None

    @veda.gpu
    def slow_total(x: np.ndarray) -> float:
        time.sleep(0.02)  # heavy on the CPU: the GPU is worth trying
        return float(x.sum())

    x = np.ones(10**5)  # 800 KB: the first call runs on the CPU
    key = function_key(slow_total.__wrapped__, f"{__name__}.{slow_total.__qualname__}")
    gpu_samples = []
    with pytest.warns(veda.OffloadWarning):  # gpu tries fail for real here (no driver)
        for _ in range(3):
            slow_total(x)
            gpu_samples.append(len(model._samples(key, signature_of([x]),
                                                  size_bucket(x.nbytes))["gpu"]))
    # The CPU call, the function's first GPU run (warm-up, which also wakes the GPU path
    # after the CPU call), then a GPU call learned from.
    assert gpu_samples == [0, 0, 1]
    assert runtime.telemetry.function(slow_total.display_name).as_dict()["fallback_calls"] == 2


def test_cpu_ceiling_covers_sizes_settled_on_the_cpu_from_the_smallest_up() -> None:
    model = AdaptiveModel()
    assert model.cpu_ceiling("f") == 0
    for nbytes in (256 * 1024, 1 * MB):
        feed(model, nbytes, {"cpu": 1e-5, "gpu": 1e-3}, calls=2 * EXPLORE_TRIES)
    feed(model, 16 * MB, {"cpu": 1e-2, "gpu": 1e-3}, calls=2 * EXPLORE_TRIES)
    assert model.cpu_ceiling("f") == 2 ** (size_bucket(1 * MB) + 1)
    feed(model, 64 * 1024, {"cpu": 1e-3, "gpu": 1e-5}, calls=2 * EXPLORE_TRIES)  # gpu below
    assert model.cpu_ceiling("f") == 0


def test_cpu_ceiling_ends_below_a_size_with_a_signature_not_settled_on_the_cpu() -> None:
    """Two signatures in one size bucket: the ceiling passes the bucket only when both are
    settled on the CPU. Numbers among the arguments end it: a call's bytes do not tell its
    work (monte_carlo_pi settled on the CPU at n = 10**4 ran n = 10**7 on the CPU too)."""
    model = AdaptiveModel()
    small, large = ";n~2^13", ";n~2^24"
    for signature, times in ((small, {"cpu": 1e-5, "gpu": 1e-3}),
                             (large, {"cpu": 2e-2, "gpu": 1e-3})):
        for _ in range(2 * EXPLORE_TRIES):
            path = model.choose("f", signature, 0).path
            model.observe("f", signature, 0, path, times[path])
    assert model.choose("f", large, 0).path == "gpu" and model.cpu_ceiling("f") == 0
    for nbytes in (256 * 1024, 1 * MB):  # a CPU-settled size with two signatures, one on GPU
        feed(model, nbytes, {"cpu": 1e-5, "gpu": 1e-3}, calls=2 * EXPLORE_TRIES, key="g")
    feed(model, 1 * MB, {"cpu": 1e-2, "gpu": 1e-3}, calls=2 * EXPLORE_TRIES, key="g",
         signature="<f8:1")
    assert model.cpu_ceiling("g") == 2 ** (size_bucket(256 * 1024) + 1)


def test_revision_changes_only_when_a_choice_may_change() -> None:
    model = AdaptiveModel()
    revisions = [model.revision]
    for seconds in (3.0, 2.0, 2.5, 1.0, 4.0, 5.0, 0.5):  # cpu samples at one size
        model.observe("f", SIG, MB, "cpu", seconds)
        revisions.append(model.revision)
    # A new typical time (the lower median: 3, 2, 2.5, 2, 2.5, 2.5, 2.5) or a path still
    # being explored (its first EXPLORE_TRIES samples) bumps it; a sample that leaves the
    # typical time as it was does not, since no choice depends on it.
    assert EXPLORE_TRIES == 3 and revisions == [0, 1, 2, 3, 4, 5, 5, 5]
    model.set_calibration(Calibration())
    assert model.revision == 6


def test_a_settled_bucket_moves_the_revision_only_when_its_faster_path_changes() -> None:
    model = AdaptiveModel()
    for nbytes in (MB, 16 * MB):  # every bucket of the signature has samples of both paths
        for path, seconds in [("cpu", 1e-3), ("gpu", 2e-4)]:
            for _ in range(SAMPLES_KEPT + 1):  # + the unlearned first call after a switch
                model.observe("f", SIG, nbytes, path, seconds)
    settled = model.revision
    choice = model.choose("f", SIG, MB)
    medians = []
    for seconds in [3e-4] * 5 + [1e-4] * 5:  # the gpu's median moves; it stays faster
        model.observe("f", SIG, MB, "gpu", seconds)
        medians.append(typical(model._samples("f", SIG, size_bucket(MB))["gpu"])[0])
    assert len(set(medians)) >= 2  # the median did move
    assert model.revision == settled
    assert model.choose("f", SIG, MB) is choice  # kept, figures and all
    for _ in range(SAMPLES_KEPT):
        model.observe("f", SIG, MB, "gpu", 5e-3)  # now slower than the cpu: a choice changed
    assert model.revision > settled and model.choose("f", SIG, MB)[0] == "cpu"


def test_a_new_time_moves_the_revision_while_a_size_is_predicted_by_fits() -> None:
    model = AdaptiveModel()
    for path, seconds in [("cpu", 1e-3), ("gpu", 2e-4)] * EXPLORE_TRIES:
        model.observe("f", SIG, MB, path, seconds)
    model.observe("f", SIG, 16 * MB, "cpu", 1e-2)  # a bucket with no gpu sample: fits say
    before = model.revision
    for _ in range(EXPLORE_TRIES):
        model.observe("f", SIG, MB, "gpu", 1e-4)  # the median moves, and the fits with it
    assert model.revision > before


def test_settled_cpu_sizes_take_the_fast_path_with_an_adaptive_reason(tmp_path: Path) -> None:
    runtime = adaptive_on_a_fake_gpu(tmp_path)

    @veda.gpu
    def total(x: np.ndarray) -> float:
        return float(x.sum())

    x = np.ones(10**5)
    # The GPU's times are given: a GPU attempt fails for real here and, re-run on the CPU, costs
    # about what a CPU call does, which left the winner (and re-checks) to timing noise.
    assert runtime.cost_model is not None
    key = function_key(total.__wrapped__, f"{__name__}.{total.__qualname__}")
    for _ in range(EXPLORE_TRIES):
        runtime.cost_model.observe(key, signature_of([x]), x.nbytes, "gpu", 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", veda.OffloadWarning)
        for _ in range(6 * EXPLORE_TRIES):
            total(x)
    stats = runtime.telemetry.function(f"{__name__}.{total.__qualname__}")
    recorded = len(runtime.telemetry.recent())
    assert total(x) == 1e5
    assert len(runtime.telemetry.recent()) == recorded  # fast path: no slow-path record
    path, reason = stats.last_decision()  # type: ignore[misc]
    assert path == "cpu" and reason.startswith("adaptive: cpu learned faster below: 800.0 KB <")


def test_a_path_only_predicted_much_slower_is_first_rechecked_within_the_budget() -> None:
    # monte_carlo_pi's pattern: a new size settles on the GPU against a CPU time predicted from
    # the other sizes, so the bucket has no CPU sample; running the CPU after REVISIT_FIRST
    # calls would cost far more than those calls saved.
    model = AdaptiveModel()
    cpu_s_per_mb, gpu_s = 10e-3, lambda nbytes: 2e-4 + nbytes / MB * 1e-4
    for nbytes in (1 * MB, 4 * MB, 16 * MB):
        feed(model, nbytes, {"cpu": nbytes / MB * cpu_s_per_mb, "gpu": gpu_s(nbytes)}, 8)
    chosen = feed(model, 64 * MB, {"cpu": 64 * cpu_s_per_mb, "gpu": gpu_s(64 * MB)}, 3000)
    first_cpu = chosen.index("cpu")  # the bucket's first CPU call: it was never explored
    # one CPU sample in all: the re-check's second call (its first, a switch, is not learned)
    assert len(model._samples("f", SIG, size_bucket(64 * MB))["cpu"]) == 1
    budgeted = RECHECK_CALLS * (64 * cpu_s_per_mb / gpu_s(64 * MB) - 1) / EXPLORE_BUDGET
    assert budgeted <= first_cpu <= budgeted + 2 * EXPLORE_TRIES + 2 * RECHECK_CALLS
    assert chosen[first_cpu:first_cpu + RECHECK_CALLS] == ["cpu"] * RECHECK_CALLS
