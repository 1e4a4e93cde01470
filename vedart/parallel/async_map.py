"""The ``async_map`` stage: ``f(item)`` for each item, awaited concurrently on one event loop.

Each pipeline run gets an event loop of its own on a thread of its own, started when the
terminal starts and closed with the pipeline. Per item, in input order, the stage starts
``f(item)`` on the loop; when the call returns an awaitable (an ``async def`` function, or a
plain one returning a coroutine or future) the item's result is what it gives, otherwise the
value itself. At most ``concurrency`` items are in flight at once (started and not yet
delivered downstream), and results come out in input order whatever order they finish in.

A plain function runs on the loop's thread, between the awaits of the others: it holds them
up while it runs, so CPU work belongs in ``map``. An item whose call raises an Exception
becomes an :class:`~vedart.parallel.batch.ItemFailure` naming this stage, as in the other
stages; KeyboardInterrupt, SystemExit and the like reach the terminal's caller as they are.
Closing the pipeline early cancels the calls still under way (their ``finally`` blocks run)
and joins the loop's thread. Shutting the runtime down (``veda.shutdown()``, ``veda.init()``)
does the same to a pipeline still running, which raises ``ParIterError`` as a ``map`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from contextvars import Context, copy_context
from functools import partial
from typing import Any

from vedart.parallel.batch import Batch, ItemFailure, Reader
from vedart.parallel.scheduler import ChunkPolicy, ItemwiseReader
from vedart.tasks import Task

DEFAULT_CONCURRENCY = 64  # calls in flight: enough to overlap network or disk waits widely
_SHUT_DOWN = object()  # a call's outcome when the runtime's shutdown cancelled it


class _Slot:
    """Where an item's outcome lands before its task hands it over: its batch, or an exception
    that is no item failure (KeyboardInterrupt, SystemExit), raised to the terminal's caller."""

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome: Batch | BaseException | None = None

    def take(self) -> Batch:
        assert self.outcome is not None
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class AsyncMapReader(ItemwiseReader):
    """The async_map stage (see the module docstring)."""

    def __init__(self, upstream: Reader, function: Callable[[Any], Any], label: str,
                 concurrency: int, chunks: ChunkPolicy,
                 attach: Callable[[AsyncMapReader], None]) -> None:
        """``attach(self)`` has the runtime :meth:`stop` the stage when it shuts down (it
        raises ParIterError when the runtime is shut down already)."""
        super().__init__(upstream, concurrency, chunks)
        self._function = function
        self.label = label
        self._stopped = False  # the runtime shut down: no item is started any more
        self._dispatching = threading.Lock()  # no item is sent to the loop once stopped
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="vedart-async-map")
        self._thread.start()
        try:
            attach(self)
        except BaseException:  # shut down already: the loop's thread ends here
            self._stop_loop()
            self._thread.join()
            raise

    def _serve(self) -> None:
        """The loop's thread: run until :meth:`close` stops the loop, then cancel what is left
        and let it finish."""
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.wait(left))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def _dispatch(self, item: Any, origin: int) -> None:
        if isinstance(item, ItemFailure):
            self._push(Task.completed(Batch([item], [origin], {0: item})))
            return
        slot = _Slot()
        task: Task[Batch] = Task(slot.take, helpable=False)
        with self._dispatching:
            if self._stopped:
                task = Task.cancelled()
            else:  # the caller's context (a veda.force block, say) applies to the call
                self._loop.call_soon_threadsafe(self._start, item, origin, slot, task,
                                                copy_context())
            self._push(task)

    def _start(self, item: Any, origin: int, slot: _Slot, task: Task[Batch],
               context: Context) -> None:
        """On the loop: start the item's call as an asyncio task in ``context`` (not when the
        runtime has shut down since the item was sent)."""
        if self._stopped:
            task.cancel()
            return
        running = context.run(self._loop.create_task, self._call(item, origin))
        running.add_done_callback(partial(_deliver, slot, task))

    async def _call(self, item: Any, origin: int) -> Batch | BaseException | object:
        try:
            value = self._function(item)
            if inspect.isawaitable(value):
                value = await value
        except (Exception, asyncio.CancelledError) as error:  # a cancelled await fails its item
            if self._stopped and isinstance(error, asyncio.CancelledError):
                return _SHUT_DOWN
            failure = ItemFailure(origin, self.label, error)
            return Batch([failure], [origin], {0: failure})
        except BaseException as error:  # noqa: BLE001  # raised out of the loop, it would
            return error  # stop it and leave the other items' tasks waiting forever
        return Batch([value], [origin])

    def stop(self) -> None:
        """The runtime shut down: cancel the items not delivered yet (the terminal raises
        ParIterError) and stop the loop, which cancels the calls under way; :meth:`close`
        joins its thread."""
        with self._dispatching:
            self._stopped = True
            for task in list(self._tasks):  # a copy: the terminal's thread takes from it
                task.cancel()
        self._stop_loop()

    def close(self) -> None:
        super().close()
        if self._thread is threading.current_thread():
            return
        self._stop_loop()
        self._thread.join()

    def _stop_loop(self) -> None:
        with contextlib.suppress(RuntimeError):  # closed already
            self._loop.call_soon_threadsafe(self._loop.stop)


def _deliver(slot: _Slot, task: Task[Batch],
             running: asyncio.Task[Batch | BaseException | object]) -> None:
    """Hand an item's outcome to its task (not run when the pipeline was closed meanwhile;
    cancelled when the runtime's shutdown cancelled its call)."""
    if running.cancelled():  # cancelled before it started: only when the pipeline closed
        return
    outcome = running.result()
    if outcome is _SHUT_DOWN:
        task.cancel()
        return
    slot.outcome = outcome  # type: ignore[assignment]
    if task.claim():
        task.run()
