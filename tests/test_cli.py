from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.cli import collect_info, format_info, main


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VEDART_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "vedart", *args], capture_output=True,
                          text=True, env=full_env)


def test_info_json_schema_and_sources() -> None:
    result = run_cli("info", "--json", env={"VEDART_THRESHOLD": "4MB"})
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["vedart"] == veda.__version__
    assert set(info["versions"]) == {"python", "numpy", "cupy", "numba", "numba-cuda", "pynvml"}
    assert info["config"]["offload_threshold"] == {"value": 4_000_000,
                                                   "source": "env:VEDART_THRESHOLD"}
    assert info["config"]["gpu"] == {"value": True, "source": "default"}
    assert set(info["gpu"]) >= {"available", "reason", "devices"}
    if not info["gpu"]["available"]:
        assert info["gpu"]["reason"] and info["gpu"]["devices"] == []


def test_info_says_the_default_threshold_is_the_static_rules() -> None:
    adaptive = format_info(collect_info(veda.init()))
    assert "offload_threshold    1000000        default (the static rule's; the adaptive " \
        "model starts at 65.5 KB)" in adaptive
    static = format_info(collect_info(veda.init(veda.Config.builder().cost_model("static")
                                                .build())))
    assert "offload_threshold    1000000        default\n" in static


def test_info_text_names_the_reason_without_a_gpu() -> None:
    result = run_cli("info", env={"VEDART_GPU": "0"})
    assert result.returncode == 0
    assert "GPU: not available: GPU disabled by config" in result.stdout
    assert "gpu                  False          env:VEDART_GPU" in result.stdout


def test_info_with_devices_lists_each_device() -> None:
    runtime = veda.init(device_probe=FakeProbe(count=2, free=2**30, total=4 * 2**30))
    info = collect_info(runtime)
    assert [row["ordinal"] for row in info["gpu"]["devices"]] == [0, 1]
    assert info["gpu"]["devices"][0]["free_mb"] == 1024.0
    assert info["gpu"]["devices"][0]["compute_capability"] == "9.0"
    text = format_info(info)
    assert "GPU: available (cupy), 2 device(s)" in text and "Fake GPU 1" in text


@pytest.mark.parametrize("args", [["bogus"], ["info", "--nope"], []])
def test_unknown_subcommands_and_flags_exit_2_with_usage(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "usage: vedart" in result.stderr


def test_bad_env_exits_1_with_the_config_error(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEDART_THREADS", "-3")
    assert main(["info"]) == 1
    assert "threads (from VEDART_THREADS): got -3" in capsys.readouterr().err


@pytest.mark.parametrize("writable", [True, False])
def test_calibrate_writes_the_profile_or_exits_1_saying_it_could_not(
        tmp_path: Any, writable: bool) -> None:
    profile = tmp_path / "profile.json"
    if not writable:
        profile.mkdir()  # a directory where the file should go
    result = run_cli("calibrate", env={"VEDART_PROFILE": str(profile)})
    assert result.returncode == (0 if writable else 1), result.stderr
    assert f"-> {profile}" in result.stdout
    if writable:
        assert "calibration" in json.loads(profile.read_text())
        assert "not saved" not in result.stdout
    else:
        assert f"not saved: {profile} could not be written" in result.stdout
        assert "cannot save the cost-model profile" in result.stderr


def test_console_script_entry_point_is_declared() -> None:
    from importlib import metadata

    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("vedart") == "vedart.cli:main"


def test_demo_checks_every_pattern_and_says_where_it_ran() -> None:
    result = run_cli("demo", env={"VEDART_GPU": "0"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("GPU: none usable: GPU disabled by config\n"
                                    "cost model: adaptive (learns into ")
    assert result.stdout.count("[ok]") == 4 and "[FAILED]" not in result.stdout
    assert result.stdout.count("last reason: GPU disabled by config") == 2
    assert "call 1: cpu in " in result.stdout and "call 6: cpu in " in result.stdout
    assert result.stdout.count("ms (GPU disabled by config)") == 6
    assert re.search(r"\nvedart\.demo\.column_sums_of_gram +16 ", result.stdout)  # report()'s row
    assert result.stdout.rstrip().endswith("all checks passed")


def test_demo_exits_1_when_a_check_fails(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from vedart import demo

    monkeypatch.setenv("VEDART_GPU", "0")
    monkeypatch.setattr(demo, "PI_TOLERANCE", 0.0)
    assert main(["demo"]) == 1
    printed = capsys.readouterr().out
    assert "[FAILED] within 0.0 of pi" in printed and printed.rstrip().endswith(
        "SOME CHECKS FAILED")
    assert printed.count("[ok]") == 3
