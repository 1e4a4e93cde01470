"""Whether a timed call imported modules: a one-time stall, not a measure of its work.

A function's first call often imports what it uses lazily (a SciPy submodule, a plugin,
``import`` inside the function), which can take tens or hundreds of milliseconds against
microseconds of work. The adaptive model must not take that time for the function's CPU time:
one such call made a light function heavy at once, and the GPU it then tried and chose (against
the stalled sample, at many times the CPU's real time) kept it for hundreds of calls.

A call imported modules when ``sys.modules`` gained names during it (a dict keeps insertion
order, so the names added are the ones after the count taken before the call). Names other
threads may add meanwhile are not counted: the standard library's, and the packages vedart's
own threads import (the staging loop's loader, the GPU context's); while the staging loop is
loading nothing is counted, since its loader imports a package's dependencies as well.
"""

from __future__ import annotations

import sys

from vedart.gpu.transfer import current_engine

# Top-level packages vedart's own threads import while the caller's code runs.
BACKGROUND_PACKAGES = frozenset({"vedart", "cupy", "cupyx", "cupy_backends", "fastrlock",
                                 "numba", "llvmlite", "cuda", "nvidia", "pynvml"})
_NOT_THE_CALLS = BACKGROUND_PACKAGES | sys.stdlib_module_names


def modules_loaded() -> int:
    """How many modules are loaded now: what :func:`imported_since` takes before a call."""
    return len(sys.modules)


def imported_since(loaded_before: int, seconds: float) -> bool:
    """Whether a call that began when :func:`modules_loaded` was ``loaded_before`` and took
    ``seconds`` imported a module of its own (see the module doc: modules of the standard
    library, of vedart's background packages, or any while the staging loop loads, are not
    taken for the call's)."""
    if len(sys.modules) <= loaded_before:
        return False
    engine = current_engine()
    if engine is not None and engine.loop.loading_within(seconds):
        return False
    added = list(sys.modules)[loaded_before:]  # a copy: another thread may be importing
    return any(name.partition(".")[0] not in _NOT_THE_CALLS for name in added)
