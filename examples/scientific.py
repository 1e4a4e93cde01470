"""Scientific computing: Monte Carlo pi, an all-pairs n-body step, an FFT-based convolution.

    python examples/scientific.py [--quick]

No `force=` anywhere: where each call runs is the cost model's choice, and the script prints
it with the reason. Each result is checked against NumPy.
"""

import sys
import time

import numpy as np

import vedart as veda

QUICK = "--quick" in sys.argv
SAMPLES = 1_000_000 if QUICK else 20_000_000
BODIES = 300 if QUICK else 4000
SIGNAL = 1 << (14 if QUICK else 22)


@veda.gpu
def monte_carlo_pi(n_samples):
    import numpy as np

    x = np.random.random(n_samples)
    y = np.random.random(n_samples)
    inside = (x ** 2 + y ** 2) <= 1.0
    return 4.0 * inside.sum() / n_samples


@veda.gpu
def nbody_step(positions, velocities, masses, dt=1e-3, softening=1e-2):
    """One leapfrog step of `len(positions)` bodies under their mutual gravity (G = 1)."""
    offsets = positions[np.newaxis, :, :] - positions[:, np.newaxis, :]
    distance2 = (offsets ** 2).sum(axis=2) + softening ** 2
    weights = masses[np.newaxis, :] * distance2 ** -1.5
    accelerations = (offsets * weights[:, :, np.newaxis]).sum(axis=1)
    velocities = velocities + dt * accelerations
    return positions + dt * velocities, velocities


@veda.gpu
def fft_convolve(signal, kernel):
    """The full linear convolution of `signal` and `kernel`, through the FFT."""
    size = len(signal) + len(kernel) - 1
    padded = 1 << (size - 1).bit_length()
    spectrum = np.fft.rfft(signal, padded) * np.fft.rfft(kernel, padded)
    return np.fft.irfft(spectrum, padded)[:size]


def report(label, function, *args):
    decision = function.explain(*args)
    print(f"{label:30} {decision.path} ({decision.reason})")


rng = np.random.default_rng()

for _ in range(3):                  # the adaptive model times its choices over a few calls
    start = time.perf_counter()
    pi = monte_carlo_pi(SAMPLES)
    print(f"pi ~ {pi:.5f} from {SAMPLES:,} samples in {(time.perf_counter() - start) * 1e3:.1f} ms")
assert isinstance(pi, np.float64) and abs(pi - np.pi) < 0.01
report("monte_carlo_pi", monte_carlo_pi, SAMPLES)

positions = rng.standard_normal((BODIES, 3))
velocities = rng.standard_normal((BODIES, 3)) * 0.1
masses = rng.random(BODIES) / BODIES
new_positions, new_velocities = nbody_step(positions, velocities, masses)
expected_positions, expected_velocities = nbody_step.__wrapped__(positions, velocities, masses)
np.testing.assert_allclose(new_positions, expected_positions, rtol=1e-9, atol=1e-12)
np.testing.assert_allclose(new_velocities, expected_velocities, rtol=1e-9, atol=1e-12)
report(f"nbody_step ({BODIES} bodies)", nbody_step, positions, velocities, masses)

signal = rng.standard_normal(SIGNAL)
kernel = rng.standard_normal(257)
convolved = fft_convolve(signal, kernel)
np.testing.assert_allclose(convolved, np.convolve(signal, kernel), atol=1e-8)
report(f"fft_convolve ({SIGNAL:,} samples)", fft_convolve, signal, kernel)

veda.report()
print("all results match NumPy")
