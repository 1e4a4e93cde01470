from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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


@pytest.fixture
def fresh_process() -> Callable[[str, float], subprocess.CompletedProcess[str]]:
    """``run(source, timeout)``: Python ``source`` run in a process of its own (its own CUDA
    context) that imports this checkout's vedart; its exit status and output."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path(veda.__file__).resolve().parents[1]), environment.get("PYTHONPATH", "")])

    def run(source: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", source], env=environment,
                              capture_output=True, text=True, timeout=timeout, check=False)

    return run
