"""Benchmarks and calibration on a CPU-only machine: they run, mark GPU figures n/a, and their
outputs have the documented shape."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import pytest

import vedart as veda
from vedart import calibrate
from vedart.bench import ops, overhead
from vedart.bench.harness import interleaved_medians, interleaved_samples, round_orders
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
        for rounds in (row["static_rounds"], row["adaptive_rounds"]):  # cheap cases: more
            assert 6 < rounds <= ops.MAX_ROUNDS and rounds % 2 == 0  # cycles of two orders
    assert result["summary"]["meets_target"] is None
    text = ops.format_table(result)
    assert "target (adaptive): geomean <= 1.05, worst <= 1.5: n/a (no GPU)" in text


@pytest.mark.parametrize("budget_s, expected", [(0.0, 6), (3600.0, 24)])
def test_interleaved_samples_add_whole_cycles_while_the_budget_lasts(budget_s: float,
                                                                     expected: int) -> None:
    calls: list[str] = []
    runs = {name: functools.partial(calls.append, name) for name in ("a", "b", "c")}
    samples = interleaved_samples(runs, repeats=4, warmup=dict.fromkeys(runs, 0),
                                  budget_s=budget_s, max_repeats=24)
    assert {name: len(values) for name, values in samples.items()} == dict.fromkeys(runs,
                                                                                     expected)
    assert [calls[i:i + 3] for i in range(0, len(calls), 3)] == round_orders(list(runs),
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
])
def test_bench_usage_errors(args: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2 and message in capsys.readouterr().err


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
        "bytes_to_device", "bytes_to_host", "transfer_gb_per_s", "last_path", "last_reason"}


def test_round_orders_let_each_run_follow_each_other_equally_often() -> None:
    names = ["cpu", "gpu", "cupy"]
    orders = round_orders(names, 12)
    assert all(sorted(order) == sorted(names) for order in orders)
    assert len({tuple(order) for order in orders[:6]}) == 6  # every permutation once
    assert orders[6:] == orders[:6]
    follows = Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert set(follows.values()) == {4} and len(follows) == 6  # each ordered pair, alike
    # Across round boundaries a name only follows itself.
    assert all(before[-1] == after[0] for before, after in zip(orders, orders[1:]))
    assert round_orders(["a", "b"], 3) == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_interleaved_medians_time_each_run_once_per_round_in_those_orders() -> None:
    calls: list[str] = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("cpu", "gpu", "cupy")}
    synced: list[str] = []
    medians = interleaved_medians(runs, repeats=4, warmup={"gpu": 2},
                                  synchronize={"cupy": lambda: synced.append("cupy")})
    assert calls[:4] == ["cpu", "gpu", "gpu", "cupy"]  # warm-up: 1 each unless told
    assert calls[4:] == [name for order in round_orders(list(runs), 4) for name in order]
    assert len(synced) == 1 + 4 and set(medians) == {"cpu", "gpu", "cupy"}
    assert all(seconds >= 0 for seconds in medians.values())


def test_transfer_targets_treat_the_baseline_call_itself_as_met() -> None:
    small = {"size_mb": 4, "h2d_x_baseline": 0.97, "d2h_x_baseline": 3.5}
    assert _targets_met({**small, "h2d_same_call_as_baseline": True})
    assert not _targets_met({**small, "h2d_same_call_as_baseline": False})
    assert not _targets_met({**small, "h2d_same_call_as_baseline": True, "d2h_x_baseline": 0.9})
    large = {"size_mb": 64, "h2d_same_call_as_baseline": False, "h2d_x_baseline": 3.2,
             "h2d_of_peak": 0.45, "d2h_x_baseline": 15.0, "d2h_of_peak": 0.97}
    assert not _targets_met(large) and _targets_met({**large, "h2d_of_peak": 0.6})
