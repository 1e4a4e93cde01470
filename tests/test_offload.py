"""@veda.gpu without a GPU: decisions and their reasons (device facts through FakeProbe),
decorator forms, force contexts, fallback on the real no-driver CuPy path, writes, telemetry."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import pickle
import threading
import warnings
from collections import OrderedDict, defaultdict
from typing import Any

import numpy as np
import pytest
from fakes import GIB, FakeProbe

import vedart as veda
from vedart.offload.arguments import ON_DEVICE, host_bytes, map_arrays, scan
from vedart.offload.cost import Decision
from vedart.offload.failures import is_gpu_failure


@veda.gpu
def module_level_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adds two arrays."""
    return a + b


def big(nbytes: int, dtype: Any = np.float64) -> np.ndarray:
    """A read-only view with ``nbytes`` logical bytes and almost no memory behind it."""
    itemsize = np.dtype(dtype).itemsize
    return np.broadcast_to(np.ones(1, dtype=dtype), (nbytes // itemsize,))


def fake_gpu(**probe_options: Any) -> FakeProbe:
    """A runtime with the static rule (the decisions these tests check) on faked devices."""
    probe = FakeProbe(**probe_options)
    veda.init(veda.Config.builder().cost_model("static").build(), device_probe=probe)
    return probe


def explain(*args: Any, **options: Any) -> veda.Decision:
    return veda.gpu(**options)(lambda *a: None).explain(*args)


# --- decisions and reasons --------------------------------------------------------------------

def test_below_threshold_reason() -> None:
    fake_gpu()
    assert explain(np.ones(1500)) == veda.Decision("cpu", "below threshold: 12.0 KB < 1.0 MB")


def test_enough_free_memory_goes_to_the_gpu() -> None:
    fake_gpu(free=10 * GIB)
    decision = explain(big(4_000_000))
    assert decision == veda.Decision(
        "gpu", "4.0 MB >= threshold 1.0 MB; device 0 has 10.0 GB free", 0, free_bytes=10 * GIB)


def test_not_enough_free_memory_reason() -> None:
    fake_gpu(free=1_100_000_000)
    assert explain(big(1_600_000_000)) == veda.Decision(
        "cpu", "device 0 has 1.1 GB free, needs 3.2 GB (2.0x inputs)")


def test_headroom_from_config_applies() -> None:
    veda.init(veda.Config.builder().memory_headroom(4).build(),
              device_probe=FakeProbe(free=10 * GIB))
    assert explain(big(3 * GIB)).reason == "device 0 has 10.0 GB free, needs 12.0 GB (4.0x inputs)"


@pytest.mark.parametrize(
    ("array", "reason"),
    [(np.array([object()] * 10), "dtype object is not supported on GPU"),
     (np.array(["abc"]), "dtype <U3 is not supported on GPU"),
     (np.array(["2026-11-22"], dtype="datetime64[D]"), "dtype datetime64[D] is not supported on GPU"),
     (np.ones(3, dtype=np.longdouble), "dtype float128 is not supported on GPU"),
     (np.ma.array([1.0, 2.0]), "argument type MaskedArray (an ndarray subclass) is not supported on GPU")],
)
def test_unsupported_arrays_stay_on_cpu(array: np.ndarray, reason: str) -> None:
    fake_gpu()
    assert explain(array, threshold=0) == veda.Decision("cpu", reason)


def test_big_endian_arrays_are_supported() -> None:
    fake_gpu()
    assert explain(np.ones(10, dtype=">f8"), threshold=0).path == "gpu"


def test_gpu_disabled_by_config_and_no_gpu_reasons() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    assert explain(big(10**9)) == veda.Decision("cpu", "GPU disabled by config")
    veda.init(device_probe=FakeProbe(reason="cupy is not installed"))
    assert explain(big(10**9)) == veda.Decision("cpu", "no GPU: cupy is not installed")


def test_per_function_threshold_overrides_config() -> None:
    veda.init(veda.Config.builder().offload_threshold("100MB").cost_model("static").build(),
              device_probe=FakeProbe())
    assert explain(big(4_000_000)).reason == "below threshold: 4.0 MB < 100.0 MB"
    assert explain(big(4_000_000), threshold="1MB").path == "gpu"


def test_device_with_most_free_memory_is_chosen() -> None:
    probe = fake_gpu(count=3)
    probe.free = {0: 5 * GIB, 1: 20 * GIB, 2: 10 * GIB}
    assert explain(big(4_000_000)).device == 1
    assert explain(big(4_000_000), device=2).device == 2


def test_configured_devices_limit_the_choice() -> None:
    probe = FakeProbe(count=2)
    probe.free = {0: 5 * GIB, 1: 20 * GIB}
    veda.init(veda.Config.builder().devices([0]).cost_model("static").build(), device_probe=probe)
    assert explain(big(4_000_000)).device == 0


def test_named_device_that_is_absent() -> None:
    fake_gpu(count=1)
    assert explain(big(4_000_000), device=3) == veda.Decision(
        "cpu", "device 3 is not available (runtime devices: [0])", refused=True)


def test_converted_containers_keep_their_subclass_and_what_it_carries() -> None:
    """A defaultdict takes its factory, not its items, as its first argument: rebuilding one
    from its items raised TypeError after the function had run."""
    class Labelled(list):  # a list subclass whose constructor wants more than the items
        def __init__(self, items: list[Any], label: str) -> None:
            super().__init__(items)
            self.label = label

    counts: defaultdict[str, Any] = defaultdict(int, {"x": np.arange(3), "n": 2})
    ordered = OrderedDict([("b", np.ones(2)), ("a", np.zeros(2))])
    labelled = Labelled([np.arange(2), "text"], label="pair")
    rebuilt = map_arrays((counts, ordered, labelled), np.ndarray, lambda array: array * 10, 3)
    new_counts, new_ordered, new_labelled = rebuilt
    assert type(new_counts) is defaultdict and new_counts.default_factory is int
    np.testing.assert_array_equal(new_counts["x"], [0, 10, 20])
    assert new_counts["n"] == 2 and new_counts["missing"] == 0
    assert type(new_ordered) is OrderedDict and list(new_ordered) == ["b", "a"]
    np.testing.assert_array_equal(new_ordered["b"], [10, 10])
    assert type(new_labelled) is Labelled and new_labelled.label == "pair"
    np.testing.assert_array_equal(new_labelled[0], [0, 10])
    assert new_labelled[1] == "text"
    np.testing.assert_array_equal(counts["x"], [0, 1, 2])  # the originals are untouched
    np.testing.assert_array_equal(labelled[0], [0, 1])


def test_arrays_are_found_in_containers_up_to_the_documented_depth() -> None:
    fake_gpu()
    a = big(600_000)
    assert scan(([a, a],), {}, type(None)).host_bytes == 1_200_000
    assert scan(({"x": (a,)},), {"k": [a]}, type(None)).host_bytes == 1_200_000
    assert scan(([[[a]]],), {}, type(None)).host_bytes == 0  # three levels down: not seen
    assert host_bytes(([a, a],), {"k": {"x": a}}, type(None)) == 1_800_000
    assert explain([a, a]).path == "gpu"


def test_device_array_argument_goes_to_its_device() -> None:
    class DeviceArray:
        pass

    assert host_bytes((np.ones(3), DeviceArray()), {}, DeviceArray) == ON_DEVICE
    assert host_bytes(([DeviceArray()],), {}, DeviceArray) >= ON_DEVICE


# --- force contexts and options -----------------------------------------------------------

def test_force_cpu_context_and_option() -> None:
    fake_gpu()
    with veda.force("cpu"):
        assert explain(big(10**8)) == veda.Decision("cpu", 'forced by veda.force("cpu")')
    assert explain(big(10**8), force="cpu") == veda.Decision("cpu", 'forced by @gpu(force="cpu")')


def test_force_gpu_skips_threshold_but_not_usability() -> None:
    probe = fake_gpu()
    with veda.force("gpu"):
        assert explain(np.ones(3)) == veda.Decision("gpu", 'forced by veda.force("gpu")', 0,
                                                    free_bytes=probe.free[0])
        assert explain(np.array([None])) == veda.Decision(
            "cpu", 'forced by veda.force("gpu") but dtype object is not supported on GPU',
            refused=True)


def test_force_gpu_without_a_gpu_follows_fallback(recwarn: pytest.WarningsRecorder) -> None:
    veda.init(device_probe=FakeProbe(reason="CUDA driver not found"))
    add = veda.gpu(lambda a: a + 1)
    with veda.force("gpu"):
        np.testing.assert_array_equal(add(np.ones(2)), np.full(2, 2.0))
        assert add.explain(np.ones(2)).reason == \
            'forced by veda.force("gpu") but no GPU: CUDA driver not found'
    strict = veda.gpu(force="gpu", fallback="raise")(lambda a: a + 1)
    with pytest.raises(veda.GPUUnavailableError, match="but no GPU: CUDA driver not found"):
        strict(np.ones(2))


def test_force_context_is_per_thread() -> None:
    fake_gpu()
    seen: list[str] = []
    f = veda.gpu(lambda a: a)

    def other() -> None:
        seen.append(f.explain(np.ones(3)).reason)

    with veda.force("cpu"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == ["below threshold: 24 B < 1.0 MB"]


@pytest.mark.parametrize("path", ["tpu", None, 1])
def test_bad_force_word(path: Any) -> None:
    with pytest.raises(veda.ConfigError, match="force: got"):
        with veda.force(path):
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [({"device": -1}, "device: got -1; allowed: None or a CUDA ordinal >= 0"),
     ({"device": "0"}, "device: got '0'"),
     ({"threshold": "4 parsecs"}, "threshold: got '4 parsecs'; allowed: a byte count"),
     ({"force": "tpu"}, "force: got 'tpu'; allowed: None, 'cpu' or 'gpu'"),
     ({"fallback": "retry"}, "fallback: got 'retry'; allowed: 'cpu' or 'raise'"),
     ({"writes": "out"}, "writes: got 'out'; allowed: a tuple of parameter names"),
     ({"writes": ("nope",)}, r"writes: got \['nope'\]; allowed: parameter names of .* \['a', 'out'\]"),
     ({"writes": (name for name in ["nope"])},
      r"writes: got \['nope'\]; allowed: parameter names of .* \['a', 'out'\]"),
     ({"returns": "disk"}, "returns: got 'disk'; allowed: 'host' or 'device'")],
)
def test_bad_options_raise_config_error_naming_the_option(options: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(veda.ConfigError, match=message):
        veda.gpu(**options)(lambda a, out: None)


def test_numpy_bools_are_taken_for_flags() -> None:
    wrapped = veda.gpu(idempotent=np.False_, reach=np.True_)(lambda a: a)
    options = wrapped.gpu_options  # type: ignore[attr-defined]
    assert (options.idempotent, options.reach) == (False, True)
    assert type(options.idempotent) is bool and type(options.reach) is bool
    with pytest.raises(veda.ConfigError, match=r"^idempotent: got 0; allowed: True or False$"):
        veda.gpu(idempotent=0)


def test_non_callable_raises_type_error() -> None:
    with pytest.raises(TypeError, match="@veda.gpu needs a callable; got 5 of type int"):
        veda.gpu(5)  # type: ignore[call-overload]


def test_generator_and_async_functions_raise_type_error() -> None:
    def draws(n):  # type: ignore[no-untyped-def]
        yield np.ones(n)

    async def later(a):  # type: ignore[no-untyped-def]
        return a * 2

    async def stream(a):  # type: ignore[no-untyped-def]
        yield a

    for function, kind in ((draws, "a generator function"), (later, "an async function"),
                           (stream, "an async function")):
        with pytest.raises(TypeError) as error:
            veda.gpu(function)
        assert str(error.value) == (
            f"@veda.gpu: {function.__qualname__} is {kind}, whose body runs after the call "
            "returns; allowed: a plain function (decorate the function it calls per item)")


def test_decorating_twice_raises_type_error() -> None:
    def scale(a, out):  # type: ignore[no-untyped-def]
        out[:] = a * 2

    once = veda.gpu(writes=("out",))(scale)
    for twice in (lambda: veda.gpu(once), lambda: veda.gpu(device=0)(once)):
        with pytest.raises(TypeError) as error:
            twice()
        assert str(error.value) == (
            f"@veda.gpu: {scale.__qualname__} is already a @veda.gpu function; decorate it "
            "once, with every option (for other options, wrap its __wrapped__)")
    again = veda.gpu(once.__wrapped__)
    out = np.zeros(3)
    again(np.ones(3), out)
    np.testing.assert_array_equal(out, np.full(3, 2.0))


# --- decorator forms ------------------------------------------------------------------------

def test_forms_and_metadata() -> None:
    def f(a: np.ndarray, b: int = 2) -> np.ndarray:
        """Doc."""
        return a * b

    for wrapped in (veda.gpu(f), veda.gpu()(f), veda.gpu(threshold="2MB")(f)):
        assert wrapped.__name__ == "f" and wrapped.__doc__ == "Doc." and wrapped.__wrapped__ is f
        assert inspect.signature(wrapped) == inspect.signature(f)
        np.testing.assert_array_equal(wrapped(np.ones(2)), np.full(2, 2.0))
    assert module_level_add.__doc__ == "Adds two arrays."


def test_methods_lambdas_and_partials() -> None:
    class Model:
        def __init__(self) -> None:
            self.bias = 1.0

        @veda.gpu
        def predict(self, x: np.ndarray) -> np.ndarray:
            return x + self.bias

    np.testing.assert_array_equal(Model().predict(np.zeros(2)), np.ones(2))
    np.testing.assert_array_equal(veda.gpu(lambda x: x * 3)(np.ones(2)), np.full(2, 3.0))
    scaled = veda.gpu(functools.partial(np.multiply, 4.0))
    np.testing.assert_array_equal(scaled(np.ones(2)), np.full(2, 4.0))


def test_pickles_by_reference() -> None:
    assert pickle.loads(pickle.dumps(module_level_add)) is module_level_add


def test_concurrent_calls_are_correct_and_counted_exactly() -> None:
    veda.init(device_probe=FakeProbe())

    @veda.gpu
    def double(x: np.ndarray) -> np.ndarray:
        return x * 2

    failures: list[str] = []

    def worker(seed: int) -> None:
        x = np.random.default_rng(seed).random(50)
        for _ in range(500):
            if not np.array_equal(double(x), x * 2):
                failures.append("wrong")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = veda.get_runtime().telemetry.function(f"{__name__}.{double.__qualname__}")
    assert stats.as_dict()["cpu_calls"] == 4000


def test_gpu_false_runs_everything_on_cpu_as_written() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    x = np.random.default_rng().random(300_000)
    np.testing.assert_array_equal(module_level_add(x, x), x + x)
    assert veda.get_runtime().telemetry.function(
        f"{__name__}.module_level_add").last_decision() == ("cpu", "GPU disabled by config")


# --- fallback on the real no-driver CuPy path ---------------------------------------------

cupy = pytest.importorskip("cupy", reason="the no-driver fallback tests need CuPy installed")


def no_driver_runtime(**builder: Any) -> None:
    """A runtime that believes in a GPU (FakeProbe) on a machine whose CuPy has no driver, so
    the GPU path fails for real inside CuPy."""
    config = veda.Config.builder()
    for name, value in builder.items():
        getattr(config, name)(value)
    veda.init(config.build(), device_probe=FakeProbe())


def test_gpu_failure_reruns_on_cpu_with_original_arguments_and_warns_once() -> None:
    no_driver_runtime()
    calls: list[type] = []

    @veda.gpu(force="gpu", writes=("out",))
    def fill(a: np.ndarray, out: np.ndarray) -> float:
        calls.append(type(a))
        out[:] = a + 1
        return float(a.sum())

    a, out = np.random.default_rng().random(10), np.zeros(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fill(a, out) == pytest.approx(a.sum())
        fill(a, out)
    np.testing.assert_array_equal(out, a + 1)
    assert calls == [np.ndarray, np.ndarray]  # CPU runs only: the GPU failed before the body
    assert [w.category for w in caught] == [veda.OffloadWarning]
    assert "re-ran on CPU" in str(caught[0].message)
    stats = veda.get_runtime().telemetry.function(f"{__name__}.{fill.__qualname__}")
    path, reason = stats.last_decision()  # type: ignore[misc]
    assert path == "fallback" and reason.startswith("GPU failed (CUDARuntimeError: ")
    assert stats.as_dict()["fallback_calls"] == 2


def test_fallback_raise_chains_the_gpu_error_and_leaves_arrays_untouched() -> None:
    no_driver_runtime(fallback="raise")
    out = np.random.default_rng().random(10)
    before = out.copy()
    scale = veda.gpu(force="gpu", writes=("out",))(lambda a, out: out.__imul__(2))
    with pytest.raises(veda.OffloadError, match="GPU execution failed on device 0") as caught:
        scale(np.ones(10), out)
    assert type(caught.value.__cause__).__name__ == "CUDARuntimeError"
    np.testing.assert_array_equal(out, before)


def test_classification_of_failures() -> None:
    no_device = 100  # cudaErrorNoDevice: what a machine without a driver raises
    assert is_gpu_failure(cupy.cuda.runtime.CUDARuntimeError(no_device))

    class Dispatching:
        def __array_function__(self, *args: Any) -> Any:
            return NotImplemented

    with pytest.raises(TypeError) as dispatch_error:
        np.concatenate([Dispatching()])
    assert is_gpu_failure(dispatch_error.value)
    assert not is_gpu_failure(ValueError("need three rows"))
    with pytest.raises(ValueError) as string_dtype:  # CuPy holds no string arrays
        cupy.array(np.array(["lo", "hi"]))
    assert is_gpu_failure(string_dtype.value)

    class LikeCupysArray:  # an attribute NumPy's arrays have and CuPy's lack
        __slots__ = ()

    LikeCupysArray.__module__ = "cupy"
    with pytest.raises(AttributeError) as missing_on_device:
        LikeCupysArray().resize  # type: ignore[attr-defined]  # noqa: B018
    assert is_gpu_failure(missing_on_device.value)
    with pytest.raises(AttributeError) as missing_on_users:
        np.ones(2).no_such_attribute  # type: ignore[attr-defined]  # noqa: B018
    assert not is_gpu_failure(missing_on_users.value)
    try:
        raise TypeError("user's own type error")
    except TypeError as error:
        assert not is_gpu_failure(error)


def test_user_exception_on_cpu_path_propagates_unchanged() -> None:
    fake_gpu()

    @veda.gpu
    def strict(x: np.ndarray) -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        strict(np.ones(3))


# --- writes and results ---------------------------------------------------------------------

def test_writes_problems_keep_the_call_on_cpu() -> None:
    fake_gpu()
    f = veda.gpu(writes=("out",))(lambda a, out: None)
    assert f.explain(big(4_000_000), [1, 2]).reason == \
        "writes= argument 'out' is a list, not an ndarray"
    assert f.explain(big(4_000_000), big(8)).reason == "writes= argument 'out' is read-only"


def test_a_writes_argument_sharing_memory_with_another_keeps_the_call_on_cpu() -> None:
    """On the GPU every argument is a device copy of its own: ``f(a, a)`` writing through one
    name would not show through the other, and the copy-back would undo one of the writes."""
    fake_gpu()

    @veda.gpu(writes=("out",))
    def scale(x: np.ndarray, out: np.ndarray) -> float:
        out *= 2
        return float(x.sum())

    a = np.random.default_rng(15).random(1_000_000)
    other = np.random.default_rng(16).random(1_000_000)
    shared = "writes= argument 'out' shares memory with another argument"
    assert scale.explain(a, a).reason == shared
    assert scale.explain(a[::2], a).reason == shared  # a view
    assert scale.explain([a[:10]], out=a).reason == shared  # inside a container
    assert scale.explain(a[:500_000], a[500_000:]).path == "gpu"  # disjoint halves of one array
    assert scale.explain(other, a).path == "gpu"
    expected = a.sum() * 2
    assert scale(a, a) == pytest.approx(expected)  # on the CPU, as NumPy does it
    assert scale.explain(a, a).path == "cpu"


def test_arguments_the_code_writes_into_are_checked_as_writes_arguments() -> None:
    """A parameter the function's code writes into in place is copied back after a GPU run,
    so the same arguments that keep a ``writes=`` call on the CPU keep this one there: a
    read-only array (NumPy would raise) and one sharing memory with another argument."""
    fake_gpu()

    @veda.gpu
    def centre(x: Any, y: np.ndarray) -> float:
        x -= x.mean()
        return float(y.max())

    a = np.random.default_rng(17).random(1_000_000)
    other = np.random.default_rng(18).random(1_000_000)
    found = "argument 'x', which the function writes into in place,"
    assert centre.explain(big(8_000_000), other).reason == f"{found} is read-only"
    assert centre.explain(a, a[::2]).reason == f"{found} shares memory with another argument"
    assert centre.explain(a, other).path == "gpu"
    assert centre.explain([1.0, 2.0], big(8_000_000)).path == "gpu"  # not an array: no copy
    before = a.copy()
    assert centre(a, a) == (before - before.mean()).max()  # on the CPU, as NumPy does it
    np.testing.assert_allclose(a, before - before.mean())

    @veda.gpu(writes=("y",))  # stated writes=, and one found in the code
    def scale_both(x: np.ndarray, y: np.ndarray) -> None:
        x *= 2
        np.copyto(y, x)

    assert scale_both.explain(big(8_000_000), other).reason == \
        "argument 'x', which the function writes into in place, is read-only"
    assert scale_both.explain(other, big(8_000_000)).reason == "writes= argument 'y' is read-only"
    np.testing.assert_allclose(a, before - before.mean())


def test_arrays_in_a_list_or_dict_the_code_writes_into_are_checked_too() -> None:
    fake_gpu()

    @veda.gpu
    def sgd_step(params: list[np.ndarray], grads: list[np.ndarray], lr: float) -> None:
        for p, g in zip(params, grads):
            p -= lr * g

    rng = np.random.default_rng(21)
    w, b = rng.random(600_000), rng.random(600_000)
    grads = [rng.random(600_000), rng.random(600_000)]
    found = "argument 'params', which the function writes into in place, holds an array that "
    assert sgd_step.explain([w, b], grads, 0.1).path == "gpu"
    assert sgd_step.explain([w, big(8)], grads, 0.1).reason == found + "is read-only"
    assert sgd_step.explain([w, w[::2]], grads, 0.1).reason == \
        found + "shares memory with another argument"
    assert sgd_step.explain([w, b[::2]], grads, 0.1).reason == \
        found + "is strided (its device copy would not be)"
    assert sgd_step.explain([w, b], [w, w], 0.1).reason == \
        found + "shares memory with another argument"


def test_writes_are_found_again_when_the_code_is_replaced() -> None:
    """A reload in place (IPython's autoreload) gives the function new code."""
    fake_gpu()

    def reads(x: np.ndarray, y: np.ndarray) -> float:
        return float(y.max())

    def writes(x: np.ndarray, y: np.ndarray) -> float:
        x[0] = 0
        return float(y.max())

    decorated = veda.gpu(reads)
    other = np.random.default_rng(20).random(1_000_000)
    assert decorated.explain(big(8_000_000), other).path == "gpu"
    reads.__code__ = writes.__code__
    assert decorated.explain(big(8_000_000), other).reason == \
        "argument 'x', which the function writes into in place, is read-only"


def test_strided_and_byte_swapped_arguments_written_into_stay_on_cpu() -> None:
    """The device copy of a strided or byte-swapped argument is contiguous and native. Code
    that copies such an array on the CPU (``x.reshape(-1)``) or tests it (``if not
    x.dtype.isnative: x = x.astype(...)``) would write into the device copy where NumPy
    writes into a copy of its own, and copying that back would change the caller's array."""
    fake_gpu()

    @veda.gpu
    def centre_flat(x: np.ndarray) -> float:
        flat = x.reshape(-1)
        flat -= flat.mean()
        return float(flat[0])

    @veda.gpu
    def rescale(image: np.ndarray) -> None:
        if image.dtype != np.float64:
            image = image.astype(np.float64)
        image -= image.min()

    data = np.random.default_rng(19).random((1000, 600))
    assert centre_flat.explain(data).path == "gpu"
    assert centre_flat.explain(np.asfortranarray(data)).path == "gpu"
    found = "argument '{}', which the function writes into in place, is {} (its device copy " \
            "would not be)"
    assert centre_flat.explain(data[:, :300]).reason == found.format("x", "strided")
    assert rescale.explain(data.astype(">f8")).reason == found.format("image", "byte-swapped")
    strided, swapped = data[:, :300], data.astype(">f8")
    strided_before, swapped_before = strided.copy(), swapped.copy()
    centre_flat(strided)  # on the CPU: the reshape copied, as NumPy does
    rescale(swapped)  # on the CPU: astype copied
    np.testing.assert_array_equal(strided, strided_before)
    np.testing.assert_array_equal(swapped, swapped_before)


# --- telemetry ------------------------------------------------------------------------------

def test_report_lists_functions_with_last_reason(capsys: pytest.CaptureFixture[str]) -> None:
    fake_gpu()
    module_level_add(np.ones(3), np.ones(3))
    veda.report()
    out = capsys.readouterr().out
    assert "module_level_add" in out and "cpu: below threshold: 48 B < 1.0 MB" in out
    row = next(line for line in out.splitlines() if "module_level_add" in line).split()
    assert row[1:8] == ["1", "0", "1", "0", "-", "-", "-"]  # no GPU call: no GPU phases


def test_report_gives_mean_gpu_phases_of_a_function_with_gpu_calls() -> None:
    from vedart.telemetry import CallRecord, Telemetry

    telemetry = Telemetry()
    for compute in (0.002, 0.004):
        telemetry.record(CallRecord("f", "gpu", "forced", bytes_to_device=10**6,
                                    seconds_to_device=0.001, seconds_compute=compute,
                                    seconds_to_host=0.0005))
    telemetry.record(CallRecord("f", "cpu", "below threshold"))
    row = next(line for line in telemetry.report().splitlines() if line.startswith("f ")).split()
    assert row[1:8] == ["3", "2", "1", "0", "1.000", "3.000", "0.500"]


def test_telemetry_off_records_nothing() -> None:
    veda.init(veda.Config.builder().telemetry(False).build(), device_probe=FakeProbe())
    module_level_add(np.ones(3), np.ones(3))
    snapshot = veda.get_runtime().telemetry.snapshot()
    assert snapshot["functions"] == [] and snapshot["recent"] == []
    assert "telemetry is off" in veda.get_runtime().telemetry.report()


def test_recent_records_are_bounded() -> None:
    from vedart.telemetry import CallRecord, Telemetry

    telemetry = Telemetry(recent_limit=5)
    for index in range(12):
        telemetry.record(CallRecord("f", "cpu", f"r{index}"))
    assert [r.reason for r in telemetry.recent()] == ["r7", "r8", "r9", "r10", "r11"]
    assert telemetry.snapshot()["functions"][0]["cpu_calls"] == 12
    # No GPU call, no GPU phases: None, as the report's "-" (not a mean of 0 s).
    assert telemetry.snapshot()["functions"][0]["mean_seconds_gpu"] == \
        {"to_device": None, "compute": None, "to_host": None}


def test_reinit_between_calls_uses_the_new_runtime() -> None:
    fake_gpu()
    module_level_add(np.ones(3), np.ones(3))
    veda.init(veda.Config.builder().gpu(False).build())
    module_level_add(np.ones(3), np.ones(3))
    assert veda.get_runtime().telemetry.function(
        f"{__name__}.module_level_add").last_decision() == ("cpu", "GPU disabled by config")


def test_prefer_device_steers_decisions_without_a_device_option() -> None:
    from vedart.offload.force import prefer_device

    probe = fake_gpu(count=2)
    probe.free = {0: 20 * GIB, 1: 10 * GIB}
    with prefer_device(1):
        assert explain(big(4_000_000)).device == 1
        assert explain(big(4_000_000), device=0).device == 0
    assert explain(big(4_000_000)).device == 0
    block = prefer_device(1)
    with block, pytest.raises(RuntimeError, match="already entered"):
        with block:
            pass
    assert explain(big(4_000_000)).device == 0  # the outer block was left cleanly


def test_a_decision_is_a_value_that_cannot_be_changed() -> None:
    decision = Decision("gpu", "adaptive: gpu 1 ms vs cpu 9 ms", 1, model="adaptive",
                        timed=False)
    assert decision == Decision("gpu", "adaptive: gpu 1 ms vs cpu 9 ms", 1, False, "adaptive",
                                None, False)
    assert (decision.device, decision.refused, decision.free_bytes) == (1, False, None)
    assert not decision.learned and Decision("cpu", "first call", model="adaptive").learned
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.path = "cpu"  # type: ignore[misc]


def test_options_take_any_case_and_numpy_ordinals_and_force_names_what_it_allows() -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    options = veda.gpu(force="GPU", fallback="Raise", returns="HOST", device=np.int64(1))(
        abs).gpu_options  # type: ignore[attr-defined]
    assert (options.force, options.fallback, options.returns, options.device) == \
        ("gpu", "raise", "host", 1)
    assert type(options.device) is int
    values = np.random.default_rng().random(3) - 0.5
    with veda.force("CPU"):
        np.testing.assert_array_equal(veda.gpu(np.abs)(values), np.abs(values))
    for path in (None, "tpu", 1):
        with pytest.raises(veda.ConfigError, match=rf"^force: got {path!r}; allowed: 'cpu' or "
                                                   r"'gpu'$"):
            with veda.force(path):  # type: ignore[arg-type]
                pass


def test_gpu_above_staticmethod_and_classmethod_binds_as_without_it() -> None:
    veda.init(veda.Config.builder().gpu(False).build())

    class Scaler:
        factor = 3.0

        @veda.gpu
        @staticmethod
        def doubled(values: np.ndarray) -> np.ndarray:
            return values * 2

        @veda.gpu
        @classmethod
        def scaled(cls, values: np.ndarray) -> np.ndarray:
            return values * cls.factor

    values = np.random.default_rng().random(4)
    for owner in (Scaler, Scaler()):
        np.testing.assert_array_equal(owner.doubled(values), values * 2)
        np.testing.assert_array_equal(owner.scaled(values), values * 3.0)
    assert Scaler.doubled.explain(values).path == "cpu"


def test_explain_refuses_arguments_the_call_would_refuse() -> None:
    veda.init(veda.Config.builder().gpu(False).build())

    @veda.gpu
    def scaled(x: np.ndarray, factor: float = 2.0) -> np.ndarray:
        return x * factor

    def fixed_factor(function: Any) -> Any:
        @functools.wraps(function)
        def with_factor(x: np.ndarray) -> np.ndarray:  # fewer parameters than it wraps
            return function(x, 4.0)
        return with_factor

    class Model:
        @veda.gpu
        def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return x + y

    values = np.random.default_rng().random(4)
    assert scaled.explain(values, factor=3.0).path == "cpu"
    assert veda.gpu(fixed_factor(scaled.__wrapped__)).explain(values).path == "cpu"

    def scaling(function: Any) -> Any:
        @functools.wraps(function)
        def with_scale(x: np.ndarray, scale: float) -> np.ndarray:  # more than it wraps
            return function(x) * scale
        return with_scale

    assert veda.gpu(scaling(lambda x: x)).explain(values, scale=2.0).path == "cpu"
    assert Model().add.explain(values, values).path == "cpu"  # no self: still a decision
    with pytest.raises(TypeError):
        Model().add.explain(values, z=values)  # through an instance, unknown keywords only
    for args, kwargs in [((), {"y": values}), ((values, 2.0, 3.0), {}), ((values,), {"x": 1})]:
        with pytest.raises(TypeError):
            scaled(*args, **kwargs)
        with pytest.raises(TypeError, match=r"^test_explain_refuses_arguments_the_call_would_"
                                             r"refuse.<locals>.scaled\(\): .*argument"):
            scaled.explain(*args, **kwargs)


def a_function_whose_qualified_name_is_longer_than_the_report_column_allows_for(x):  # type: ignore[no-untyped-def]
    return x


def test_report_keeps_lambdas_apart_and_shortens_long_names_in_the_middle(
        capsys: pytest.CaptureFixture[str]) -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    doubled = veda.gpu(lambda x: x * 2)
    shifted = veda.gpu(lambda x: x + 1)
    doubled(1), shifted(1), shifted(1)
    veda.gpu(a_function_whose_qualified_name_is_longer_than_the_report_column_allows_for)(1)
    veda.report()
    rows = capsys.readouterr().out.splitlines()[2:]
    lambdas = [row.split("<lambda>")[1].split()[:4] for row in rows if "<lambda>" in row]
    first_line = doubled.__wrapped__.__code__.co_firstlineno  # type: ignore[attr-defined]
    assert doubled.display_name == (  # type: ignore[attr-defined]
        f"{__name__}.{doubled.__qualname__} (line {first_line})")
    assert lambdas == [["(line", f"{first_line})", "1", "0"],
                       ["(line", f"{first_line + 1})", "2", "0"]]
    long_row = next(row.split() for row in rows if row.split()[0].endswith("allows_for"))
    name = f"{__name__}.a_function_whose_qualified_name_is_longer_than_the_report_column_allows_for"
    start, end = long_row[0].split("...")
    assert len(long_row[0]) == 60 and name.startswith(start) and name.endswith(end)
    assert len(end) > len(start) and long_row[1:3] == ["1", "0"]


def test_report_keeps_two_lambdas_of_one_line_apart(capsys: pytest.CaptureFixture[str]) -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    doubled, shifted = veda.gpu(lambda x: x * 2), veda.gpu(lambda x: x + 1)
    doubled(1), shifted(1), shifted(1)
    line = doubled.__wrapped__.__code__.co_firstlineno  # type: ignore[attr-defined]
    source = linecache.getline(__file__, line)
    columns = [source.index("x * 2") + 1, source.index("x + 1") + 1]
    assert [doubled.display_name, shifted.display_name] == [  # type: ignore[attr-defined]
        f"{__name__}.{doubled.__qualname__} (line {line}, column {column})"
        for column in columns]
    veda.report()
    rows = capsys.readouterr().out.splitlines()[2:]
    assert sorted(row.split("<lambda>")[1].split()[:5] for row in rows if "<lambda>" in row) == [
        ["(line", f"{line},", "column", f"{column})", calls] for column, calls in zip(columns, "12")]


def test_report_says_no_call_yet_of_a_function_only_explained(
        capsys: pytest.CaptureFixture[str]) -> None:
    veda.init(veda.Config.builder().gpu(False).build())
    explained = veda.gpu(lambda x: x * 2)
    explained.explain(np.ones(3))
    veda.report()
    out = capsys.readouterr().out
    assert "None: None" not in out
    row = next(line for line in out.splitlines() if "<lambda>" in line)
    assert row.endswith("no call yet") and " 0 " in row
