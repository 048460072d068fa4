"""The command line: every command is built from its options (options.py) and calls the API.

A command parses its arguments, hands them to the API function of the same name with a
session whose observer prints (printer.py), and turns a RagexamError into one line on stderr
and its exit code. Each command imports its stage when it runs, so `ragexam --help` does not
load every library.
"""

from __future__ import annotations

import functools
import inspect
import signal
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from ragexam.config import debug_enabled
from ragexam.errors import RagexamError
from ragexam.options import COMMANDS, SLOTS, Deprecated, Spec, hints, meta
from ragexam.stages import stopping


class Command(TyperCommand):
    """A command that takes the old spellings its options had (`run --controls` alone), and
    whose --help is shown as the flag it is."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """The arguments, with a deprecated spelling rewritten (and said) first."""
        return super().parse_args(ctx, _deprecated_argv(self.name, args))

    def get_help_option(self, ctx: Any) -> Any:
        """--help, with no "<bool>" after it: a flag takes no value."""
        return _flag(super().get_help_option(ctx))


class Group(TyperGroup):
    """The `ragexam` command itself, whose --help is shown as a flag too."""

    def get_help_option(self, ctx: Any) -> Any:
        """--help, with no "<bool>" after it."""
        return _flag(super().get_help_option(ctx))


def _flag(option: Any) -> Any:
    if option is not None:
        option.metavar = ""
    return option


app = typer.Typer(
    cls=Group,
    help="Evaluate a RAG system over a Chroma collection: run, or generate, answer, judge, stats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
HELP = {
    "run": "Run every stage in order: generate, answer, judge, stats; --limit applies to each.",
    "generate": "Write one question and ground-truth answer per chunk: qa_dataset.csv.",
    "answer": "Have the RAG system answer every question, with the source chunk's rank: "
    "answers.csv.",
    "judge": "Grade every answer against its ground truth: judgments.csv (and judge_controls.csv).",
    "stats": "Summarise per source document: summary_by_document.csv, summary.csv, report.html.",
    "compare": "Did the change help? Paired differences per metric and document: comparison.csv.",
    "calibrate": "Measure the judge against your grades: calibration.csv; or write a template "
    "to fill in.",
}


def parameters(spec: Spec) -> list[inspect.Parameter]:
    """The typer parameters of a command: its arguments, then its options by panel."""
    ordered = sorted(spec.fields(), key=lambda pair: not meta(pair[1]).argument)
    found = [_parameter(spec, slot, item) for slot, item in ordered]
    for alias in spec.aliases:  # old spellings, still taken, not shown
        hidden = typer.Option("--" + alias.old.replace("_", "-"), hidden=True)
        hint = Annotated[alias.hidden_type, hidden]  # type: ignore[name-defined]
        found.append(inspect.Parameter(alias.old, _KIND, default=None, annotation=hint))
    return found


_KIND = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _parameter(spec: Spec, slot: str, item: Any) -> inspect.Parameter:
    """One option (or argument) as typer takes it: its type, flag, help, panel and bounds."""
    shown = meta(item)
    kind = shown.cli_type or hints(SLOTS[slot])[item.name]
    text = escape(shown.help_by_command.get(spec.name, shown.help))  # "[x]" is not rich markup
    if shown.argument:
        info: Any = typer.Argument(help=text, show_default=False, metavar=item.name.upper())
    else:
        flag = shown.flag or "--" + item.name.replace("_", "-")
        extra: dict[str, Any] = {"min": shown.min, "max": shown.max}
        if kind is bool:
            extra = {"metavar": ""}  # no "<bool>": a flag takes no value
        info = typer.Option(flag, help=text, rich_help_panel=SLOTS[slot].PANEL, **extra)
    default = ... if shown.required else item.default  # ...: typer's "required"
    return inspect.Parameter(item.name, _KIND, default=default, annotation=Annotated[kind, info])


def build(spec: Spec, function: Callable[..., Any]) -> Callable[..., None]:
    """The command: parse, call the API function with a printing session, say what failed."""

    def command(**values: Any) -> None:
        from ragexam.cli.collector import held_while_starting
        from ragexam.cli.printer import printing_session

        with (
            held_while_starting(spec.name) as collector,
            printing_session(spec.name, collector) as session,
        ):
            function(**values, session=session)

    command.__name__ = spec.name
    command.__doc__ = HELP[spec.name]
    command.__signature__ = inspect.Signature(parameters(spec))  # type: ignore[attr-defined]
    return handled(command)


def handled(command: Callable[..., None]) -> Callable[..., None]:
    """Turn a RagexamError into one line on stderr and its exit code; bugs keep a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from ragexam.cli.display import say, show_warnings
        from ragexam.config import export_env_file

        show_warnings()
        try:
            export_env_file()
            with warnings.catch_warnings():
                warnings.simplefilter("always", Deprecated)
                warnings.showwarning = _say_warning
                command(*args, **kwargs)
        except RagexamError as exc:
            say(f"{exc.label}: {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            running = (  # made, a batch runs (and is billed) whatever happens here
                " The batches made keep running at the endpoint: the rerun collects them."
                if kwargs.get("batch")
                else ""
            )
            say(
                "Interrupted: every finished row is saved; rerun the same command to go on."
                + running
            )
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except Exception as exc:
            if debug_enabled():
                raise
            last = traceback.extract_tb(exc.__traceback__)[-1]
            say(
                f"Internal error: {type(exc).__name__} at {Path(last.filename).name}:"
                f"{last.lineno}. This is a bug; RAGEXAM_DEBUG=1 shows the traceback."
            )
            raise typer.Exit(2) from None

    return wrapper


def _say_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """A deprecated option's warning, as one line like every other."""
    from ragexam.cli.display import say

    say(f"Warning: {message}")


def _version(shown: bool) -> None:
    if shown:
        from ragexam import __version__

        print(f"ragexam {__version__}")
        raise typer.Exit()


@app.callback()
def _commands(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Show the version and exit.",
            callback=_version,
            is_eager=True,
            metavar="",
        ),
    ] = False,
) -> None:
    """Evaluate a RAG system over a Chroma collection: run, or generate, answer, judge, stats."""


def _commands_from_the_api() -> dict[str, Callable[..., None]]:
    """Every command, `run` first, each calling the API function of its name."""
    from ragexam import api

    built = {spec.name: build(spec, getattr(api, spec.name)) for spec in COMMANDS}
    for name, command in built.items():
        app.command(name, help=HELP[name], cls=Command)(command)
    return built


COMMAND = _commands_from_the_api()


def interruptible() -> None:
    """SIGINT and SIGTERM end a run as Ctrl-C does (exit 130), wherever it was started.

    A process a non-interactive shell starts with `&` inherits SIGINT ignored; SIGTERM is sent
    by `kill` and by CI cancelling a job. Both raise KeyboardInterrupt in the main thread, which
    winds the stage down and keeps every finished row.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    # the terminal went away (an ssh session dropped) as SIGTERM; not under nohup, which
    # ignores it so that the run goes on
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _terminated)


def _terminated(signum: int, frame: object) -> None:
    """The first SIGTERM (or SIGHUP) interrupts; the ones after wait for the stage to wind
    down (a supervisor, or an impatient user, often sends two). Ignored, not reset: Python
    resets a handler of its own to the default as it exits, which would end the process by
    the signal (exit 143), but leaves an ignored signal ignored. A running stage's main task
    is cancelled, as asyncio.run does on Ctrl-C; between stages, KeyboardInterrupt is raised."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) is _terminated:
            signal.signal(number, signal.SIG_IGN)
    stopping.MAIN.interrupt()


def _deprecated_argv(command: str | None, argv: list[str]) -> list[str]:
    """`run --controls` with no number (the control runs, before --control-runs was named)."""
    if command != "run" or "--controls" not in argv:
        return argv
    at = argv.index("--controls")
    following = argv[at + 1] if at + 1 < len(argv) else ""
    if following.isdigit():
        return argv
    from ragexam.cli.display import say

    say("Warning: run --controls with no number is deprecated: use --control-runs")
    return [*argv[:at], "--control-runs", *argv[at + 1 :]]


def main() -> None:
    """Entry point of `ragexam`."""
    interruptible()
    app(prog_name="ragexam")


def _single(name: str) -> Callable[[], None]:
    def entry() -> None:
        interruptible()
        typer.run(COMMAND[name])

    entry.__doc__ = f"Entry point of `ragexam-{name}`."
    return entry


generate_main, answer_main = _single("generate"), _single("answer")
judge_main, stats_main = _single("judge"), _single("stats")
