"""Whether a timed call imported modules: a one-time stall, not a measure of its work.

A function's first call often imports what it uses lazily (a SciPy submodule, a plugin,
``import`` inside the function), which can take tens or hundreds of milliseconds against
microseconds of work. The adaptive model must not take that time for the function's CPU time:
one such call made a light function heavy at once, and the GPU it then tried and chose (against
the stalled sample, at many times the CPU's real time) kept it for hundreds of calls, and kept
it in the profile for the next process.

Imports are counted per thread by a finder placed first on ``sys.meta_path`` when this module
is imported: Python asks the finders only for a module not loaded yet, and this one finds
nothing (the finders after it import the module as before), but counts the question for the
thread that asked. So imports by other threads (the staging loop's loader imports SciPy and
much of NumPy in the background during a GPU runtime's first seconds) are never taken for the
call's. A failed import counts too (it asks the finders every time): a function's timed calls
that imported are set aside ``SET_ASIDE_AT_MOST`` times, after which an import that recurs is
taken for part of its work.

Not counted: an import that waits for another thread importing the same module (Python asks
no finder then), an import a finder put before this one serves, and a module a lazy loader
runs on first use. Counted although nothing is imported: a probe through
``importlib.util.find_spec``.
"""

from __future__ import annotations

import _thread
import sys
from typing import Any

SET_ASIDE_AT_MOST = 2  # a function's timed calls that imported which are not learned


class _ImportCounter:
    """A finder that finds nothing and counts, per thread, the imports that reach it. It
    reads nothing from module globals, which are gone while the interpreter shuts down (an
    import then must still work)."""

    _thread_of_caller = staticmethod(_thread.get_ident)

    def __init__(self) -> None:
        self.by_thread: dict[int, int] = {}  # each key written by its own thread only

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        thread, counts = self._thread_of_caller(), self.by_thread
        counts[thread] = counts.get(thread, 0) + 1


def _installed() -> _ImportCounter:
    """The counter on ``sys.meta_path``, put first there once per process (a reload of this
    module finds the one already there)."""
    for finder in sys.meta_path:
        if type(finder).__qualname__ == _ImportCounter.__qualname__ and \
                type(finder).__module__ == __name__:
            return finder  # type: ignore[return-value]
    counter = _ImportCounter()
    sys.meta_path.insert(0, counter)
    return counter


_COUNTER = _installed()


def imports_so_far() -> int:
    """How many imports of modules not yet loaded this thread has made (failed ones too)."""
    return _COUNTER.by_thread.get(_COUNTER._thread_of_caller(), 0)


def imported_since(before: int) -> bool:
    """Whether this thread imported a module since :func:`imports_so_far` was ``before``."""
    return imports_so_far() > before
