from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest
from fakes import FakeProbe

import vedart as veda


def test_get_runtime_auto_initialises_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEDART_THREADS", "3")
    runtime = veda.get_runtime()
    assert runtime.config.threads == 3
    assert runtime.config.sources["threads"] == "env:VEDART_THREADS"
    assert veda.get_runtime() is runtime


def test_init_replaces_and_closes_the_previous_runtime() -> None:
    first_probe, second_probe = FakeProbe(), FakeProbe()
    first = veda.init(device_probe=first_probe)
    second = veda.init(veda.Config.builder().threads(2).build(), device_probe=second_probe)
    assert first.closed and first_probe.closed
    assert not second.closed and not second_probe.closed
    assert veda.get_runtime() is second and second.config.threads == 2


@pytest.mark.parametrize("given, hint", [("threads", ""), ({"threads": 4}, ""),
                                         (veda.Config.builder().threads(4), " (call .build() "
                                          "on the builder)")])
def test_init_with_something_else_than_a_config_raises_and_leaves_the_runtime_running(
        given: object, hint: str) -> None:
    running = veda.init(veda.Config.builder().threads(1).build(), device_probe=FakeProbe())
    with pytest.raises(veda.ConfigError) as raised:
        veda.init(given)  # type: ignore[arg-type]
    assert str(raised.value) == f"config: got {given!r}; allowed: a vedart.Config or None{hint}"
    assert not running.closed and veda.get_runtime() is running


def test_shutdown_closes_and_next_get_runtime_builds_a_fresh_one() -> None:
    probe = FakeProbe()
    runtime = veda.init(device_probe=probe)
    veda.shutdown()
    assert runtime.closed and probe.closed
    veda.shutdown()  # idempotent
    assert veda.get_runtime() is not runtime


def test_gpu_false_gives_no_gpu_context() -> None:
    runtime = veda.init(veda.Config.builder().gpu(False).build())
    assert runtime.gpu is None and runtime.gpu_unavailable_reason == "GPU disabled by config"


def test_gpu_unavailable_reason_says_why_or_none() -> None:
    assert veda.init(device_probe=FakeProbe(reason="cupy is not installed")
                     ).gpu_unavailable_reason == "cupy is not installed"
    assert veda.init(device_probe=FakeProbe()).gpu_unavailable_reason is None


def test_concurrent_get_runtime_creates_exactly_one() -> None:
    barrier = threading.Barrier(8)
    seen: list[veda.Runtime] = []

    def worker() -> None:
        barrier.wait()
        seen.append(veda.get_runtime())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and len({id(runtime) for runtime in seen}) == 1


def test_concurrent_init_leaves_one_open_runtime_and_closes_the_rest() -> None:
    barrier = threading.Barrier(8)
    made: list[veda.Runtime] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        runtime = veda.init(device_probe=FakeProbe())
        with lock:
            made.append(runtime)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    current = veda.get_runtime()
    assert current in made
    assert [runtime for runtime in made if not runtime.closed] == [current]


def test_log_level_attaches_a_handler_and_sets_the_level() -> None:
    veda.init(veda.Config.builder().log_level("debug").gpu(False).build())
    logger = logging.getLogger("vedart")
    assert logger.level == logging.DEBUG
    assert any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.NullHandler)
               for h in logger.handlers)


def test_importing_vedart_touches_neither_cupy_nor_cuda() -> None:
    code = ("import sys, vedart; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('cupy', 'cupy_backends', 'numba', 'pynvml')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_api_is_exported_from_the_package() -> None:
    for name in veda.__all__:
        assert hasattr(veda, name), name
