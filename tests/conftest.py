from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import gpu_unavailable_reason

import vedart as veda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_runtime_leaks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Every test starts and ends without a current runtime and without VEDART_* variables,
    and the adaptive model's default profile file lands in the test's own directory, so no
    test reads what another learned (or writes to the user's cache)."""
    for name in list(os.environ):
        if name.startswith("VEDART_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    veda.shutdown()
    yield
    veda.shutdown()
