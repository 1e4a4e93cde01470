"""The exceptions vedart raises.

Every vedart error derives from :class:`VedaError`, and each also derives from the
built-in exception a caller would naturally catch (``ValueError`` for bad values,
``RuntimeError`` for an unusable device), so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class VedaError(Exception):
    """Base class of every exception raised by vedart itself."""


class ConfigError(VedaError, ValueError):
    """A configuration or option value is invalid; the message names the field,
    the value given and what is allowed."""


class GPUUnavailableError(VedaError, RuntimeError):
    """A GPU was required but none is usable; the message carries the reason."""


class DeviceError(VedaError, ValueError):
    """A device ordinal was named that the runtime does not have."""


class OffloadError(VedaError, RuntimeError):
    """A @gpu call failed on the GPU and ``fallback="raise"`` forbids re-running it on the CPU;
    the GPU's exception is the ``__cause__``."""


class OffloadWarning(RuntimeWarning):
    """A @gpu call fell back to the CPU after a GPU failure (issued once per function and kind
    of failure)."""
