"""The seed GPU guide's @veda.gpu snippets, runnable with or without a GPU.

Run: python examples/seed_gpu_guide.py   (then read the table veda.report() prints)
"""

import numpy as np

import vedart as veda

veda.init(veda.Config.builder().gpu(True).build())


@veda.gpu
def matrix_multiply(A, B):
    """Automatically uses GPU if beneficial."""
    return A @ B


@veda.gpu
def train_step(X, y, weights):
    predictions = X @ weights
    loss = ((predictions - y) ** 2).mean()
    grad = 2 * X.T @ (predictions - y) / len(y)
    return loss, grad


@veda.gpu(force="gpu")  # no array argument: force it, or it stays below the threshold
def monte_carlo_pi(n_samples):
    import numpy as np

    x = np.random.random(n_samples)
    y = np.random.random(n_samples)
    inside = (x**2 + y**2) <= 1.0
    return 4.0 * inside.sum() / n_samples


@veda.gpu
def apply_filter(image, kernel):
    from scipy.ndimage import convolve

    return convolve(image, kernel)


rng = np.random.default_rng()
matrix_multiply(rng.random((10, 10)), rng.random((10, 10)))          # small: CPU
matrix_multiply(rng.random((2000, 2000)), rng.random((2000, 2000)))  # large: GPU if present
loss, grad = train_step(rng.random((20000, 100)), rng.random(20000), rng.random(100))
print(f"loss {loss:.4f} ({type(loss).__name__}), pi ~ {monte_carlo_pi(10_000_000):.4f}")
try:
    apply_filter(rng.random((1024, 1024)).astype(np.float32), np.ones((5, 5), np.float32) / 25)
except ImportError:
    print("scipy is not installed: apply_filter skipped")
veda.report()
