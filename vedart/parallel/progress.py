"""Progress display for par_iter terminals: a tqdm bar counting items when tqdm is installed
(``pip install vedart[progress]``), else a plain counter line on stderr."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

PLAIN_INTERVAL_SECONDS = 0.5


class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class PlainProgress:
    """Rewrites one stderr line, ``par_iter: 1200/5000 items``, at most every
    PLAIN_INTERVAL_SECONDS, and ends it on close."""

    def __init__(self, total: int | None, stream: TextIO | None = None) -> None:
        self._total = total
        self._stream = sys.stderr if stream is None else stream
        self._count = 0
        self._shown_at = 0.0

    def update(self, n: int) -> None:
        self._count += n
        now = time.monotonic()
        if now - self._shown_at >= PLAIN_INTERVAL_SECONDS:
            self._shown_at = now
            self._show("")

    def close(self) -> None:
        self._show("\n")

    def _show(self, end: str) -> None:
        total = "" if self._total is None else f"/{self._total}"
        self._stream.write(f"\rpar_iter: {self._count}{total} items{end}")
        self._stream.flush()


class NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def open_progress(enabled: bool, total: int | None) -> Progress:
    """A progress display counting items towards ``total`` (None: unknown)."""
    if not enabled:
        return NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return PlainProgress(total)
    bar: Progress = tqdm(total=total, unit="item", desc="par_iter")
    return bar
