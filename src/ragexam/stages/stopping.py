"""Ctrl-C for stages run in a worker thread: an API call made inside a running event loop
(a Jupyter cell) runs there, where no signal reaches it.

The thread that called waits on the worker; a KeyboardInterrupt there (the kernel's
"interrupt") stops the worker's stage as Ctrl-C stops one in the main thread: its event loop's
main task is cancelled, the rows written are kept, and no later stage begins.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Stop:
    """A worker's stop: asked once, it ends the stage running and every one after it."""

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


def in_worker(stop: Stop, call: Callable[[], T]) -> T:
    """Make `call` in this (worker) thread, stoppable by `stop`."""
    _local.stop = stop
    try:
        return call()
    finally:
        _local.stop = None


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), but in a worker whose stop was asked: KeyboardInterrupt, as Ctrl-C
    raises in the main thread (before the loop starts, or once its main task is cancelled)."""
    stop: Stop | None = getattr(_local, "stop", None)
    if stop is None:
        return asyncio.run(main)
    if stop.asked:
        main.close()
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
        return asyncio.run(stoppable())
    except asyncio.CancelledError:
        if stop.asked:
            raise KeyboardInterrupt from None
        raise
