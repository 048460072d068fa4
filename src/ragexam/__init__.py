"""ragexam: evaluate a RAG system over an existing Chroma collection."""

from importlib.metadata import version

__version__ = version("ragexam")

from ragexam.api import (
    Result,
    answer,
    calibrate,
    compare,
    generate,
    judge,
    run,
    stats,
)
from ragexam.stages.session import Observer, Session

__all__ = [
    "Observer",
    "Result",
    "Session",
    "__version__",
    "answer",
    "calibrate",
    "compare",
    "generate",
    "judge",
    "run",
    "stats",
]
