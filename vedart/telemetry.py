"""Per-call records and per-function aggregates of @gpu decisions, timings and bytes moved.

Memory is bounded: one :class:`FunctionStats` per decorated function plus a ring of the most
recent :class:`CallRecord` objects. The @gpu fast path only bumps a counter and remembers the
reason's parts (the text is formatted when read); with telemetry off nothing is recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vedart.units import format_bytes

PATHS = ("cpu", "gpu", "fallback")
NAME_COLUMN_MOST = 60  # report()'s name columns: longer names are shortened in the middle


@dataclass(frozen=True, init=False)
class CallRecord:
    """One call that went past the fast path. Seconds are wall-clock per phase;
    ``seconds_to_device`` is the host's time to hand the inputs over (the end of a copy can
    overlap the launch and then counts in ``seconds_compute``, so GB/s derived from it can read
    high for inputs the driver copies asynchronously); a one-array result under 1 MiB is
    copied back without a wait of its own for the device, so the device's work still running
    then counts in ``seconds_to_host``; on the CPU path only ``seconds_compute`` is
    measured."""

    function: str
    path: str
    reason: str
    device: int | None = None
    bytes_to_device: int = 0
    bytes_to_host: int = 0
    seconds_to_device: float = 0.0
    seconds_compute: float = 0.0
    seconds_to_host: float = 0.0
    timestamp: float = 0.0

    # Every call past the fast path makes one: the generated frozen __init__ sets each of the
    # ten fields through a guard (as Decision's did, cost.py).
    def __init__(self, function: str, path: str, reason: str, device: int | None = None,
                 bytes_to_device: int = 0, bytes_to_host: int = 0,
                 seconds_to_device: float = 0.0, seconds_compute: float = 0.0,
                 seconds_to_host: float = 0.0, timestamp: float = 0.0) -> None:
        self.__dict__.update(function=function, path=path, reason=reason, device=device,
                             bytes_to_device=bytes_to_device, bytes_to_host=bytes_to_host,
                             seconds_to_device=seconds_to_device,
                             seconds_compute=seconds_compute, seconds_to_host=seconds_to_host,
                             timestamp=timestamp)


@dataclass(frozen=True)
class Placement:
    """Where a par_iter ``gpu_map`` stage ran one item: ``path`` is "gpu" (on ``device``'s lane
    ``lane``), "cpu" (the cost model chose the CPU) or "hybrid" (rated for a GPU, run by an idle
    CPU worker while the lanes were full). ``item`` is the source index; ``started`` and
    ``finished`` are ``time.perf_counter()`` readings, comparable across items."""

    stage: str
    item: int
    path: str
    device: int | None = None
    lane: int | None = None
    started: float = 0.0
    finished: float = 0.0


class FunctionStats:
    """Aggregates of one function. Counters are exact under concurrent calls: the fast path
    counts with ``itertools.count`` (atomic in CPython), the slow path under a lock."""

    __slots__ = ("name", "threshold", "below_rule", "fast_cpu_calls", "leased_cpu_calls", "last",
                 "helpers", "_lock", "_calls", "_bytes", "_seconds")

    def __init__(self, name: str, threshold: int = 0) -> None:
        self.name = name
        self.threshold = threshold
        self.below_rule = "below threshold"  # what the fast path's size cut-off is called
        self.fast_cpu_calls = itertools.count()  # advanced by the @gpu fast path
        # Advanced by the @gpu wrapper for calls on a lease of the adaptive model's (kept
        # apart: the fast path paces its timing by its own count).
        self.leased_cpu_calls = itertools.count()
        # The last decision: a CallRecord, a fixed fast-path reason, or the host bytes of a
        # below-threshold fast-path call (formatted only when read).
        self.last: CallRecord | str | int | None = None
        # Helper functions and classes its GPU calls ran as device clones (qualified names).
        self.helpers: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._calls = dict.fromkeys(PATHS, 0)
        self._bytes = {"to_device": 0, "to_host": 0}
        self._seconds = {"to_device": 0.0, "compute": 0.0, "to_host": 0.0}

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self._calls[record.path] += 1
            self.last = record
            if record.path == "gpu":
                self._bytes["to_device"] += record.bytes_to_device
                self._bytes["to_host"] += record.bytes_to_host
                self._seconds["to_device"] += record.seconds_to_device
                self._seconds["compute"] += record.seconds_compute
                self._seconds["to_host"] += record.seconds_to_host

    def last_decision(self) -> tuple[str, str] | None:
        """(path, reason) of the most recent call, or None before the first."""
        last = self.last
        if last is None:
            return None
        if isinstance(last, CallRecord):
            return last.path, last.reason
        if isinstance(last, int):
            return "cpu", (f"{self.below_rule}: {format_bytes(last)} < "
                           f"{format_bytes(self.threshold)}")
        return "cpu", last

    def totals(self) -> dict[str, Any]:
        """Calls by path (fast-path CPU calls included), bytes and seconds by phase, as plain
        numbers, and the last decision: what :meth:`merge` adds to another process's stats."""
        fast_cpu = _count_value(self.fast_cpu_calls) + _count_value(self.leased_cpu_calls)
        with self._lock:
            totals: dict[str, Any] = {
                "calls": dict(self._calls, cpu=self._calls["cpu"] + fast_cpu),
                "bytes": dict(self._bytes), "seconds": dict(self._seconds)}
        totals["last"] = self.last_decision()
        return totals

    def merge(self, delta: dict[str, Any]) -> None:
        """Add calls, bytes and seconds made elsewhere (a device worker process's, as the
        difference of two :meth:`totals`), and take its last decision when it has one."""
        with self._lock:
            for group, counters in (("calls", self._calls), ("bytes", self._bytes),
                                    ("seconds", self._seconds)):
                for name, amount in delta[group].items():
                    counters[name] += amount  # type: ignore[operator]
            if delta["last"] is not None:
                path, reason = delta["last"]
                self.last = CallRecord(self.name, path, reason)

    def as_dict(self) -> dict[str, Any]:
        totals = self.totals()
        calls, bytes_moved, seconds, last = (totals["calls"], totals["bytes"],
                                             totals["seconds"], totals["last"])
        moved_seconds = seconds["to_device"] + seconds["to_host"]
        moved_bytes = bytes_moved["to_device"] + bytes_moved["to_host"]
        # None without a GPU call: CPU calls are not split into phases.
        mean = {phase: total / calls["gpu"] if calls["gpu"] else None
                for phase, total in seconds.items()}
        return {
            "function": self.name,
            "calls": sum(calls.values()),
            **{f"{path}_calls": count for path, count in calls.items()},
            "mean_seconds_gpu": mean,
            "bytes_to_device": bytes_moved["to_device"],
            "bytes_to_host": bytes_moved["to_host"],
            "transfer_gb_per_s": moved_bytes / moved_seconds / 1e9 if moved_seconds else None,
            "last_path": None if last is None else last[0],
            "last_reason": None if last is None else last[1],
            "helpers": list(self.helpers),
        }


def _count_value(counter: itertools.count) -> int:  # type: ignore[type-arg]
    # itertools.count has no read accessor; its repr is "count(N)".
    return int(repr(counter)[len("count("):-1])


KERNEL_PATHS = ("gpu", "simulator", "cpu")


class KernelStats:
    """Aggregates of one @gpu_kernel: launches by path (counted lock-free on the launch path
    with ``itertools.count``), first-call compile seconds, and device seconds per launch from
    CUDA events (recorded only when ``Config.profiling`` is on)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.launches = {path: itertools.count() for path in KERNEL_PATHS}
        self._lock = threading.Lock()
        self._compiles = 0
        self._compile_seconds = 0.0
        self._timed_launches = 0
        self._kernel_seconds = 0.0

    def add_compile(self, seconds: float) -> None:
        with self._lock:
            self._compiles += 1
            self._compile_seconds += seconds

    def add_kernel_time(self, seconds: float) -> None:
        with self._lock:
            self._timed_launches += 1
            self._kernel_seconds += seconds

    def as_dict(self) -> dict[str, Any]:
        launches = {path: _count_value(counter) for path, counter in self.launches.items()}
        with self._lock:
            timed, kernel_seconds = self._timed_launches, self._kernel_seconds
            compiles, compile_seconds = self._compiles, self._compile_seconds
        return {
            "kernel": self.name,
            "launches": sum(launches.values()),
            **{f"{path}_launches": count for path, count in launches.items()},
            "compiles": compiles,
            "compile_seconds": compile_seconds,
            "timed_launches": timed,
            "mean_kernel_seconds": kernel_seconds / timed if timed else None,
        }


class Telemetry:
    """The runtime's telemetry: per-function stats and a bounded ring of recent records."""

    def __init__(self, enabled: bool = True, recent_limit: int = 1024) -> None:
        self.enabled = enabled
        self._functions: dict[str, FunctionStats] = {}
        self._kernels: dict[str, KernelStats] = {}
        self._lock = threading.Lock()
        self._recent: deque[CallRecord] = deque(maxlen=recent_limit)
        self._placements: deque[Placement] = deque(maxlen=recent_limit)
        self._placement_counts: dict[tuple[str, str, int | None], int] = {}
        self._remote: dict[tuple[str, str], FunctionStats] = {}

    def function(self, name: str, threshold: int | None = None) -> FunctionStats:
        """The stats of function ``name``, created on first use; ``threshold``, when given, is
        the one its below-threshold reasons quote."""
        stats = self._functions.get(name)
        if stats is None or threshold is not None:
            with self._lock:
                stats = self._functions.get(name)
                if stats is None:
                    stats = self._functions[name] = FunctionStats(name)
                if threshold is not None:
                    stats.threshold = threshold
        return stats

    def kernel(self, name: str) -> KernelStats:
        """The stats of @gpu_kernel ``name``, created on first use."""
        with self._lock:
            return self._kernels.setdefault(name, KernelStats(name))

    def record(self, record: CallRecord, stats: FunctionStats | None = None) -> None:
        """Count ``record`` in its function's stats (``stats``, when the caller holds them)
        and keep it among the recent ones."""
        (self.function(record.function) if stats is None else stats).add(record)
        self._recent.append(record)

    def recent(self) -> list[CallRecord]:
        """The most recent slow-path records, oldest first."""
        return list(self._recent)

    def record_placement(self, placement: Placement) -> None:
        key = (placement.stage, placement.path, placement.device)
        with self._lock:  # count and list together: readers match the two up
            self._placement_counts[key] = self._placement_counts.get(key, 0) + 1
            self._placements.append(placement)

    def placements(self) -> list[Placement]:
        """The most recent gpu_map placements, oldest first."""
        return list(self._placements)

    def placement_counts(self) -> dict[tuple[str, str, int | None], int]:
        """Items per (stage, path, device) over every gpu_map run of this runtime."""
        with self._lock:
            return dict(self._placement_counts)

    def merge_remote(self, source: str, name: str, delta: dict[str, Any]) -> None:
        """Add the calls of function ``name`` that another process made (a Dask worker,
        ``source`` naming it and its device) to the function's stats and to that source's
        own row of :meth:`report`. ``delta`` is a difference of two ``FunctionStats.totals``."""
        self.function(name).merge(delta)
        with self._lock:
            stats = self._remote.setdefault((source, name), FunctionStats(name))
        stats.merge(delta)

    def functions(self) -> list[FunctionStats]:
        """The stats of every function seen so far."""
        with self._lock:
            return list(self._functions.values())

    def snapshot(self) -> dict[str, Any]:
        """Everything recorded, as JSON-friendly data."""
        with self._lock:
            functions = list(self._functions.values())
            kernels = list(self._kernels.values())
            remote = list(self._remote.items())
        return {
            "functions": [stats.as_dict() for stats in functions],
            "workers": [{"worker": source, **stats.as_dict()} for (source, _), stats in remote],
            "kernels": [stats.as_dict() for stats in kernels],
            "recent": [asdict(record) for record in self.recent()],
        }

    def export_json(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`snapshot` as JSON: a performance report to attach to a bug."""
        Path(path).write_text(json.dumps(self.snapshot(), indent=2) + "\n")

    def report(self) -> str:
        """A per-function table: calls by path, mean GPU phase times ("-" for a function with no
        GPU call: CPU calls are not split into phases), bytes moved, last reason."""
        rows = self.snapshot()["functions"]
        if not rows:
            return "no @gpu calls recorded" + ("" if self.enabled else " (telemetry is off)") \
                + self._kernel_table()
        names = _name_column("function", [row["function"] for row in rows])
        header = (f"{names[0]} {'calls':>6} {'gpu':>5} {'cpu':>5} {'fallbk':>6} "
                  f"{'to-dev ms':>9} {'compute ms':>10} {'to-host ms':>10} {'moved':>9} "
                  f"{'GB/s':>6}  last decision")
        lines = [header, "-" * len(header)]
        for name, row in zip(names[1:], rows):
            mean = row["mean_seconds_gpu"]
            moved = format_bytes(row["bytes_to_device"] + row["bytes_to_host"])
            gbps = row["transfer_gb_per_s"]
            rate = "-" if gbps is None else f"{gbps:.1f}"
            phases = ["-" if mean[phase] is None else f"{mean[phase] * 1e3:.3f}"
                      for phase in ("to_device", "compute", "to_host")]
            lines.append(
                f"{name} {row['calls']:>6} {row['gpu_calls']:>5} "
                f"{row['cpu_calls']:>5} {row['fallback_calls']:>6} "
                f"{phases[0]:>9} {phases[1]:>10} {phases[2]:>10} {moved:>9} {rate:>6}  "
                + ("no call yet" if row["last_path"] is None  # explained, or set up, only
                   else f"{row['last_path']}: {row['last_reason']}")
            )
        reached = [f"  {row['function']}: {', '.join(row['helpers'])}" for row in rows
                   if row.get("helpers")]
        if reached:
            lines += ["", "helpers run as device clones:", *reached]
        return "\n".join(lines) + self._worker_table() + self._kernel_table()

    def _worker_table(self) -> str:
        """The per-worker table report() appends ("" when no worker process reported)."""
        rows = self.snapshot()["workers"]
        if not rows:
            return ""
        workers = _name_column("worker (device)", [row["worker"] for row in rows])
        functions = _name_column("function", [row["function"] for row in rows])
        return _appended_table(
            f"{workers[0]} {functions[0]} {'calls':>6} {'gpu':>5} {'cpu':>5} {'fallbk':>6}",
            [f"{worker} {function} {row['calls']:>6} {row['gpu_calls']:>5} "
             f"{row['cpu_calls']:>5} {row['fallback_calls']:>6}"
             for worker, function, row in zip(workers[1:], functions[1:], rows)])

    def _kernel_table(self) -> str:
        """The @gpu_kernel table report() appends ("" before the first kernel launch)."""
        rows = self.snapshot()["kernels"]
        if not rows:
            return ""
        names = _name_column("kernel", [row["kernel"] for row in rows])
        lines = []
        for name, row in zip(names[1:], rows):
            mean = "-" if row["mean_kernel_seconds"] is None else \
                f"{row['mean_kernel_seconds'] * 1e3:.3f}"
            lines.append(
                f"{name} {row['launches']:>8} "
                f"{row['gpu_launches']:>6} {row['simulator_launches']:>6} "
                f"{row['cpu_launches']:>6} {row['compile_seconds']:>9.3f} {mean:>14}")
        return _appended_table(f"{names[0]} {'launches':>8} {'gpu':>6} {'simul':>6} "
                               f"{'cpu':>6} {'compile s':>9} {'mean kernel ms':>14}", lines)


def _name_column(title: str, names: list[str]) -> list[str]:
    """A name column's cells, ``title`` first, padded to its longest (at most
    ``NAME_COLUMN_MOST``; longer names shortened by :func:`_fitted`)."""
    width = min(max(len(title), *map(len, names)), NAME_COLUMN_MOST)
    return [f"{_fitted(text, width):<{width}}" for text in (title, *names)]


def _fitted(name: str, width: int) -> str:
    """``name`` shortened to ``width`` in the middle, keeping its module's start and its own
    end (``vedart.par...normalise_columns``)."""
    if len(name) <= width:
        return name
    start = (width - 3) // 3
    return f"{name[:start]}...{name[len(name) - (width - 3 - start):]}"


def _appended_table(header: str, rows: list[str]) -> str:
    """A table appended to report(): a blank line, the header, a rule, the rows."""
    return "\n".join(["", "", header, "-" * len(header), *rows])
