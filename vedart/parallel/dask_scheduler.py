"""The Dask scheduler: par_iter's element-wise stages as Dask tasks on a distributed cluster.

Contracts (as on the thread scheduler, :mod:`vedart.parallel.scheduler`):
- A fused run of map/filter/flat_map/gpu_map stages becomes one Dask task per batch of items,
  batches sized by the same :class:`ChunkPolicy` (aiming at DASK_TASK_SECONDS of work, from the
  seconds each task measured in its worker); positional stages stay on the calling thread.
- At most ``DASK_WINDOW_PER_THREAD`` tasks per worker thread are in flight; upstream is read
  only to fill that window; results come back in input order, each item once (a task Dask
  re-runs after its worker died is still one future with one result).
- Functions and items are pickled before anything is sent (:mod:`.dask_payload`): one that
  cannot be fails the pipeline at once naming its stage or item. On a LocalCluster (the
  runtime's own, or the one a caller's client was made with), batches holding a megabyte or
  more of arrays go through shared memory (:mod:`.dask_shared`).
- A task that fails as a whole (its worker died more often than Dask allows) fails each of its
  items in place, so ``collect(errors=...)`` treats them like any other failure. A scheduler
  that stops answering for ``Config.dask_timeout`` seconds raises ParIterError.
- The cluster is started once per runtime (:meth:`DaskCluster.start`) and closed with it; a
  caller's client or a cluster reached by address is never closed, only its workers'
  vedart runtimes are.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import import_module
from importlib.util import find_spec
from typing import Any

from vedart._logging import logger
from vedart.config import Config
from vedart.errors import ConfigError, ParIterError, SchedulerUnavailableError
from vedart.locks import renew_in_child
from vedart.offload.force import forced_path
from vedart.parallel.batch import Batch, ItemFailure, Reader
from vedart.parallel.dask_payload import (
    check_batch,
    encode_steps,
    failed_batch,
    held,
    received,
    run_batch,
    with_failures,
    without_failures,
)
from vedart.parallel.dask_shared import SharedBatch, SharedRing
from vedart.parallel.device_workers import visible_device
from vedart.parallel.elementwise import Step
from vedart.parallel.scheduler import ChunkPolicy, WindowedReader, shut_down_error
from vedart.telemetry import Telemetry

# Between two tasks a worker idles 10-25 ms when its tasks hold the GIL (its event loop waits
# for the lock); with 0.1 s tasks ``bench dask``'s GIL-bound map, timed alone, ran in
# 0.49-0.58 s, with 0.05 s tasks in 0.64-1.02 s (H100, 8 workers, 2026-11-25).
DASK_TASK_SECONDS = 0.1
DASK_WINDOW_PER_THREAD = 4  # one running, the rest queued on the worker while results travel
POLL_S = 0.5                # how often a wait checks that the scheduler still answers
EXTRAS = {"distributed": "dask", "dask_cuda": "dask-cuda"}
HELD_CHAIN_BYTES = 1 << 20  # a pickled chain this large is sent to the cluster once, not per task
_HOST_PORT_SCHEMES = ("tcp", "tls", "ws", "wss")  # the rest (inproc, ucx) name no port


def require(module: str) -> Any:
    """``import module``, or ConfigError naming the vedart extra that installs it."""
    try:
        return import_module(module)
    except ImportError as error:
        extra = EXTRAS[module]
        raise ConfigError(f"scheduler: got 'dask', which needs the {module!r} package ({error});"
                          f" allowed: install the extra, pip install 'vedart[{extra}]', or "
                          "scheduler='threads'") from error


def embedded_kind(config: Config, gpus: int) -> str:
    """"cuda" or "cpu": the embedded cluster ``config.dask_cluster`` asks for on a host with
    ``gpus`` usable GPUs ("auto": a LocalCUDACluster where there are GPUs and dask-cuda)."""
    kind = config.dask_cluster
    if kind == "auto":
        kind = "cuda" if gpus and find_spec("dask_cuda") is not None else "cpu"
    return kind


def embedded_cluster(config: Config, gpus: int) -> Any:
    """A LocalCUDACluster (one worker per GPU) or a LocalCluster of single-threaded worker
    processes, as ``config.dask_cluster`` asks."""
    kind = embedded_kind(config, gpus)
    workers = {} if config.dask_workers is None else {"n_workers": config.dask_workers}
    if kind == "cuda":
        dask_cuda = require("dask_cuda")
        if gpus and workers:  # one worker per GPU: dask_workers can only ask for fewer
            workers["n_workers"] = min(workers["n_workers"], gpus)
        if config.devices is not None:  # ordinals as this process numbers them
            workers["CUDA_VISIBLE_DEVICES"] = [visible_device(ordinal)
                                               for ordinal in config.devices]
        return dask_cuda.LocalCUDACluster(threads_per_worker=1, dashboard_address=":0",
                                          **workers)
    distributed = require("distributed")
    return distributed.LocalCluster(n_workers=workers.get("n_workers", os.cpu_count() or 1),
                                    threads_per_worker=1, processes=True,
                                    dashboard_address=":0")


def _is_cuda_cluster(cluster: Any) -> bool:
    """Whether ``cluster`` is a dask-cuda ``LocalCUDACluster`` (whose maker imported
    dask-cuda)."""
    dask_cuda = sys.modules.get("dask_cuda")
    return dask_cuda is not None and isinstance(cluster, dask_cuda.LocalCUDACluster)


# One shared-memory ring per LocalCluster, for every runtime that uses it.
_rings: weakref.WeakKeyDictionary[Any, SharedRing | None] = weakref.WeakKeyDictionary()
_rings_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_rings_lock")


def _address_problem(address: str) -> str | None:
    """What is wrong with ``address`` as distributed reads it (an unknown scheme, no port),
    or None. Checked before a Client is made: a Client that fails to parse it is left half
    made, and waits twice ``dask_timeout`` to close when the process exits."""
    from distributed.comm import get_address_host_port, normalize_address, parse_address
    from distributed.comm.registry import get_backend

    try:
        normalized = normalize_address(address)
        scheme, _ = parse_address(normalized)
        get_backend(scheme)
        if scheme in _HOST_PORT_SCHEMES:
            get_address_host_port(normalized)
    except ValueError as error:
        return str(error)
    return None


class DaskCluster:
    """The runtime's Dask client, the cluster it started (None when it uses the caller's
    client or an address), and the worker plugin that gives each worker its runtime."""

    def __init__(self, client: Any, cluster: Any, owns_client: bool, timeout: float) -> None:
        self.client = client
        self.cluster = cluster
        self._owns_client = owns_client
        self._timeout = timeout
        # Kept: a closed client forgets its scheduler, and errors still name it then.
        self._address = str(client.scheduler.address)
        self._closed = False  # the runtime closed it (veda.shutdown() or veda.init())

    def local_cluster(self) -> Any:
        """The ``LocalCluster`` (dask-cuda's included) of this host that the workers belong
        to: the runtime's own, or the one the caller's client was made with; None for a
        cluster reached by address or a client of another kind of cluster."""
        distributed = require("distributed")
        local = self.cluster if self.cluster is not None else getattr(self.client, "cluster",
                                                                        None)
        return local if isinstance(local, distributed.LocalCluster) else None

    def shared_ring(self) -> SharedRing | None:
        """The ring batches reach a cluster of this host through: the runtime's own, or a
        ``LocalCluster`` the caller's client was made with (one ring per cluster, made on first
        use and closed with the cluster). None for a cluster reached by address, whose workers
        may be on other hosts, or where shared memory is short (:mod:`.dask_shared`)."""
        local = self.local_cluster()
        if local is None:
            return None
        with _rings_lock:
            if local not in _rings:
                ring = _rings[local] = SharedRing.create()
                if ring is not None:
                    weakref.finalize(local, ring.close)
            return _rings[local]

    @classmethod
    def start(cls, config: Config, gpus: int) -> DaskCluster:
        """Connect as ``config`` says (``dask_client``, ``dask_address`` or an embedded
        cluster; ``gpus``: usable GPUs of this host) and register the worker runtime.
        ConfigError when the extra is missing; SchedulerUnavailableError when the address
        does not answer within ``config.dask_timeout`` seconds."""
        distributed = require("distributed")
        from vedart.parallel.dask_worker import PLUGIN_NAME, RuntimePlugin

        cluster = None
        if config.dask_client is not None:
            client = config.dask_client
            if client.status != "running":  # a closed client has no scheduler to name
                raise ConfigError(f"dask_client: got a distributed.Client whose status is "
                                  f"{client.status!r}; allowed: a running Client")
        elif config.dask_address is not None:
            problem = _address_problem(config.dask_address)
            if problem is None:
                try:
                    client = distributed.Client(config.dask_address, set_as_default=False,
                                                timeout=config.dask_timeout)
                except OSError as error:  # TimeoutError included
                    raise SchedulerUnavailableError(
                        f"dask_address: the Dask scheduler at {config.dask_address!r} did not "
                        f"answer within dask_timeout={config.dask_timeout:g} s ({error})"
                    ) from error
                except ValueError as error:  # distributed cannot parse it after all
                    problem = str(error)
            if problem is not None:
                raise ConfigError(f"dask_address: got {config.dask_address!r}; allowed: a Dask "
                                  f"scheduler address such as 'tcp://host:8786' ({problem})")
        else:
            cluster = embedded_cluster(config, gpus)
            try:
                client = distributed.Client(cluster, timeout=config.dask_timeout,
                                            set_as_default=False)
            except BaseException:
                cluster.close()
                raise
        started = cls(client, cluster, config.dask_client is None, config.dask_timeout)
        try:
            # The many workers of a CPU cluster of this host would each take every GPU of it
            # (contexts, staging buffers, a staging loop loading beside the first tasks).
            local = started.local_cluster()
            use_gpus = local is None or _is_cuda_cluster(local)
            answers = client.register_plugin(RuntimePlugin(config, use_gpus), name=PLUGIN_NAME)
        except BaseException:
            started.close()
            raise
        for worker, answer in (answers or {}).items():
            if answer.get("status") != "OK":
                logger.warning("Dask worker %s could not start its vedart runtime (%s); its "
                               "@gpu calls use a default one", worker, answer.get("text"))
        return started

    @property
    def address(self) -> str:
        return self._address

    def threads(self) -> int:
        """Task threads over all workers now (at least 1); ParIterError when the client was
        closed (a pipeline started after it was)."""
        if self.client.status in ("closing", "closed"):
            raise self.gone("the client was closed")
        return max(1, sum(self.client.nthreads().values()))

    def result(self, future: Any) -> Any:
        """``future``'s result; ParIterError once the scheduler has not answered for the
        timeout, or the client was closed, or the runtime shut down while it waited. A task
        that failed raises its exception."""
        silent_since: float | None = None
        while True:
            self.check_open()  # tasks shorter than a poll would not see a shutdown otherwise
            try:
                return future.result(timeout=POLL_S)
            except TimeoutError:  # a shutdown meanwhile: check_open() at the loop's top
                if self.client.status == "running":
                    silent_since = None
                    continue
                if self.client.status in ("closing", "closed"):  # no answer will come
                    raise self.gone("the client was closed") from None
            except UnboundLocalError:
                # distributed's sync() can lose the race between its own timeout and the
                # result, and raise this instead of either (dask/distributed#8514): a task
                # that neither failed nor was cancelled is waited for again.
                if future.status not in ("pending", "finished"):
                    raise
                continue
            except Exception as error:
                if self.client.status == "running":
                    raise
                raise self.gone(f"the connection was lost ({type(error).__name__}: "
                                 f"{error})") from error
            now = time.monotonic()
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= self._timeout:
                raise self.gone(f"it has not answered for {now - silent_since:.1f} s")

    def hold(self, data: bytes) -> Any:
        """A future of ``data`` for tasks to take in its place: the result of a task, which
        Dask runs again elsewhere when the worker holding it dies, and which waits for workers
        as any task does (scattered data was lost with its last worker, and a scatter failed
        on a cluster without workers yet)."""
        self.check_open()
        with warnings.catch_warnings(), self.sending():
            # Sent once on purpose: Dask's hint is against repeating large data in a graph.
            warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
            return self.client.submit(held, data, pure=False)

    @contextmanager
    def sending(self) -> Iterator[None]:
        """Around a submission: an error raised because the client was closed meanwhile
        becomes the ParIterError saying so."""
        try:
            yield
        except Exception as error:
            if self.client.status != "running":
                raise self.gone(f"the client was closed ({type(error).__name__}: "
                                f"{error})") from error
            raise

    def check_open(self) -> None:
        """ParIterError once the runtime has closed this cluster (``veda.shutdown()`` or
        ``veda.init()``), whose client may stay open: no more work is sent or waited for."""
        if self._closed:
            raise shut_down_error()

    def gone(self, what: str) -> ParIterError:
        """The error of a pipeline whose scheduler stopped answering (``what`` says how), or
        whose runtime was shut down meanwhile."""
        if self._closed:
            return shut_down_error()
        return ParIterError(f"par_iter cancelled: the Dask scheduler at {self.address} went "
                            f"away: {what} (client status {self.client.status!r}, "
                            f"dask_timeout={self._timeout:g} s)")

    def gather_telemetry(self, telemetry: Telemetry) -> None:
        """Merge each worker's telemetry since the last gathering into ``telemetry``, per
        worker and device. Workers that do not answer are skipped."""
        from vedart.parallel.dask_worker import worker_telemetry

        if self.client.status != "running":
            return
        answers = self.client.run(worker_telemetry, on_error="ignore")
        for worker, (devices, deltas) in answers.items():
            source = f"{worker} ({', '.join(devices) or 'CPU'})"
            for name, delta in deltas:
                telemetry.merge_remote(source, name, delta)

    def describe(self) -> dict[str, Any]:
        """Address, dashboard link and each worker's threads and GPUs, for ``vedart info``."""
        from vedart.parallel.dask_worker import worker_devices

        info = self.client.scheduler_info()
        devices = self.client.run(worker_devices, on_error="ignore")
        dashboard = info.get("services", {}).get("dashboard")
        return {
            "address": self.address,
            "embedded": type(self.cluster).__name__ if self.cluster is not None else None,
            "dashboard": self.client.dashboard_link if dashboard else None,
            "workers": [{"address": address, "threads": worker.get("nthreads"),
                         "gpus": devices.get(address, [])}
                        for address, worker in sorted(info.get("workers", {}).items())],
        }

    def close(self) -> None:
        """Close what this runtime started; on a cluster it does not own, remove its worker
        runtimes. Idempotent."""
        from vedart.parallel.dask_worker import PLUGIN_NAME

        self._closed = True
        if self._owns_client:
            self.client.close(timeout=self._timeout)
            if self.cluster is not None:
                self.cluster.close()
            with _rings_lock:
                ring = _rings.pop(self.cluster, None) if self.cluster is not None else None
            if ring is not None:
                ring.close()
            self._owns_client, self.cluster = False, None
        elif self.client.status == "running":
            try:
                self.client.unregister_worker_plugin(PLUGIN_NAME)
            except Exception as error:  # noqa: BLE001  # the caller's cluster may be gone
                logger.info("could not remove vedart's worker runtimes: %s", error)


@dataclass
class _Submitted:
    """A task in flight (None: nothing to send, every item failed upstream), the batch it was
    given, the failures of its items that failed upstream (kept here, stand-ins sent) and,
    when the batch went through shared memory, the ring and ticket of its span, which
    :meth:`release` releases once."""

    future: Any
    batch: Batch
    upstream_failures: list[ItemFailure] = field(default_factory=list)
    ring: SharedRing | None = None
    ticket: int = -1

    def cancel(self) -> None:
        if self.future is not None:
            self.future.cancel()
        self.release()

    def release(self) -> None:
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.release(self.ticket)


class DaskReader(WindowedReader[_Submitted]):
    """Runs a fused chain of ``steps`` over upstream batches as Dask tasks (see the module
    docstring); ParIterError at construction when a function cannot be pickled.

    The window is refilled once at least one task per worker thread has room, all those tasks
    in one submission: submitted one by one, the GIL-bound map of ``bench dask`` ran 3.9-4.1x
    faster than threads on 8 workers, grouped 4.65x, where one ``client.map`` of all the same
    batches reached 6.7x (H100, 2026-11-24). Until a task has measured the items, only one
    task per worker thread is in flight, of one item each."""

    def __init__(self, upstream: Reader, steps: Sequence[Step], cluster: DaskCluster,
                 chunks: ChunkPolicy, telemetry: Telemetry) -> None:
        payload = encode_steps(steps)
        threads = cluster.threads()
        super().__init__(upstream, DASK_WINDOW_PER_THREAD * threads)
        self._chunks = chunks
        self._refill_at = threads
        # A chain that holds data (a closure over an array) goes to the cluster once, each
        # worker fetching it for its first task: sent with every task, a 76 MB closure took
        # 13.4 s over 40 items against 0.08 s on threads (2 workers, AMD EPYC, 2026-11-27).
        self._steps: Any = payload if len(payload) < HELD_CHAIN_BYTES else cluster.hold(payload)
        self._stage = ", ".join(step.label for step in steps)
        self._cluster = cluster
        self._telemetry = telemetry
        self._forced = forced_path.get()

    def _fill(self) -> None:
        self._cluster.check_open()
        if self._tasks and self._window - len(self._tasks) < self._refill_at:
            return
        # Until a task has measured the items, one single-item task per worker thread: a whole
        # window of them would each pay a Dask task's cost (10-25 ms between a GIL-bound
        # worker's tasks on the H100) for one item.
        limit = self._window if self._chunks.sized else self._refill_at
        batches: list[Batch] = []
        try:
            while len(self._tasks) + len(batches) < limit:
                batch = self._upstream.read(self._chunks.size)
                if batch is None:
                    self._ended = True
                    return
                sent, failed = without_failures(batch)
                check_batch(sent, self._stage)
                batches.append((sent, failed))
        finally:  # the batches read before a failing one still run
            self._submit(batches)

    def _submit(self, read: list[tuple[Batch, list[ItemFailure]]]) -> None:
        """Send the batches ``read`` (each with stand-ins for its upstream failures, and those)
        in one submission, and push their tasks in the order read; a batch of failures alone
        is not sent, they pass through."""
        batches = [sent for sent, failures in read if len(failures) < len(sent)]
        ring = self._cluster.shared_ring() if batches else None
        shipped = [None if ring is None else ring.ship(batch) for batch in batches]
        futures = self._map(batches, shipped, ring) if batches else []
        sent_tasks = iter(zip(futures, shipped))
        for batch, failures in read:
            future, ship = next(sent_tasks) if len(failures) < len(batch) else (None, None)
            self._push(_Submitted(future, batch, failures) if ship is None
                       else _Submitted(future, batch, failures, ring, ship[1]))

    def _map(self, batches: list[Batch], shipped: list[tuple[SharedBatch, int] | None],
             ring: SharedRing | None) -> list[Any]:
        """One task per batch, in one submission (a batch ``shipped`` through ``ring`` is sent
        as its shared-memory handle); a failed submission releases the spans shipped."""
        payloads = [batch if ship is None else ship[0] for batch, ship in zip(batches, shipped)]
        count = len(batches)
        try:
            with self._cluster.sending():
                return self._cluster.client.map(  # type: ignore[no-any-return]
                    run_batch, [self._steps] * count, payloads, [self._forced] * count,
                    pure=False)
        except Exception:
            for ship in shipped:
                if ship is not None and ring is not None:
                    ring.release(ship[1])
            raise

    def _await(self, task: _Submitted) -> Batch:
        if task.future is None:
            return with_failures(task.batch, task.upstream_failures)
        try:
            result, seconds = received(self._cluster.result(task.future))
        except ParIterError:
            raise
        except Exception as error:  # noqa: BLE001  # the task failed as a whole
            return with_failures(failed_batch(task.batch, self._stage, error),
                                 task.upstream_failures)
        finally:
            task.release()
        self._chunks.observe(max(1, len(task.batch) - len(task.upstream_failures)), seconds)
        return with_failures(result, task.upstream_failures)

    def close(self) -> None:
        submitted = list(self._tasks)
        self._tasks.clear()
        futures = [task.future for task in submitted if task.future is not None]
        if futures and self._cluster.client.status == "running":
            self._cluster.client.cancel(futures)
        if not isinstance(self._steps, bytes):  # the cluster may drop the chain it held
            self._steps.release()
        for task in submitted:
            task.release()
        super().close()
        if self._telemetry.enabled:
            try:
                self._cluster.gather_telemetry(self._telemetry)
            except Exception as error:  # noqa: BLE001  # telemetry never fails a pipeline
                logger.info("could not gather the Dask workers' telemetry: %s", error)
