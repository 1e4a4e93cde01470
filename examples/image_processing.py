"""Image processing with scipy.ndimage imported inside the function.

    python examples/image_processing.py [--quick]

On the GPU path vedart runs the function with `scipy.ndimage` replaced by
`cupyx.scipy.ndimage`; without a GPU, SciPy runs as written. A batch of images goes through
`par_iter(...).gpu_map(...)`; every result is checked against SciPy on the CPU.
"""

import sys

import numpy as np
from scipy import ndimage

import vedart as veda

QUICK = "--quick" in sys.argv
IMAGES, SIDE = (4, 128) if QUICK else (32, 2048)


SIGMA = 2.0


@veda.gpu
def edges(image):
    """Gradient magnitude of the image smoothed by a Gaussian of width SIGMA."""
    from scipy import ndimage

    smooth = ndimage.gaussian_filter(image, SIGMA)
    return np.hypot(ndimage.sobel(smooth, axis=0), ndimage.sobel(smooth, axis=1))


@veda.gpu
def box_blur(image, kernel):
    from scipy.ndimage import convolve

    return convolve(image, kernel, mode="reflect")


rng = np.random.default_rng()
images = [rng.random((SIDE, SIDE), dtype=np.float32) for _ in range(IMAGES)]
kernel = np.full((5, 5), 1 / 25, dtype=np.float32)

outlines = veda.par_iter(images).gpu_map(edges).collect()
blurred = veda.par_iter(images).gpu_map(lambda image: box_blur(image, kernel)).collect()

for image, outline, blur in zip(images, outlines, blurred):
    smooth = ndimage.gaussian_filter(image, SIGMA)
    expected = np.hypot(ndimage.sobel(smooth, axis=0), ndimage.sobel(smooth, axis=1))
    assert outline.dtype == expected.dtype == np.float32
    np.testing.assert_allclose(outline, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(blur, ndimage.convolve(image, kernel, mode="reflect"),
                               rtol=1e-4, atol=1e-6)

for name, function, args in [("edges", edges, (images[0],)),
                             ("box_blur", box_blur, (images[0], kernel))]:
    decision = function.explain(*args)
    print(f"{name:9} on {SIDE}x{SIDE}: {decision.path} ({decision.reason})")
print("items by path:", veda.get_runtime().telemetry.placement_counts() or "no GPU stage ran")
veda.report()
print("all results match NumPy")
