"""``python -m vedart demo``: the seed guide's common patterns run end to end, each result
checked against plain NumPy, with where each call ran and why.

It runs on any machine. Without a usable GPU every call runs on the CPU, and the reasons say
so. The exit status is 0 when every check passed and 1 otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import vedart as veda

MATRICES, MATRIX_SIZE = 16, 1000
PI_SAMPLES = 10_000_000
PI_TOLERANCE = 0.005  # about 12 standard errors of the estimate at PI_SAMPLES
PI_CALLS = 6  # the first runs as written; then the GPU is tried and, where faster, kept


@veda.gpu
def train_step(X: np.ndarray, y: np.ndarray, weights: np.ndarray) -> tuple[Any, Any]:
    """The seed guide's machine-learning step: squared loss and its gradient."""
    predictions = X @ weights
    loss = ((predictions - y) ** 2).mean()
    grad = 2 * X.T @ (predictions - y) / len(y)
    return loss, grad


@veda.gpu
def monte_carlo_pi(n_samples: int) -> Any:
    """The seed guide's Monte Carlo estimate: 8 bytes of arguments, seconds of work at 10**9
    samples. Its first call shows it heavy, and the cost model then learns where it is faster."""
    import numpy as np

    x = np.random.random(n_samples)
    y = np.random.random(n_samples)
    inside = (x**2 + y**2) <= 1.0
    return 4.0 * inside.sum() / n_samples


def column_sums_of_gram(M: np.ndarray) -> np.ndarray:
    """The seed guide's "process many matrices" item."""
    return (M @ M.T).sum(axis=0)


def _where(function: Callable[..., Any]) -> str:
    """Where the last call of a @gpu function ran, and why (from the runtime's telemetry)."""
    # A @gpu wrapper's name, or a plain function's as gpu_map's own wrapper names it.
    name = getattr(function, "display_name", f"{function.__module__}.{function.__qualname__}")
    stats = veda.get_runtime().telemetry.function(name).as_dict()
    paths = ", ".join(f"{path} {stats[f'{path}_calls']}" for path in ("gpu", "cpu", "fallback")
                      if stats[f"{path}_calls"])
    return f"calls: {paths or 'fast path only'}; last reason: {stats['last_reason']}"


class _Checks:
    """Prints each check's outcome and remembers whether all passed."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self.passed = True

    def check(self, label: str, ok: bool, detail: str) -> None:
        self.passed = self.passed and ok
        self._out(f"  [{'ok' if ok else 'FAILED'}] {label}: {detail}")


def _same(result: Any, expected: Any, rtol: float) -> bool:
    return type(result) is type(expected) and np.allclose(result, expected, rtol=rtol)


def run(out: Callable[[str], None] = print, seed: int | None = None) -> bool:
    """Run the demo, printing through ``out``; True when every check passed."""
    runtime = veda.init(veda.Config.builder().build())
    gpu = runtime.gpu
    if gpu:
        out("GPU: " + ", ".join(f"{device.ordinal}: {device.name}" for device in gpu.devices))
    else:
        out(f"GPU: none usable: {runtime.gpu_unavailable_reason}")
    model = runtime.cost_model
    out(f"cost model: {runtime.config.cost_model}"
        + ("" if model is None or model.profile_path is None
           else f" (learns into {model.profile_path})"))
    rng = np.random.default_rng(seed)
    checks = _Checks(out)

    out("\n@veda.gpu train_step on 20000 x 100 float64 (16 MB):")
    X, y, weights = rng.random((20000, 100)), rng.random(20000), rng.random(100)
    loss, grad = train_step(X, y, weights)
    expected_loss, expected_grad = train_step.__wrapped__(X, y, weights)
    checks.check("same loss and gradient as NumPy", _same(loss, expected_loss, 1e-9)
                 and _same(grad, expected_grad, 1e-9),
                 f"loss {float(loss):.6g} ({type(loss).__name__}), grad {grad.shape}")
    out(f"  {_where(train_step)}")

    out("\nthe same function on 200 x 10 (17 KB):")
    small = rng.random((200, 10)), rng.random(200), rng.random(10)
    loss, grad = train_step(*small)
    expected_loss, expected_grad = train_step.__wrapped__(*small)
    checks.check("same loss and gradient as NumPy", _same(loss, expected_loss, 1e-12)
                 and _same(grad, expected_grad, 1e-12),
                 f"reason: {train_step.explain(*small).reason}")

    out(f"\n@veda.gpu monte_carlo_pi({PI_SAMPLES:,}), {PI_CALLS} calls (no force):")
    estimates = []
    for call in range(1, PI_CALLS + 1):
        decision = monte_carlo_pi.explain(PI_SAMPLES)
        started = time.perf_counter()
        estimates.append(monte_carlo_pi(PI_SAMPLES))
        out(f"  call {call}: {decision.path} in {(time.perf_counter() - started) * 1e3:.1f} ms "
            f"({decision.reason})")
    checks.check(f"within {PI_TOLERANCE} of pi",
                 all(abs(float(estimate) - np.pi) < PI_TOLERANCE for estimate in estimates),
                 ", ".join(f"{float(estimate):.5f}" for estimate in estimates)
                 + f" ({type(estimates[-1]).__name__})")
    if gpu:
        final = monte_carlo_pi.explain(PI_SAMPLES)
        checks.check("learned to run on the GPU", final.path == "gpu", final.reason)

    out(f"\npar_iter over {MATRICES} float32 {MATRIX_SIZE}x{MATRIX_SIZE} matrices, "
        "gpu_map((M @ M.T).sum(axis=0)):")
    matrices = [rng.random((MATRIX_SIZE, MATRIX_SIZE), dtype=np.float32) for _ in range(MATRICES)]
    results = veda.par_iter(matrices).gpu_map(column_sums_of_gram).collect()
    expected = [column_sums_of_gram(M) for M in matrices]
    checks.check("every item as NumPy computes it", len(results) == len(expected) and all(
        _same(result, want, 1e-4) for result, want in zip(results, expected)),
        f"{len(results)} results in input order")
    out(f"  {_where(column_sums_of_gram)}")
    placed = {path + ("" if device is None else f":{device}"): count
              for (_, path, device), count in runtime.telemetry.placement_counts().items()}
    if placed:  # without a GPU, gpu_map is a map of the @gpu wrapper: nothing to place
        out(f"  items per lane path: {placed}")

    out("\nveda.report() (a function's first GPU call includes CUDA start-up and kernel "
        "compilation):")
    veda.report()
    out("\n" + ("all checks passed" if checks.passed else "SOME CHECKS FAILED"))
    veda.shutdown()
    return checks.passed
