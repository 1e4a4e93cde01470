"""``python -m vedart calibrate``: measure this machine's figures for the adaptive cost model.

Measures host -> device and device -> host bandwidth through vedart's transfer engine (64 MiB),
GPU launch overhead (a tiny elementwise kernel, synchronised), GPU and CPU elementwise float32
throughput (64 MiB), writes them into the profile file the adaptive model reads, and returns a
summary. Without a GPU only the CPU figure is measured; GPU figures keep their defaults.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from vedart.bench.harness import median_seconds, wait_for_staging_loop
from vedart.lifecycle import get_runtime
from vedart.offload.adaptive import CALIBRATION_FIELDS, AdaptiveModel, Calibration
from vedart.offload.profile import ProfileFile, default_profile_path

SAMPLE_BYTES = 64 * 2**20


def _elementwise(x: Any) -> Any:
    return x * np.float32(2.0) + np.float32(1.0)


def measure() -> tuple[Calibration, list[str]]:
    """The calibration, and the names of the figures actually measured."""
    host = np.random.default_rng(0).random(SAMPLE_BYTES // 4, dtype=np.float32)
    cpu_seconds = median_seconds(lambda: _elementwise(host), repeats=5)
    calibration = replace(Calibration(), cpu_bytes_per_s=SAMPLE_BYTES / cpu_seconds)
    measured = ["cpu_bytes_per_s"]
    runtime = get_runtime()
    gpu = runtime.gpu
    if not gpu or gpu.transfers is None:
        return calibration, measured
    import cupy

    engine = gpu.transfers
    wait_for_staging_loop(runtime)
    sync = cupy.cuda.get_current_stream().synchronize
    device = engine.to_device(host)
    tiny = cupy.ones(8, dtype=cupy.float32)
    calibration = replace(
        calibration,
        h2d_bytes_per_s=SAMPLE_BYTES / median_seconds(lambda: engine.to_device(host), repeats=5,
                                                      synchronize=sync),
        d2h_bytes_per_s=SAMPLE_BYTES / median_seconds(lambda: engine.to_host(device), repeats=5,
                                                      synchronize=sync),
        gpu_launch_s=median_seconds(lambda: _elementwise(tiny), repeats=50, warmup=5,
                                    synchronize=sync),
        gpu_bytes_per_s=SAMPLE_BYTES / median_seconds(lambda: _elementwise(device), repeats=10,
                                                      warmup=2, synchronize=sync),
    )
    return calibration, measured + ["h2d_bytes_per_s", "d2h_bytes_per_s", "gpu_launch_s",
                                    "gpu_bytes_per_s"]


def run() -> dict[str, Any]:
    """Measure, write the profile, and return what was written, where, and whether it could be
    (``saved``)."""
    runtime = get_runtime()
    gpu_name = runtime.gpu.devices[0].name if runtime.gpu else None
    path = Path(runtime.config.profile_path) if runtime.config.profile_path else \
        default_profile_path(gpu_name)
    calibration, measured = measure()
    model = runtime.cost_model or AdaptiveModel(ProfileFile(path, gpu_name, CALIBRATION_FIELDS))
    model.set_calibration(calibration)
    saved = model.save()
    return {"profile": str(path), "device_name": gpu_name, "calibration": asdict(calibration),
            "measured": measured, "saved": saved}


def format_summary(result: dict[str, Any]) -> str:
    figures = result["calibration"]
    labels = {"h2d_bytes_per_s": ("host -> device", 1e9, "GB/s"),
              "d2h_bytes_per_s": ("device -> host", 1e9, "GB/s"),
              "gpu_launch_s": ("GPU launch overhead", 1e-6, "us"),
              "gpu_bytes_per_s": ("GPU elementwise f32", 1e9, "GB/s"),
              "cpu_bytes_per_s": ("CPU elementwise f32", 1e9, "GB/s")}
    lines = [f"calibration for {result['device_name'] or 'no GPU'} -> {result['profile']}"]
    for name, (label, scale, unit) in labels.items():
        note = "" if name in result["measured"] else "  (default: not measured without a GPU)"
        lines.append(f"  {label:<22} {figures[name] / scale:10.2f} {unit}{note}")
    if not result["saved"]:
        lines.append(f"not saved: {result['profile']} could not be written (the warning above "
                     "says why); set profile_path (VEDART_PROFILE) to a writable file")
    return "\n".join(lines)
