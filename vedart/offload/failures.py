"""Telling GPU-specific failures from the user's own exceptions, and warning once about each.

Under ``fallback="cpu"`` every exception of a GPU attempt re-runs the call on the CPU; this
classification matters where no re-run happens (``fallback="raise"``, ``idempotent=False``):
a GPU-specific failure then raises ``OffloadError``, the user's own exception propagates as
it is.

GPU-specific: exceptions whose class is defined by CuPy (out of memory, CUDA driver/runtime
errors, cuBLAS/cuSOLVER errors, NVRTC compile errors); any exception raised inside CuPy's own
code or passed through it (``OverflowError`` for ``np.clip(uint8_array, -5, 5)``); ``TypeError`` /
``NotImplementedError`` / ``AttributeError`` raised by NumPy's dispatch when CuPy has no
implementation or refuses an implicit conversion; an ``AttributeError`` for an attribute a CuPy
object lacks (``ndarray.resize``); and CuPy's ``ValueError`` for a dtype it cannot hold (string
arrays); and vedart's own :class:`~vedart.errors.CUDADriverError` (a failed copy through the
staging loop). Everything else is the user's exception.
"""

from __future__ import annotations

import re
import threading
import traceback
import warnings

import numpy as np

from vedart._logging import logger
from vedart.errors import CUDADriverError, OffloadWarning
from vedart.locks import renew_in_child

_GPU_PACKAGES = ("cupy", "cupyx", "cupy_backends", "numba.cuda", "cuda.core", "cuda.bindings")
_GPU_PATH_PARTS = ("/cupy/", "/cupyx/", "/cupy_backends/")
_MISSING_IMPLEMENTATION_TEXT = (
    "no implementation found for",            # NumPy __array_function__ dispatch
    "returned NotImplemented from __array_ufunc__",  # a ufunc CuPy lacks (np.spacing)
    "Implicit conversion to a NumPy array",   # cupy.ndarray.__array__
    "Unsupported type <class 'numpy.",        # CuPy refusing a NumPy operand
)
_RAISED_BY_LIBRARY = (TypeError, NotImplementedError, AttributeError)
_UNSUPPORTED_DTYPE_TEXT = "Unsupported dtype "  # CuPy's ValueError for str and object arrays


def is_gpu_failure(error: BaseException) -> bool:
    """Whether ``error``, raised on the GPU path, is the GPU's fault rather than the user's."""
    if type(error).__module__.startswith(_GPU_PACKAGES) or isinstance(error, CUDADriverError):
        return True
    # Raised in or through CuPy's code (it may call NumPy, which raises); compiled CuPy code
    # names its frames by relative path ("cupy/_core/core.pyx").
    for frame in traceback.extract_tb(error.__traceback__):
        where = "/" + frame.filename.replace("\\", "/")
        if any(part in where for part in _GPU_PATH_PARTS):
            return True
    if isinstance(error, ValueError):
        return str(error).startswith(_UNSUPPORTED_DTYPE_TEXT)
    if not isinstance(error, _RAISED_BY_LIBRARY):
        return False
    # Raised in the user's own frame (``x.resize(...)``), but about a CuPy object.
    if isinstance(error, AttributeError) and type(error.obj).__module__.startswith(_GPU_PACKAGES):
        return True
    message = str(error)
    return any(text in message for text in _MISSING_IMPLEMENTATION_TEXT)


# By class name, for classes of the GPU packages: CuPy's three, Numba's driver error and
# cuda.core's (the two a kernel launch raises). vedart's own CUDADriverError (its driver calls)
# is matched by class.
_DEVICE_STATE_ERRORS = ("OutOfMemoryError", "CUDARuntimeError", "CUDADriverError",
                        "CudaAPIError", "CUDAError")


def depends_on_the_moment(error: BaseException) -> bool:
    """Whether ``error`` says more about the device's state (out of memory, a CUDA runtime or
    driver error: no driver, a lost device) than about the call's arguments: such a failure is
    not remembered for their signature (the adaptive model learns a failing device as slow)."""
    return isinstance(error, CUDADriverError) or \
        type(error).__name__ in _DEVICE_STATE_ERRORS and \
        type(error).__module__.startswith(_GPU_PACKAGES)


def depends_on_the_values(error: BaseException) -> bool:
    """Whether ``error`` is NumPy's ``LinAlgError``, raised by the device's linear algebra for
    the values it was given (a singular matrix; a matrix of NaN, for which CuPy's ``inv``
    raises where NumPy's returns NaN): the next call of the same signature may have other
    values, so such a failure is not remembered for it."""
    return isinstance(error, np.linalg.LinAlgError)


# CUDA errors after which no CUDA work of the process can succeed (the CUDA documentation says
# of each that the process must be terminated and relaunched to use CUDA again), by the name
# the messages carry: CuPy's and cuda.core's begin with it, Numba's end with it ("[700] Call
# to cuLaunchKernel results in CUDA_ERROR_ILLEGAL_ADDRESS").
_CONTEXT_LOST = frozenset({
    "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorLaunchTimeout",
    "cudaErrorIllegalInstruction", "cudaErrorMisalignedAddress", "cudaErrorInvalidAddressSpace",
    "cudaErrorInvalidPc", "cudaErrorHardwareStackError", "cudaErrorAssert",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT"})


_CUDA_ERROR_NAME = re.compile(r"\b(?:cudaError[A-Za-z]+|CUDA_ERROR_[A-Z_]+)\b")


def loses_context(error: BaseException) -> bool:
    """Whether ``error`` is a CUDA error that leaves the process's CUDA context unusable (an
    illegal memory access, a failed kernel launch, a device-side assert)."""
    return depends_on_the_moment(error) and \
        any(name in _CONTEXT_LOST for name in _CUDA_ERROR_NAME.findall(str(error)))


def failure_summary(error: BaseException) -> str:
    """A one-line description: the exception type and the first line of its message."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first_line}"[:200]


def lost_context_reason(error: BaseException, place: str) -> str:
    """Why the GPU is disabled after ``error``, which lost the CUDA context in ``place`` (a
    function or kernel name, with the helper it failed in, if any)."""
    return (f"{failure_summary(error)} (in {place}); the CUDA context is lost for this "
            "process: restart it to use the GPU")


class WarnOnce:
    """Warns (an :class:`OffloadWarning`, and on the ``vedart`` logger) the first time each
    (function, kind) is seen: a kind of failure is its exception's type name."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    def warn(self, function: str, kind: str, message: str) -> None:
        key = (function, kind)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        logger.warning(message)
        warnings.warn(message, OffloadWarning, stacklevel=4)
