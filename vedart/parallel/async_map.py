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
and joins the loop's thread.
"""

from __future__ import annotations

import asyncio
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
                 concurrency: int, chunks: ChunkPolicy) -> None:
        super().__init__(upstream, concurrency, chunks)
        self._function = function
        self.label = label
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="vedart-async-map")
        self._thread.start()

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
        # The caller's context (a veda.force block, say) applies to the call.
        self._loop.call_soon_threadsafe(self._start, item, origin, slot, task, copy_context())
        self._push(task)

    def _start(self, item: Any, origin: int, slot: _Slot, task: Task[Batch],
               context: Context) -> None:
        """On the loop: start the item's call as an asyncio task in ``context``."""
        running = context.run(self._loop.create_task, self._call(item, origin))
        running.add_done_callback(partial(_deliver, slot, task))

    async def _call(self, item: Any, origin: int) -> Batch | BaseException:
        try:
            value = self._function(item)
            if inspect.isawaitable(value):
                value = await value
        except (Exception, asyncio.CancelledError) as error:  # a cancelled await fails its item
            failure = ItemFailure(origin, self.label, error)
            return Batch([failure], [origin], {0: failure})
        except BaseException as error:  # noqa: BLE001  # raised out of the loop, it would
            return error  # stop it and leave the other items' tasks waiting forever
        return Batch([value], [origin])

    def close(self) -> None:
        super().close()
        if self._loop.is_closed() or self._thread is threading.current_thread():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


def _deliver(slot: _Slot, task: Task[Batch], running: asyncio.Task[Batch | BaseException]
             ) -> None:
    """Hand an item's outcome to its task (not run when the pipeline was closed meanwhile)."""
    if running.cancelled():  # cancelled before it started: only when the pipeline closed
        return
    slot.outcome = running.result()
    if task.claim():
        task.run()
