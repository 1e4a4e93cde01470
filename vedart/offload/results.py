"""Device results to host types, as NumPy would have returned them.

CuPy arrays become NumPy arrays; 0-d CuPy arrays become the NumPy scalar NumPy returns for a
reduction (``x.sum()`` -> ``numpy.float64``); tuples, lists, dicts and namedtuples are rebuilt
around converted items; every other value is returned unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from vedart.gpu import transfer
from vedart.offload.arguments import iter_arrays, map_arrays

# Results are walked deeper than arguments: functions return nested structures more often.
RESULT_DEPTH = 8


def device_array_to_host(array: Any) -> Any:
    host = transfer.to_host(array)
    return host[()] if host.ndim == 0 else host


def results_to_host(value: Any, device_type: type) -> Any:
    """``value`` with every ``device_type`` array converted as the module docstring says."""
    return map_arrays(value, device_type, device_array_to_host, RESULT_DEPTH)


def result_bytes(value: Any, array_type: type) -> int:
    """Bytes of the ``array_type`` arrays in a result."""
    return sum(array.nbytes for array in iter_arrays(value, array_type, RESULT_DEPTH))


def to_host(value: Any) -> Any:
    """Convert the CuPy arrays in ``value`` (e.g. from ``@gpu(returns="device")``) to host
    types as a @gpu call would; ``value`` is returned unchanged when CuPy is not loaded."""
    cupy = sys.modules.get("cupy")
    return value if cupy is None else results_to_host(value, cupy.ndarray)
