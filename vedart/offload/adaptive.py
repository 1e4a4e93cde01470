"""The adaptive cost model: learn, per function and argument signature, which path is faster.

Bytes alone cannot tell (a float64 sum never pays for its transfer; a 256 KB FFT does; a
function of an ``int`` can run for seconds), so timings decide. Per (function, signature:
dtypes, ranks and the log2 magnitudes of numbers passed as arguments, log2 size bucket) the
model keeps the latest end-to-end times of each path and:

0. learns from each timed call's end-to-end time, except the first call of a bucket after a
   call on the other path: it pays for waking its path (NumPy's BLAS threads, cold caches),
   which is not what the path costs once chosen. @gpu's fast path (arguments below
   ``ADAPTIVE_FLOOR``) feeds it the CPU time of calls of ``LIGHT_S`` or more: a function
   lighter than that never reaches the model;
1. starts a size it knows nothing about on the CPU while the calibration predicts the CPU
   under ``FIRST_ON_CPU_S`` (the first call runs as written and its time decides what is worth
   trying), else on the path the calibration predicts faster;
2. explores: a path with fewer than ``EXPLORE_TRIES`` samples in the bucket is tried, one
   path's tries back to back, unless it is clearly worse (its typical time above
   ``CLEARLY_WORSE`` x the other's, or so predicted by fits over other sizes, though not from
   one sample under ``FIRST_ON_CPU_S`` at ``ADAPTIVE_FLOOR`` or more against a path not yet
   measured; or, for the GPU, a measured CPU call faster than a GPU launch plus the upload),
   or trying it would take the function's exploration cost beyond ``EXPLORE_BUDGET`` of its
   time so far;
3. exploits: otherwise it takes the path with the lower typical time (the lower median of
   its kept samples). Settled calls are not timed; they count down to a re-check of the other
   path (``RECHECK_CALLS`` calls, then as many timed calls of the chosen path) after
   ``REVISIT_FIRST`` calls, then twice as many each time (up to ``REVISIT_MAX``), and never
   sooner than keeps the re-check within ``EXPLORE_BUDGET`` of the calls between (at least
   ``SLOW_REVISIT_MIN`` for a path ``SLOW_RATIO`` times slower; a path the bucket has no
   samples of counts at the time the fits over the function's other sizes predict). A
   re-check that finds the other path faster is followed by another after ``REVISIT_FIRST``
   calls;
4. generalises: a bucket with no samples for a path is predicted by a per-path fit
   ``time = a + b * size`` over the function's other buckets of the signature (size: bytes
   times the scalars' magnitudes), never below a GPU launch plus the upload for the GPU, else
   by the calibration profile (``python -m vedart calibrate``; defaults are figures measured
   on an H100 80GB HBM3).

The model is consulted only after the static checks allowed the GPU (usable device, supported
dtypes, enough free memory), so it never picks a path that fails them. History persists in the
profile file (:mod:`vedart.offload.profile`) keyed by qualname and a hash of the code; reasons
of buckets settled from it say ``from profile``.
"""

from __future__ import annotations

import hashlib
import itertools
import marshal
import math
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from vedart.offload.profile import ProfileFile, today
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
# A fast-path call (arguments below the floor) at least this long on the CPU makes its function
# "heavy": its calls then reach the model. Well above a GPU launch plus a small transfer (about
# 50 us on the H100), so a function this light on the CPU never pays for exploring the GPU.
LIGHT_S = 200e-6
# Fast-path calls timed: every one of a function's first TIMED_FIRST_CALLS, then one in
# TIMED_ONE_IN (a power of two). Two clock reads on every call cost about as much as the rest of
# the fast path together (H100, 2026-11-24: +0.79 us against 0.33-0.76 before them).
TIMED_FIRST_CALLS = 64
TIMED_ONE_IN = 16
# A timed call between LIGHT_S and this may be a stall rather than work (waiting up to a few
# 5 ms interpreter-lock switch intervals for a thread of the runtime's start-up, first-touch page
# faults): it makes its function heavy only when another such call follows within
# HEAVY_CONFIRM_CALLS fast-path calls. A call this long or longer counts at once.
HEAVY_AT_ONCE_S = 0.02
HEAVY_CONFIRM_CALLS = 64
# Exploring a path predicted slower, and re-checking a slower path, may cost a function at most
# this share of its total time so far beyond what the faster path would have cost.
EXPLORE_BUDGET = 0.1
# A size the model knows nothing about starts on the CPU while the calibration predicts the CPU
# under this; above, on the path the calibration predicts faster.
FIRST_ON_CPU_S = 0.01
SLOW_RATIO = 10.0       # a path measured this much slower is re-checked at least ...
SLOW_REVISIT_MIN = 256  # ... this many calls apart
_rechecks_deferred: ContextVar[bool] = ContextVar("vedart_rechecks_deferred", default=False)


@contextmanager
def rechecks_deferred() -> Iterator[None]:
    """Within the block, a settled bucket whose re-check is due or under way answers with its
    settled choice, untimed, and keeps the re-check for the first call after the block: a
    pipeline decides its next items so while a re-check's CPU item runs (``gpu_map``), and
    none of them is timed beside it."""
    token = _rechecks_deferred.set(True)
    try:
        yield
    finally:
        _rechecks_deferred.reset(token)


@dataclass(frozen=True)
class Calibration:
    """Machine figures that predict a path's time before any sample exists."""

    h2d_bytes_per_s: float = 35e9    # vedart staging, H100, 2026-11-22 (bench transfer)
    d2h_bytes_per_s: float = 50e9
    gpu_launch_s: float = 50e-6
    gpu_bytes_per_s: float = 1e12    # elementwise float32 on the H100
    cpu_bytes_per_s: float = 4e9     # elementwise float32, NumPy, one core

    def gpu_floor(self, nbytes: int) -> float:
        """The least a GPU call with ``nbytes`` of host inputs can cost: a launch and the
        upload, whatever the work (a CPU call faster than this cannot lose to the GPU)."""
        return self.gpu_launch_s + nbytes / self.h2d_bytes_per_s

    def predict(self, path: str, nbytes: int) -> float:
        if path == "cpu":
            return nbytes / self.cpu_bytes_per_s
        return (self.gpu_launch_s + nbytes / self.h2d_bytes_per_s
                + nbytes / self.d2h_bytes_per_s + nbytes / self.gpu_bytes_per_s)


CALIBRATION_FIELDS = frozenset(each.name for each in fields(Calibration))


def _ms(seconds: float) -> str:
    """``seconds`` for reasons: ``0.675 ms``, ``326 ms``, ``3.1 s``."""
    return f"{seconds:.3g} s" if seconds >= 0.9995 else f"{seconds * 1e3:.3g} ms"


def function_key(func: Callable[..., Any], qualified_name: str) -> str:
    """``qualified_name`` plus a hash of the function's code, so edited code learns afresh;
    code that only moved (other lines above it, another path to its file) keeps its key."""
    code = getattr(getattr(func, "func", func), "__code__", None)
    if code is None:
        return f"{qualified_name}@nocode"
    digest = hashlib.sha1()
    _hash_code(code, digest)
    return f"{qualified_name}@{digest.hexdigest()[:12]}"


def _hash_code(code: types.CodeType, digest: Any) -> None:
    """Feed ``digest`` what ``code`` does: its bytecode, names, arguments, and constants
    (nested functions' code the same way), without its file name or line numbers."""
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                        code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                        code.co_flags)).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _hash_code(constant, digest)
        else:
            digest.update(marshal.dumps(constant))


def bucket_name(signature: str, bucket: int) -> str:
    """How the profile names bucket ``bucket`` of ``signature``."""
    return f"{signature}|{bucket}"


def size_bucket(nbytes: int) -> int:
    return max(nbytes, 1).bit_length() - 1


SCALARS = ";"  # separates a signature's arrays from its scalar parts ("<f4:1;n~2^24")
# A work size's scalar factor is at most 2 to this (many large numbers among the arguments):
# fits square the sizes, which must stay finite floats.
WORK_EXPONENT_MOST = 256


def family(signature: str) -> str:
    """``signature`` without its scalars' magnitudes (``"<f4:1;n"``): the signatures whose
    buckets one fit spans."""
    arrays, _, scalars = signature.partition(SCALARS)
    if not scalars:
        return signature
    return arrays + SCALARS + ",".join(part.split("~", 1)[0] for part in scalars.split(","))


def work_size(signature: str, nbytes: float) -> float:
    """What sizes a call's work, for fits across buckets: its bytes, times each scalar's
    magnitude (``2**k`` for ``n~2^k``) where the signature has scalars."""
    _, _, scalars = signature.partition(SCALARS)
    if not scalars:
        return nbytes
    exponent = sum(int(part.rsplit("^", 1)[1]) for part in scalars.split(","))
    return max(nbytes, 1.0) * 2.0 ** min(exponent, WORK_EXPONENT_MOST)


def describe(signature: str, nbytes: int) -> str:
    """Where a call sits, for reasons: ``at ~16.0 MB``, ``for n~2^24``, ``at ~36.0 KB,
    n~2^12``."""
    _, _, scalars = signature.partition(SCALARS)
    if not scalars:
        return f"at ~{format_bytes(nbytes)}"
    if nbytes == 0:
        return f"for {scalars.replace(',', ', ')}"
    return f"at ~{format_bytes(nbytes)}, {scalars.replace(',', ', ')}"


class Choice(NamedTuple):
    """The model's answer for one call: the path, why, and whether the call is timed and
    learned from (exploring or re-checking); a settled call is not. ``exploring``: the bucket
    has not settled, so the next call's choice depends on this one's time."""

    path: str
    reason: str
    timed: bool = True
    exploring: bool = False


@dataclass(slots=True)
class _Revisit:
    """When a settled bucket next runs its other path: after ``calls_left`` more calls (the
    current ``interval``), while ``chosen`` is its choice; ``recheck_left`` more calls of a
    re-check under way (``RECHECK_CALLS`` of the other path, then as many of the chosen path,
    timed so that both paths' times are recent)."""

    calls_left: int
    interval: int
    chosen: str
    recheck_left: int = 0


@dataclass(slots=True)
class _Ledger:
    """One function's time: ``total`` seconds of its calls that reached the model (settled
    calls counted at their path's typical time), and ``extra``, what exploring and re-checking
    cost beyond the faster path."""

    total: float = 0.0
    extra: float = 0.0

    def allows(self, cost: float) -> bool:
        return self.extra + cost <= EXPLORE_BUDGET * self.total


@dataclass(slots=True)
class _Bucket:
    """The model's state of one (function, signature, size bucket): ``samples``, the
    profile's [seconds, nbytes] lists per path (changed only by ``observe``); ``choice``, the
    cached (Choice, settled, the fits it read, if any: it holds while they are the current ones);
    ``typicals``, each path's typical seconds since its samples last changed; ``revisit``, the
    re-check schedule of a settled bucket; ``last_path``, the path of the latest observed call;
    ``from_profile``, whether its samples all came from the profile file; ``predicted``, the
    times the latest settled choice saw: measured in the bucket, or predicted by the fits over
    the function's other sizes where it has no samples (not a calibration's guess, which can be
    several times off: an 80 MB float64 sum's CPU time, 16.8 ms predicted, 2.9 ms on 2 cores).
    One lookup finds it all (H100, 2026-11-23, a 256 KB FFT settled on the GPU, timed inside
    the bench's interleaving: ``observe`` took 20-21 us with these in five dictionaries and
    three sorts, 15-17 us with one lookup and one sort)."""

    samples: dict[str, list[list[float]]]
    choice: tuple[Choice, bool, dict[str, Any] | None] | None = None
    typicals: dict[str, float] = field(default_factory=dict)
    revisit: _Revisit | None = None
    last_path: str | None = None
    from_profile: bool = False
    predicted: dict[str, float] = field(default_factory=dict)

    def expected(self, path: str) -> float:
        """``path``'s typical seconds, or, without samples, the time the fits over the
        function's other sizes predicted for it at the latest settled choice (inf when none
        did)."""
        seconds = self.typical(path)
        return self.predicted.get(path, seconds) if seconds == math.inf else seconds

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


def _fit(points: list[tuple[float, float]], proportional: bool = False
         ) -> Callable[[float], float] | None:
    """Least squares ``time = a + b * size`` (a, b >= 0) through per-bucket typical times; with
    one point, ``time = b * size`` where ``proportional`` (work sized by scalars), else None."""
    if len(points) == 1 and proportional:
        size, seconds = points[0]
        return lambda work: seconds * work / size
    if len(points) < 2:
        return None
    sizes = np.array([p[0] for p in points], dtype=float)
    times = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(sizes, times, 1)
    slope, intercept = max(float(slope), 0.0), max(float(intercept), 0.0)
    return lambda work: intercept + slope * work


def _count_settled(bucket: _Bucket, revisit: _Revisit, path: str, ledger: _Ledger,
                   counting: bool) -> None:
    """Count one settled call of ``path`` (the caller holds the model's lock): towards the
    bucket's next re-check when ``counting``, and in the function's ledger at the path's
    typical time."""
    if counting:
        revisit.calls_left -= 1
        bucket.last_path = path  # untimed, but a switch all the same
    seconds = bucket.typicals.get(path) or bucket.typical(path)
    if seconds != math.inf:
        ledger.total += seconds


class Lease:
    """Leave to run one bucket's settled path without asking the model, call by call, while
    the bucket stays settled as it was (:meth:`AdaptiveModel.lease`). Each :meth:`take`
    counts the call as :meth:`AdaptiveModel.choose` counts a settled one, so re-checks come on
    the same call with or without leases, whichever call sites and threads hold them."""

    __slots__ = ("_bucket", "_choice", "_fits", "_ledger", "_lock", "_revisit", "reason")

    def __init__(self, lock: threading.Lock, bucket: _Bucket,
                 choice: tuple[Choice, bool, dict[str, Any] | None], revisit: _Revisit,
                 ledger: _Ledger,
                 fits: tuple[dict[tuple[str, str], Any], tuple[str, str]] | None) -> None:
        self._lock = lock
        self._bucket = bucket
        self._choice = choice
        self._revisit = revisit
        self._ledger = ledger
        self._fits = fits  # (the model's fit cache, the key of the fits the choice read)
        self.reason = choice[0].reason

    def take(self) -> bool:
        """Count one call of the settled path; False, counting nothing, once the bucket's
        choice, the fits it read or its re-check schedule changed, or a re-check is due or
        under way (then the model decides the call, and defers the re-check within
        :func:`rechecks_deferred`, as it would have: a settled call before it counts the same
        deferred or not)."""
        bucket, revisit, fits = self._bucket, self._revisit, self._fits
        with self._lock:
            if bucket.choice is not self._choice or bucket.revisit is not revisit \
                    or revisit.recheck_left > 0 or revisit.calls_left <= 1 \
                    or fits is not None and fits[0].get(fits[1]) is not self._choice[2]:
                return False
            _count_settled(bucket, revisit, revisit.chosen, self._ledger, True)
            return True


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
        # What this process learned since its last save, which a save writes over the file's:
        # buckets (key, name) and the calibration. The rest is taken from the file as it is
        # then, where another process may have saved meanwhile.
        self._changed: set[tuple[str, str]] = set()
        self._calibration_changed = False
        self._used: set[str] = set()  # function keys this process has used, marked at saves
        self._saving = threading.Lock()  # one save at a time, from snapshot to rename
        # Bucket names that came with samples from the profile file (reasons say so).
        self._loaded = {(key, name) for key, buckets in data["functions"].items()
                        for name, samples in buckets.items() if samples["cpu"] or samples["gpu"]}
        # Per-(function, family) fits, dropped when a bucket's typical time of a path changes.
        self._fit_cache: dict[tuple[str, str], dict[str, Callable[[float], float] | None]] = {}
        # Per-(function, signature) whether every bucket has samples of both paths, dropped
        # when a bucket or a bucket's first sample of a path appears.
        self._complete: dict[tuple[str, str], bool] = {}
        self._buckets: dict[tuple[str, str, int], _Bucket] = {}
        self._ledgers: dict[str, _Ledger] = {}
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
            if key not in self._used:
                self._used.add(key)
                # A function used on a day the file does not record is saved as used then,
                # or the profile would drop it after KEEP_DAYS.
                if self._profile is not None and self._data.get("used", {}).get(key) != today():
                    self._unsaved = True
            buckets = self._data["functions"].setdefault(key, {})
            name = bucket_name(signature, bucket)
            if name not in buckets:
                buckets[name] = {"cpu": [], "gpu": []}
                self._complete.pop((key, signature), None)
            state = self._buckets[where] = _Bucket(buckets[name],
                                                   from_profile=(key, name) in self._loaded)
        return state

    def _ledger(self, key: str) -> _Ledger:
        ledger = self._ledgers.get(key)
        if ledger is None:
            ledger = self._ledgers[key] = _Ledger()
        return ledger

    def _samples(self, key: str, signature: str, bucket: int) -> dict[str, list[list[float]]]:
        return self._bucket((key, signature, bucket)).samples

    def _fits(self, key: str, signature: str) -> dict[str, Callable[[float], float] | None]:
        group = family(signature)
        cached = self._fit_cache.get((key, group))
        if cached is not None:
            return cached
        typical_points: dict[str, list[tuple[float, float]]] = {path: [] for path in PATHS}
        for name, samples in self._data["functions"].get(key, {}).items():
            other = name.rsplit("|", 1)[0]
            if family(other) != group:
                continue
            for path in PATHS:
                if samples[path]:
                    seconds, nbytes = typical(samples[path])
                    typical_points[path].append((work_size(other, nbytes), seconds))
        proportional = group != signature.partition(SCALARS)[0]
        # One GPU time is no slope: a launch-bound call (1 ms at n = 2**15) scaled with n
        # predicted 512 ms at n = 2**24, where the call takes 1.2 ms.
        fits = {path: _fit(points, proportional and path == "cpu")
                for path, points in typical_points.items()}
        self._fit_cache[key, group] = fits
        return fits

    @property
    def profile_path(self) -> Path | None:
        """The profile file this model loads and saves, or None without one."""
        return None if self._profile is None else self._profile.path

    def choose(self, key: str, signature: str, nbytes: int, *, peek: bool = False) -> Choice:
        """The Choice for a call with ``nbytes`` of host arrays of ``signature``. Calls of
        a bucket with samples of both paths share one choice (and its reason, which names the
        size and the times of when it was made) until a sample count changes or the other
        path becomes the faster one. A settled bucket's calls are not timed, except that it
        re-checks its other path now and then (:meth:`_revisit_or`); ``peek`` answers as for
        the next call without counting this one (``explain``)."""
        where = (key, signature, max(nbytes, 1).bit_length() - 1)  # size_bucket(nbytes)
        with self._lock:
            state = self._buckets.get(where) or self._bucket(where)
            cached = state.choice
            if cached is not None and cached[2] is None:  # settled, on its own samples
                return self._revisit_or(cached[0], state, key, signature, nbytes, peek)
            choice, settled = self._bucket_choice(state, key, signature, nbytes)
            if not settled:
                return choice
            return self._revisit_or(choice, state, key, signature, nbytes, peek)

    def lease(self, key: str, signature: str, nbytes: int, path: str) -> Lease | None:
        """A :class:`Lease` on the bucket of this call, settled on ``path`` (on its own
        samples, or on the fits over the function's other sizes while they are the current
        ones), or None when it is not (exploring, a re-check under way or due, or settled
        since on the other path)."""
        with self._lock:
            state = self._buckets.get((key, signature, size_bucket(nbytes)))
            cached = None if state is None else state.choice
            if cached is None or cached[0].path != path:
                return None
            fitted = (key, family(signature))
            if cached[2] is not None and self._fit_cache.get(fitted) is not cached[2]:
                return None
            assert state is not None
            revisit = state.revisit
            if revisit is None or revisit.chosen != path or revisit.recheck_left > 0:
                return None
            return Lease(self._lock, state, cached, revisit, self._ledger(key),
                         None if cached[2] is None else (self._fit_cache, fitted))

    def _bucket_choice(self, state: _Bucket, key: str, signature: str, nbytes: int
                       ) -> tuple[Choice, bool]:
        """The choice for bucket ``state`` of (``key``, ``signature``) at ``nbytes`` and
        whether the bucket is settled (explored, not exploring), reused while cached (see
        :meth:`choose`); the caller holds the lock."""
        cached = state.choice
        if cached is not None and (cached[2] is None or
                                   self._fit_cache.get((key, family(signature))) is cached[2]):
            return cached[0], cached[1]
        fits = self._fits_if_needed(key, signature, state.samples)
        path, reason, settled, predicted = self._choose(state, fits, signature, nbytes,
                                                        self._ledger(key))
        choice = Choice(path, reason, not settled, not settled)
        if settled:  # an exploring choice reads the ledger, which every call moves
            state.choice = (choice, settled, fits)
            state.predicted = predicted
        return choice, settled

    def _revisit_or(self, choice: Choice, bucket: _Bucket, key: str, signature: str,
                    nbytes: int, peek: bool) -> Choice:
        """``choice`` untimed, except that every so many calls of a settled bucket the other
        path runs (``RECHECK_CALLS`` calls in a row, then as many timed calls of the chosen
        path): a path's evidence is its recent times, and ones measured during a slow spell
        (a cold thread pool, another tenant) would otherwise never be measured again. The
        interval starts at ``REVISIT_FIRST`` calls and doubles up to ``REVISIT_MAX``, and is
        at least what keeps the re-check within ``EXPLORE_BUDGET`` of the calls between
        (at least ``SLOW_REVISIT_MIN`` for a path ``SLOW_RATIO`` times slower); it starts afresh
        when the choice changes. Only calls that reach the model count (not those under the
        settled-CPU floor, which take the fast path); with ``peek`` nothing is counted. Under
        :func:`rechecks_deferred` a re-check that is due or under way waits, and the calls
        meanwhile count for nothing but the ledger."""
        state = bucket.revisit
        other = "cpu" if choice.path == "gpu" else "gpu"
        if state is None or state.chosen != choice.path:
            first = self._interval(REVISIT_FIRST, bucket, choice.path, other)
            state = _Revisit(first, first, choice.path)
            if not peek:
                bucket.revisit = state
        counting = state.recheck_left == 0 and state.calls_left > 1
        if counting or _rechecks_deferred.get():
            if not peek:
                # Deferred: last_path stays the re-check's, so its next call is learned from
                # (in a pipeline, after some milliseconds of untimed items on the other path,
                # which may leave that call colder than a direct call's: towards the settled
                # path, the safe side).
                _count_settled(bucket, state, choice.path,
                               self._ledgers.get(key) or self._ledger(key), counting)
            return choice
        if state.recheck_left > 0:
            interval, call = state.interval, 2 * RECHECK_CALLS - state.recheck_left + 1
            if not peek:
                state.recheck_left -= 1
        else:
            interval = self._interval(min(2 * state.interval, REVISIT_MAX), bucket,
                                      choice.path, other)
            call = 1
            if not peek:
                state.calls_left = state.interval = interval
                state.recheck_left = 2 * RECHECK_CALLS - 1
        if call > RECHECK_CALLS:  # the re-check's second half: the chosen path, timed
            return Choice(choice.path, choice.reason, True)
        return Choice(other, f"adaptive: re-checking {other} {describe(signature, nbytes)}, "
                             f"call {call} of {RECHECK_CALLS} ({choice.path} chosen; next check "
                             f"in {interval} calls)")

    @staticmethod
    def _interval(calls: int, bucket: _Bucket, chosen: str, other: str) -> int:
        """Calls until the next re-check: ``calls``, or more where that keeps a re-check's
        extra time within ``EXPLORE_BUDGET`` of the chosen path's time over the interval."""
        # A path with no samples in the bucket counts at its predicted time: a GPU chosen
        # against a CPU predicted 40x slower from the function's other sizes would otherwise
        # run the CPU after REVISIT_FIRST calls (monte_carlo_pi(10**6): 2 x 15 ms against
        # 16 x 0.24 ms, H200, 2026-11-26).
        chosen_s, other_s = bucket.expected(chosen), bucket.expected(other)
        if not (0 < chosen_s < other_s < math.inf):
            return calls
        ratio = other_s / chosen_s
        budgeted = math.ceil(RECHECK_CALLS * (ratio - 1) / EXPLORE_BUDGET)
        if ratio >= SLOW_RATIO:
            budgeted = max(budgeted, SLOW_REVISIT_MIN)
        return max(calls, budgeted)

    def _fits_if_needed(self, key: str, signature: str, samples: dict[str, list[list[float]]]
                        ) -> dict[str, Callable[[float], float] | None] | None:
        """The fits, or None when both paths have samples in the bucket and no fit is read
        (fitting costs tens of microseconds; a settled bucket must not pay it)."""
        return None if samples["cpu"] and samples["gpu"] else self._fits(key, signature)

    def cpu_ceiling(self, key: str) -> int:
        """Bytes below which every size this function has been seen at is settled on the CPU
        (explored, and the CPU won): calls below it can skip the model. 0 when none is. A
        size of a signature with numbers among its arguments ends it: bytes do not tell that
        call's work (``f(10**4)`` settled on the CPU says nothing of ``f(10**7)``)."""
        ceiling = 0
        with self._lock:
            buckets = sorted((int(name.rsplit("|", 1)[1]), name.rsplit("|", 1)[0])
                             for name, samples in self._data["functions"].get(key, {}).items()
                             if samples["cpu"] or samples["gpu"])
            for bucket, sizes in itertools.groupby(buckets, key=lambda size: size[0]):
                for _, signature in sizes:  # every signature of the size, or none
                    if SCALARS in signature:
                        return ceiling
                    (path, *_), settled = self._bucket_choice(  # bucket 0: 0 and 1 byte
                        self._bucket((key, signature, bucket)), key, signature,
                        2**bucket if bucket else 0)
                    if path != "cpu" or not settled:
                        return ceiling
                ceiling = 2 ** (bucket + 1)
        return ceiling

    def seen_below(self, key: str, nbytes: int) -> bool:
        """Whether this function has samples at a size under ``nbytes`` (the floor): it made
        a heavy call there, so its small calls must reach the model."""
        limit = size_bucket(nbytes)
        with self._lock:
            return any(int(name.rsplit("|", 1)[1]) < limit
                       and (samples["cpu"] or samples["gpu"])
                       for name, samples in self._data["functions"].get(key, {}).items())

    def _choose(self, state: _Bucket, fits: dict[str, Callable[[float], float] | None] | None,
                signature: str, nbytes: int, ledger: _Ledger
                ) -> tuple[str, str, bool, dict[str, float]]:
        """(path, reason, settled: not exploring, and for a settled choice the time of each
        path measured in the bucket or predicted by the fits over the function's other sizes,
        a calibration's guess left out: empty while exploring); ``fits`` may be None only when
        both paths have samples (it is not read then)."""
        samples = state.samples
        where = describe(signature, nbytes)
        measured = {path: state.typical(path) if samples[path] else None for path in PATHS}
        fitted = fits or dict.fromkeys(PATHS)
        work = work_size(signature, nbytes)
        predicted = {path: measured[path] if measured[path] is not None
                     else (fitted[path](work) if fitted[path] is not None  # type: ignore[misc]
                           else self.calibration.predict(path, nbytes)) for path in PATHS}
        if measured["gpu"] is None:  # no fit can take the GPU below a launch and the upload
            predicted["gpu"] = max(predicted["gpu"], self.calibration.gpu_floor(nbytes))
        if all(measured[path] is None and fitted[path] is None for path in PATHS) \
                and predicted["cpu"] < FIRST_ON_CPU_S:
            # Nothing known of this function at this size, and bytes alone cannot tell a heavy
            # call from a light one: the first call runs as written, and its time decides
            # what is worth trying (the calibration's guess at it is cheap to be wrong about).
            return "cpu", f"adaptive: exploring cpu {where} (first call)", False, {}

        def clearly_worse(path: str) -> bool:
            other = "gpu" if path == "cpu" else "cpu"
            if path == "gpu" and measured["cpu"] is not None \
                    and measured["cpu"] < self.calibration.gpu_floor(nbytes):
                return True  # faster than a GPU launch plus the upload: the GPU cannot win
            known = measured[path] is not None or (fitted[path] is not None
                                               and fitted[other] is not None)
            if known and len(samples[path]) == 1 and measured[other] is None \
                    and measured[path] < FIRST_ON_CPU_S and nbytes >= ADAPTIVE_FLOOR:
                # One sample of a cheap call may be a stall (a 0.08 ms matmul once took
                # 5.7-8.8 ms, H100): against a mere guess at the other path it is tried again.
                # (Below the floor a call reaches the model only once the fast path has seen
                # it heavy twice, or 20 ms or more once.)
                known = False
            return known and predicted[path] > CLEARLY_WORSE * predicted[other]

        def affordable(path: str) -> bool:  # against a measured alternative
            other = "gpu" if path == "cpu" else "cpu"
            cost = predicted[path] - predicted[other]
            return cost <= 0 or measured[other] is None or ledger.allows(cost)

        # A path being explored is finished before the other starts, so each is sampled as it
        # runs once chosen: after itself.
        for path in sorted(PATHS, key=lambda p: (-len(samples[p]), predicted[p])):
            if len(samples[path]) < EXPLORE_TRIES and not clearly_worse(path) \
                    and affordable(path):
                return path, (f"adaptive: exploring {path} {where} "
                              f"({len(samples[path])} of {EXPLORE_TRIES} tries)"), False, {}
        path = min(PATHS, key=lambda p: predicted[p])
        count = len(samples["cpu"]) + len(samples["gpu"])
        origin = ", from profile" if state.from_profile else ""
        known = {name: seconds for name, seconds in predicted.items()
                 if measured[name] is not None or fitted[name] is not None}
        return path, (f"adaptive: gpu {_ms(predicted['gpu'])} vs cpu {_ms(predicted['cpu'])} "
                      f"{where} ({count} samples{origin})"), True, known

    def woke(self, key: str, signature: str, nbytes: int, path: str) -> None:
        """Note a call of ``path`` that is not learned from (a function's first GPU run): it
        woke its path, so the next call there is learned (not taken for the first after a
        switch)."""
        with self._lock:
            self._bucket((key, signature, size_bucket(nbytes))).last_path = path

    def observe(self, key: str, signature: str, nbytes: int, path: str, seconds: float) -> None:
        """Record one end-to-end time of ``path`` (not the first after a call on the other
        path: see the module docstring); writes the profile at most every
        ``SAVE_INTERVAL_S`` seconds (and on :meth:`save`)."""
        with self._lock:
            bucket = size_bucket(nbytes)
            state = self._bucket((key, signature, bucket))
            other_path = "gpu" if path == "cpu" else "cpu"
            other_time = state.typical(other_path)
            ledger = self._ledger(key)
            ledger.total += seconds
            if seconds > other_time:
                ledger.extra += seconds - other_time
            last, state.last_path = state.last_path, path
            if last is not None and last != path:  # the first call after a switch: waking up
                return
            if state.from_profile:
                state.from_profile = False
                state.choice = None
            kept = state.samples[path]
            before = state.typical(path)
            explored_before = len(kept) >= EXPLORE_TRIES <= len(state.samples[other_path])
            if not kept:
                self._complete.pop((key, signature), None)
            kept.append([seconds, nbytes])
            self._changed.add((key, bucket_name(signature, bucket)))
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
                self._fit_cache.pop((key, family(signature)), None)
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
                self._saved_at = time.monotonic()  # one background save per interval
        if due:  # off the calling thread: a save reads and writes the whole file
            try:
                threading.Thread(target=self.save, name="vedart-profile-save",
                                 daemon=True).start()
            except RuntimeError:  # no new threads (interpreter shutdown): save here
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
            self._calibration_changed = True

    def save(self) -> bool:
        """Write the profile file (no-op without one): what this process learned since its
        last save over what the file holds now (everything it knows where there is no valid
        file). Saves run one at a time. Whether the file holds it now: False without a file,
        or when writing it failed (warned, and tried again at the next save)."""
        if self._profile is None:
            return False
        with self._saving:
            with self._lock:
                if not self._unsaved:
                    return True
                self._unsaved = False
                self._saved_at = time.monotonic()
                changed, self._changed = self._changed, set()
                calibration_changed, self._calibration_changed = \
                    self._calibration_changed, False
                snapshot = {"calibration": self._data.get("calibration"),
                            "functions": {key: {name: {path: list(times)
                                                       for path, times in samples.items()}
                                                for name, samples in buckets.items()}
                                          for key, buckets in self._data["functions"].items()},
                            "used": dict(self._data.get("used", {}))}
                used_now = set(self._used)
            saved = False
            try:
                saved = self._profile.save(snapshot, changed, calibration_changed, used_now)
            finally:
                if not saved:  # failed (warned) or raised: tried again at the next save
                    with self._lock:
                        self._unsaved = True
                        self._changed |= changed
                        self._calibration_changed |= calibration_changed
            return saved
