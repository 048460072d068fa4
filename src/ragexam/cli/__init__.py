"""The command line: parse options, call the API, print what it returns."""

from ragexam.cli.app import answer_main, generate_main, judge_main, main, stats_main

__all__ = ["answer_main", "generate_main", "judge_main", "main", "stats_main"]
