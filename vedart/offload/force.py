"""Context that steers @gpu calls for a block of code: ``veda.force("cpu" | "gpu")`` forces
the path (debugging); ``prefer_device(d)`` names the device a GPU decision uses when the
function names none (the par_iter GPU lanes)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

from vedart.config import one_of
from vedart.errors import ConfigError

PATHS = ("cpu", "gpu")
forced_path: ContextVar[str | None] = ContextVar("vedart_forced_path", default=None)
preferred_device: ContextVar[int | None] = ContextVar("vedart_preferred_device", default=None)


def check_path(option: str, value: object, *, none: bool = True) -> str | None:
    """``value`` if it is "cpu" or "gpu" in any case (lowered), or None where ``none``;
    ConfigError naming ``option`` and what is allowed otherwise."""
    if value is None and none:
        return None
    try:
        return one_of(value, PATHS)
    except ValueError:
        raise ConfigError(f"{option}: got {value!r}; allowed: "
                          f"{'None, ' if none else ''}'cpu' or 'gpu'") from None


@contextmanager
def force(path: str) -> Iterator[None]:
    """Within the block, @gpu calls in this thread (and tasks it starts with a copied context)
    take ``path``; a GPU forced where none is usable follows the fallback setting."""
    token = forced_path.set(check_path("force", path, none=False))
    try:
        yield
    finally:
        forced_path.reset(token)


class prefer_device:  # noqa: N801 (a context manager used like a function, as ``force``)
    """Within the block, GPU decisions of @gpu functions without ``device=`` and without CuPy
    arguments use device ``ordinal`` (its free memory is still checked). A class, not a
    generator: gpu_map enters it three times per item. One object is entered once at a time
    (``with prefer_device(d):`` makes a new one each time)."""

    __slots__ = ("_ordinal", "_token")

    def __init__(self, ordinal: int) -> None:
        self._ordinal = ordinal
        self._token: Token[int | None] | None = None

    def __enter__(self) -> None:
        if self._token is not None:
            raise RuntimeError("prefer_device: this block is already entered")
        self._token = preferred_device.set(self._ordinal)

    def __exit__(self, *exc_info: object) -> None:
        token, self._token = self._token, None
        assert token is not None
        preferred_device.reset(token)
