"""Runtime configuration: the frozen :class:`Config`, its fluent builder and ``VEDART_*`` overrides.

Precedence, lowest first: documented defaults, ``VEDART_*`` environment variables, builder
calls. Every value is validated by one function per field, used alike by the builder (the
error comes at the builder call), by environment parsing (at ``build()``) and by direct
construction of ``Config`` (at construction), so an invalid configuration never exists.
``Config()`` alone is the pure defaults; only ``ConfigBuilder.build()`` reads the environment.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy
import psutil

from vedart.errors import ConfigError
from vedart.units import ALLOWED_SIZE_TEXT, parse_size

DEFAULT_OFFLOAD_THRESHOLD = 1_000_000
PINNED_SHARE_OF_RAM = 0.25
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _default_threads() -> int:
    return os.cpu_count() or 1


def _default_pinned_limit() -> int:
    return int(psutil.virtual_memory().total * PINNED_SHARE_OF_RAM)


@dataclass(frozen=True)
class Config:
    """Everything a :class:`~vedart.runtime.Runtime` is configured with. Immutable.

    Fields (defaults in brackets):
      gpu [True]: use a GPU when one is usable; False runs every @gpu function on the CPU.
      threads [os.cpu_count()]: worker threads of the scheduler's pool.
      offload_threshold [1 MB]: host-array bytes below which a call stays on the CPU.
      memory_headroom [2.0]: a GPU needs this many times the input bytes free.
      devices [None = all visible]: CUDA ordinals the runtime may use.
      fallback ["cpu"]: on a GPU failure re-run on the CPU ("cpu") or raise ("raise").
      cost_model ["adaptive"]: "adaptive" (learned timings) or "static" (threshold + headroom).
      telemetry [True]: record per-call decisions and timings.
      profiling [False]: time device work with CUDA events (costs synchronisation).
      gpu_memory_fraction [1.0]: share of each device's memory the pool may take, 0 < f <= 1.
      pinned_memory_limit [25% of RAM]: bytes of page-locked host memory vedart may hold.
      scheduler ["threads"]: "threads" or "dask".
      device_processes [True]: a gpu_map over several devices runs each device's items in a
        worker process of its own (docs/par_iter.md); False keeps every lane in this process.
      dask_address [None]: address of a running Dask scheduler to connect to, e.g.
        "tcp://10.0.0.5:8786"; None (and no ``dask_client``) starts an embedded cluster.
      dask_client [None]: a ``distributed.Client`` of the caller's to run on (never closed by
        vedart); builder only, not from the environment, and not pickled with the Config.
      dask_workers [None = one per core, or one per GPU on a dask-cuda cluster]: worker
        processes of the embedded cluster.
      dask_cluster ["auto"]: the embedded cluster's kind: "cuda" (dask-cuda's
        LocalCUDACluster, one worker per GPU), "cpu" (distributed's LocalCluster) or "auto"
        ("cuda" when dask-cuda is installed and a GPU is visible, else "cpu").
      dask_timeout [10.0]: seconds to wait for a Dask scheduler to answer (connecting, and
        during a pipeline once it stops answering) before raising.
      progress [False]: show progress bars in par_iter terminals.
      log_level [None]: level of the ``vedart`` logger; None leaves logging alone.
      profile_path [None = user cache dir]: the adaptive cost model's profile file.

    ``sources`` maps each field to where its value came from: "default", "builder",
    "env:VEDART_NAME", or "constructor" for a value other than the default given to
    ``Config(...)`` or ``dataclasses.replace``. It does not take part in equality.
    """

    gpu: bool = True
    threads: int = field(default_factory=_default_threads)
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    memory_headroom: float = 2.0
    devices: tuple[int, ...] | None = None
    fallback: str = "cpu"
    cost_model: str = "adaptive"
    telemetry: bool = True
    profiling: bool = False
    gpu_memory_fraction: float = 1.0
    pinned_memory_limit: int = field(default_factory=_default_pinned_limit)
    scheduler: str = "threads"
    device_processes: bool = True
    dask_address: str | None = None
    dask_client: Any = None
    dask_workers: int | None = None
    dask_cluster: str = "auto"
    dask_timeout: float = 10.0
    progress: bool = False
    log_level: str | None = None
    profile_path: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for spec in FIELD_SPECS.values():
            object.__setattr__(self, spec.name, spec.validate(getattr(self, spec.name)))
        if self.dask_client is not None and self.dask_address is not None:
            raise ConfigError(f"dask_address: got {self.dask_address!r} beside a dask_client; "
                              "allowed: one of dask_client and dask_address")
        known_sources = {}
        for each in fields(self):
            if each.name not in FIELD_SPECS:
                continue
            source = self.sources.get(each.name, "default")
            if source == "default" and getattr(self, each.name) != (
                    each.default_factory() if each.default is MISSING  # type: ignore[misc]
                    else each.default):
                source = "constructor"  # Config(...) or dataclasses.replace set it
            known_sources[each.name] = source
        object.__setattr__(self, "sources", MappingProxyType(known_sources))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its field values and their sources (for worker processes), without
        ``dask_client`` (a connection of this process)."""
        values = {name: getattr(self, name) for name in FIELD_SPECS}
        values["dask_client"] = None
        return (_config_from, (values, dict(self.sources)))

    @staticmethod
    def builder() -> ConfigBuilder:
        """Return a fluent builder: ``Config.builder().gpu(True).threads(8).build()``."""
        return ConfigBuilder()

    def as_dict(self) -> dict[str, Any]:
        """The field values as plain JSON-friendly data (tuples become lists, a Dask client
        its repr)."""
        values = {
            name: list(value) if isinstance(value, tuple) else value
            for name in FIELD_SPECS
            for value in [getattr(self, name)]
        }
        if values["dask_client"] is not None:
            values["dask_client"] = repr(values["dask_client"])
        return values


def _config_from(values: dict[str, Any], sources: dict[str, str]) -> Config:
    return Config(**values, sources=sources)


# --- validation: one function per kind of field -------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """How one Config field is validated and read from its environment variable."""

    name: str
    allowed: str
    check: Callable[[Any], Any]  # returns the normalised value, raises ValueError/TypeError
    from_env: Callable[[str], Any]

    @property
    def env_var(self) -> str:
        return "VEDART_" + {"offload_threshold": "THRESHOLD", "log_level": "LOG",
                            "profile_path": "PROFILE"}.get(
            self.name, self.name.upper()
        )

    def validate(self, value: Any, origin: str | None = None) -> Any:
        """Return ``value`` normalised, or raise ConfigError naming the field and what is allowed."""
        try:
            return self.check(value)
        except (TypeError, ValueError) as error:
            where = self.name if origin is None else f"{self.name} (from {origin})"
            raise ConfigError(f"{where}: got {value!r}; allowed: {self.allowed}") from error

    def read_env(self, text: str) -> Any:
        try:
            parsed = self.from_env(text)
        except (TypeError, ValueError) as error:
            raise ConfigError(
                f"{self.name} (from {self.env_var}): got {text!r}; allowed: {self.allowed}"
            ) from error
        return self.validate(parsed, origin=self.env_var)


def parameter_names(field_name: str, value: Any, allowed: str) -> tuple[str, ...]:
    """``value``, an iterable of parameter names, as a tuple (read once, so a generator is
    kept whole); ConfigError naming ``field_name``, the value and ``allowed`` otherwise."""
    names = None if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) \
        else tuple(value)
    if names is None or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{field_name}: got {value!r}; allowed: {allowed}")
    return names


def _check_bool(value: Any) -> bool:
    """``value`` as a ``bool`` when it is one or a NumPy bool (``arr.any()``); TypeError
    otherwise (an int is not taken for a flag)."""
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError("not a bool")
    return bool(value)


def checked_bool(where: str, value: Any, allowed: str = "True or False") -> bool:
    """``value`` as a ``bool`` (:func:`_check_bool`); else ConfigError naming ``where``, the
    value and ``allowed``."""
    try:
        return _check_bool(value)
    except TypeError:
        raise ConfigError(f"{where}: got {value!r}; allowed: {allowed}") from None


def _bool_from_env(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def whole_number(value: Any) -> int:
    """``value`` as an ``int`` when it is a whole number (an ``int``, a NumPy integer, anything
    ``operator.index`` takes) and not a bool; TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError("a bool")
    return operator.index(value)


def checked_int(where: str, value: Any, minimum: int | None = None,
                allowed: str | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is a whole number (:func:`whole_number`) from
    ``minimum`` to ``maximum`` (either unbounded when None); else ConfigError naming
    ``where``, the value and ``allowed`` (default: "an int", or "an int >= minimum")."""
    try:
        number: int | None = whole_number(value)
    except TypeError:
        number = None
    if number is None or (minimum is not None and number < minimum) or \
            (maximum is not None and number > maximum):
        default = "an int" if minimum is None else f"an int >= {minimum}"
        raise ConfigError(f"{where}: got {value!r}; allowed: {allowed or default}")
    return number


def one_of(value: Any, words: tuple[str, ...]) -> str:
    """``value`` lowered when it is one of ``words`` (lower-case) in any case; ValueError
    otherwise."""
    if not isinstance(value, str) or value.lower() not in words:
        raise ValueError("not one of the words")
    return value.lower()


def _check_positive_int(value: Any) -> int:
    number = whole_number(value)
    if number < 1:
        raise ValueError("not an int >= 1")
    return number


def _check_size(value: Any) -> int:
    if isinstance(value, str):
        return parse_size(value)
    number = whole_number(value)
    if number < 0:
        raise ValueError("not a size")
    return number


def finite_float(value: Any) -> float:
    """``value``, an int or float (not a bool) a float holds finitely, as a float; TypeError or
    ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("not a finite number")
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range
        raise ValueError("not a finite number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _check_optional_positive_int(value: Any) -> int | None:
    return None if value is None else _check_positive_int(value)


def _check_timeout(value: Any) -> float:
    number = finite_float(value)
    if number <= 0.0:
        raise ValueError("not positive")
    return number


def _check_dask_client(value: Any) -> Any:
    # Duck-typed: this layer does not import distributed.
    if value is not None and not (hasattr(value, "submit") and hasattr(value, "scheduler_info")):
        raise TypeError("not a distributed.Client")
    return value


def _not_from_env(text: str) -> Any:
    raise ValueError("cannot come from the environment")


def _optional_int_from_env(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "auto") else int(text)


def _check_headroom(value: Any) -> float:
    number = finite_float(value)
    if number < 1.0:
        raise ValueError("below 1")
    return number


def _check_fraction(value: Any) -> float:
    number = finite_float(value)
    if not 0.0 < number <= 1.0:
        raise ValueError("outside (0, 1]")
    return number


def _check_devices(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError("not a list of ints")
    ordinals = tuple(value)
    if not ordinals or len(set(ordinals)) != len(ordinals):
        raise ValueError("empty or repeated")
    ordinals = tuple(whole_number(ordinal) for ordinal in ordinals)
    if any(ordinal < 0 for ordinal in ordinals):
        raise ValueError("not a device ordinal")
    return ordinals


def _devices_from_env(text: str) -> tuple[int, ...] | None:
    if text.strip().lower() in ("", "all"):
        return None
    return tuple(int(part) for part in text.split(","))


def _check_choice(words: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:  # any case, as the environment variables and log_level
        return one_of(value, words)

    return check


def _check_optional_text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError("not a non-empty string")
    return value


def _check_optional_path(value: Any) -> str | None:
    return _check_optional_text(None if value is None else os.fspath(value))


def _check_log_level(value: Any) -> str | None:
    return None if value is None else one_of(value, LOG_LEVELS)


def _identity(text: str) -> str:
    return text


def _lower(text: str) -> str:
    return text.strip().lower()


def _choice_spec(name: str, words: tuple[str, ...]) -> FieldSpec:
    return FieldSpec(name, " or ".join(repr(w) for w in words), _check_choice(words), _lower)


def _bool_spec(name: str) -> FieldSpec:
    return FieldSpec(name, "True or False (env: 1/0, true/false, yes/no, on/off)",
                     _check_bool, _bool_from_env)


FIELD_SPECS: dict[str, FieldSpec] = {
    spec.name: spec
    for spec in (
        _bool_spec("gpu"),
        FieldSpec("threads", "an int >= 1", _check_positive_int, int),
        FieldSpec("offload_threshold", ALLOWED_SIZE_TEXT, _check_size, _identity),
        FieldSpec("memory_headroom", "a number >= 1.0", _check_headroom, float),
        FieldSpec("devices", "None (all visible) or a non-empty list of distinct CUDA ordinals "
                  ">= 0 (env: '0,1' or 'all')", _check_devices, _devices_from_env),
        _choice_spec("fallback", ("cpu", "raise")),
        _choice_spec("cost_model", ("static", "adaptive")),
        _bool_spec("telemetry"),
        _bool_spec("profiling"),
        FieldSpec("gpu_memory_fraction", "a number f with 0 < f <= 1", _check_fraction, float),
        FieldSpec("pinned_memory_limit", ALLOWED_SIZE_TEXT, _check_size, _identity),
        _choice_spec("scheduler", ("threads", "dask")),
        _bool_spec("device_processes"),
        FieldSpec("dask_address", "None or a non-empty address string such as "
                  "'tcp://10.0.0.5:8786'", _check_optional_text, _identity),
        FieldSpec("dask_client", "None or a distributed.Client (builder only, not from the "
                  "environment)", _check_dask_client, _not_from_env),
        FieldSpec("dask_workers", "None (one per core, or per GPU on a dask-cuda cluster) or "
                  "an int >= 1", _check_optional_positive_int, _optional_int_from_env),
        _choice_spec("dask_cluster", ("auto", "cpu", "cuda")),
        FieldSpec("dask_timeout", "a number of seconds > 0", _check_timeout, float),
        _bool_spec("progress"),
        FieldSpec("log_level", "None or one of " + ", ".join(LOG_LEVELS), _check_log_level,
                  _lower),
        FieldSpec("profile_path", "None (the user cache dir) or a non-empty file path",
                  _check_optional_path, _identity),
    )
}


class ConfigBuilder:
    """Fluent builder of :class:`Config`. Each setter validates at once and returns the builder.

    ``build()`` fills unset fields from ``VEDART_*`` environment variables, then from the
    defaults, and raises ConfigError for a malformed environment variable.
    """

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def _set(self, name: str, value: Any) -> ConfigBuilder:
        self._values[name] = FIELD_SPECS[name].validate(value)
        return self

    def gpu(self, enabled: bool) -> ConfigBuilder:
        return self._set("gpu", enabled)

    def threads(self, count: int) -> ConfigBuilder:
        return self._set("threads", count)

    def offload_threshold(self, size: int | str) -> ConfigBuilder:
        return self._set("offload_threshold", size)

    def memory_headroom(self, factor: float) -> ConfigBuilder:
        return self._set("memory_headroom", factor)

    def devices(self, ordinals: Iterable[int] | None) -> ConfigBuilder:
        return self._set("devices", ordinals)

    def fallback(self, mode: str) -> ConfigBuilder:
        return self._set("fallback", mode)

    def cost_model(self, name: str) -> ConfigBuilder:
        return self._set("cost_model", name)

    def telemetry(self, enabled: bool) -> ConfigBuilder:
        return self._set("telemetry", enabled)

    def profiling(self, enabled: bool) -> ConfigBuilder:
        return self._set("profiling", enabled)

    def gpu_memory_fraction(self, fraction: float) -> ConfigBuilder:
        return self._set("gpu_memory_fraction", fraction)

    def pinned_memory_limit(self, size: int | str) -> ConfigBuilder:
        return self._set("pinned_memory_limit", size)

    def scheduler(self, name: str) -> ConfigBuilder:
        return self._set("scheduler", name)

    def dask_address(self, address: str | None) -> ConfigBuilder:
        return self._set("dask_address", address)

    def dask_client(self, client: Any) -> ConfigBuilder:
        return self._set("dask_client", client)

    def dask_workers(self, count: int | None) -> ConfigBuilder:
        return self._set("dask_workers", count)

    def dask_cluster(self, kind: str) -> ConfigBuilder:
        return self._set("dask_cluster", kind)

    def dask_timeout(self, seconds: float) -> ConfigBuilder:
        return self._set("dask_timeout", seconds)

    def device_processes(self, enabled: bool) -> ConfigBuilder:
        return self._set("device_processes", enabled)

    def progress(self, enabled: bool) -> ConfigBuilder:
        return self._set("progress", enabled)

    def log_level(self, level: str | None) -> ConfigBuilder:
        return self._set("log_level", level)

    def profile_path(self, path: str | os.PathLike[str] | None) -> ConfigBuilder:
        return self._set("profile_path", path)

    def build(self, environ: Mapping[str, str] | None = None) -> Config:
        """Return the Config: builder values, else ``VEDART_*`` from ``environ``
        (default ``os.environ``), else defaults. A ``dask_client`` given here also overrides
        ``VEDART_DASK_ADDRESS`` (the two name one scheduler)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, spec in FIELD_SPECS.items():
            if name in self._values:
                values[name], sources[name] = self._values[name], "builder"
            elif name == "dask_address" and self._values.get("dask_client") is not None:
                continue
            elif spec.env_var in environ:
                values[name] = spec.read_env(environ[spec.env_var])
                sources[name] = "env:" + spec.env_var
        return Config(**values, sources=sources)
