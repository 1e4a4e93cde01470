"""The singular-matrix checks of ``np.linalg.solve`` and ``inv`` on the GPU path, made when the
call lands instead of inside it.

NumPy raises ``LinAlgError`` for a singular matrix to ``solve`` or ``inv``. CuPy raises only
when told to (``cupyx.errstate(linalg="raise")``), and then reads back cuSOLVER's status of the
factorisation and of the solve as each ends: two waits for the device in every call, each after
two kernels of its own, where CuPy's default makes none. In a call that may run again
(``@gpu(idempotent=True)``, the default), the device :func:`solve` and :func:`inv` of one
matrix run cuSOLVER's ``getrf`` and ``getrs`` as CuPy does, and keep ``getrf``'s status on the
device in the list the launch sets in :data:`pending_statuses`. Landing reads them in the one
wait for the device it makes anyway (:func:`any_failed`). A nonzero status is ``getrf``
finding a zero pivot, which is how LAPACK reports to NumPy the singular matrix it raises for:
the attempt's result cannot stand, landing raises :class:`StatusCheckFailed`, and the call is
attempted again with CuPy's own checks, which raise where NumPy raises (and the call then
re-runs on the CPU, or raises, as any GPU failure does). A function that makes many solves
has its statuses read every :data:`CHECK_EVERY` of them too (:func:`keep`), so that a loop
does not run on past a singular matrix.

Without a list (a call that must not run twice, the attempt again, a stack of matrices, a
dtype other than float32, float64, complex64 or complex128, an empty matrix) CuPy's function
runs with its checks, as it did before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import numpy

# The statuses of the current launch on this thread, or None: CuPy's checks run at once. Set by
# the launch around its device function (``token = pending_statuses.set([])``, then reset).
pending_statuses: ContextVar[list[Any] | None] = ContextVar("vedart_pending_statuses",
                                                            default=None)

# Kept statuses are read, a wait for the device, once this many have been kept: a loop of
# solves does not run on for long past a singular matrix, as one whose condition is a NaN
# result's comparison might for ever, where NumPy raises.
CHECK_EVERY = 16

_ROUTINE_TYPE = {"f": "s", "d": "d", "F": "c", "D": "z"}  # cuSOLVER's prefix per dtype char


class StatusCheckFailed(Exception):
    """A status kept on the device was nonzero: the call's attempt is to be made again with
    CuPy's checks (see the module docstring)."""


def _factors(a: Any) -> bool:
    """Whether ``a`` is one non-empty square device matrix of a dtype cuSOLVER's ``getrf``
    takes."""
    import cupy

    return isinstance(a, cupy.ndarray) and a.ndim == 2 and a.shape[0] == a.shape[1] and \
        a.size > 0 and a.dtype.char in _ROUTINE_TYPE


def _solves(a: Any, b: Any) -> bool:
    """Whether :func:`factor_and_solve` takes ``a`` and ``b`` (copied to one dtype)."""
    import cupy

    return _factors(a) and isinstance(b, cupy.ndarray) and b.ndim in (1, 2) and \
        b.shape[0] == a.shape[0] and b.size > 0 and b.dtype.char in _ROUTINE_TYPE


def factor_and_solve(a: Any, b: Any, statuses: list[Any]) -> None:
    """``cupyx.lapack.gesv(a, b)`` (``b`` overwritten by the solution of ``a x = b``, ``a`` by its
    LU factors) with ``getrf``'s status appended to ``statuses`` instead of read: ``a`` square,
    F- or C-contiguous, ``b`` of one or two dimensions, F-contiguous, of ``a``'s dtype, which
    is float32, float64, complex64 or complex128."""
    import cupy
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas, cusolver

    routine = _ROUTINE_TYPE[a.dtype.char]
    n = a.shape[0]
    right_hand_sides = b.shape[1] if b.ndim == 2 else 1
    # A C-contiguous matrix read by columns is its transpose.
    operation = cublas.CUBLAS_OP_N if a.flags.f_contiguous else cublas.CUBLAS_OP_T
    handle = device.get_cusolver_handle()
    pivots = cupy.empty(n, dtype=numpy.int32)
    status = cupy.empty(1, dtype=numpy.int32)
    work = cupy.empty(getattr(cusolver, routine + "getrf_bufferSize")(handle, n, n, a.data.ptr, n),
                      dtype=a.dtype)
    getattr(cusolver, routine + "getrf")(handle, n, n, a.data.ptr, n, work.data.ptr,
                                         pivots.data.ptr, status.data.ptr)
    keep(statuses, status)
    # getrs reports only arguments it rejects, which these are not; its status goes elsewhere so
    # that getrf's is not overwritten.
    getattr(cusolver, routine + "getrs")(handle, operation, n, right_hand_sides, a.data.ptr, n,
                                         pivots.data.ptr, b.data.ptr, n,
                                         cupy.empty(1, dtype=numpy.int32).data.ptr)


def keep(statuses: list[Any], status: Any) -> None:
    """Append ``status`` (a device array of int32) to ``statuses``. Once there are
    :data:`CHECK_EVERY`, read them on the current stream: all zero, they are dropped; else one
    array holding the failure stays, and NumPy's ``LinAlgError`` is raised into the function
    (which may catch it: the attempt is made again when it lands, whatever it does)."""
    statuses.append(status)
    if len(statuses) < CHECK_EVERY:
        return
    together = _together(statuses)
    if not together.get().any():
        statuses.clear()
        return
    statuses[:] = [together]
    raise numpy.linalg.LinAlgError("Singular matrix")


def solve(raising: Callable[..., Any], a: Any, b: Any) -> Any:
    """``cupy.linalg.solve(a, b)`` with its singular-matrix check kept for landing (see the
    module docstring); ``raising`` (CuPy's ``solve`` with its checks) where none is kept."""
    statuses = pending_statuses.get()
    if statuses is None or not _solves(a, b):
        return raising(a, b)
    dtype = numpy.result_type(a.dtype, b.dtype)
    # Copies, in the layout getrf and getrs take: the caller's arrays are not overwritten.
    factors, solution = a.astype(dtype, copy=True, order="F"), b.astype(dtype, copy=True, order="F")
    factor_and_solve(factors, solution, statuses)
    return solution


def inv(raising: Callable[..., Any], a: Any) -> Any:
    """``cupy.linalg.inv(a)`` with its singular-matrix check kept for landing (see the module
    docstring); ``raising`` (CuPy's ``inv`` with its checks) where none is kept."""
    import cupy

    statuses = pending_statuses.get()
    if statuses is None or not _factors(a):
        return raising(a)
    order = "F" if a.flags.f_contiguous else "C"
    factors = a.astype(a.dtype, copy=True, order=order)
    inverse = cupy.eye(a.shape[0], dtype=a.dtype, order=order)
    if order == "F":
        factor_and_solve(factors, inverse, statuses)
    else:  # the transposes of C-contiguous arrays are F-contiguous: solve a' x' = I
        factor_and_solve(factors.T, inverse.T, statuses)
    return inverse


def _together(statuses: list[Any]) -> Any:
    """``statuses`` in one device array."""
    import cupy

    return statuses[0] if len(statuses) == 1 else cupy.concatenate(statuses)


def any_failed(statuses: list[Any], stream: Any) -> bool:
    """Whether any of ``statuses`` (device arrays, from :func:`factor_and_solve`) is nonzero:
    they are read back on ``stream``, the launch's, which waits for its work."""
    return bool(_together(statuses).get(stream=stream).any())
