from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import FakeProbe

import vedart as veda
from vedart.config import FIELD_SPECS, Config
from vedart.errors import ConfigError
from vedart.units import format_bytes, parse_size


def test_defaults_are_documented_values() -> None:
    config = veda.Config.builder().build(environ={})
    assert config.gpu is True
    assert config.offload_threshold == 1_000_000
    assert config.memory_headroom == 2.0
    assert config.devices is None
    assert config.fallback == "cpu"
    assert config.cost_model == "adaptive"
    assert config.threads >= 1
    assert config.pinned_memory_limit > 0
    assert set(config.sources.values()) == {"default"}


def test_every_field_has_a_spec_a_builder_method_and_an_env_var() -> None:
    names = {f.name for f in dataclasses.fields(Config)} - {"sources"}
    assert set(FIELD_SPECS) == names
    for name in names:
        assert callable(getattr(veda.ConfigBuilder, name))
        assert FIELD_SPECS[name].env_var.startswith("VEDART_")


def test_builder_overrides_env_which_overrides_defaults() -> None:
    environ = {"VEDART_THRESHOLD": "4MB", "VEDART_GPU": "0", "VEDART_DEVICES": "0,1",
               "VEDART_THREADS": "3"}
    config = veda.Config.builder().threads(8).build(environ=environ)
    assert config.threads == 8 and config.sources["threads"] == "builder"
    assert config.offload_threshold == 4_000_000
    assert config.sources["offload_threshold"] == "env:VEDART_THRESHOLD"
    assert config.gpu is False and config.devices == (0, 1)
    assert config.sources["memory_headroom"] == "default"


def test_build_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEDART_LOG", "DEBUG")
    monkeypatch.setenv("VEDART_FALLBACK", "raise")
    config = veda.Config.builder().build()
    assert config.log_level == "debug" and config.fallback == "raise"


@pytest.mark.parametrize(
    ("method", "value", "expected"),
    [
        ("threads", -4, "threads: got -4; allowed: an int >= 1"),
        ("threads", 0, "threads: got 0"),
        ("threads", 2.5, "threads: got 2.5"),
        ("threads", True, "threads: got True"),
        ("offload_threshold", "4 parsecs", "offload_threshold: got '4 parsecs'; allowed: a byte"),
        ("offload_threshold", -1, "offload_threshold: got -1"),
        ("gpu_memory_fraction", 1.5, "gpu_memory_fraction: got 1.5; allowed: a number f with 0 < f <= 1"),
        ("gpu_memory_fraction", 0, "gpu_memory_fraction: got 0;"),
        ("memory_headroom", 0.5, "memory_headroom: got 0.5; allowed: a number >= 1.0"),
        ("memory_headroom", float("nan"), "memory_headroom: got nan"),
        ("memory_headroom", 10**400, "memory_headroom: got 1000"),
        ("fallback", "gpu", "fallback: got 'gpu'; allowed: 'cpu' or 'raise'"),
        ("cost_model", "magic", "cost_model: got 'magic'; allowed: 'static' or 'adaptive'"),
        ("scheduler", "mpi", "scheduler: got 'mpi'; allowed: 'threads' or 'dask'"),
        ("gpu", "yes", "gpu: got 'yes'; allowed: True or False"),
        ("telemetry", 1, "telemetry: got 1"),
        ("devices", [0, 0], "devices: got [0, 0]; allowed: None (all visible)"),
        ("devices", [], "devices: got []"),
        ("devices", "0,1", "devices: got '0,1'"),
        ("devices", [-1], "devices: got [-1]"),
        ("pinned_memory_limit", "lots", "pinned_memory_limit: got 'lots'"),
        ("dask_address", "", "dask_address: got ''"),
        ("log_level", "loud", "log_level: got 'loud'; allowed: None or one of debug"),
    ],
)
def test_bad_builder_values_raise_config_error_at_the_call(method: str, value: object,
                                                          expected: str) -> None:
    builder = veda.Config.builder()
    with pytest.raises(veda.ConfigError) as caught:
        getattr(builder, method)(value)
    assert expected in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("variable", "text", "expected"),
    [
        ("VEDART_GPU", "maybe", "gpu (from VEDART_GPU): got 'maybe'"),
        ("VEDART_THREADS", "-2", "threads (from VEDART_THREADS): got -2; allowed: an int >= 1"),
        ("VEDART_THREADS", "many", "threads (from VEDART_THREADS): got 'many'"),
        ("VEDART_THRESHOLD", "4 parsecs", "offload_threshold (from VEDART_THRESHOLD): got '4 parsecs'"),
        ("VEDART_DEVICES", "0,x", "devices (from VEDART_DEVICES): got '0,x'"),
        ("VEDART_GPU_MEMORY_FRACTION", "2", "gpu_memory_fraction (from VEDART_GPU_MEMORY_FRACTION): got 2.0"),
    ],
)
def test_bad_env_values_raise_at_build(variable: str, text: str, expected: str) -> None:
    with pytest.raises(veda.ConfigError) as caught:
        veda.Config.builder().build(environ={variable: text})
    assert expected in str(caught.value)


def test_numpy_numbers_paths_and_any_case_are_taken_and_normalised(tmp_path: Path) -> None:
    config = (veda.Config.builder().threads(np.int64(3)).offload_threshold(np.uint32(4096))
              .devices([np.int64(0)]).dask_timeout(np.int32(5)).dask_workers(np.int16(2))
              .fallback("RAISE").cost_model("Static").scheduler("Threads")
              .profile_path(tmp_path / "profile.json").build())
    assert (config.threads, config.offload_threshold, config.devices, config.dask_workers) == \
        (3, 4096, (0,), 2)
    assert [type(value) for value in (config.threads, config.offload_threshold,
                                      config.devices[0], config.dask_workers)] == [int] * 4
    assert (config.dask_timeout, config.fallback, config.cost_model, config.scheduler) == \
        (5.0, "raise", "static", "threads")
    assert config.profile_path == str(tmp_path / "profile.json")
    flags = veda.Config.builder().gpu(np.False_).telemetry(np.True_).progress(np.bool_(1)).build()
    assert (flags.gpu, flags.telemetry, flags.progress) == (False, True, True)
    assert [type(value) for value in (flags.gpu, flags.telemetry, flags.progress)] == [bool] * 3
    for method, value in [("threads", np.float64(3.0)), ("threads", np.True_),
                          ("profile_path", 7), ("fallback", 3), ("gpu", 1), ("gpu", np.int8(1))]:
        with pytest.raises(ConfigError, match=f"^{method}: got "):
            getattr(veda.Config.builder(), method)(value)


def test_a_client_and_an_address_together_are_refused_and_a_client_overrides_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client:  # what the field checks of a distributed.Client
        def submit(self) -> None: ...

        def scheduler_info(self) -> None: ...

    builder = veda.Config.builder().dask_client(Client())
    with pytest.raises(ConfigError, match=r"^dask_address: got 'tcp://10.0.0.1:8786' beside a "
                                          r"dask_client; allowed: one of dask_client and "
                                          r"dask_address$"):
        builder.dask_address("tcp://10.0.0.1:8786").build()
    monkeypatch.setenv("VEDART_DASK_ADDRESS", "tcp://10.0.0.1:8786")  # the client overrides it
    config = veda.Config.builder().dask_client(Client()).build()
    assert config.dask_address is None and config.sources["dask_address"] == "default"
    assert veda.Config.builder().build().dask_address == "tcp://10.0.0.1:8786"


def test_builder_value_wins_over_a_malformed_env_value() -> None:
    config = veda.Config.builder().threads(2).build(environ={"VEDART_THREADS": "many"})
    assert config.threads == 2


def test_config_is_frozen_and_validated_on_construction_and_replace() -> None:
    config = Config(threads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.threads = 3  # type: ignore[misc]
    with pytest.raises(veda.ConfigError, match="threads: got -1"):
        Config(threads=-1)
    with pytest.raises(veda.ConfigError, match="fallback: got 'never'"):
        dataclasses.replace(config, fallback="never")


def test_equality_ignores_sources_and_normalises_values() -> None:
    from_builder = veda.Config.builder().devices([0, 1]).offload_threshold("2MB").build(environ={})
    direct = Config(devices=(0, 1), offload_threshold=2_000_000, threads=from_builder.threads,
                    pinned_memory_limit=from_builder.pinned_memory_limit)
    assert from_builder == direct
    assert from_builder.devices == (0, 1)


def test_env_devices_all_means_every_visible_device() -> None:
    assert veda.Config.builder().build(environ={"VEDART_DEVICES": "all"}).devices is None


@pytest.mark.parametrize(
    ("text", "count"),
    [("0", 0), ("1024", 1024), ("4MB", 4_000_000), ("4 mb", 4_000_000), ("1.5GiB", 1610612736),
     ("512KB", 512_000), (".5MB", 500_000), ("2.01MB", 2_010_000), ("0.29KB", 290),
     ("9007199254740993", 9007199254740993), ("1.0000005KB", 1000)],
)
def test_parse_size(text: str, count: int) -> None:
    assert parse_size(text) == count


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "4 parsecs", "1e6", "4 M B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (999, "999 B"), (12_000, "12.0 KB"), (1_000_000, "1.0 MB"),
     (3_200_000_000, "3.2 GB"), (2 * 10**12, "2.0 TB")],
)
def test_format_bytes(count: int, text: str) -> None:
    assert format_bytes(count) == text


def test_format_bytes_of_other_number_types_is_not_confused_with_cached_ints() -> None:
    import numpy as np

    assert format_bytes(np.float32(1_050_000)) == "1.0 MB"  # float32 arithmetic
    assert format_bytes(1_050_000.0) == "1.1 MB"
    assert format_bytes(1_050_000) == "1.1 MB"
    assert format_bytes(np.array(5.0)) == "5 B"  # not hashable: not cached


def test_as_dict_is_json_friendly() -> None:
    import json

    data = veda.Config.builder().devices([1]).build(environ={}).as_dict()
    assert json.loads(json.dumps(data))["devices"] == [1]


def test_values_given_to_the_constructor_or_replace_are_sourced_as_such() -> None:
    config = veda.Config(offload_threshold=8_000_000, threads=veda.Config().threads)
    assert config.sources["offload_threshold"] == "constructor"
    assert config.sources["threads"] == "default"  # the default value, given or not
    replaced = dataclasses.replace(veda.Config.builder().build(), memory_headroom=3.0)
    assert replaced.sources["memory_headroom"] == "constructor"
    assert replaced.sources["gpu"] == "default"


def test_a_threshold_given_to_the_constructor_is_kept_under_the_adaptive_model(
        tmp_path: Any) -> None:
    veda.init(veda.Config(offload_threshold=8_000_000, profile_path=str(tmp_path / "p.json")),
              device_probe=FakeProbe())
    small = veda.gpu(lambda x: x + 1)
    assert small.explain(np.ones(10**5)).reason == "below threshold: 800.0 KB < 8.0 MB"
