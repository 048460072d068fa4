"""Run `ragexam ARGS` and die as `kill -9` makes a process die (os._exit: nothing flushed,
nothing closed, no handler run) at a chosen step of the batch road.

    python tests/dying.py POINT N ARGS...

POINT is `settle` (once the Nth row is settled), `create` (once the endpoint made the Nth
batch, before the ledger records it) or `event:NAME` (once the Nth ledger event NAME is on
disk). RAGEXAM_TEST_HELD_BYTES sets how much the row log holds before it writes,
RAGEXAM_TEST_SHARD_LINES how many requests a shard holds.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ragexam.cli import main
from ragexam.io import batchfiles, rowlog
from ragexam.io.ledger import Ledger
from ragexam.stages.runner import Runner

KILLED = 137  # a shell's exit code of a process killed by SIGKILL


def die_after(owner: Any, name: str, counts: Any, n: int) -> None:
    """Make owner.name die once `counts(*args)` has been true n times, after it ran."""
    real, seen = getattr(owner, name), [0]

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, *args, **kwargs)
        if counts(*args, **kwargs):
            seen[0] += 1
            if seen[0] == n:
                os._exit(KILLED)
        return result

    setattr(owner, name, wrapped)


if __name__ == "__main__":
    point, n, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if "RAGEXAM_TEST_HELD_BYTES" in os.environ:
        rowlog.HELD_BYTES = int(os.environ["RAGEXAM_TEST_HELD_BYTES"])
    if "RAGEXAM_TEST_SHARD_LINES" in os.environ:
        batchfiles.MAX_LINES = int(os.environ["RAGEXAM_TEST_SHARD_LINES"])
    if point == "settle":
        die_after(Runner, "settle", lambda *_: True, n)
    elif point == "create":  # once the endpoint made the Nth batch, before the ledger knows
        from ragexam.llm.batchapi import BatchApi

        made, real = [0], BatchApi.create

        async def create(self: Any, *args: Any, **kwargs: Any) -> Any:
            batch = await real(self, *args, **kwargs)
            made[0] += 1
            if made[0] == n:
                os._exit(KILLED)
            return batch

        BatchApi.create = create  # type: ignore[method-assign]
    else:
        event = point.removeprefix("event:")
        die_after(Ledger, "record", lambda kind, **_: kind == event, n)
    sys.argv = ["ragexam", *args]
    main()
