"""Existing NumPy functions, decorated: matrix multiply, vector add, column normalisation.

    python examples/numpy_functions.py [--quick]

Each function is plain NumPy with @veda.gpu on top; each result is checked against the same
function run by NumPy, and the script prints where each call ran and why.
"""

import sys
import time

import numpy as np

import vedart as veda

QUICK = "--quick" in sys.argv
N = 512 if QUICK else 4096          # matrix side
ELEMENTS = 1 << (18 if QUICK else 25)


@veda.gpu
def matrix_multiply(A, B):
    return A @ B


@veda.gpu
def vector_add(a, b):
    return a + b


@veda.gpu
def normalise_columns(X):
    return (X - X.mean(axis=0)) / X.std(axis=0)


def timed(function, *args):
    """The function's result and its best time of three calls, after one warm-up call."""
    result = function(*args)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        result = function(*args)
        best = min(best, time.perf_counter() - start)
    return result, best


rng = np.random.default_rng()
A = rng.random((N, N), dtype=np.float32)
B = rng.random((N, N), dtype=np.float32)
a = rng.random(ELEMENTS)
b = rng.random(ELEMENTS)
X = rng.random((ELEMENTS // 64, 64))

for function, args, rtol in [(matrix_multiply, (A, B), 1e-4), (vector_add, (a, b), 1e-12),
                             (normalise_columns, (X,), 1e-9)]:
    result, vedart_s = timed(function, *args)
    expected, numpy_s = timed(function.__wrapped__, *args)
    assert type(result) is type(expected) and result.dtype == expected.dtype
    np.testing.assert_allclose(result, expected, rtol=rtol, atol=1e-6)
    decision = function.explain(*args)
    print(f"{function.__name__:18} {vedart_s * 1e3:8.2f} ms, NumPy {numpy_s * 1e3:8.2f} ms "
          f"({numpy_s / vedart_s:5.2f}x): {decision.path} ({decision.reason})")

veda.report()
print("all results match NumPy")
