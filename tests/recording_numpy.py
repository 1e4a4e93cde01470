"""A stand-in "device package" for substitution tests: records the calls routed to it."""

from __future__ import annotations

import threading
from typing import Any

import numpy

calls: list[tuple[str, int]] = []
_lock = threading.Lock()


def zeros(*args: Any, **kwargs: Any) -> numpy.ndarray:
    with _lock:
        calls.append(("zeros", threading.get_ident()))
    return numpy.zeros(*args, **kwargs)


pi = numpy.pi
