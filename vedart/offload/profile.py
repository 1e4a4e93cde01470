"""The adaptive cost model's profile file: learned timings and the calibration, on disk.

One JSON file per machine (GPU name + CPU model), by default under the user's cache directory
(``$XDG_CACHE_HOME/vedart`` or ``~/.cache/vedart``). Writes are atomic (a temporary file
renamed over the old one), one process of the host at a time, and write what this process
learned over what the file holds then, so what other processes saved since stays. A file that
is unreadable, malformed anywhere, or written for another GPU or CPU is ignored with a
warning and replaced on the next save; a save that fails (an unwritable directory) warns once
and is tried again later.

The file keeps the day each function key last reached the cost model (``"used"``: key -> ISO
date), and a save drops the functions no process sharing the file has sent through the model
for more than ``KEEP_DAYS``: a key hashes the function's code, so every edit of a function
leaves its old key behind, and a file that only grew would make every process's start and
save slower. Each save marks the functions its process has sent through the model as used
that day, and writes back what it knows of them where another process dropped them
meanwhile.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from vedart._logging import logger
from vedart.config import finite_float

FORMAT_VERSION = 1
KEEP_DAYS = 90  # a function no process has used for this long is dropped at the next save
_BUCKET = re.compile(r"[0-9]+")  # a size bucket's number (ASCII digits: "2".isdigit() too)
# A signature's numbers: ";name~2^k,name~2^k" after its arrays, k at most three digits.
_SCALAR_PARTS = re.compile(r"[^;,~|]+~2\^[0-9]{1,3}(,[^;,~|]+~2\^[0-9]{1,3})*")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else the platform's processor text."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_profile_path(gpu_name: str | None) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vedart"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{gpu_name or 'cpu-only'}_{cpu_model()}").strip("-")
    return cache / f"profile-{slug[:120]}.json"


def _number(value: Any, positive: bool = False) -> bool:
    """Whether ``value`` is a :func:`~vedart.config.finite_float`, >= 0 (> 0 with
    ``positive``)."""
    try:
        number = finite_float(value)
    except (TypeError, ValueError):
        return False
    return number > 0 if positive else number >= 0


def _samples_problem(samples: Any) -> str | None:
    """What is wrong with one bucket's ``{"cpu": [[seconds, nbytes], ...], "gpu": [...]}``."""
    if not isinstance(samples, dict) or set(samples) != {"cpu", "gpu"}:
        return "a bucket is not {'cpu': [...], 'gpu': [...]}"
    for timings in samples.values():
        if not isinstance(timings, list) or not all(
                isinstance(sample, list) and len(sample) == 2 and all(map(_number, sample))
                for sample in timings):
            return "a sample is not [seconds, bytes] of numbers >= 0"
    return None


def _iso_day(value: Any) -> bool:
    """Whether ``value`` is a day as ``date.isoformat`` writes it."""
    try:
        return isinstance(value, str) and date.fromisoformat(value).isoformat() == value
    except ValueError:
        return False


def today() -> str:
    """This day, as the profile's ``"used"`` holds it."""
    return date.today().isoformat()


def _pruned(functions: dict[str, Any], used: dict[str, str], used_now: Collection[str]
            ) -> tuple[dict[str, Any], dict[str, str]]:
    """``functions`` without those last used more than ``KEEP_DAYS`` ago, and the day each
    kept one was last used: today for ``used_now``, for a key of no recorded day (written
    before days were kept) and for one of a day to come (a clock set wrong), else its day in
    ``used``."""
    this_day = date.today()
    now, oldest = this_day.isoformat(), (this_day - timedelta(days=KEEP_DAYS)).isoformat()
    days = {key: now if key in used_now else min(used.get(key, now), now)
            for key in functions}
    kept = {key: day for key, day in days.items() if day >= oldest}  # ISO days sort as dates
    return {key: functions[key] for key in kept}, kept


def profile_problem(data: Any, calibration_fields: frozenset[str]) -> str | None:
    """What makes ``data`` no profile of this format (None: nothing): the format, a calibration
    of ``calibration_fields`` with positive numbers, functions mapping keys to buckets named
    ``signature|int`` of valid samples, and days of last use as ISO dates (optional)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION or \
            not isinstance(data.get("functions"), dict):
        return "not a vedart profile of this format"
    calibration = data.get("calibration")
    if calibration is not None and not (
            isinstance(calibration, dict) and set(calibration) <= calibration_fields
            and all(_number(value, positive=True) for value in calibration.values())):
        return f"its calibration is not positive numbers of {sorted(calibration_fields)}"
    used = data.get("used", {})
    if not isinstance(used, dict) or not all(map(_iso_day, used.values())):
        return "its 'used' is not function keys mapped to ISO dates"
    for key, buckets in data["functions"].items():
        if not isinstance(buckets, dict):
            return f"function {key!r} has no buckets"
        for name, samples in buckets.items():
            signature, _, bucket = name.rpartition("|")
            if not signature or _BUCKET.fullmatch(bucket) is None:
                return f"function {key!r} has a bucket named {name!r}, not 'signature|int'"
            _, semicolon, scalars = signature.partition(";")
            if semicolon and _SCALAR_PARTS.fullmatch(scalars) is None:
                return (f"function {key!r} has a bucket named {name!r}, whose numbers are not "
                        f"'name~2^int,...'")
            problem = _samples_problem(samples)
            if problem is not None:
                return f"function {key!r}, bucket {name!r}: {problem}"
    return None


class ProfileFile:
    """Reads and atomically writes one profile: ``{"format", "gpu", "cpu", "calibration",
    "functions", "used"}``, whose calibration holds ``calibration_fields``."""

    def __init__(self, path: Path, gpu_name: str | None,
                 calibration_fields: frozenset[str]) -> None:
        self.path = path
        self.identity = {"gpu": gpu_name, "cpu": cpu_model()}
        self.calibration_fields = calibration_fields
        self.rejected = False  # the last load ignored an existing file
        self._save_failed = False  # a save failed (warned once)

    def load(self) -> dict[str, Any]:
        """The stored profile, or an empty one (with a warning when a file was rejected)."""
        empty: dict[str, Any] = {"format": FORMAT_VERSION, **self.identity, "calibration": None,
                                 "functions": {}}
        data, why = self._read()
        if why is not None:
            self._reject(why)
        return empty if data is None else data

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        """The file's profile for this machine (None when there is none), and why a file that
        exists is not one (None when it is, or when there is no file)."""
        if not self.path.exists():
            return None, None
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError) as error:
            return None, f"unreadable ({type(error).__name__}: {error})"
        problem = profile_problem(data, self.calibration_fields)
        if problem is not None:
            return None, problem
        if {key: data.get(key) for key in self.identity} != self.identity:
            return None, (f"written for {data.get('gpu')!r} / {data.get('cpu')!r}, not this "
                          f"machine's {self.identity['gpu']!r} / {self.identity['cpu']!r}")
        return data, None

    def _reject(self, why: str) -> None:
        self.rejected = True
        message = f"ignoring the cost-model profile {self.path}: {why}"
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def save(self, data: dict[str, Any], changed: set[tuple[str, str]],
             calibration_changed: bool, used_now: Collection[str] = ()) -> bool:
        """Write a profile atomically: the file's as it is now (another process may have saved
        since this one read it) with the buckets ``changed`` (``(key, name)``) and, when
        ``calibration_changed``, the calibration taken from ``data``; ``data`` whole where
        there is no valid file. The function keys ``used_now`` are marked used today, with the
        buckets of theirs in ``data`` that the file lacks, and functions unused for
        ``KEEP_DAYS`` are dropped. Processes of this host save one at a time (a lock file
        beside the profile, where ``fcntl`` exists). The identity fields are set from this
        machine. Whether it was written: a failure (an unwritable directory) warns the first
        time."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _held(self.path.with_name(self.path.name + ".lock")):
                stored, _ = self._read()
                if stored is None:
                    merged = data
                else:
                    functions = {key: dict(buckets)
                                 for key, buckets in stored["functions"].items()}
                    for key, name in changed:
                        functions.setdefault(key, {})[name] = data["functions"][key][name]
                    # A function in use keeps what this process knows of it, where another
                    # process has dropped it (unused there for KEEP_DAYS) since.
                    for key in used_now:
                        kept = functions.setdefault(key, {})
                        for name, samples in data["functions"].get(key, {}).items():
                            if samples["cpu"] or samples["gpu"]:
                                kept.setdefault(name, samples)
                    merged = {"calibration": data["calibration"] if calibration_changed
                              else stored.get("calibration"), "functions": functions,
                              "used": stored.get("used", {})}
                functions, used = _pruned(merged["functions"], merged.get("used", {}),
                                          used_now)
                self._write(json.dumps({**merged, "functions": functions, "used": used,
                                        "format": FORMAT_VERSION, **self.identity}))
        except OSError as error:
            if not self._save_failed:
                self._save_failed = True
                message = (f"cannot save the cost-model profile {self.path} ({error}); what "
                           "this process learns is kept in memory and saving is tried again "
                           "later (Config.profile_path sets another file)")
                logger.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            return False
        return True

    def _write(self, payload: str) -> None:
        """``payload`` to the profile's path through a temporary file renamed over it."""
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".profile-",
                                             suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as stream:
                stream.write(payload)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


@contextmanager
def _held(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock_path`` (made if missing) while the block runs,
    where it can be had; elsewhere (no ``fcntl``, a file system without locks such as some
    NFS mounts, a lock file of another user) the block runs unlocked, as saves did before."""
    try:
        import fcntl

        handle = open(lock_path, "a")  # noqa: SIM115  # closed below, after the block
    except (ImportError, OSError):
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
        except OSError:  # ENOLCK, EOPNOTSUPP: no locks on this file system
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
