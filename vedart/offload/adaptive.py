"""The adaptive cost model: learn, per function and argument signature, which path is faster.

Bytes alone cannot tell (a float64 sum never pays for its transfer; a 256 KB FFT does), so
timings decide. Per (function, signature: dtypes and ranks, log2 size bucket) the model keeps
the latest end-to-end times of each path and:

0. learns from each call's end-to-end time, except the first call of a bucket after a
   call on the other path: it pays for waking its path (NumPy's BLAS threads, cold caches),
   which is not what the path costs once chosen;
1. explores: a path with fewer than ``EXPLORE_TRIES`` samples in the bucket is tried, one
   path's tries back to back (the predicted-faster path first), unless that path is already
   clearly worse (its typical time above
   ``CLEARLY_WORSE`` x the other's, or so predicted by fits over several other sizes);
2. exploits: otherwise it takes the path with the lower typical time (the lower median of
   its kept samples: one slow sample does not condemn a path, one lucky sample does not
   crown it), except that it re-checks the other path after ``REVISIT_FIRST`` calls,
   then after twice as many each time (up to ``REVISIT_MAX``), so a path timed during a slow
   spell is timed again. A re-check runs the other path on ``RECHECK_CALLS`` consecutive
   calls; one that finds it faster than the chosen path is followed by another after
   ``REVISIT_FIRST`` calls again, so a path whose samples came from a slow spell wins back in
   a few re-checks. Calls below the size under which a function is settled on the CPU
   take the @gpu fast path and never reach the model, so those sizes are not re-checked;
3. generalises: a bucket with no samples for a path is predicted by a per-path fit
   ``time = a + b * bytes`` over the function's other buckets, else by the calibration profile
   (``python -m vedart calibrate``; defaults are figures measured on an H100 80GB HBM3).

The model is consulted only after the static checks allowed the GPU (usable device, supported
dtypes, enough free memory), so it never picks a path that fails them. History persists in the
profile file (:mod:`vedart.offload.profile`) keyed by qualname and a hash of the code.
"""

from __future__ import annotations

import hashlib
import marshal
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vedart.offload.profile import ProfileFile
from vedart.units import format_bytes

PATHS = ("cpu", "gpu")
EXPLORE_TRIES = 3
CLEARLY_WORSE = 2.0
SAMPLES_KEPT = 8
REVISIT_FIRST = 16   # a settled bucket runs its other path once after this many calls, ...
REVISIT_MAX = 4096   # ... then after twice as many each time, up to this
RECHECK_CALLS = 2    # consecutive calls of a re-check (the first, a switch, is not learned)
SAVE_INTERVAL_S = 30.0  # the profile is written at most this often, and when the runtime closes
ADAPTIVE_FLOOR = 64 * 1024  # default threshold under the adaptive model: below it, the fast path


@dataclass(frozen=True)
class Calibration:
    """Machine figures that predict a path's time before any sample exists."""

    h2d_bytes_per_s: float = 35e9    # vedart staging, H100, 2026-11-22 (bench transfer)
    d2h_bytes_per_s: float = 50e9
    gpu_launch_s: float = 50e-6
    gpu_bytes_per_s: float = 1e12    # elementwise float32 on the H100
    cpu_bytes_per_s: float = 4e9     # elementwise float32, NumPy, one core

    def predict(self, path: str, nbytes: int) -> float:
        if path == "cpu":
            return nbytes / self.cpu_bytes_per_s
        return (self.gpu_launch_s + nbytes / self.h2d_bytes_per_s
                + nbytes / self.d2h_bytes_per_s + nbytes / self.gpu_bytes_per_s)


def function_key(func: Callable[..., Any], qualified_name: str) -> str:
    """``qualified_name`` plus a hash of the function's code, so edited code learns afresh."""
    code = getattr(getattr(func, "func", func), "__code__", None)
    digest = hashlib.sha1(marshal.dumps(code)).hexdigest()[:12] if code is not None else "nocode"
    return f"{qualified_name}@{digest}"


def size_bucket(nbytes: int) -> int:
    return max(nbytes, 1).bit_length() - 1


@dataclass(slots=True)
class _Revisit:
    """When a settled bucket next runs its other path: after ``calls_left`` more calls (the
    current ``interval``), while ``chosen`` is its choice; ``recheck_left`` more calls of a
    re-check under way."""

    calls_left: int
    interval: int
    chosen: str
    recheck_left: int = 0


@dataclass(slots=True)
class _Bucket:
    """The model's state of one (function, signature, size bucket): ``samples``, the
    profile's [seconds, nbytes] lists per path (changed only by ``observe``); ``choice``, the
    cached ((path, reason), settled) while it holds (see ``AdaptiveModel.choose``);
    ``typicals``, each path's typical seconds since its samples last changed; ``revisit``, the
    re-check schedule of a settled bucket; ``last_path``, the path of the latest observed call.
    One lookup finds it all (H100, 2026-11-23, a 256 KB FFT settled on the GPU, timed inside
    the bench's interleaving: ``observe`` took 20-21 us with these in five dictionaries and
    three sorts, 15-17 us with one lookup and one sort)."""

    samples: dict[str, list[list[float]]]
    choice: tuple[tuple[str, str], bool] | None = None
    typicals: dict[str, float] = field(default_factory=dict)
    revisit: _Revisit | None = None
    last_path: str | None = None

    def typical(self, path: str) -> float:
        """:func:`typical` seconds of ``path`` (inf without samples)."""
        seconds = self.typicals.get(path)
        if seconds is None:
            kept = self.samples[path]
            seconds = self.typicals[path] = typical(kept)[0] if kept else math.inf
        return seconds


def typical(samples: list[list[float]]) -> list[float]:
    """The [seconds, nbytes] sample at the lower median of ``samples`` by time."""
    return sorted(samples)[(len(samples) - 1) // 2]


def _fit(points: list[tuple[int, float]]) -> Callable[[int], float] | None:
    """Least squares ``time = a + b * bytes`` (a, b >= 0) through per-bucket typical times."""
    if len(points) < 2:
        return None
    sizes = np.array([p[0] for p in points], dtype=float)
    times = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(sizes, times, 1)
    slope, intercept = max(float(slope), 0.0), max(float(intercept), 0.0)
    return lambda nbytes: intercept + slope * nbytes


class AdaptiveModel:
    """Chooses cpu or gpu per call from observed timings. Thread-safe."""

    def __init__(self, profile: ProfileFile | None = None,
                 calibration: Calibration | None = None) -> None:
        self._profile = profile
        self._lock = threading.Lock()
        data = profile.load() if profile is not None else {"functions": {}, "calibration": None}
        self._data = data
        stored = data.get("calibration")
        self.calibration = calibration or (Calibration(**stored) if isinstance(stored, dict)
                                           else Calibration())
        self._unsaved = profile is not None and profile.rejected  # replace a rejected file
        self._saved_at = time.monotonic()
        # Per-(function, signature) fits, dropped when a bucket's typical time of a path changes.
        self._fit_cache: dict[tuple[str, str], dict[str, Callable[[int], float] | None]] = {}
        # Per-(function, signature) whether every bucket has samples of both paths, dropped
        # when a bucket or a bucket's first sample of a path appears.
        self._complete: dict[tuple[str, str], bool] = {}
        self._buckets: dict[tuple[str, str, int], _Bucket] = {}
        # Changes whenever a choice may have changed: which path is faster in a bucket, a path
        # still being explored (its sample count), a time the fits of an unsampled size read,
        # the calibration. Callers deriving state from choices re-derive it only then.
        self.revision = 0

    def _bucket(self, where: tuple[str, str, int]) -> _Bucket:
        """The state of bucket ``where`` (key, signature, bucket), created with empty samples
        in the profile data when new; the caller holds the lock (or owns the model)."""
        state = self._buckets.get(where)
        if state is None:
            key, signature, bucket = where
            buckets = self._data["functions"].setdefault(key, {})
            name = f"{signature}|{bucket}"
            if name not in buckets:
                buckets[name] = {"cpu": [], "gpu": []}
                self._complete.pop((key, signature), None)
            state = self._buckets[where] = _Bucket(buckets[name])
        return state

    def _samples(self, key: str, signature: str, bucket: int) -> dict[str, list[list[float]]]:
        return self._bucket((key, signature, bucket)).samples

    def _fits(self, key: str, signature: str) -> dict[str, Callable[[int], float] | None]:
        cached = self._fit_cache.get((key, signature))
        if cached is not None:
            return cached
        typical_points: dict[str, list[tuple[int, float]]] = {path: [] for path in PATHS}
        for name, samples in self._data["functions"].get(key, {}).items():
            if name.rsplit("|", 1)[0] != signature:
                continue
            for path in PATHS:
                if samples[path]:
                    seconds, nbytes = typical(samples[path])
                    typical_points[path].append((int(nbytes), seconds))
        fits = {path: _fit(points) for path, points in typical_points.items()}
        self._fit_cache[key, signature] = fits
        return fits

    @property
    def profile_path(self) -> Path | None:
        """The profile file this model loads and saves, or None without one."""
        return None if self._profile is None else self._profile.path

    def choose(self, key: str, signature: str, nbytes: int, *, peek: bool = False
               ) -> tuple[str, str]:
        """(path, reason) for a call with ``nbytes`` of host arrays of ``signature``. Calls of
        a bucket with samples of both paths share one choice (and its reason, which names the
        size and the times of when it was made) until a sample count changes or the other
        path becomes the faster one. A settled bucket
        re-checks its other path now and then (:meth:`_revisit_or`); ``peek`` answers as for
        the next call without counting this one (``explain``)."""
        with self._lock:
            state = self._bucket((key, signature, size_bucket(nbytes)))
            choice, settled = self._bucket_choice(state, key, signature, nbytes)
            return self._revisit_or(choice, state, nbytes, peek) if settled else choice

    def _bucket_choice(self, state: _Bucket, key: str, signature: str, nbytes: int
                       ) -> tuple[tuple[str, str], bool]:
        """The choice for bucket ``state`` of (``key``, ``signature``) at ``nbytes`` and
        whether the bucket is settled (explored, not exploring), reused while cached (see
        :meth:`choose`); the caller holds the lock."""
        if state.choice is not None:
            return state.choice
        fits = self._fits_if_needed(key, signature, state.samples)
        path, reason, settled = self._choose(state.samples, fits, nbytes)
        choice = ((path, reason), settled)
        if fits is None:
            state.choice = choice
        return choice

    def _revisit_or(self, choice: tuple[str, str], bucket: _Bucket, nbytes: int,
                    peek: bool) -> tuple[str, str]:
        """``choice``, except that every so many calls of a settled bucket the other path runs
        (``RECHECK_CALLS`` calls in a row): a path's evidence is its recent times, and ones
        measured during a slow spell (a cold thread pool, another tenant) would otherwise
        never be measured again. The
        interval starts at ``REVISIT_FIRST`` calls and doubles up to ``REVISIT_MAX``, so a
        path that really is slower costs little; it starts afresh when the choice changes.
        Only calls that reach the model count (not those under the settled-CPU floor, which
        take the fast path); with ``peek`` nothing is counted."""
        state = bucket.revisit
        if state is None or state.chosen != choice[0]:
            state = _Revisit(REVISIT_FIRST, REVISIT_FIRST, choice[0])
            if not peek:
                bucket.revisit = state
        if state.recheck_left == 0 and state.calls_left > 1:
            if not peek:
                state.calls_left -= 1
            return choice
        if state.recheck_left > 0:
            interval, call = state.interval, RECHECK_CALLS - state.recheck_left + 1
            if not peek:
                state.recheck_left -= 1
        else:
            interval, call = min(2 * state.interval, REVISIT_MAX), 1
            if not peek:
                state.calls_left = state.interval = interval
                state.recheck_left = RECHECK_CALLS - 1
        other = "cpu" if choice[0] == "gpu" else "gpu"
        return other, (f"adaptive: re-checking {other} at ~{format_bytes(nbytes)}, call {call} "
                       f"of {RECHECK_CALLS} ({choice[0]} chosen; next check in {interval} "
                       f"calls)")

    def _fits_if_needed(self, key: str, signature: str, samples: dict[str, list[list[float]]]
                        ) -> dict[str, Callable[[int], float] | None] | None:
        """The fits, or None when both paths have samples in the bucket and no fit is read
        (fitting costs tens of microseconds; a settled bucket must not pay it)."""
        return None if samples["cpu"] and samples["gpu"] else self._fits(key, signature)

    def cpu_ceiling(self, key: str) -> int:
        """Bytes below which every size this function has been seen at is settled on the CPU
        (explored, and the CPU won): calls below it can skip the model. 0 when none is."""
        ceiling = 0
        with self._lock:
            buckets = sorted((int(name.rsplit("|", 1)[1]), name.rsplit("|", 1)[0])
                             for name, samples in self._data["functions"].get(key, {}).items()
                             if samples["cpu"] or samples["gpu"])
            for bucket, signature in buckets:
                (path, _), settled = self._bucket_choice(
                    self._bucket((key, signature, bucket)), key, signature, 2**bucket)
                if path != "cpu" or not settled:
                    break
                ceiling = 2 ** (bucket + 1)
        return ceiling

    def _choose(self, samples: dict[str, list[list[float]]],
                fits: dict[str, Callable[[int], float] | None] | None, nbytes: int
                ) -> tuple[str, str, bool]:
        """(path, reason, settled: not exploring); ``fits`` may be None only when both paths
        have samples (it is not read then)."""
        size = f"~{format_bytes(nbytes)}"
        measured = {path: typical(samples[path])[0] if samples[path] else None for path in PATHS}
        fitted = fits or dict.fromkeys(PATHS)
        predicted = {path: measured[path] if measured[path] is not None
                     else (fitted[path](nbytes) if fitted[path] is not None  # type: ignore[misc]
                           else self.calibration.predict(path, nbytes)) for path in PATHS}

        def clearly_worse(path: str) -> bool:
            other = "gpu" if path == "cpu" else "cpu"
            known = measured[path] is not None or (fitted[path] is not None
                                               and fitted[other] is not None)
            return known and predicted[path] > CLEARLY_WORSE * predicted[other]

        # A path being explored is finished before the other starts, so each is sampled as it
        # runs once chosen: after itself.
        for path in sorted(PATHS, key=lambda p: (-len(samples[p]), predicted[p])):
            if len(samples[path]) < EXPLORE_TRIES and not clearly_worse(path):
                return path, (f"adaptive: exploring {path} at {size} "
                              f"({len(samples[path])} of {EXPLORE_TRIES} tries)"), False
        path = min(PATHS, key=lambda p: predicted[p])
        count = len(samples["cpu"]) + len(samples["gpu"])
        return path, (f"adaptive: gpu {predicted['gpu'] * 1e3:.3g} ms vs cpu "
                      f"{predicted['cpu'] * 1e3:.3g} ms at {size} ({count} samples)"), True

    def observe(self, key: str, signature: str, nbytes: int, path: str, seconds: float) -> None:
        """Record one end-to-end time of ``path`` (not the first after a call on the other
        path: see the module docstring); writes the profile at most every
        ``SAVE_INTERVAL_S`` seconds (and on :meth:`save`)."""
        with self._lock:
            state = self._bucket((key, signature, size_bucket(nbytes)))
            last, state.last_path = state.last_path, path
            if last is not None and last != path:  # the first call after a switch: waking up
                return
            other_path = "gpu" if path == "cpu" else "cpu"
            kept, other = state.samples[path], state.samples[other_path]
            before, other_time = state.typical(path), state.typical(other_path)
            explored_before = len(kept) >= EXPLORE_TRIES <= len(other)
            if not kept:
                self._complete.pop((key, signature), None)
            kept.append([seconds, nbytes])
            revisit = state.revisit
            if revisit is not None and path != revisit.chosen and seconds < other_time:
                # A re-check found the other path faster than the chosen one: its older
                # samples may be stale, so check again soon rather than after twice as long.
                revisit.calls_left = revisit.interval = REVISIT_FIRST
            if len(kept) <= SAMPLES_KEPT:  # the count in the reason changed
                state.choice = None
            del kept[:-SAMPLES_KEPT]
            state.typicals.pop(path, None)
            after = state.typical(path)
            if after != before:
                self._fit_cache.pop((key, signature), None)
                # A settled bucket whose faster path stays keeps its choice (the figures in
                # its reason are those of when it was made): a noisy path's median moves on
                # about half of its samples, and choosing afresh costs tens of microseconds.
                steady = explored_before and (before < other_time) == (after < other_time)
                if not steady:
                    state.choice = None
                if not (steady and self._all_buckets_sampled(key, signature)):
                    self.revision += 1
            elif len(kept) <= EXPLORE_TRIES:
                self.revision += 1
            self._unsaved = True
            due = time.monotonic() - self._saved_at >= SAVE_INTERVAL_S
        if due:
            self.save()

    def _all_buckets_sampled(self, key: str, signature: str) -> bool:
        """Whether every bucket of ``signature`` has samples of both paths, so none is
        predicted by the fits a new typical time moves (the caller holds the lock)."""
        complete = self._complete.get((key, signature))
        if complete is None:
            complete = self._complete[key, signature] = all(
                samples["cpu"] and samples["gpu"]
                for name, samples in self._data["functions"][key].items()
                if name.rsplit("|", 1)[0] == signature)
        return complete

    def set_calibration(self, calibration: Calibration) -> None:
        with self._lock:
            self.calibration = calibration
            for state in self._buckets.values():
                state.choice = None
            self.revision += 1
            self._data["calibration"] = asdict(calibration)
            self._unsaved = True

    def save(self) -> None:
        """Write the profile file (no-op without one)."""
        if self._profile is None:
            return
        with self._lock:
            if not self._unsaved:
                return
            self._unsaved = False
            self._saved_at = time.monotonic()
            snapshot = {"calibration": self._data.get("calibration"),
                        "functions": {key: {name: {path: list(times) for path, times in s.items()}
                                            for name, s in buckets.items()}
                                      for key, buckets in self._data["functions"].items()}}
        self._profile.save(snapshot)
