"""Benchmarks and calibration on a CPU-only machine: they run, mark GPU figures n/a, and their
outputs have the documented shape."""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart import calibrate
from vedart.bench import harness, helpers, ops, overhead, transfer_cold, workloads
from vedart.bench.harness import (interleaved_medians, interleaved_samples, round_orders,
                                  rounds_per_block)
from vedart.bench.transfer import _targets_met
from vedart.cli import main


def test_ops_suite_runs_without_a_gpu_and_reports_regret() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    result = ops.run(quick=True, sizes=(64 * 1024,), heavy_sizes={
        "monte_carlo_pi": (10**4,), "nearest_neighbour_distances": (40,), "power_iteration": (8,)})
    assert [row["op"] for row in result["rows"]] == [*ops.OPS, *ops.HEAVY_SIZES]
    assert [row["size"] for row in result["rows"][-3:]] == ["n=10000", "side=40", "side=8"]
    for row in result["rows"]:
        assert row["static_oracle_s"] == row["cpu_s"] and "cupy_s" not in row
        assert row["adaptive_oracle_s"] == row["adaptive_phase_cpu_s"]
        assert row["adaptive_regret"] == row["adaptive_s"] / row["adaptive_phase_cpu_s"]
        assert row["static_regret"] > 0 and row["adaptive_regret"] > 0
        for rounds in (row["static_rounds"], row["adaptive_rounds"]):
            assert 6 <= rounds <= ops.MAX_ROUNDS and rounds % 2 == 0  # cycles of two orders
    # Cheap cases get more rounds within the budget (a 64 KB matmul took 32 ms a call on a
    # loaded 2-core machine, and got only its 6).
    assert max(row["static_rounds"] for row in result["rows"]) > 6
    assert result["summary"]["meets_target"] is None
    text = ops.format_table(result)
    assert "target (adaptive): geomean <= 1.05, worst <= 1.5: n/a (no GPU)" in text
    worst = max(result["rows"], key=lambda row: row["adaptive_regret"])
    assert (f"adaptive: geomean regret {result['summary']['adaptive']['geomean_regret']:.3f}, "
            f"worst {worst['adaptive_regret']:.2f} ({worst['op']} {worst['size']})") in text


@pytest.mark.parametrize("budget_s, expected", [(0.0, 6), (3600.0, 24)])
def test_interleaved_samples_add_whole_cycles_while_the_budget_lasts(budget_s: float,
                                                                     expected: int) -> None:
    calls: list[str] = []
    runs = {name: functools.partial(calls.append, name) for name in ("a", "b", "c")}
    samples = interleaved_samples(runs, repeats=4, warmup=dict.fromkeys(runs, 0),
                                  budget_s=budget_s, max_repeats=24)
    assert {name: len(values) for name, values in samples.items()} == dict.fromkeys(runs,
                                                                                     expected)
    assert calls[0] == "a"  # leads in the first round: nothing was warmed
    assert [calls[i:i + 3] for i in range(1, len(calls), 3)] == round_orders(list(runs),
                                                                            expected)


def test_ops_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = ops.run(quick=True, sizes=(64 * 1024, 128 * 1024),
                     heavy_sizes={"monte_carlo_pi": (10**3, 10**4)})
    ops.plot(result, str(tmp_path / "ops.png"))
    assert (tmp_path / "ops.png").read_bytes()[:4] == b"\x89PNG"


def test_overhead_suite_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "overhead", "--quick", "--json", str(tmp_path / "o.json")]) == 0
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["suite"] == "overhead" and data["target_ns"] == overhead.TARGET_NS
    assert {row["case"].split(" (")[0] for row in data["rows"]} >= {"GPU disabled by config"}
    assert all(row["reason"] for row in data["rows"])
    assert data["environment"]["vedart"] == veda.__version__
    out = capsys.readouterr().out
    assert "settled on the CPU, 1.0 MB" in out and "model bookkeeping, settled GPU bucket" in out


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "overhead", "--sweep"], "--sweep applies to the transfer suite only"),
    (["bench", "transfer", "--plot", "x.png"], "--plot applies to the ops suite only"),
    (["bench", "nope"], "invalid choice: 'nope'"),
    (["bench", "ops", "--cold"], "--cold applies to the transfer suite only"),
    (["bench", "transfer", "--cold", "--sweep"], "--sweep times warm transfers: not with --cold"),
    (["bench", "overhead", "--json", "/nonexistent-folder/x.json"],
     "--json: cannot write '/nonexistent-folder/x.json' (its folder is missing or not "
     "writable)"),
    (["bench", "ops", "--plot", "/nonexistent-folder/x.png"], "--plot: cannot write"),
    (["bench", "overhead", "--json", "."], "--json: cannot write '.'"),
])
def test_bench_usage_errors(args: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2 and message in capsys.readouterr().err


def test_cold_transfer_bench_without_a_gpu_says_why_and_starts_no_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(transfer_cold, "CudaProbe", lambda: FakeProbe(reason="no CUDA devices"))
    monkeypatch.setattr(transfer_cold, "_child", lambda side: pytest.fail("started a process"))
    assert main(["bench", "transfer", "--cold", "--quick", "--json",
                 str(tmp_path / "cold.json")]) == 0
    data = json.loads((tmp_path / "cold.json").read_text())
    assert data["suite"] == "transfer --cold" and data["sizes_mb"] == [64, 256]
    assert data["note"] == "no GPU (no CUDA devices): nothing to time"
    assert data["environment"]["device"] == "no GPU"
    out = capsys.readouterr().out
    assert "vedart bench transfer --cold |" in out and data["note"] in out


def test_cold_transfer_bench_alternates_fresh_processes_and_reports_medians(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vedart.gpu import transfer

    started: list[str] = []
    speeds = {"vedart": iter([20.0, 30.0, 25.0]), "cupy": iter([5.0, 4.0, 10.0])}

    def child(side: str) -> dict[str, object]:
        started.append(side)
        gbps = next(speeds[side])
        return {"side": side, "gbps_64": gbps, "gbps_256": gbps / 5,
                **({"loop_ready": gbps > 20, "ring_ready": gbps > 25} if side == "vedart"
                   else {})}

    monkeypatch.setattr(transfer_cold, "CudaProbe", FakeProbe)
    monkeypatch.setattr(transfer, "STAGING_LOOP", transfer.LoopLoader(lambda: None))
    monkeypatch.setattr(transfer_cold, "_child", child)
    result = transfer_cold.run(quick=True)
    assert started == ["vedart", "cupy", "cupy", "vedart", "vedart", "cupy"]
    assert result["rows"] == [
        {"size_mb": 64, "vedart_gbps": 25.0, "cupy_gbps": 5.0, "x_cupy": 5.0,
         "meets_target": True},
        {"size_mb": 256, "vedart_gbps": 5.0, "cupy_gbps": 1.0, "x_cupy": 5.0,
         "meets_target": True}]
    assert result["loop_ready_runs"] == 2 and result["ring_ready_runs"] == 1
    assert result["vedart_runs"] == 3
    assert not result["loop_cached"]
    monkeypatch.setattr(transfer_cold, "_child", lambda side: {"error": "no GPU: disabled"})
    with pytest.raises(RuntimeError, match="bench transfer --cold: no GPU: disabled"):
        transfer_cold.run(quick=True)
    text = transfer_cold.format_table(result)
    assert "   64 |          25.00              5.00    5.00 | ok (>= 1.0x)" in text
    assert text.endswith("at the first transfer, of 3 vedart processes: staging loop loaded "
                         "in 2, staging ring made in 1 (the loop cannot be loaded here)")


def test_calibrate_on_cpu_writes_the_profile(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    veda.init(veda.Config.builder().gpu(False).profile_path(str(profile)).build())
    result = calibrate.run()
    assert result["measured"] == ["cpu_bytes_per_s"] and result["profile"] == str(profile)
    stored = json.loads(profile.read_text())
    assert stored["calibration"]["cpu_bytes_per_s"] == result["calibration"]["cpu_bytes_per_s"] > 0
    assert "(default: not measured without a GPU)" in calibrate.format_summary(result)


def test_export_json_schema(tmp_path: Path) -> None:
    runtime = veda.init(veda.Config.builder().gpu(False).build())
    veda.gpu(lambda x: x)(1)
    runtime.telemetry.export_json(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert {"functions", "recent"} <= set(data)
    assert set(data["functions"][0]) == {
        "function", "calls", "cpu_calls", "gpu_calls", "fallback_calls", "mean_seconds_gpu",
        "bytes_to_device", "bytes_to_host", "transfer_gb_per_s", "last_path", "last_reason",
        "helpers"}


def test_round_orders_let_each_run_follow_each_other_equally_often() -> None:
    names = ["cpu", "gpu", "cupy"]
    orders = round_orders(names, 12)
    assert all(sorted(order) == sorted(names) for order in orders)
    assert len({tuple(order) for order in orders[:6]}) == 6 and rounds_per_block(3) == 6
    follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert set(follows.values()) == {4} and len(follows) == 6  # each ordered pair, alike
    # Across round boundaries a name only follows itself.
    assert all(before[-1] == after[0] for before, after in zip(orders, orders[1:]))
    assert round_orders(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]


@pytest.mark.parametrize("count", [4, 5, 6])
def test_a_block_of_round_orders_balances_any_number_of_runs(count: int) -> None:
    names = [f"run{i}" for i in range(count)]
    block = rounds_per_block(count)
    assert block == (count if count % 2 == 0 else 2 * count)  # not count! rounds
    follows = Counter(pair for order in round_orders(names, block)
                      for pair in zip(order, order[1:]))
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1


def test_interleaved_medians_time_each_run_once_per_round_in_those_orders() -> None:
    calls: list[str] = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("cpu", "gpu", "cupy")}
    synced: list[str] = []
    medians = interleaved_medians(runs, repeats=4, warmup={"gpu": 2},
                                  synchronize={"cupy": lambda: synced.append("cupy")})
    assert calls[:4] == ["cpu", "gpu", "gpu", "cupy"]  # warm-up: 1 each unless told
    # Rounded up to a whole block of 6; the first round, starting with another run than the
    # last warmed, is led in by an untimed run of its first.
    assert calls[4:] == ["cpu"] + [name for order in round_orders(list(runs), 6)
                                   for name in order]
    assert len(synced) == 1 + 6 and set(medians) == {"cpu", "gpu", "cupy"}
    assert all(seconds >= 0 for seconds in medians.values())


def test_interleaved_samples_time_no_run_right_after_another_across_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    runs = {name: functools.partial(calls.append, name) for name in ("np", "a", "b", "hand")}
    clock = harness.time.perf_counter
    monkeypatch.setattr(harness.time, "perf_counter", lambda: calls.append("clock") or clock())
    samples = interleaved_samples(runs, repeats=5, warmup=dict.fromkeys(runs, 1))
    assert {len(values) for values in samples.values()} == {8}  # two blocks of four
    # What ran just before each timed run (one the clock started for): each other run
    # equally often, or itself (an untimed lead-in at a round's boundary).
    calls.remove("clock")  # the rounds' start, read once; then each timed run's start, end
    before_timed: Counter[tuple[str, str]] = Counter()
    previous, clocks = "", 0
    for call in calls:
        if call == "clock":
            clocks += 1
            continue
        if clocks % 2:
            before_timed[previous, call] += 1
        previous = call
    distinct = {pair: count for pair, count in before_timed.items() if pair[0] != pair[1]}
    assert len(distinct) == 12 and set(distinct.values()) == {2}


def test_transfer_targets_treat_the_baseline_call_itself_as_met() -> None:
    small = {"size_mb": 4, "h2d_x_baseline": 0.97, "d2h_x_baseline": 3.5}
    assert _targets_met({**small, "h2d_same_call_as_baseline": True})
    assert not _targets_met({**small, "h2d_same_call_as_baseline": False})
    assert not _targets_met({**small, "h2d_same_call_as_baseline": True, "d2h_x_baseline": 0.9})
    large = {"size_mb": 64, "h2d_same_call_as_baseline": False, "h2d_x_baseline": 3.2,
             "h2d_of_peak": 0.45, "d2h_x_baseline": 15.0, "d2h_of_peak": 0.97}
    assert not _targets_met(large) and _targets_met({**large, "h2d_of_peak": 0.6})


def test_helpers_suite_checks_results_and_says_what_it_cannot_time_without_a_gpu() -> None:
    result = helpers.run(quick=True)
    assert [row["case"] for row in result["rows"]] == ["fit_and_predict", "naive_spectrum",
                                                       "correlation"]
    assert all(row["numpy_s"] > 0 and row["forced_path"] == "cpu" for row in result["rows"])
    assert result["meets_target"] is None
    assert helpers.format_table(result).endswith("no GPU: CuPy columns n/a")


def test_the_hand_port_of_the_workloads_runs_their_source_on_another_module() -> None:
    ported = helpers.hand_port("numpy")  # NumPy in CuPy's place: the same answer
    x = np.random.default_rng(3).random((50, 4))
    np.testing.assert_allclose(ported.correlation(x), workloads.correlation(x))
    assert ported.correlation is not workloads.correlation


def test_dask_bench_without_dask_cuda_names_the_gpu_it_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dask_bench = importlib.import_module("vedart.bench.dask")
    probe = FakeProbe()
    real_init = veda.init
    monkeypatch.setattr(dask_bench.veda, "init",
                        lambda config: real_init(config, device_probe=probe))
    monkeypatch.setattr(dask_bench, "find_spec", lambda name: None)
    monkeypatch.setattr(dask_bench, "_python_map", lambda repeats, items, workers: {})
    result = dask_bench.run(quick=True)
    assert result["device_name"] == probe.devices[0].name
    assert result["gpu_map"] is None
    assert result["gpu_note"].startswith("dask-cuda not installed")


def test_bench_plot_without_matplotlib_is_a_usage_error_before_the_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "not installed"
    monkeypatch.setattr(ops, "run", lambda **options: pytest.fail("the suite ran"))
    with pytest.raises(SystemExit) as exited:
        main(["bench", "ops", "--quick", "--plot", "ops.png"])
    assert exited.value.code == 2
    assert "--plot needs matplotlib (pip install 'vedart[plot]')" in capsys.readouterr().err
