"""Stopping a stage from outside its event loop: by SIGTERM in the main thread, or by Ctrl-C
in a thread that waits on a worker (an API call made inside a running event loop, a Jupyter
cell, runs in a worker, where no signal reaches it).

Either way the stage stops as asyncio.run stops it on Ctrl-C: its event loop's main task is
cancelled, the rows written are kept, and no later stage begins. An exception raised into the
loop by a signal handler could land anywhere, half way through a lock's release or a
connection pool's bookkeeping, and leave a task waiting for ever (a SIGTERM'd run hung so).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Stop:
    """A worker's stop (or the main thread's, MAIN): asked once, it ends the stage running
    and every one after it (the main thread's, the next one only: it is said once)."""

    def __init__(self) -> None:
        self.asked = False
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def ask(self) -> None:
        """Stop the worker: its running stage now, any later one before it begins."""
        with self._lock:
            self.asked = True
            running = self._running
        if running is not None:
            loop, task = running
            loop.call_soon_threadsafe(task.cancel)

    def interrupt(self) -> None:
        """Stop, from a signal handler in the thread that runs the stages: no lock (the
        handler may have interrupted that very thread holding it). Outside a stage, raise
        KeyboardInterrupt, as Ctrl-C does."""
        running = self._running
        if running is None:
            raise KeyboardInterrupt
        self.asked = True
        loop, task = running
        try:
            loop.call_soon_threadsafe(task.cancel)  # it also wakes a loop waiting in select
        except RuntimeError:  # the loop closed as the signal came: no stage runs
            self.asked = False  # said now, not again to a later stage
            raise KeyboardInterrupt from None

    def _enter(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        with self._lock:
            self._running = (loop, task)
            asked = self.asked
        if asked:  # asked while the loop was starting
            task.cancel()

    def _leave(self) -> None:
        with self._lock:
            self._running = None


_local = threading.local()
MAIN = Stop()  # the main thread's stages: SIGTERM asks it (ragexam.cli.app)


def in_worker(stop: Stop, call: Callable[[], T]) -> T:
    """Make `call` in this (worker) thread, stoppable by `stop`."""
    _local.stop = stop
    try:
        return call()
    finally:
        _local.stop = None


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), but once its stop is asked (a worker's, or the main thread's by
    SIGTERM): KeyboardInterrupt, as Ctrl-C raises in the main thread (before the loop starts,
    once its main task is cancelled, or as it ends when asked past its last await)."""
    stop: Stop | None = getattr(_local, "stop", None)
    if stop is None and threading.current_thread() is threading.main_thread():
        stop = MAIN
    if stop is None:
        return asyncio.run(main)
    if stop.asked:
        main.close()
        stop.asked = stop is not MAIN  # the main thread's stop is said once
        raise KeyboardInterrupt

    async def stoppable() -> T:
        task = asyncio.current_task()
        assert task is not None
        stop._enter(asyncio.get_running_loop(), task)
        try:
            return await main
        finally:
            stop._leave()

    try:
        result = asyncio.run(stoppable())
    except asyncio.CancelledError:
        if stop.asked:
            stop.asked = stop is not MAIN
            raise KeyboardInterrupt from None
        raise
    if stop is MAIN and stop.asked:  # asked as the stage ended, past its last await: the
        stop.asked = False  # stage is whole, and the command stops here, as asked
        raise KeyboardInterrupt
    return result
