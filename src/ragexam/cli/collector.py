"""The cycle collector, held while a command starts: the one place ragexam touches it.

Loading the stage's libraries and reading a large input build many objects and no cycles,
yet the collector's full passes over them cost `judge` on 100,000 rows 0.8 s before its first
call (bench/bench_first_call.py: 1.7 s with the collector held, 2.3-2.5 s without). So the
command line holds the collector until the first row is under way, and freezes what was built
by then: it lives as long as the command, and later passes skip it. Library code (the Python
API, a notebook) never touches the collector.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager

# What each command's stages import: loaded with the collector held, then frozen.
LIBRARIES = {
    "generate": ("ragexam.stages.generate",),
    "answer": ("ragexam.stages.answer",),
    "judge": ("ragexam.stages.judge",),
    "run": ("ragexam.stages.generate", "ragexam.stages.answer", "ragexam.stages.judge"),
}


class Collector:
    """Holds the cycle collector from the start of a command until `release`."""

    def __init__(self) -> None:
        self.held = False

    def release(self) -> None:
        """Freeze what the command built so far, and let the collector run again."""
        if self.held:
            gc.freeze()
            gc.enable()
            self.held = False


@contextmanager
def held_while_starting(command: str) -> Iterator[Collector]:
    """Hold the collector, load the command's libraries; on the way out, undo it all."""
    collector = Collector()
    if gc.isenabled():
        gc.disable()
        collector.held = True
    try:
        for module in LIBRARIES.get(command, ()):
            importlib.import_module(module)
        gc.freeze()  # before the collector runs again: its first pass would take them all
        yield collector
    finally:
        if collector.held:
            gc.enable()
        gc.unfreeze()  # a caller in the same process (a test) collects it all again
