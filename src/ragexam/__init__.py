"""ragexam: evaluate a RAG system over an existing Chroma collection."""

from importlib.metadata import version

__version__ = version("ragexam")

from ragexam.api import Result, answer, compare, generate, judge, stats
from ragexam.pipeline import run

__all__ = ["Result", "__version__", "answer", "compare", "generate", "judge", "run", "stats"]
