"""The adaptive cost model's profile file: learned timings and the calibration, on disk.

One JSON file per machine (GPU name + CPU model), by default under the user's cache directory
(``$XDG_CACHE_HOME/vedart`` or ``~/.cache/vedart``). Writes are atomic (a temporary file
renamed over the old one). A file that is unreadable, malformed, or written for another GPU or
CPU is ignored with a warning and replaced on the next save.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

from vedart._logging import logger

FORMAT_VERSION = 1


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


class ProfileFile:
    """Reads and atomically writes one profile: ``{"format", "gpu", "cpu", "calibration",
    "functions"}``."""

    def __init__(self, path: Path, gpu_name: str | None) -> None:
        self.path = path
        self.identity = {"gpu": gpu_name, "cpu": cpu_model()}
        self.rejected = False  # the last load ignored an existing file

    def load(self) -> dict[str, Any]:
        """The stored profile, or an empty one (with a warning when a file was rejected)."""
        empty: dict[str, Any] = {"format": FORMAT_VERSION, **self.identity, "calibration": None,
                                 "functions": {}}
        if not self.path.exists():
            return empty
        try:
            data = json.loads(self.path.read_text())
            valid = (isinstance(data, dict) and data.get("format") == FORMAT_VERSION
                     and isinstance(data.get("functions"), dict))
        except (OSError, ValueError) as error:
            self._reject(f"unreadable ({error})")
            return empty
        if not valid:
            self._reject("not a vedart profile of this format")
            return empty
        if {key: data.get(key) for key in self.identity} != self.identity:
            self._reject(f"written for {data.get('gpu')!r} / {data.get('cpu')!r}, "
                         f"not this machine's {self.identity['gpu']!r} / {self.identity['cpu']!r}")
            return empty
        return data

    def _reject(self, why: str) -> None:
        self.rejected = True
        message = f"ignoring the cost-model profile {self.path}: {why}"
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def save(self, data: dict[str, Any]) -> None:
        """Write ``data`` atomically; the identity fields are set from this machine."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({**data, "format": FORMAT_VERSION, **self.identity})
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".profile-",
                                             suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as stream:
                stream.write(payload)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
