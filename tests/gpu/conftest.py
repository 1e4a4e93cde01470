from __future__ import annotations

import pytest

import vedart as veda


@pytest.fixture(autouse=True)
def gpu_runtime() -> veda.Runtime:
    """Every GPU test starts with a runtime whose GPU is usable, under the static rule so the
    test knows where each call runs (the adaptive default has test_adaptive_gpu.py; tests that
    need another configuration call ``veda.init`` themselves)."""
    runtime = veda.init(veda.Config.builder().gpu(True).cost_model("static").build())
    assert runtime.gpu and runtime.gpu.transfers, runtime.gpu and runtime.gpu.unavailable_reason
    # The staging ring the runtime makes ahead in the background is made before the test, so
    # that no test counts threads or pinned memory while it is being made.
    runtime.gpu.transfers.wait_prepared(300.0)
    return runtime
