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

__all__ = [
    "Result",
    "__version__",
    "answer",
    "calibrate",
    "compare",
    "generate",
    "judge",
    "run",
    "stats",
]
