"""Calls with a deadline: blocking calls run in daemon threads, so a hung one can be left behind.

A call into Chroma or into the user's RAG callable may never return (a server that accepts
and never answers, a function that sleeps). A thread cannot be killed, but a daemon thread
can be abandoned: the caller stops waiting at the deadline, and the process can still exit,
at once on Ctrl-C, without joining it (an executor's threads would be joined at exit).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The call did not return within its deadline; it may still be running, abandoned."""


def _start(
    function: Callable[..., T], args: tuple[Any, ...], done: Callable[[Any, Any], None]
) -> None:
    def target() -> None:
        try:
            result = function(*args)
        except BaseException as exc:  # handed to the caller, who re-raises it
            done(None, exc)
        else:
            done(result, None)

    threading.Thread(target=target, name="ragexam-deadline", daemon=True).start()


def call_with_deadline(function: Callable[..., T], seconds: float, *args: Any) -> T:
    """`function(*args)` in a daemon thread; DeadlineExceeded after `seconds`."""
    finished = threading.Event()
    outcome: list[Any] = [None, None]

    def done(result: Any, error: Any) -> None:
        outcome[:] = [result, error]
        finished.set()

    _start(function, args, done)
    if not finished.wait(seconds):
        raise DeadlineExceeded(f"no answer within {seconds:g}s")
    if outcome[1] is not None:
        raise outcome[1]
    return outcome[0]  # type: ignore[no-any-return]


async def await_with_deadline(function: Callable[..., T], seconds: float, *args: Any) -> T:
    """`function(*args)` in a daemon thread, awaited; DeadlineExceeded after `seconds`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: Any) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def done(result: Any, error: Any) -> None:
        with suppress(RuntimeError):  # a closed loop: the caller left long ago
            loop.call_soon_threadsafe(settle, result, error)

    _start(function, args, done)
    try:
        return await asyncio.wait_for(future, seconds)
    except TimeoutError:
        raise DeadlineExceeded(f"no answer within {seconds:g}s") from None
