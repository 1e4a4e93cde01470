"""Machine learning in plain NumPy, on the GPU where it pays.

    python examples/ml_numpy.py [--quick]

A small MLP trained with manual backpropagation and Adam on synthetic data; then conv2d by
im2col, 2x2 max-pooling and softmax cross-entropy on an image batch. Every step is checked
against NumPy running the same function, timed against it, and shown with where it ran and why.
"""

import sys
import time

import numpy as np

import vedart as veda

QUICK = "--quick" in sys.argv
SAMPLES, FEATURES, HIDDEN, CLASSES = (512, 64, 64, 10) if QUICK else (16384, 512, 1024, 10)
IMAGES, CHANNELS, SIDE, FILTERS = (4, 3, 16, 8) if QUICK else (64, 3, 64, 32)
STEPS = 20 if QUICK else 100


@veda.gpu
def mlp_loss_and_gradients(X, targets, W1, b1, W2, b2):
    """Forward and backward pass of a two-layer ReLU network."""
    hidden = np.maximum(X @ W1 + b1, 0)
    logits = hidden @ W2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    loss = -(targets * np.log(probabilities + 1e-12)).sum(axis=1).mean()
    d_logits = (probabilities - targets) / len(X)
    d_hidden = (d_logits @ W2.T) * (hidden > 0)
    return loss, (X.T @ d_hidden, d_hidden.sum(axis=0), hidden.T @ d_logits, d_logits.sum(axis=0))


@veda.gpu
def adam_step(param, grad, m, v, t, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


@veda.gpu
def conv2d(images, kernels):
    """Valid 2-D convolution (cross-correlation) by im2col: (N, C, H, W) x (F, C, k, k)."""
    n, c, h, w = images.shape
    f, _, k, _ = kernels.shape
    out_h, out_w = h - k + 1, w - k + 1
    patches = np.stack([images[:, :, i:i + out_h, j:j + out_w]
                        for i in range(k) for j in range(k)], axis=2)
    columns = patches.reshape(n, c * k * k, out_h * out_w)
    return (kernels.reshape(f, c * k * k) @ columns).reshape(n, f, out_h, out_w)


@veda.gpu
def max_pool_2x2(x):
    n, c, h, w = x.shape
    return x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


@veda.gpu
def classify_loss(features, weights, targets):
    logits = features.reshape(len(features), -1) @ weights
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -(targets * log_probabilities).sum(axis=1).mean()


def check_and_time(label, function, *args, rtol=2e-3):
    """Run `function` through vedart and as plain NumPy; compare, time, and say where it ran."""
    def best_of(run):
        result, best = run(*args), float("inf")
        for _ in range(3):
            start = time.perf_counter()
            result = run(*args)
            best = min(best, time.perf_counter() - start)
        return result, best

    result, vedart_s = best_of(function)
    expected, numpy_s = best_of(function.__wrapped__)
    for got, want in zip(_flat(result), _flat(expected), strict=True):
        assert type(got) is type(want) and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)
    decision = function.explain(*args)
    print(f"{label:26} {vedart_s * 1e3:8.2f} ms, NumPy {numpy_s * 1e3:8.2f} ms "
          f"({numpy_s / vedart_s:5.2f}x): {decision.path} ({decision.reason})")
    return result


def _flat(value):
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


rng = np.random.default_rng()
f32 = np.float32

# Synthetic classification: the class is the argmax of a fixed random projection.
X = rng.standard_normal((SAMPLES, FEATURES)).astype(f32)
targets = np.eye(CLASSES, dtype=f32)[(X @ rng.standard_normal((FEATURES, CLASSES))).argmax(1)]
params = [(rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(f32),
          np.zeros(HIDDEN, f32),
          (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(f32),
          np.zeros(CLASSES, f32)]
moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]

print("step timings, vedart against NumPy:")
check_and_time("MLP forward + backward", mlp_loss_and_gradients, X, targets, *params)
check_and_time("Adam step (W1)", adam_step, params[0], params[0] * f32(0.01), *moments[0], 1)

first_loss = None
for step in range(1, STEPS + 1):
    loss, grads = mlp_loss_and_gradients(X, targets, *params)
    first_loss = loss if first_loss is None else first_loss
    for index, grad in enumerate(grads):
        params[index], m, v = adam_step(params[index], grad, *moments[index], step)
        moments[index] = (m, v)
print(f"MLP: loss {first_loss:.3f} -> {loss:.3f} in {STEPS} Adam steps")
assert loss < first_loss * 0.8

images = rng.standard_normal((IMAGES, CHANNELS, SIDE, SIDE)).astype(f32)
kernels = rng.standard_normal((FILTERS, CHANNELS, 3, 3)).astype(f32)
features = check_and_time("conv2d (im2col)", conv2d, images, kernels)
pooled = check_and_time("max-pool 2x2", max_pool_2x2, features)
image_targets = np.eye(CLASSES, dtype=f32)[rng.integers(0, CLASSES, IMAGES)]
weights = (rng.standard_normal((pooled[0].size, CLASSES)) * 0.01).astype(f32)
check_and_time("softmax cross-entropy", classify_loss, pooled, weights, image_targets)

# conv2d against a direct loop over output positions, on a corner of the batch.
direct = np.einsum("nchw,fchw->nf", images[:2, :, :3, :3], kernels)
np.testing.assert_allclose(features[:2, :, 0, 0], direct, rtol=1e-4, atol=1e-4)

veda.report()
print("all results match NumPy")
