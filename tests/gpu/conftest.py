from __future__ import annotations

import pytest

import vedart as veda


@pytest.fixture(autouse=True)
def gpu_runtime() -> veda.Runtime:
    """Every GPU test starts with a default runtime whose GPU is usable (tests that need
    another configuration call ``veda.init`` themselves)."""
    runtime = veda.init(veda.Config.builder().gpu(True).build())
    assert runtime.gpu, runtime.gpu and runtime.gpu.unavailable_reason
    return runtime
