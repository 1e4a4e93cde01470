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


class CUDADriverError(VedaError, RuntimeError):
    """A CUDA driver call vedart makes itself (the staging loop's copies to the device) failed;
    the message names the status as the driver does (``CUDA_ERROR_ILLEGAL_ADDRESS``), so a
    failure that loses the CUDA context is told apart as CuPy's and Numba's errors are."""


class DeviceError(VedaError, ValueError):
    """A device ordinal was named that the runtime does not have."""


class SchedulerUnavailableError(VedaError, ConnectionError):
    """The Dask scheduler named by ``Config.dask_address`` did not answer within
    ``Config.dask_timeout`` seconds; the message names the address and the timeout."""


class OffloadError(VedaError, RuntimeError):
    """A @gpu call failed on the GPU and ``fallback="raise"`` forbids re-running it on the CPU;
    the GPU's exception is the ``__cause__``."""


class OffloadWarning(RuntimeWarning):
    """A @gpu call fell back to the CPU after a GPU failure (issued once per function and kind
    of failure)."""


class ParIterError(VedaError, RuntimeError):
    """A par_iter pipeline could not deliver an item.

    ``index`` is the failing item's position in the pipeline's source (None when no single
    item is to blame, e.g. the scheduler was shut down); ``stage`` names the stage that raised,
    e.g. ``"#2 map(parse)"`` or ``"source"``. The original exception is the ``__cause__``.
    """

    def __init__(self, message: str, *, index: int | None = None,
                 stage: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.stage = stage


class KernelLaunchError(VedaError, ValueError):
    """A kernel launch was refused before any work started (bad launch configuration, wrong
    argument count, an output that is not an array, arrays on different devices, ...); the
    message names the kernel, the argument or setting, the value and what is allowed."""


class SimulatorWarning(RuntimeWarning):
    """A @gpu_kernel ran in Numba's CUDA simulator because no GPU is usable and it has no
    ``cpu=`` implementation (issued once per kernel): correct, but orders of magnitude slower."""
