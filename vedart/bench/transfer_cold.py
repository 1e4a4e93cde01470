"""``bench transfer --cold``: the first large host -> device transfers of a fresh process,
through ``@veda.gpu``, against ``cupy.asarray`` in a fresh process of its own.

Each run is a new interpreter. It draws fresh random float32 arrays (64 MB, 256 MB and a 1 MB
one), then either inits vedart with the default configuration or imports CuPy, and moves the
1 MB array once, so that creating the CUDA context and the first-call set-up of a ``@veda.gpu``
function are not counted (the 1 MB copy is ``cupy.asarray`` on both sides). One second after
``init`` (or the import) it times its first transfer of each size: through
``@veda.gpu(force="gpu")`` on a function returning the array's first four elements, or
``cupy.asarray(x)[:4].get()``, each followed by a device synchronisation, so both time the
upload, a 16-byte download and nothing else. vedart and CuPy runs alternate, each starting
every other round; the rows give medians.

Target (issue: decisions that see the work): vedart >= 1.0x ``cupy.asarray`` at 64 MB and
256 MB. What makes it reachable: ``init`` starts loading the compiled staging loop and then
makes a staging ring in the background (:meth:`vedart.gpu.transfer.TransferEngine.prepare`).
The parent process loads the loop once first, so that its compiled code is in Numba's
on-disk cache, as it is for every process on a machine but the very first.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import vedart as veda
from vedart.gpu.devices import CudaProbe

MB = 2**20
SIZES_MB = (64, 256)
WARM_MB = 1  # below the staging cutoff: a plain cupy.asarray on both sides
WAIT_AFTER_INIT_S = 1.0
SIDES = ("vedart", "cupy")


def _head(x: np.ndarray) -> np.ndarray:
    return x[:4]


def _cupy_head(x: np.ndarray) -> np.ndarray:
    import cupy

    return cupy.asarray(x)[:4].get()  # type: ignore[no-any-return]


def _fresh_arrays() -> dict[int, np.ndarray]:
    rng = np.random.default_rng()  # a new seed per process: no run sees another's data
    return {size: rng.random(size * MB // 4, dtype=np.float32) for size in (WARM_MB, *SIZES_MB)}


def measure(side: str) -> dict[str, Any]:
    """One fresh process's timings (run in a child process by :func:`run`): GB/s of the first
    transfer of each of ``SIZES_MB`` by ``side`` ("vedart" or "cupy"), and for vedart whether
    its staging loop was loaded and a staging ring made for every device by then.
    ``{"error": ...}`` when no GPU is usable."""
    arrays = _fresh_arrays()
    began = time.perf_counter()
    if side == "vedart":
        runtime = veda.init()
        if not runtime.gpu:
            return {"error": f"no GPU: {runtime.gpu_unavailable_reason}"}
        engine = runtime.gpu.transfers
        assert engine is not None
        transfer = veda.gpu(force="gpu")(_head)
    else:
        transfer = _cupy_head
    import cupy

    np.testing.assert_array_equal(transfer(arrays[WARM_MB]), arrays[WARM_MB][:4])
    time.sleep(max(0.0, began + WAIT_AFTER_INIT_S - time.perf_counter()))
    result: dict[str, Any] = {"side": side, "after_init_s": time.perf_counter() - began}
    if side == "vedart":
        result["loop_ready"] = engine.loop.calls() is not None
        result["ring_ready"] = all(engine.has_idle_ring(ordinal)
                                   for ordinal in runtime.gpu.ordinals)
    for size in SIZES_MB:
        x = arrays[size]
        started = time.perf_counter()
        head = transfer(x)
        cupy.cuda.Device().synchronize()
        seconds = time.perf_counter() - started
        np.testing.assert_array_equal(head, x[:4])
        result[f"gbps_{size}"] = x.nbytes / seconds / 1e9
    return result


def _child(side: str) -> dict[str, Any]:
    """:func:`measure` in a new interpreter that imports this vedart."""
    environment = dict(os.environ)
    root = str(Path(veda.__file__).resolve().parents[1])
    environment["PYTHONPATH"] = os.pathsep.join(
        [root] + ([environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else []))
    code = ("import json; from vedart.bench.transfer_cold import measure; "
            f"print(json.dumps(measure({side!r})))")
    finished = subprocess.run([sys.executable, "-c", code], env=environment, check=False,
                              capture_output=True, text=True, timeout=300)
    if finished.returncode != 0:
        return {"error": f"{side} process exited with {finished.returncode}: "
                         f"{finished.stderr.strip()[-2000:]}"}
    return json.loads(finished.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(quick: bool) -> dict[str, Any]:
    """The runs and their medians (a note instead where no GPU is usable); RuntimeError with
    the child's reason when a measuring process fails."""
    rounds = 3 if quick else 7
    result: dict[str, Any] = {"suite": "transfer --cold", "sizes_mb": list(SIZES_MB),
                              "wait_after_init_s": WAIT_AFTER_INIT_S}
    probe = CudaProbe()
    try:
        discovery = probe.discover()
    finally:
        probe.close()
    if discovery.unavailable_reason is not None:
        result.update(device_name=None, note=f"no GPU ({discovery.unavailable_reason}): "
                                             "nothing to time")
        return result
    from vedart.gpu.transfer import STAGING_LOOP

    result["loop_cached"] = STAGING_LOOP.wait(300) is not None
    runs = []
    for round_ in range(rounds):
        for side in (SIDES if round_ % 2 == 0 else SIDES[::-1]):
            timings = _child(side)
            if "error" in timings:
                raise RuntimeError(f"bench transfer --cold: {timings['error']}")
            runs.append({"round": round_, **timings})
    rows = []
    for size in SIZES_MB:
        medians = {side: statistics.median(r[f"gbps_{size}"] for r in runs if r["side"] == side)
                   for side in SIDES}
        ratio = medians["vedart"] / medians["cupy"]
        rows.append({"size_mb": size, "vedart_gbps": round(medians["vedart"], 2),
                     "cupy_gbps": round(medians["cupy"], 2), "x_cupy": round(ratio, 2),
                     "meets_target": ratio >= 1.0})
    result.update(device_name=discovery.devices[0].name, rows=rows, runs=runs,
                  loop_ready_runs=sum(bool(r.get("loop_ready")) for r in runs),
                  ring_ready_runs=sum(bool(r.get("ring_ready")) for r in runs),
                  vedart_runs=rounds)
    return result


def format_table(result: dict[str, Any]) -> str:
    if "rows" not in result:
        return result["note"]
    lines = [f"first transfers of a fresh process, {result['wait_after_init_s']:g} s after init "
             f"(medians of {result['vedart_runs']} processes each)",
             f"{'MB':>5} | {'@veda.gpu GB/s':>14} {'cupy.asarray GB/s':>17} {'x cupy':>7} | target"]
    for row in result["rows"]:
        lines.append(f"{row['size_mb']:>5} | {row['vedart_gbps']:>14.2f} {row['cupy_gbps']:>17.2f} "
                     f"{row['x_cupy']:>7.2f} | {'ok' if row['meets_target'] else 'MISSED'} "
                     "(>= 1.0x)")
    lines.append(f"at the first transfer, of {result['vedart_runs']} vedart processes: staging "
                 f"loop loaded in {result['loop_ready_runs']}, staging ring made in "
                 f"{result['ring_ready_runs']}"
                 f"{'' if result['loop_cached'] else ' (the loop cannot be loaded here)'}")
    return "\n".join(lines)
