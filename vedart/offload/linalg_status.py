"""The singular-matrix check of ``np.linalg.solve`` and ``inv`` of one matrix on the GPU path,
made with one read of cuSOLVER's status.

NumPy raises ``LinAlgError`` for a singular matrix to ``solve`` or ``inv``. CuPy raises only
when told to (``cupyx.errstate(linalg="raise")``), and then checks the status of the
factorisation (``getrf``) and of the solve (``getrs``) each with two kernels of its own and a
wait for the device. :func:`solve` and :func:`inv` run ``getrf`` and ``getrs`` as CuPy does
(``cupyx.lapack.gesv``), but read back ``getrf``'s status alone, 4 bytes in one wait: a
nonzero one is the zero pivot by which LAPACK tells NumPy that the matrix is singular, and
``getrs``'s status reports only arguments it rejects, which these are not. A singular matrix
then runs CuPy's checked function, which raises CuPy's ``LinAlgError`` as it did before, at
the same call, so a function that catches it sees it where NumPy raises it.

Reading the status only when the call lands was tried: code that loops on a singular matrix's
result (until it is small, until an iteration converges) then ran for ever where NumPy
raises (docs/performance.md).

Inputs ``getrf`` does not take here (a stack of matrices, a dtype other than float32, float64,
complex64 or complex128, an empty matrix, host arrays) go to CuPy's checked function.

Code of a GPU call that the substitution does not reach (``reach=False``, a helper that
assigns module globals, code past the reach bounds) calls ``np.linalg`` on device arrays
through NumPy's dispatch, which lands in CuPy's own functions: :func:`raise_errors_here` makes
them check for the length of the call, as NumPy does, where CuPy by default returns what
cuSOLVER left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy

_ROUTINE_TYPE = {"f": "s", "d": "d", "F": "c", "D": "z"}  # cuSOLVER's prefix per dtype char
_error_state: Any = None  # ``cupyx._ufunc_config`` once imported: CuPy's per-thread error modes


def raise_errors_here() -> tuple[Any, str]:
    """Make CuPy's linear algebra on this thread raise ``LinAlgError`` for what cuSOLVER
    reports (a singular matrix, a failed factorisation), as ``cupyx.errstate(linalg="raise")``
    does, whatever mode the caller set, and return CuPy's per-thread error modes and the mode
    replaced: ``modes.linalg = previous`` puts it back, a plain store, so that no function
    call (where an interrupt can be raised) comes between the call's end and the restore.
    The mode is the one ``cupyx.errstate`` sets, set directly: entering ``errstate`` took
    3 us, this 0.2 us (2026-11-27), on every GPU call. The first call imports ``cupyx``
    whole (0.2 s, SciPy's sparse matrices among it) unless the staging loop's loader has
    (:mod:`vedart.gpu.transfer` does so first, at ``init``)."""
    global _error_state
    if _error_state is None:
        import cupyx._ufunc_config

        _error_state = cupyx._ufunc_config
    modes = _error_state._config
    previous: str = getattr(modes, "linalg", "ignore")  # CuPy's default
    modes.linalg = "raise"
    return modes, previous


def raises_here() -> bool:
    """Whether CuPy's linear algebra on this thread raises what cuSOLVER reports already (in a
    GPU call, :func:`raise_errors_here` has made it so)."""
    modes = _error_state._config if _error_state is not None else None
    return getattr(modes, "linalg", None) == "raise"


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


def factor_and_solve(a: Any, b: Any) -> bool:
    """``cupyx.lapack.gesv(a, b)`` (``b`` overwritten by the solution of ``a x = b``, ``a`` by
    its LU factors) with one read of a status: False, ``b`` left as it was, when ``getrf``
    reports a zero pivot (or an argument it rejects). ``a``: square, F- or C-contiguous; ``b``:
    of one or two dimensions, F-contiguous, of ``a``'s dtype, which is float32, float64,
    complex64 or complex128. Waits for the device once."""
    import cupy
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas, cusolver

    if not (a.flags.f_contiguous or a.flags.c_contiguous) or not b.flags.f_contiguous:
        raise ValueError("factor_and_solve: a must be F- or C-contiguous and b F-contiguous")
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
    if status.get()[0] != 0:
        return False
    getattr(cusolver, routine + "getrs")(handle, operation, n, right_hand_sides, a.data.ptr, n,
                                         pivots.data.ptr, b.data.ptr, n, status.data.ptr)
    return True


def solve(raising: Callable[..., Any], a: Any, b: Any) -> Any:
    """``cupy.linalg.solve(a, b)`` checked with one read (see the module docstring);
    ``raising`` (CuPy's ``solve`` with its checks) for what ``getrf`` does not take here, and
    for a singular matrix, for which it raises."""
    if not _solves(a, b):
        return raising(a, b)
    dtype = numpy.result_type(a.dtype, b.dtype)
    # Copies, in the layout getrf and getrs take: the caller's arrays are not overwritten.
    factors, solution = a.astype(dtype, copy=True, order="F"), b.astype(dtype, copy=True, order="F")
    return solution if factor_and_solve(factors, solution) else raising(a, b)


def inv(raising: Callable[..., Any], a: Any) -> Any:
    """``cupy.linalg.inv(a)`` checked with one read (see the module docstring); ``raising``
    (CuPy's ``inv`` with its checks) for what ``getrf`` does not take here, and for a singular
    matrix, for which it raises."""
    import cupy

    if not _factors(a):
        return raising(a)
    order = "F" if a.flags.f_contiguous else "C"
    factors = a.astype(a.dtype, copy=True, order=order)
    inverse = cupy.eye(a.shape[0], dtype=a.dtype, order=order)
    # The transposes of C-contiguous arrays are F-contiguous: then solve a' x' = I.
    solved = factor_and_solve(factors, inverse) if order == "F" else \
        factor_and_solve(factors.T, inverse.T)
    return inverse if solved else raising(a)
