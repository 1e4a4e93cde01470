"""Byte sizes: parsing ``"4MB"``-style strings and formatting byte counts for people.

Units are decimal (``1 MB = 1_000_000`` bytes, as in the seed's 1 MB offload rule);
binary units are spelled ``KiB``, ``MiB``, ``GiB``, ``TiB``.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_UNIT_BYTES: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")
ALLOWED_SIZE_TEXT = "a byte count (int >= 0) or a size string such as '512KB', '4MB', '1.5GiB'"


def parse_size(text: str) -> int:
    """Return the byte count that ``text`` (e.g. ``"4MB"``, ``"1.5 GiB"``, ``"1024"``) names.

    A fraction of a byte is dropped. Raises ``ValueError`` for anything else (unknown unit,
    negative number, empty string).
    """
    match = _SIZE_PATTERN.match(text)
    if match is None or match.group(2).lower() not in _UNIT_BYTES:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    return int(Fraction(number) * _UNIT_BYTES[unit.lower()])  # exact: "2.01MB" is 2_010_000


def format_bytes(count: float) -> str:
    """Format a byte count with a decimal unit and one decimal: ``12.0 KB``, ``3.2 GB``."""
    if type(count) is int:  # decisions format the same int sizes call after call
        return _format_int_bytes(count)
    return _format_bytes(count)


@functools.lru_cache(maxsize=4096)
def _format_int_bytes(count: int) -> str:
    return _format_bytes(count)


def _format_bytes(count: float) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"
