"""``bench matmul``: 5000x5000 float64 ``A @ B`` through @veda.gpu against hand-written CuPy
doing the same transfers (``cupy.asarray`` in, ``.get()`` out), and against NumPy.

Target (issue: @veda.gpu): @gpu within 5% of the hand-written CuPy time, in one run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import vedart as veda
from vedart.bench.harness import median_seconds, wait_for_staging_loop

TARGET_RATIO = 1.05


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def run(quick: bool) -> dict[str, Any]:
    # Pageable transfers dominate and vary by +-10% between runs, hence many interleaved samples.
    size, repeats = (5000, 15) if quick else (5000, 31)
    runtime = veda.init(veda.Config.builder().cost_model("static").build())  # always the GPU
    rng = np.random.default_rng(42)
    a, b = rng.random((size, size)), rng.random((size, size))
    result: dict[str, Any] = {"suite": "matmul", "shape": [size, size], "dtype": "float64",
                              "target_ratio": TARGET_RATIO, "samples": repeats}
    result["numpy_s"] = median_seconds(lambda: _matmul(a, b), repeats=3 if quick else 5)
    if not runtime.gpu:
        result["device_name"] = None
        result["note"] = "no GPU: GPU columns n/a"
        return result
    import cupy

    wait_for_staging_loop(runtime)

    def hand_written() -> np.ndarray:
        return (cupy.asarray(a) @ cupy.asarray(b)).get()

    wrapped = veda.gpu(_matmul)
    decision = wrapped.explain(a, b)  # type: ignore[attr-defined]
    sync = cupy.cuda.get_current_stream().synchronize
    # Interleave the two so drift (clocks, other tenants) affects both alike.
    cupy_samples, vedart_samples = [], []
    for _ in range(repeats):
        cupy_samples.append(median_seconds(hand_written, repeats=1, synchronize=sync))
        vedart_samples.append(median_seconds(lambda: wrapped(a, b), repeats=1, synchronize=sync))
    check = wrapped(a, b)
    np.testing.assert_allclose(check, a @ b, rtol=1e-10, atol=1e-8)
    cupy_s, vedart_s = float(np.median(cupy_samples)), float(np.median(vedart_samples))
    result.update({
        "device_name": runtime.gpu.devices[0].name, "decision": decision.reason,
        "cupy_s": cupy_s, "vedart_s": vedart_s,
        "cupy_samples_s": cupy_samples, "vedart_samples_s": vedart_samples, "ratio_vedart_over_cupy": vedart_s / cupy_s,
        "meets_target": vedart_s / cupy_s <= TARGET_RATIO,
        "speedup_over_numpy": result["numpy_s"] / vedart_s,
    })
    veda.shutdown()
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [f"5000x5000 float64 A @ B: NumPy {result['numpy_s'] * 1e3:.1f} ms"]
    if "cupy_s" not in result:
        lines.append(result["note"])
        return "\n".join(lines)
    lines.append(f"hand-written CuPy (same transfers) {result['cupy_s'] * 1e3:.1f} ms, "
                 f"@veda.gpu {result['vedart_s'] * 1e3:.1f} ms, ratio "
                 f"{result['ratio_vedart_over_cupy']:.3f} (target <= {TARGET_RATIO}) "
                 f"{'ok' if result['meets_target'] else 'MISSED'}")
    lines.append(f"decision: {result['decision']}")
    return "\n".join(lines)
