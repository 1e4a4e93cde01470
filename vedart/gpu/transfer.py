"""Host <-> device transfers: the one code path every part of vedart moves arrays through.

``to_device`` copies a host ndarray to the current CuPy device (on the current stream);
``to_host`` copies a device array back into a NumPy ndarray. Both are byte-exact for every
dtype CuPy supports; non-native byte order is converted on the way in.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_device(array: np.ndarray) -> Any:
    """A CuPy copy of ``array`` on the current device. The caller's array is never modified."""
    import cupy

    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return cupy.asarray(array)


def to_host(array: Any) -> np.ndarray:
    """A NumPy copy of the CuPy array ``array`` (synchronous with the current stream)."""
    return array.get()
