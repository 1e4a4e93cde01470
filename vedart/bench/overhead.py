"""``bench overhead``: what @gpu adds to a call that stays on the CPU (the fast path).

Target (issue: @veda.gpu): at most 1.0 us median over calling the function directly, with the
GPU disabled by config and with a GPU present but the arguments below the threshold.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import vedart as veda

TARGET_NS = 1000.0


def _identity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a


def _per_call_ns(func: Callable[..., Any], args: tuple[Any, ...], calls: int,
                 repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            func(*args)
        samples.append((time.perf_counter() - started) / calls * 1e9)
    return statistics.median(samples)


def run(quick: bool) -> dict[str, Any]:
    calls, repeats = (50_000, 7) if quick else (200_000, 15)
    args = (np.random.default_rng(0).random(128), np.random.default_rng(1).random(128))
    cases = [("GPU disabled by config", veda.Config.builder().gpu(False)),
             ("GPU disabled, telemetry off", veda.Config.builder().gpu(False).telemetry(False)),
             ("below threshold", veda.Config.builder()),
             ("below threshold, telemetry off", veda.Config.builder().telemetry(False))]
    rows = []
    device_name = None
    for label, builder in cases:
        runtime = veda.init(builder.build())
        if runtime.gpu is not None:
            device_name = runtime.gpu.devices[0].name if runtime.gpu else None
            if not runtime.gpu:
                label += f" (no GPU: {runtime.gpu.unavailable_reason})"
        wrapped = veda.gpu(_identity)
        decision = wrapped.explain(*args)  # type: ignore[attr-defined]
        assert decision.path == "cpu", decision
        direct_ns = _per_call_ns(_identity, args, calls, repeats)
        wrapped_ns = _per_call_ns(wrapped, args, calls, repeats)
        rows.append({"case": label, "reason": decision.reason, "direct_ns": round(direct_ns, 1),
                     "wrapped_ns": round(wrapped_ns, 1),
                     "overhead_ns": round(wrapped_ns - direct_ns, 1),
                     "meets_target": wrapped_ns - direct_ns <= TARGET_NS})
    veda.shutdown()
    return {"suite": "overhead", "target_ns": TARGET_NS, "calls_per_sample": calls,
            "samples": repeats, "device_name": device_name, "rows": rows}


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'case':<48} {'direct ns':>10} {'@gpu ns':>10} {'overhead ns':>12}  target <= "
             f"{result['target_ns']:.0f} ns"]
    for row in result["rows"]:
        lines.append(f"{row['case']:<48} {row['direct_ns']:>10.1f} {row['wrapped_ns']:>10.1f} "
                     f"{row['overhead_ns']:>12.1f}  {'ok' if row['meets_target'] else 'MISSED'}")
    return "\n".join(lines)
