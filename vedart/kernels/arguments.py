"""The arguments of one @gpu_kernel call: validated before any work, moved to the device, and
the outputs copied back into the caller's arrays.

Rules:
* Kernel arguments are positional; their count must match the kernel's parameters.
* NumPy arrays (``np.ndarray`` itself, dtype bool, int, uint, float or complex) are copied to
  the device; each distinct array once, so an array passed twice stays one array.
* Device arrays (CuPy, or any ``__cuda_array_interface__`` array, adopted zero-copy) pass as
  they are and must all be on one device. Other values (scalars, tuples) pass through.
* Outputs -- ``outputs=`` names, by default every writable NumPy array argument, as Numba does --
  must be arrays; the NumPy ones are copied back after the kernel and every copy succeeded, so
  the caller's arrays are never left half-written. Writes to other NumPy arguments stay on
  the device, and writes to device arrays happen in place.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vedart.backends import Backend
from vedart.backends.base import KERNEL_DTYPE_KINDS
from vedart.errors import ConfigError, KernelLaunchError
from vedart.kernels.launch_config import MAX_AUTO_DIMENSIONS

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class NoDeviceArrays:
    """Stands in for the device array type where no GPU is used (no argument is ever one)."""


@dataclass(frozen=True)
class KernelParameters:
    """A kernel's parameter names, and the positions its ``size_from=`` and ``outputs=`` name
    (``outputs`` None: every writable NumPy array argument)."""

    kernel: str
    names: tuple[str, ...]
    size_from: int | None = None
    outputs: tuple[int, ...] | None = None

    @staticmethod
    def of(kernel: str, function: Callable[..., Any], size_from: str | None,
           outputs: Iterable[str] | None) -> KernelParameters:
        """Positions of ``size_from`` and ``outputs`` among ``function``'s parameters; TypeError
        for a kernel with non-positional parameters, ConfigError for a name it does not have."""
        parameters = inspect.signature(function).parameters.values()
        if any(parameter.kind not in _POSITIONAL for parameter in parameters):
            raise TypeError(f"@gpu_kernel {kernel}: kernel parameters must be positional; got "
                            f"{inspect.signature(function)}")
        names = tuple(parameter.name for parameter in parameters)

        def position(option: str, name: str) -> int:
            if name not in names:
                raise ConfigError(f"{option}: got {name!r}; allowed: a parameter of {kernel} "
                                  f"{list(names)}")
            return names.index(name)

        return KernelParameters(
            kernel, names,
            None if size_from is None else position("size_from", size_from),
            None if outputs is None else tuple(position("outputs", name) for name in outputs))

    def describe(self, position: int) -> str:
        return f"{self.kernel}: argument {self.names[position]!r}"


@dataclass
class BoundCall:
    """One call's validated arguments. ``values`` is ``args`` with foreign device arrays
    adopted; ``host`` and ``device`` are positions of NumPy and device arrays; ``copy_back``
    the NumPy outputs; ``device_ordinal`` the device of the device arrays (None without any)."""

    args: tuple[Any, ...]
    values: list[Any]
    host: list[int]
    device: list[int]
    copy_back: list[int]
    device_ordinal: int | None


def bind(parameters: KernelParameters, args: tuple[Any, ...], device_type: type,
         adopt: Callable[[Any], Any] | None, where: str) -> BoundCall:
    """Validate ``args`` for one launch. ``device_type`` is the device array type (CuPy's) and
    ``adopt`` converts another ``__cuda_array_interface__`` array to it zero-copy; with ``adopt``
    None (no GPU used) a device array is refused, ``where`` saying why."""
    if len(args) != len(parameters.names):
        raise KernelLaunchError(
            f"{parameters.kernel}: got {len(args)} arguments; allowed: exactly "
            f"{len(parameters.names)} ({', '.join(parameters.names)})")
    values = list(args)
    host: list[int] = []
    device: list[int] = []
    for position, value in enumerate(args):
        kind = type(value)
        if kind is device_type:
            device.append(position)
        elif kind is np.ndarray:
            if value.dtype.kind not in KERNEL_DTYPE_KINDS:
                raise KernelLaunchError(f"{parameters.describe(position)}: dtype {value.dtype} "
                                        f"is not supported; allowed: bool, int, uint, float or "
                                        f"complex dtypes")
            host.append(position)
        elif isinstance(value, np.ndarray):
            raise KernelLaunchError(f"{parameters.describe(position)}: got {kind.__name__} (an "
                                    f"ndarray subclass); allowed: a NumPy ndarray or a device "
                                    f"array")
        elif hasattr(kind, "__cuda_array_interface__"):
            if adopt is None:
                raise KernelLaunchError(f"{parameters.describe(position)}: got a device array "
                                        f"({kind.__name__}) but this call runs on the CPU "
                                        f"({where}); allowed: NumPy arrays and scalars")
            values[position] = adopt(value)
            device.append(position)
    return BoundCall(args, values, host, device, _copy_back(parameters, args, host, device),
                     _one_device(parameters, values, device))


def _copy_back(parameters: KernelParameters, args: tuple[Any, ...], host: list[int],
               device: list[int]) -> list[int]:
    if parameters.outputs is None:
        return [position for position in host if args[position].flags.writeable]
    for position in parameters.outputs:
        if position in host:
            if not args[position].flags.writeable:
                raise KernelLaunchError(f"{parameters.kernel}: output "
                                        f"{parameters.names[position]!r} is a read-only NumPy "
                                        f"array; allowed: a writable array")
        elif position not in device:
            value = args[position]
            raise KernelLaunchError(f"{parameters.kernel}: output "
                                    f"{parameters.names[position]!r}: got "
                                    f"{type(value).__name__} {value!r}; allowed: a NumPy or "
                                    f"device array")
    return [position for position in parameters.outputs if position in host]


def _one_device(parameters: KernelParameters, values: list[Any],
                device: list[int]) -> int | None:
    if not device:
        return None
    ordinals = [int(values[position].device.id) for position in device]
    if any(ordinal != ordinals[0] for ordinal in ordinals):
        placed = ", ".join(f"{parameters.names[position]!r} on device {ordinal}"
                           for position, ordinal in zip(device, ordinals))
        raise KernelLaunchError(f"{parameters.kernel}: arrays on different devices: {placed}; "
                                f"allowed: every device array on one device")
    return ordinals[0]


def sizing_shape(parameters: KernelParameters, call: BoundCall) -> tuple[int, ...]:
    """The shape an automatic launch covers: the ``size_from`` array's, else the largest array
    argument's (the first of equal ones). KernelLaunchError when there is none, or it is empty
    or has more than 3 dimensions."""
    arrays = sorted(call.host + call.device)
    if parameters.size_from is not None:
        position = parameters.size_from
        if position not in arrays:
            value = call.args[position]
            raise KernelLaunchError(f"{parameters.kernel}: size_from "
                                    f"{parameters.names[position]!r}: got {type(value).__name__} "
                                    f"{value!r}; allowed: an array")
    elif arrays:
        position = max(arrays, key=lambda p: (call.values[p].size, -p))
    else:
        raise KernelLaunchError(f"{parameters.kernel}: no array argument to size the launch; "
                                f"allowed: an array argument, size_from=, or an explicit "
                                f"kernel[grid, block]")
    array = call.values[position]
    name = parameters.names[position]
    if array.size == 0:
        raise KernelLaunchError(f"{parameters.kernel}: array {name!r} has shape {array.shape} "
                                f"(0 elements) to size the launch; allowed: at least one element, "
                                f"or an explicit kernel[grid, block]")
    if array.ndim > MAX_AUTO_DIMENSIONS:
        raise KernelLaunchError(f"{parameters.kernel}: array {name!r} has {array.ndim} "
                                f"dimensions to size the launch; allowed: 0 to "
                                f"{MAX_AUTO_DIMENSIONS}, or an explicit kernel[grid, block]")
    return tuple(array.shape)


def run_with_copies(backend: Backend, call: BoundCall,
                    run: Callable[[Sequence[Any]], float]) -> float:
    """Copy ``call``'s NumPy arrays to ``backend``'s device, ``run`` the device values, then
    copy the outputs back into the caller's arrays (only after the run and every copy from the
    device succeeded). Returns what ``run`` returns."""
    values = call.values
    if call.host:
        moved: dict[int, Any] = {}
        for position in call.host:
            array = values[position]
            if id(array) not in moved:
                moved[id(array)] = backend.to_device(array)
            values[position] = moved[id(array)]
    result = run(values)
    if call.copy_back:
        fetched = {id(call.args[position]): (call.args[position], backend.to_host(values[position]))
                   for position in call.copy_back}
        for original, result_on_host in fetched.values():
            np.copyto(original, result_on_host)
    return result
