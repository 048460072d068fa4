"""ragexam: evaluate a RAG system over an existing Chroma collection."""

import sys
import types
from importlib.metadata import version
from typing import Any

__version__ = version("ragexam")


class _Package(types.ModuleType):
    """This package, whose functions `generate`, `answer`, … share names with its submodules."""

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing a submodule sets it on the package; it must not hide the API function.
        if isinstance(value, types.ModuleType) and callable(self.__dict__.get(name)):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

from ragexam.api import Result, answer, compare, generate, judge, stats  # noqa: E402
from ragexam.pipeline import run  # noqa: E402

__all__ = ["Result", "__version__", "answer", "compare", "generate", "judge", "run", "stats"]
