"""``bench helpers``: user code whose work happens in helper functions and classes it calls
(:mod:`vedart.bench.workloads`), through ``@veda.gpu`` on the function a user decorates.

Cases: a weighted least squares class fitted and used (its methods make arrays with
``np.ones`` and ``np.diag``), a naive DFT whose matrix a helper builds with ``np.arange``, and a
correlation matrix through three small functions calling each other. Each is timed against
NumPy and against the same module ported to CuPy by hand (its source run with
``import cupy as np``; inputs in with ``cupy.asarray``, results out with ``.get()``), the three
in turn per round, after warm-up, with device synchronisation. Rows: ``@veda.gpu(force="gpu")``
(the target) and the default configuration, plain ``@veda.gpu`` (settled by the adaptive model
after warm-up calls). Every result is checked against NumPy's first.

Targets (issue: substitution that reaches helpers), quick run on the GPU: every case forced to
the GPU runs there (no fallback), equals NumPy's result, and takes at most the hand port's time.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import vedart as veda
from vedart.bench import workloads
from vedart.bench.harness import interleaved_medians, wait_for_staging_loop

TARGET_RATIO = 1.0     # vedart's time over the hand port's, at most
WARMUP_CALLS = 12      # lets the adaptive model explore both paths and settle
RTOL = {"fit_and_predict": 1e-6, "naive_spectrum": 1e-7, "correlation": 1e-9}


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[Any, ...]


def cases(quick: bool) -> list[Case]:
    rng = np.random.default_rng(17)
    rows, features, samples, signal, columns = (2000, 32, 20000, 2048, 128) if quick else \
        (4000, 64, 50000, 4096, 256)
    x = rng.random((rows, features))
    return [
        Case("fit_and_predict", (x, x @ rng.random(features) + rng.random(rows),
                                 rng.random(rows) + 0.5, rng.random((rows // 4, features)))),
        Case("naive_spectrum", (rng.random(signal),)),
        Case("correlation", (rng.random((samples, columns)),)),
    ]


def hand_port(package: str = "cupy") -> types.ModuleType:
    """:mod:`vedart.bench.workloads` ported to CuPy as a user would: its source, run with
    ``import cupy as np`` (``package``: another module in CuPy's place)."""
    source = inspect.getsource(workloads).replace("import numpy as np",
                                                  f"import {package} as np")
    module = types.ModuleType("workloads_on_cupy")
    exec(compile(source, "workloads_on_cupy", "exec"), module.__dict__)
    return module


def _end_to_end(cupy: Any, function: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        result = function(*(cupy.asarray(arg) if isinstance(arg, np.ndarray) else arg
                            for arg in args))
        return result.get()
    return run


def _last_path() -> str:
    return veda.get_runtime().telemetry.recent()[-1].path


def run(quick: bool) -> dict[str, Any]:
    repeats = 5 if quick else 11
    runtime = veda.init()
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"suite": "helpers", "samples": repeats, "rows": rows,
                              "target_ratio": TARGET_RATIO}
    cupy = None
    if runtime.gpu:
        import cupy

        wait_for_staging_loop(runtime)
        ported = hand_port()
    for case in cases(quick):
        plain = getattr(workloads, case.name)
        expected = plain(*case.args)
        row: dict[str, Any] = {"case": case.name}
        rows.append(row)
        forced, adaptive = veda.gpu(force="gpu")(plain), veda.gpu(plain)
        for label, wrapped in (("forced", forced), ("default", adaptive)):
            for _ in range(WARMUP_CALLS if label == "default" else 1):
                got = wrapped(*case.args)
            np.testing.assert_allclose(got, expected, rtol=RTOL[case.name])
            row[f"{label}_path"] = _last_path() if runtime.gpu else "cpu"
            row[f"{label}_helpers"] = list(wrapped.explain(*case.args).helpers)
        runs: dict[str, Callable[[], Any]] = {"numpy": lambda: plain(*case.args),
                                              "forced": lambda: forced(*case.args),
                                              "default": lambda: adaptive(*case.args)}
        synchronize = {}
        if cupy is not None:
            by_hand = _end_to_end(cupy, getattr(ported, case.name))
            np.testing.assert_allclose(by_hand(*case.args), expected, rtol=RTOL[case.name])
            runs["hand_cupy"] = lambda: by_hand(*case.args)
            sync = cupy.cuda.runtime.deviceSynchronize
            synchronize = {"forced": sync, "default": sync, "hand_cupy": sync}
        times = interleaved_medians(runs, repeats=repeats, synchronize=synchronize)
        row.update({f"{name}_s": seconds for name, seconds in times.items()})
        if cupy is not None:
            row["forced_ratio"] = times["forced"] / times["hand_cupy"]
            row["default_ratio"] = times["default"] / times["hand_cupy"]
            row["meets_target"] = (row["forced_path"] == "gpu"
                                   and row["forced_ratio"] <= TARGET_RATIO)
    result["device_name"] = runtime.gpu.devices[0].name if runtime.gpu else None
    result["meets_target"] = None if cupy is None else all(row["meets_target"] for row in rows)
    veda.shutdown()
    return result


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{'case':<16} {'numpy ms':>9} {'hand cupy':>9} {'forced':>9} {'ratio':>6} "
             f"{'default':>9} {'ratio':>6}  paths (forced/default); helpers run as clones"]
    for row in result["rows"]:
        def ms(name: str) -> str:
            return f"{row[name] * 1e3:9.2f}" if name in row else f"{'n/a':>9}"

        def ratio(name: str) -> str:
            return f"{row[name]:6.2f}" if name in row else f"{'n/a':>6}"

        lines.append(f"{row['case']:<16} {ms('numpy_s')} {ms('hand_cupy_s')} {ms('forced_s')} "
                     f"{ratio('forced_ratio')} {ms('default_s')} {ratio('default_ratio')}  "
                     f"{row['forced_path']}/{row['default_path']}; "
                     f"{', '.join(row['forced_helpers']) or '-'}")
    met = result["meets_target"]
    lines.append("no GPU: CuPy columns n/a" if met is None else
                 f"target (forced: on the GPU, at most {TARGET_RATIO}x the hand port): "
                 + ("ok" if met else "MISSED"))
    return "\n".join(lines)
