"""The cost model's decision (the seed's static rule, with an optional learned size rule) and
the Decision every @gpu call carries.

GPU only when all hold: a GPU is usable; every array argument is a plain ndarray of a dtype
CuPy supports; host-array bytes >= the threshold; the chosen device has at least
``headroom x`` those bytes free (NVML). A CuPy argument sends the call to its device whatever
its size. Forcing skips the threshold and memory checks, never the usability checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vedart.gpu.context import DISABLED_BY_CONFIG, GPUContext
from vedart.offload.adaptive import AdaptiveModel
from vedart.offload.arguments import ArgumentFacts
from vedart.units import format_bytes

# dtype kinds and sizes CuPy supports: bool, signed/unsigned ints, float16/32/64, complex64/128.
SUPPORTED_DTYPES = frozenset(
    np.dtype(name) for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)


@dataclass(frozen=True, init=False)
class Decision:
    """Where one call runs and why. ``refused`` marks a GPU that was asked for (forced, or a
    named device) but cannot be used, which ``fallback="raise"`` turns into an error;
    ``model`` is what chose: "adaptive" for the adaptive model, "static" for a fixed rule (the
    static threshold, and under either model: no GPU, a forced path, a call below the
    threshold or floor); ``free_bytes`` is the
    chosen device's free memory as read for this decision (None when none was read);
    ``timed``: whether the adaptive model learns from this call's time (it explores or
    re-checks; a settled call is neither timed nor learned from); ``exploring``: the model has
    not settled the call's bucket, so the next call's decision depends on this one's time;
    ``helpers``, from
    ``explain()``: the helper functions and classes the function's GPU calls ran as device
    clones so far."""

    path: str
    reason: str
    device: int | None = None
    refused: bool = False
    model: str = "static"
    free_bytes: int | None = None
    timed: bool = True
    exploring: bool = False
    helpers: tuple[str, ...] = ()

    # Every call past the fast path makes one: the generated frozen __init__ (a guarded
    # attribute set per field) took 0.9 us of the model's 2.2 us bookkeeping on a settled call.
    def __init__(self, path: str, reason: str, device: int | None = None, refused: bool = False,
                 model: str = "static", free_bytes: int | None = None, timed: bool = True,
                 exploring: bool = False, helpers: tuple[str, ...] = ()) -> None:
        self.__dict__.update(path=path, reason=reason, device=device, refused=refused,
                             model=model, free_bytes=free_bytes, timed=timed,
                             exploring=exploring, helpers=helpers)

    @property
    def learned(self) -> bool:
        """Whether the adaptive model learns from this call's time."""
        return self.timed and self.model == "adaptive"


@dataclass(frozen=True)
class Forcing:
    """A forced path and who forced it, e.g. ``Forcing("gpu", 'veda.force("gpu")')``."""

    path: str
    source: str


def unsupported_reason(arrays: Sequence[np.ndarray]) -> str | None:
    """Why these host arrays cannot go to the GPU, or None when they all can."""
    for array in arrays:
        if type(array) is not np.ndarray:
            return f"argument type {type(array).__name__} (an ndarray subclass) is not supported on GPU"
        dtype = array.dtype  # native dtypes are found as they are, without a new dtype
        if dtype not in SUPPORTED_DTYPES and dtype.newbyteorder("=") not in SUPPORTED_DTYPES:
            return f"dtype {array.dtype} is not supported on GPU"
    return None


def decide(facts: ArgumentFacts, *, gpu: GPUContext | None, threshold: int, headroom: float,
           device: int | None, forcing: Forcing | None, model: AdaptiveModel | None = None,
           key: str = "", peek: bool = False) -> Decision:
    """The decision for one call (see the module docstring for the static rule).

    ``model`` (the adaptive model, choosing for function ``key``; ``peek``: without counting
    the call) replaces "at least the threshold" for calls that reach it: its Choice (path,
    reason and timing flags) is carried into the Decision, and the memory check, with its NVML
    query, runs only when it chose the GPU."""
    wants_gpu = forcing is not None and forcing.path == "gpu"
    if gpu is None:
        return _cpu(DISABLED_BY_CONFIG, forcing)
    if forcing is not None and forcing.path == "cpu":
        return Decision("cpu", f"forced by {forcing.source}")
    if gpu.unavailable_reason is not None:
        return _cpu(f"no GPU: {gpu.unavailable_reason}", forcing)
    unsupported = unsupported_reason(facts.host_arrays) if facts.host_arrays else None
    if unsupported is not None:
        return _cpu(unsupported, forcing)
    ordinals = gpu.ordinals
    if device is not None and device not in ordinals:
        return Decision("cpu", f"device {device} is not available (runtime devices: "
                               f"{list(ordinals)})", refused=True)
    if device is None and facts.device_ordinals:
        device = facts.device_ordinals[0]
    needed = headroom * facts.host_bytes
    choice = None
    if not wants_gpu:
        if facts.device_ordinals:
            return Decision("gpu", f"input already on device {device}", device)
        if facts.host_bytes < threshold:
            return _cpu(f"below threshold: {format_bytes(facts.host_bytes)} < "
                        f"{format_bytes(threshold)}", forcing)
        if model is not None:
            choice = model.choose(key, facts.signature, facts.host_bytes, peek=peek)
            if choice.path == "cpu":
                return Decision("cpu", choice.reason, model="adaptive", timed=choice.timed,
                                exploring=choice.exploring)
    if device is None and len(ordinals) > 1:
        chosen, free = _most_free(gpu, ordinals, needed)
    else:  # one device to read, without a call to _most_free: every GPU call comes here
        chosen = ordinals[0] if device is None else device
        free = gpu.free_memory(chosen, needed)
    if wants_gpu:
        assert forcing is not None
        return Decision("gpu", f"forced by {forcing.source}", chosen, free_bytes=free)
    if free < needed:
        return _cpu(f"device {chosen} has {format_bytes(free)} free, needs "
                    f"{format_bytes(needed)} ({headroom:.1f}x inputs)", forcing)
    if choice is not None:
        return Decision("gpu", choice.reason, chosen, model="adaptive", free_bytes=free,
                        timed=choice.timed, exploring=choice.exploring)
    reason = (f"{format_bytes(facts.host_bytes)} >= threshold {format_bytes(threshold)}; "
              f"device {chosen} has {format_bytes(free)} free")
    return Decision("gpu", reason, chosen, free_bytes=free)


def _cpu(reason: str, forcing: Forcing | None) -> Decision:
    """A CPU decision for ``reason``; refused when the GPU was forced."""
    if forcing is not None and forcing.path == "gpu":
        return Decision("cpu", f"forced by {forcing.source} but {reason}", refused=True)
    return Decision("cpu", reason)


def _most_free(gpu: GPUContext, ordinals: Sequence[int], needed: float) -> tuple[int, int]:
    """The device among ``ordinals`` with the most free memory, and that free byte count,
    for a call that needs ``needed`` bytes (see ``GPUContext.free_memory``)."""
    free_by_device = [(gpu.free_memory(ordinal, needed), ordinal) for ordinal in ordinals]
    free, ordinal = max(free_by_device, key=lambda pair: (pair[0], -pair[1]))
    return ordinal, free
