"""A process forked after a real GPU call (``pytest -m gpu``): its @gpu calls run on the CPU
with the reason, give NumPy's answer and never touch CUDA (which would fail or hang)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_fork import in_forked_child

import vedart as veda
from vedart.lifecycle import FORKED_CHILD_REASON

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore:.*use of fork\\(\\) may lead to deadlocks")]


@veda.gpu
def normalised(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / x.std()


def test_after_a_gpu_call_a_forked_childs_gpu_calls_run_on_the_cpu_with_the_reason() -> None:
    runtime = veda.get_runtime()
    x = np.random.default_rng().random(2_000_000)  # 16 MB: above the static threshold
    on_gpu = veda.gpu(force="gpu")(lambda a: (a - a.mean()) / a.std())(x)
    assert runtime.telemetry.recent()[-1].path == "gpu"  # CUDA is in use in this process
    np.testing.assert_allclose(normalised(x), (x - x.mean()) / x.std())
    assert runtime.telemetry.recent()[-1].path == "gpu"

    def child() -> dict[str, Any]:
        result = normalised(x)
        stats = [f.as_dict() for f in veda.get_runtime().telemetry.functions()
                 if f.name.endswith(".normalised")]
        return {"result": result, "stats": stats, "reason": normalised.explain(x).reason,
                "gpu": bool(veda.get_runtime().gpu),
                "mapped": veda.par_iter([x, x[::2]]).gpu_map(normalised).collect()}

    got = in_forked_child(child)
    expected = (x - x.mean()) / x.std()
    np.testing.assert_allclose(got["result"], expected)
    assert type(got["result"]) is np.ndarray and got["result"].dtype == np.float64
    assert got["reason"] == f"no GPU: {FORKED_CHILD_REASON}"
    assert [(s["calls"], s["last_path"], s["last_reason"]) for s in got["stats"]] == \
        [(1, "cpu", f"no GPU: {FORKED_CHILD_REASON}")]
    assert not got["gpu"]
    np.testing.assert_allclose(got["mapped"][1], (x[::2] - x[::2].mean()) / x[::2].std())
    np.testing.assert_allclose(on_gpu, expected)
    # The parent keeps its GPU.
    normalised(x)
    assert runtime.telemetry.recent()[-1].path == "gpu"
