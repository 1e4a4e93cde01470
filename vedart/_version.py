"""vedart's version, and the installed versions of its dependencies."""

from __future__ import annotations

import platform
from importlib import metadata

__version__ = "0.1.0"

# Distribution names to try for each component; the first one installed is reported.
COMPONENT_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "cupy": ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"),
    "numba": ("numba",),
    "numba-cuda": ("numba-cuda",),
    "pynvml": ("nvidia-ml-py", "pynvml"),
}


def component_versions() -> dict[str, str | None]:
    """Installed versions of vedart's dependencies, read from package metadata (nothing is
    imported, so no CUDA state is created)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for component, distributions in COMPONENT_DISTRIBUTIONS.items():
        versions[component] = None
        for distribution in distributions:
            try:
                versions[component] = metadata.version(distribution)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions
