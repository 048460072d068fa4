"""Every command's options, declared once, for the command line and the Python API alike.

An option is a field of one of the groups below: its name (`max_error_rate` is
`--max-error-rate`), its type, its default and its help. A command takes the fields of the
groups its `Spec` names. The CLI builds its typer options from them (cli/app.py), grouped in
`--help` by panel; the API functions take them as keyword arguments (api.py); both resolve to
a `Given`, the plain values every layer below reads.

    Given                        what one command was given, every group at its defaults
    ├── Folder   --out --seed
    ├── Store    --chroma --chroma-url --collection --chroma-tenant --chroma-database ...
    ├── Calls    --model --concurrency --limit --max-error-rate --rpm --tpm --force --batch ...
    ├── Exam     --doc-key --sample --per-document --validation --check --multi-hop ...
    ├── Answering --k --embedding --rag --rag-timeout --context --texts
    ├── Inputs   --qa-dataset --answers
    ├── Grading  --samples --temperature --scale --controls --control-runs
    └── Summary  --split --exclude-flagged --fail-under
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ragexam.config import AnswerContext, LabelScale, Scale, StructuredMethod
from ragexam.errors import ConfigError

DEFAULT_K = 5  # chunks retrieved per question, and the metrics' cutoff when answer recorded none


@dataclass(frozen=True)
class Meta:
    """How an option shows: its help, its flag when not `--field-name`, and its bounds."""

    help: str
    flag: str | None = None
    min: float | None = None
    max: float | None = None
    argument: bool = False  # a positional argument on the command line
    required: bool = False  # no default: the command needs it (its field's None is "not given")
    cli_type: Any = None  # the CLI's type when the API takes more (a RAG object)
    help_by_command: Mapping[str, str] = field(default_factory=dict)  # where it reads otherwise


def option(default: Any, help: str, **meta: Any) -> Any:
    """A field that is an option: its default, and how it shows on the command line."""
    return field(default=default, metadata={"option": Meta(help, **meta)})


def meta(item: dataclasses.Field[Any]) -> Meta:
    """The option's Meta."""
    found: Meta = item.metadata["option"]
    return found


@dataclass(frozen=True, kw_only=True)
class Folder:
    """Where results go."""

    PANEL: ClassVar[str] = "Run folder"
    out: Path = option(Path("outputs"), "Run folder for every file.")
    seed: int = option(
        0, "Seed of the draws this command makes: sample, split, controls, resampling."
    )


@dataclass(frozen=True, kw_only=True)
class Store:
    """The Chroma store the exam comes from, and how its chunks are read."""

    PANEL: ClassVar[str] = "Store"
    chroma: Path | None = option(None, "Chroma persist directory.")
    chroma_url: str | None = option(None, "Chroma server URL instead.")
    collection: str | None = option(None, "May be left out if only one.")
    chroma_tenant: str | None = option(
        None, "The server's tenant [CHROMA_TENANT, else its default]."
    )
    chroma_database: str | None = option(
        None, "The server's database [CHROMA_DATABASE, else its default]."
    )
    max_chunk_chars: int = option(8000, "Truncate longer chunks.", min=100)
    trust_store_endpoint: bool = option(False, "Let the store's embedding function send its key.")

    @property
    def given(self) -> bool:
        """True when the options point at a store."""
        return self.chroma is not None or self.chroma_url is not None


@dataclass(frozen=True, kw_only=True)
class Calls:
    """How the LLM calls are made."""

    PANEL: ClassVar[str] = "Calls"
    model: str | None = option(None, "Chat model for this stage [RAGEXAM_MODEL].")
    concurrency: int | None = option(None, "Calls in flight [16].", min=1)
    limit: int | None = option(None, "Only the first N rows.", min=1)
    max_error_rate: float | None = option(
        None, "Exit 1 above this share of error rows [0.05].", min=0, max=1
    )
    structured_output: StructuredMethod | None = option(
        None, "How to ask for structured output [json_schema]."
    )
    rpm: int | None = option(None, "Pace calls to N requests a minute.", min=1)
    tpm: int | None = option(None, "Pace calls to N tokens a minute.", min=1)
    force: bool = option(False, "Redo rows made with another model, prompt or setting.")
    dry_run: bool = option(False, "Estimate calls, tokens and cost; call nothing.")
    batch: bool = option(
        False, "Send the calls through the endpoint's Batch API: half the price, within 24 h."
    )
    batch_dir: Path | None = option(
        None,
        "Write the calls as batch files in DIR/requests, merge DIR/results; exit 75 till done.",
    )


@dataclass(frozen=True, kw_only=True)
class Exam:
    """How the exam is written."""

    PANEL: ClassVar[str] = "Writing the exam"
    doc_key: str | None = option(None, "Metadata field naming the document.")
    sample: int | None = option(None, "N chunks, stratified by document.", min=1)
    per_document: int | None = option(None, "N chunks from every document.", min=1)
    validation: float | None = option(
        None, "Share of each document's questions in the validation split.", min=0, max=1
    )
    check: bool = option(False, "One critic call per row: flag bad questions.")
    multi_hop: int | None = option(
        None, "N more questions that need two chunks, each kept only when verified.", min=1
    )
    unanswerable: int | None = option(
        None, "N more questions the store cannot answer, each kept only when verified.", min=1
    )
    exam_temperature: float = option(
        0.0, "Temperature of the exam writer: 0 writes the same exam again.", min=0, max=2
    )


@dataclass(frozen=True, kw_only=True)
class Answering:
    """How the RAG system sits the exam."""

    PANEL: ClassVar[str] = "Answering"
    k: int | None = option(
        None,
        f"Chunks retrieved per question, and the metrics' cutoff [{DEFAULT_K}].",
        min=1,
        help_by_command={
            "answer": f"Chunks to retrieve per question [{DEFAULT_K}].",
            "stats": f"Metrics cutoff [answer's k, else {DEFAULT_K}].",
        },
    )
    embedding: str | None = option(
        None,
        "collection (the store's own) or openai:MODEL [collection].",
        help_by_command={
            "generate": "How --unanswerable's check embeds its questions: collection or "
            "openai:MODEL [collection]."
        },
    )
    rag: Any = option(None, "Your RAG system as module:callable.", cli_type=str | None)
    rag_timeout: float | None = option(None, "Seconds per --rag call [RAGEXAM_TIMEOUT].", min=0.001)
    context: AnswerContext = option(
        AnswerContext.retrieved, "retrieved chunks, the source chunk alone, or none."
    )
    texts: bool = option(
        True, "Record retrieved_texts and source_text in answers.csv.", flag="--texts/--no-texts"
    )


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """Files a stage reads from elsewhere than the run folder."""

    PANEL: ClassVar[str] = "Run folder"
    qa_dataset: Path | None = option(
        None,
        "Questions [OUT/qa_dataset.csv].",
        help_by_command={"run": "Sit this exam instead of writing one [OUT/qa_dataset.csv]."},
    )
    answers: Path | None = option(None, "Answers [OUT/answers.csv].")


@dataclass(frozen=True, kw_only=True)
class Grading:
    """How the judge grades, and how it is checked."""

    PANEL: ClassVar[str] = "Grading"
    samples: int = option(1, "Grade each answer N times.", min=1)
    temperature: float | None = option(
        None, "Judge temperature [0, or 0.7 with --samples > 1].", min=0, max=2
    )
    scale: Scale | None = option(
        None,
        "key-points: a verdict per key point, grades counted; unit: floats 0..1; ten: integers "
        "0..10 [key-points when the exam has key points, else unit].",
    )
    with_context: bool = option(
        False,
        "Key points: the judge also sees the retrieved chunks (lost in generation or "
        "in retrieval?).",
    )
    controls: int = option(
        10, "Grade 4 known answers and 4 injections to N sampled questions; 0: none.", min=0
    )
    control_runs: bool = option(
        False, "Also answer and judge with gold context and closed-book (OUT/gold, ...)."
    )


@dataclass(frozen=True, kw_only=True)
class Summary:
    """What the summary covers, and the gates it must pass."""

    PANEL: ClassVar[str] = "Summary"
    split: str | None = option(None, "Only this split, e.g. test.")
    exclude_flagged: bool = option(False, "Leave flagged questions out of every mean.")
    fail_under: str | None = option(None, "Exit 3 if an overall figure is below: METRIC=VALUE,...")


@dataclass(frozen=True, kw_only=True)
class Comparing:
    """The two runs compared."""

    PANEL: ClassVar[str] = "Comparing"
    run_a: Path | None = option(None, "The earlier run folder.", argument=True, required=True)
    run_b: Path | None = option(None, "The later run folder.", argument=True, required=True)
    out: Path | None = option(None, "Where comparison.csv goes [RUN_B].")
    seed: int = option(0, "Seed of the resampling.")
    fail_on_regression: bool = option(
        False, "Exit 3 if a metric got worse: 95% CI wholly below zero, and p < 0.05."
    )


@dataclass(frozen=True, kw_only=True)
class Calibrating:
    """A person's grades, against the judge's."""

    PANEL: ClassVar[str] = "Calibrating"
    labels: Path | None = option(
        None, "Your grades: qa_id, completeness and/or conciseness.", argument=True
    )
    scale: LabelScale = option(LabelScale.unit, "Your labels: unit (0..1) or ten (0..10).")
    template: int | None = option(None, "Write labels_template.csv: N questions to grade.", min=1)


GROUPS = (Folder, Store, Calls, Exam, Answering, Inputs, Grading, Summary, Comparing, Calibrating)
G = TypeVar("G")


@dataclass(frozen=True)
class Given:
    """Everything one command was given: each group, at its defaults where not given."""

    folder: Folder = Folder()
    store: Store = Store()
    calls: Calls = Calls()
    exam: Exam = Exam()
    answering: Answering = Answering()
    inputs: Inputs = Inputs()
    grading: Grading = Grading()
    summary: Summary = Summary()
    comparing: Comparing = Comparing()
    calibrating: Calibrating = Calibrating()

    @property
    def out(self) -> Path:
        """The run folder."""
        return self.folder.out

    def but(self, **changes: Any) -> Given:
        """A copy with some options changed, by name, in whichever group holds them first."""
        groups: dict[str, Any] = {}
        for name, value in changes.items():
            slot = next((s for s, cls in SLOTS.items() if name in _names(cls)), None)
            if slot is None:
                raise TypeError(f"no option {name!r}")
            groups[slot] = dataclasses.replace(
                groups.get(slot) or getattr(self, slot), **{name: value}
            )
        return dataclasses.replace(self, **groups)


SLOTS: dict[str, Any] = {  # each group class, by its field of Given
    "folder": Folder,
    "store": Store,
    "calls": Calls,
    "exam": Exam,
    "answering": Answering,
    "inputs": Inputs,
    "grading": Grading,
    "summary": Summary,
    "comparing": Comparing,
    "calibrating": Calibrating,
}


def _names(group: type) -> list[str]:
    return [item.name for item in dataclasses.fields(group)]


@dataclass(frozen=True)
class Alias:
    """An old spelling of an option, still taken, with a warning that says what to use."""

    old: str  # as a keyword (judge_controls); the flag is --judge-controls
    new: str
    hidden_type: Any = None  # the CLI type of a hidden alias option; None: no hidden option
    convert: Callable[[Any], Any] = field(default=lambda value: value)  # old value -> new

    def message(self, value: Any) -> str:
        """What the warning says."""
        return f"{_flag(self.old)} is deprecated: use {_flag(self.new)}"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class Deprecated(FutureWarning):
    """An option given under an old spelling; shown to users (FutureWarning is, by default)."""


@dataclass(frozen=True)
class Spec:
    """A command's options: the groups it takes, less the fields it leaves out."""

    name: str
    groups: tuple[str, ...]
    leave_out: frozenset[str] = frozenset()
    only: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    positional: tuple[str, ...] = ()  # taken by position in the API (chroma; run_a, run_b)
    aliases: tuple[Alias, ...] = ()

    def fields(self) -> list[tuple[str, dataclasses.Field[Any]]]:
        """(slot, field) of every option, in the order --help shows them."""
        taken = []
        for slot in self.groups:
            wanted = self.only.get(slot)
            for item in dataclasses.fields(SLOTS[slot]):
                if item.name not in self.leave_out and (wanted is None or item.name in wanted):
                    taken.append((slot, item))
        return taken

    def names(self) -> list[str]:
        """The options' names."""
        return [item.name for _, item in self.fields()]

    def resolve(self, values: Mapping[str, Any]) -> Given:
        """The Given of these options by name (the rest at their defaults); TypeError on a
        name this command does not take, as Python gives for a wrong keyword."""
        values = self._renamed(values)
        where = {item.name: slot for slot, item in self.fields()}
        missing = [
            n
            for s, item in self.fields()
            if meta(item).required and values.get(n := item.name) is None
        ]
        if missing:
            raise TypeError(f"{self.name}() is missing the required argument {missing[0]!r}")
        unknown = [name for name in values if name not in where]
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(where), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{self.name}() got an unexpected option {unknown[0]!r}{hint}")
        by_slot: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            typed = _typed(SLOTS[where[name]], name, value)
            by_slot.setdefault(where[name], {})[name] = _bounded(self.option(name), name, typed)
        groups = {slot: SLOTS[slot](**fields) for slot, fields in by_slot.items()}
        return Given(**groups)

    def option(self, name: str) -> Meta:
        """How the option `name` shows, bounds included."""
        return next(meta(item) for _, item in self.fields() if item.name == name)

    def _renamed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values with old spellings under their new names, each with its warning."""
        renamed = dict(values)
        names = self.names()
        if "control_runs" in names and isinstance(renamed.get("controls"), bool):
            warnings.warn(Alias("controls", "control_runs").message(True), Deprecated, 4)
            renamed["control_runs"] = renamed.pop("controls")
        for alias in self.aliases:
            if alias.old in renamed and (value := renamed.pop(alias.old)) is not None:
                warnings.warn(alias.message(value), Deprecated, stacklevel=4)
                renamed[alias.new] = alias.convert(value)
        split = renamed.get("split")
        if "validation" in names and split is not None and _is_share(split):
            message = "--split with a share (a number) is deprecated: use --validation"
            warnings.warn(message, Deprecated, stacklevel=4)
            renamed["validation"] = float(renamed.pop("split"))
        return renamed


@functools.cache
def hints(group: type) -> dict[str, Any]:
    """The types of a group's options, evaluated once (its annotations are strings)."""
    return typing.get_type_hints(group)


def _typed(group: type, name: str, value: Any) -> Any:
    """A value as its option's type holds it: a path for a str, an enum for its value; a
    value of another type is refused (TypeError naming the option), as the command line
    refuses `--limit three`: a "false" taken for True, a "3" compared with numbers deep
    inside, were a silent redo or a library's traceback."""
    if value is None:
        return value
    kind = hints(group)[name]
    options = typing.get_args(kind) or (kind,)
    for option in options:
        if option is Path and isinstance(value, str | os.PathLike):
            return Path(value)
        if isinstance(option, type) and issubclass(option, Enum) and not isinstance(value, option):
            if isinstance(value, bool):
                continue
            try:
                return option(value)
            except ValueError:
                choices = ", ".join(str(member.value) for member in option)
                raise ConfigError(f"{name}={value!r} is not one of {choices}") from None
    if not any(_holds(option, value) for option in options):
        wanted = " or ".join(_KINDS[option] for option in options if option in _KINDS)
        raise TypeError(f"{name}={value!r} is not {wanted or 'of the type it takes'}")
    return value


_KINDS = {bool: "True or False", int: "a whole number", float: "a number", str: "a text"}
_KINDS |= {Path: "a path"}


def _holds(option: Any, value: Any) -> bool:
    """Whether an option of this type takes the value as it is (a path or an enum: once
    made from its text, above)."""
    if option is Any:
        return True
    if option is type(None):
        return False
    if isinstance(option, type) and issubclass(option, Enum | Path):
        return isinstance(value, option)
    if option not in _KINDS:  # a type not checked here
        return True
    if isinstance(value, bool):
        return option is bool
    return isinstance(value, float | int if option is float else option)


def _bounded(shown: Meta, name: str, value: Any) -> Any:
    """The value, within the option's bounds (the API's as the command line's), or ConfigError."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    low = shown.min is not None and value < shown.min
    if low or (shown.max is not None and value > shown.max):
        bounds = [f">= {shown.min:g}" if shown.min is not None else ""]
        bounds.append(f"<= {shown.max:g}" if shown.max is not None else "")
        wanted = " and ".join(bound for bound in bounds if bound)
        raise ConfigError(f"{_flag(name)} {value:g} is out of range: it must be {wanted}")
    return value


def _share(value: Any) -> float:
    """generate's old --split F: a share of each document's questions."""
    if not _is_share(value):
        raise ConfigError(f"--split {value} on generate must be a share, e.g. --validation 0.2")
    return float(value)


def _is_share(value: Any) -> bool:
    """True for a number (or its text) that --split took before it named a split."""
    try:
        return not isinstance(value, bool) and 0 < float(value) < 1
    except (TypeError, ValueError):
        return False


GENERATE = Spec(
    "generate",
    ("store", "exam", "answering", "calls", "folder"),
    only={"answering": ("embedding",)},  # --unanswerable's check retrieves, as answer does
    positional=("chroma",),
    aliases=(Alias("split", "validation", str | None, lambda value: _share(value)),),
)
ANSWER = Spec(
    "answer",
    ("store", "answering", "inputs", "calls", "folder"),
    leave_out=frozenset({"answers", "structured_output", "seed"}),
    positional=("chroma",),
)
JUDGE = Spec(
    "judge", ("grading", "inputs", "calls", "folder"), leave_out=frozenset({"control_runs"})
)
STATS = Spec("stats", ("summary", "answering", "folder"), only={"answering": ("k",)})
RUN = Spec(
    "run",
    ("store", "exam", "answering", "grading", "summary", "inputs", "calls", "folder"),
    leave_out=frozenset({"answers"}),
    positional=("chroma",),
    aliases=(Alias("judge_controls", "controls", int | None),),
)
COMPARE = Spec("compare", ("comparing",), positional=("run_a", "run_b"))
CALIBRATE = Spec("calibrate", ("calibrating", "folder"), positional=("labels",))
COMMANDS = (RUN, GENERATE, ANSWER, JUDGE, STATS, COMPARE, CALIBRATE)
