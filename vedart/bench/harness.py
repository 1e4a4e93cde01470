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
from typing import TYPE_CHECKING, Any

from vedart._version import __version__, component_versions

if TYPE_CHECKING:
    from vedart.runtime import Runtime


def wait_for_staging_loop(runtime: Runtime) -> None:
    """Wait, up to five minutes, until ``runtime``'s transfer engine has loaded its compiled
    staging loop and made the staging ring it makes ahead, so that copies from 16 MiB are timed
    through them and not as the direct copies made while the loop loads (nothing to wait for
    without a GPU)."""
    if runtime.gpu and runtime.gpu.transfers is not None:
        runtime.gpu.transfers.loop.wait(300.0)
        runtime.gpu.transfers.wait_prepared(300.0)


def median_seconds(run: Callable[[], Any], *, repeats: int, warmup: int = 1,
                   synchronize: Callable[[], None] | None = None) -> float:
    """Median wall-clock seconds of ``run()`` over ``repeats`` timed runs after ``warmup``
    untimed ones; ``synchronize`` (e.g. a device sync) runs inside each timed span."""
    return interleaved_medians({"run": run}, repeats=repeats, warmup={"run": warmup},
                               synchronize=None if synchronize is None
                               else {"run": synchronize})["run"]


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of ``names`` in each of ``rounds`` rounds: blocks of a Williams design, in which
    each name directly follows each other name equally often (once per block of ``len(names)``
    rounds for an even count of names, twice per block of ``2 * len(names)`` for an odd one),
    the rounds of a block arranged so that a round starts with the name the previous one ended
    with where the block allows. Cycling through all permutations instead balances only over
    ``len(names)!`` rounds: with four runs and five rounds, one run followed the CPU run in
    three rounds and another in none."""
    block = _williams_block(names)
    orders: list[list[str]] = []
    while len(orders) < rounds:
        unused = list(block)
        while unused and len(orders) < rounds:
            after = [order for order in unused if orders and order[0] == orders[-1][-1]]
            order = (after or unused)[0]
            unused.remove(order)
            orders.append(order)
    return orders


def rounds_per_block(count: int) -> int:
    """Rounds in one balanced block of :func:`round_orders` for ``count`` names."""
    return count if count % 2 == 0 or count == 1 else 2 * count


def _williams_block(names: list[str]) -> list[list[str]]:
    count = len(names)
    offsets = [0]  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
    low, high = 1, count - 1
    while len(offsets) < count:
        offsets.append(low)
        low += 1
        if len(offsets) < count:
            offsets.append(high)
            high -= 1
    rows = [[names[(start + offset) % count] for offset in offsets] for start in range(count)]
    if rounds_per_block(count) > count:
        rows += [row[::-1] for row in rows]
    return rows


def interleaved_medians(runs: dict[str, Callable[[], Any]], *, repeats: int,
                        warmup: dict[str, int] | None = None,
                        synchronize: dict[str, Callable[[], None]] | None = None,
                        setup: dict[str, Callable[[], None]] | None = None
                        ) -> dict[str, float]:
    """Median wall-clock seconds of each of ``runs`` over ``repeats`` rounds of
    :func:`interleaved_samples`."""
    samples = interleaved_samples(runs, repeats=repeats, warmup=warmup, synchronize=synchronize,
                                  setup=setup)
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_samples(runs: dict[str, Callable[[], Any]], *, repeats: int,
                        warmup: dict[str, int] | None = None,
                        synchronize: dict[str, Callable[[], None]] | None = None,
                        budget_s: float = 0.0, max_repeats: int = 0,
                        setup: dict[str, Callable[[], None]] | None = None
                        ) -> dict[str, list[float]]:
    """Wall-clock seconds of each of ``runs``, timed in turn (one sample of each per round) so
    a slow spell of the machine affects all of them alike, in the orders of
    :func:`round_orders`, so each run follows each other run equally often (on the H100 the
    first GPU call after a millisecond of CPU work took 1.2-1.5x its usual time, whoever made
    it). Where a round starts with another run than the one just timed, that run is first
    made once untimed, so no run is timed right after another across a round's boundary. At
    least ``repeats`` rounds, rounded up to whole balanced blocks (:func:`rounds_per_block`);
    with ``budget_s``, further whole blocks until ``budget_s`` seconds of rounds have passed,
    up to ``max_repeats`` rounds in all (a cheap case gets many samples; the stop is read from
    elapsed time, not from a first round that may have been slow). ``warmup[name]`` untimed
    runs first (default 1), ``synchronize[name]`` inside its spans, ``setup[name]`` untimed
    before each of its runs (installing the runtime it runs on, say)."""
    warmup, synchronize, setup = warmup or {}, synchronize or {}, setup or {}

    def untimed(name: str) -> None:
        setup.get(name, _nothing)()
        runs[name]()
        if name in synchronize:
            synchronize[name]()

    last = None
    for name in runs:
        for _ in range(warmup.get(name, 1)):
            untimed(name)
            last = name
    block = rounds_per_block(len(runs))
    least = -(-repeats // block) * block
    samples: dict[str, list[float]] = {name: [] for name in runs}
    began = time.perf_counter()
    for done, order in enumerate(round_orders(list(runs), max(least, max_repeats))):
        if done >= least and done % block == 0 and time.perf_counter() - began >= budget_s:
            break
        if order[0] != last:
            untimed(order[0])
        for name in order:
            setup.get(name, _nothing)()
            started = time.perf_counter()
            runs[name]()
            if name in synchronize:
                synchronize[name]()
            samples[name].append(time.perf_counter() - started)
        last = order[-1]
    return samples


def _nothing() -> None:
    pass


def environment(device_name: str | None) -> dict[str, Any]:
    """Where and when a benchmark ran: device, CPU, versions, date."""
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
