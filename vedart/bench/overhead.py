"""``bench overhead``: what @gpu adds to a call that stays on the CPU, and what the adaptive
model's bookkeeping costs a settled GPU call.

Targets (median per call over calling the function directly): 1.0 us with the GPU disabled by
config; 0.5 us on the fast path below the adaptive floor (timed, to see heavy calls); 2 us for a
call settled on the CPU by the model at 64 KB, 1 MB and 4 MB (a function whose work is tiny next
to its arguments, so the CPU wins at every size); 5 us for the model's choice plus its learning
step for a bucket settled on the GPU (no device work: the model alone). The settled rows run
twice: with an array alone (the fast path skips the model below the size it settled on the
CPU) and with an ``int`` too (a number may size the work, so the model is asked; its settled
calls run on leases). Each runtime's staging loop is loaded before its rows are timed: while
it loads (about a second after ``init``), its thread holds the interpreter lock for long
stretches, which read as 0.4-0.5 us more per below-floor call on the H100 (2026-11-24:
0.77-0.88 us, then 0.33-0.39 us waiting), a cost of the first second, not of the fast path.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import vedart as veda
from vedart.bench.harness import wait_for_staging_loop
from vedart.offload.adaptive import EXPLORE_TRIES
from vedart.offload.arguments import scan
from vedart.offload.cost import Decision
from vedart.offload.decorator import OffloadOptions, _Offload
from vedart.units import format_bytes

TARGET_NS = 1000.0
FAST_PATH_TARGET_NS = 500.0
SETTLED_TARGET_NS = 2000.0
BOOKKEEPING_TARGET_NS = 5000.0
SETTLED_SIZES = (64 * 1024, 2**20, 4 * 2**20)
SETTLING_CALLS = 40  # enough to explore both paths and settle


def _identity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a


def head_sum(x: np.ndarray) -> Any:
    return x[:8].sum()


def head_sum_of(x: np.ndarray, count: int) -> Any:
    """``head_sum`` with the count an argument: a number that may size the work."""
    return x[:count].sum()


def _per_call_ns(func: Callable[..., Any], args: tuple[Any, ...], calls: int,
                 repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            func(*args)
        samples.append((time.perf_counter() - started) / calls * 1e9)
    return statistics.median(samples)


def _row(label: str, func: Callable[..., Any], args: tuple[Any, ...], target_ns: float,
         calls: int, repeats: int) -> dict[str, Any]:
    wrapped = veda.gpu(func)
    for _ in range(SETTLING_CALLS):
        wrapped(*args)
    decision = wrapped.explain(*args)  # type: ignore[attr-defined]
    direct_ns = _per_call_ns(func, args, calls, repeats)
    wrapped_ns = _per_call_ns(wrapped, args, calls, repeats)
    return {"case": label, "reason": decision.reason, "path": decision.path,
            "direct_ns": round(direct_ns, 1), "wrapped_ns": round(wrapped_ns, 1),
            "overhead_ns": round(wrapped_ns - direct_ns, 1), "target_ns": target_ns,
            "meets_target": decision.path == "cpu" and wrapped_ns - direct_ns <= target_ns}


def _bookkeeping_row(runtime: Any, calls: int, repeats: int) -> dict[str, Any]:
    """The model's choice and learning step for a call of a bucket settled on the GPU."""
    model = runtime.cost_model
    facts = scan((np.ones(2**20, np.float32),), {}, type(None))
    for path in ("cpu", "gpu"):  # settled: the GPU 10x faster
        for _ in range(EXPLORE_TRIES + 1):
            model.observe("bench.bookkeeping", facts.signature, facts.host_bytes, path,
                          1e-3 if path == "cpu" else 1e-4)
    learn = _Offload(_identity, OffloadOptions()).learn

    def bookkeeping() -> None:
        choice = model.choose("bench.bookkeeping", facts.signature, facts.host_bytes)
        learn(runtime, Decision(choice.path, choice.reason, 0, model="adaptive",
                                timed=choice.timed), facts, 1e-4)

    choice = model.choose("bench.bookkeeping", facts.signature, facts.host_bytes, peek=True)
    total_ns = _per_call_ns(bookkeeping, (), calls, repeats)
    return {"case": "model bookkeeping, settled GPU bucket", "reason": choice.reason,
            "path": choice.path, "direct_ns": 0.0, "wrapped_ns": round(total_ns, 1),
            "overhead_ns": round(total_ns, 1), "target_ns": BOOKKEEPING_TARGET_NS,
            "meets_target": choice.path == "gpu" and total_ns <= BOOKKEEPING_TARGET_NS}


def run(quick: bool) -> dict[str, Any]:
    calls, repeats = (50_000, 7) if quick else (200_000, 15)
    rng = np.random.default_rng()
    args = (rng.random(128), rng.random(128))
    cases = [("GPU disabled by config", veda.Config.builder().gpu(False), TARGET_NS),
             ("GPU disabled, telemetry off", veda.Config.builder().gpu(False).telemetry(False),
              TARGET_NS),
             ("below threshold", veda.Config.builder(), FAST_PATH_TARGET_NS),
             ("below threshold, telemetry off", veda.Config.builder().telemetry(False),
              FAST_PATH_TARGET_NS)]
    rows = []
    device_name = None
    with tempfile.TemporaryDirectory() as profile_dir:
        profile = str(Path(profile_dir) / "profile.json")
        for label, builder, target_ns in cases:
            runtime = veda.init(builder.profile_path(profile).build())
            wait_for_staging_loop(runtime)
            if runtime.gpu is not None:
                device_name = runtime.gpu.devices[0].name if runtime.gpu else None
                if not runtime.gpu:
                    label += f" (no GPU: {runtime.gpu.unavailable_reason})"
            rows.append(_row(label, _identity, args, target_ns, calls, repeats))
        runtime = veda.init(veda.Config.builder().profile_path(profile).build())
        wait_for_staging_loop(runtime)
        for nbytes in SETTLED_SIZES:
            x = rng.random(nbytes // 8)
            rows.append(_row(f"settled on the CPU, {format_bytes(nbytes)}", head_sum, (x,),
                             SETTLED_TARGET_NS, calls // 10, repeats))
        for nbytes in SETTLED_SIZES:  # a number among the arguments: the model is asked
            x = rng.random(nbytes // 8)
            rows.append(_row(f"settled on the CPU, {format_bytes(nbytes)} and an int",
                             head_sum_of, (x, 8), SETTLED_TARGET_NS, calls // 10, repeats))
        rows.append(_bookkeeping_row(runtime, calls // 10, repeats))
    veda.shutdown()
    return {"suite": "overhead", "target_ns": TARGET_NS, "calls_per_sample": calls,
            "samples": repeats, "device_name": device_name, "rows": rows}


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'case':<48} {'direct ns':>10} {'@gpu ns':>10} {'overhead ns':>12} {'target':>8}"]
    for row in result["rows"]:
        lines.append(f"{row['case']:<48} {row['direct_ns']:>10.1f} {row['wrapped_ns']:>10.1f} "
                     f"{row['overhead_ns']:>12.1f} {row['target_ns']:>8.0f}  "
                     f"{'ok' if row['meets_target'] else 'MISSED'}  ({row['path']}: "
                     f"{row['reason']})")
    return "\n".join(lines)
