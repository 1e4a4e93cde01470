"""What every benchmark suite shares: timing medians, the environment header, JSON output."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vedart._version import __version__


def median_seconds(run: Callable[[], Any], *, repeats: int, warmup: int = 1,
                   synchronize: Callable[[], None] | None = None) -> float:
    """Median wall-clock seconds of ``run()`` over ``repeats`` timed runs after ``warmup``
    untimed ones; ``synchronize`` (e.g. a device sync) runs inside each timed span."""
    return interleaved_medians({"run": run}, repeats=repeats, warmup={"run": warmup},
                               synchronize=None if synchronize is None
                               else {"run": synchronize})["run"]


def interleaved_medians(runs: dict[str, Callable[[], Any]], *, repeats: int,
                        warmup: dict[str, int] | None = None,
                        synchronize: dict[str, Callable[[], None]] | None = None
                        ) -> dict[str, float]:
    """Median wall-clock seconds of each of ``runs``, timed in turn (one sample of each per
    round, ``repeats`` rounds) so a slow spell of the machine affects all of them alike; each
    round starts one place further along, so each run follows each other run equally often (on
    the H100 the first GPU call after a millisecond of CPU work took 1.2-1.5x its usual time,
    whoever made it). ``warmup[name]`` untimed runs first (default 1), ``synchronize[name]``
    inside its spans."""
    warmup, synchronize = warmup or {}, synchronize or {}
    for name, run in runs.items():
        for _ in range(warmup.get(name, 1)):
            run()
        if name in synchronize:
            synchronize[name]()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(repeats):
        start = round_ % len(names)
        for name in names[start:] + names[:start]:
            started = time.perf_counter()
            runs[name]()
            if name in synchronize:
                synchronize[name]()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def environment(device_name: str | None) -> dict[str, Any]:
    """Where and when a benchmark ran: device, CPU, versions, date."""
    from vedart.cli import component_versions

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_name or "no GPU",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "vedart": __version__,
        "versions": component_versions(),
    }


def write_json(path: str | None, result: dict[str, Any]) -> None:
    if path is not None:
        Path(path).write_text(json.dumps(result, indent=2) + "\n")
