"""Device results to host types, as NumPy would have returned them.

CuPy arrays become NumPy arrays; 0-d CuPy arrays become the NumPy scalar NumPy returns for a
reduction (``x.sum()`` -> ``numpy.float64``); tuples, lists, dicts and namedtuples are rebuilt
around converted items; every other value is returned unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from vedart.gpu import transfer
from vedart.offload.arguments import map_arrays

# Results are walked deeper than arguments: functions return nested structures more often.
RESULT_DEPTH = 8


def results_to_host(value: Any, device_type: type) -> tuple[Any, int]:
    """``value`` with every ``device_type`` array converted as the module docstring says, and
    the bytes of the arrays converted (one walk over the result)."""
    moved = 0

    def convert(array: Any) -> Any:
        nonlocal moved
        moved += array.nbytes
        host = transfer.to_host(array)
        return host[()] if host.ndim == 0 else host

    return map_arrays(value, device_type, convert, RESULT_DEPTH), moved


def to_host(value: Any) -> Any:
    """Convert the CuPy arrays in ``value`` (e.g. from ``@gpu(returns="device")``) to host
    types as a @gpu call would; ``value`` is returned unchanged when CuPy is not loaded."""
    cupy = sys.modules.get("cupy")
    return value if cupy is None else results_to_host(value, cupy.ndarray)[0]
