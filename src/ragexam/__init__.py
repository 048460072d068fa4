"""ragexam: evaluate a RAG system over an existing Chroma collection."""

from importlib.metadata import version

__version__ = version("ragexam")
