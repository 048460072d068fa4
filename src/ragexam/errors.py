"""The one error tree of ragexam: every expected failure is a RagexamError.

    RagexamError              caught once by the CLI: "Error: <message>", exit 2
    ├── ConfigError           a setting is missing or invalid (API key, option values)
    │   ├── RagShapeError     the user's RAG returns what cannot be read or matched
    │   ├── LocalClientError  the HTTP client failed inside ragexam, not at the endpoint
    │   └── UnknownModel      the endpoint serves no model of that name
    ├── StoreError            the Chroma store or collection cannot be read as asked
    ├── InputFileError        an input CSV is missing, unreadable or lacks columns
    ├── OutputFileError       an existing output cannot be resumed safely, or written
    │   └── NoSpaceLeft       the run folder's disk, or the user's quota, is full
    ├── PromptError           a prompt file is missing or malformed
    ├── RowError              one row cannot be done (empty chunk, failing RAG callable)
    ├── LLMError              one call failed for good (carries attempts and raw output)
    │   ├── OutputError       the model replied, but not with valid structured output
    │   └── ContextFull       the server's context window cut the reply: not asked again
    ├── AuthError             the endpoint refused the key repeatedly: the run stops (exit 4)
    ├── EndpointError         an endpoint cannot be reached or refuses every call (exit 4)
    ├── GateFailed            a quality gate (--fail-under, --fail-on-regression) failed (exit 3)
    ├── TooManyErrors         the run finished, with more error rows than allowed (exit 1)
    ├── BatchPending          --batch-dir: requests wait for results; rerun then (exit 75)
    └── RunFolderBusy         another ragexam process is writing to the run folder

Each class says its exit code in `exit_code` (the design's "Exit codes").

Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class RagexamError(Exception):
    """Base class: an expected failure with a message that says what to do next."""

    exit_code = 2  # bad input or usage, unless a subclass says otherwise
    stops_stage = False  # met in one row, it would be met in every row: stop the stage
    label = "Error"  # how the command line introduces the message


class ConfigError(RagexamError):
    """A setting is missing or invalid."""


class RagShapeError(ConfigError):
    """The user's RAG returns what ragexam cannot read or match: every row would miss."""

    stops_stage = True


class LocalClientError(ConfigError):
    """The HTTP client failed inside ragexam (its packages disagree), not at the endpoint."""

    stops_stage = True


class UnknownModel(ConfigError):
    """The endpoint answers that it serves no model of the name asked for."""

    stops_stage = True


class StoreError(RagexamError):
    """The Chroma store or collection cannot be read as asked."""


class InputFileError(RagexamError):
    """An input CSV is missing, unreadable, or lacks required columns."""

    def __init__(self, path: Path, problem: str, line: int | None = None) -> None:
        self.path, self.line = path, line
        where = f"{path}, line {line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}")


class OutputFileError(RagexamError):
    """An existing output file cannot be resumed safely, or the run folder cannot be written."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        super().__init__(f"{path}: {problem}")


class NoSpaceLeft(OutputFileError):
    """The disk (or the quota) that holds the run folder is full."""

    def __init__(self, path: Path) -> None:
        self.path = path
        RagexamError.__init__(  # the folder first: it is the disk that needs room, not the file
            self,
            f"no space left on {path.parent} (writing {path.name}); make room and rerun the "
            "same command, every finished row is kept",
        )


class PromptError(RagexamError):
    """A prompt file is missing or malformed."""


class RowError(RagexamError):
    """One row cannot be done; it becomes an `error` row and the run goes on."""


class LLMError(RagexamError):
    """One LLM call failed for good, after `attempts` tries."""

    def __init__(
        self,
        reason: str,
        *,
        attempts: int = 1,
        raw: str | None = None,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        self.reason = reason
        self.attempts = attempts
        self.raw = raw
        self.tokens = tokens  # prompt and completion tokens the failed attempts still cost
        super().__init__(reason)


class OutputError(LLMError):
    """The model replied, but the reply is not valid structured output."""


class ContextFull(LLMError):
    """The reply was cut by the server's context window: asking again would cut it again."""


class AuthError(RagexamError):
    """The endpoint rejected the API key; every further call would fail too."""

    exit_code = 4


class EndpointError(RagexamError):
    """An endpoint cannot be reached, or refuses the call that every row needs."""

    exit_code = 4
    stops_stage = True


class GateFailed(RagexamError):
    """A quality gate failed: a figure is below its bound, or a metric regressed."""

    exit_code = 3


class TooManyErrors(RagexamError):
    """More rows ended in error than --max-error-rate allows."""

    exit_code = 1

    def __init__(
        self, errors: int, total: int, limit: float, path: Path, reason: tuple[str, int] | None
    ) -> None:
        self.errors, self.total, self.limit, self.path = errors, total, limit, path
        share = errors / total if total else 0.0
        said = f", most often ({reason[1]}): {reason[0].rstrip('.')}" if reason else ""
        super().__init__(
            f"{errors} of {total} rows ({share:.1%}) ended in error, above --max-error-rate "
            f"{limit:g}; the reasons are in the error column of {path}{said}. A rerun retries "
            "them; rows that fail the same way every time (an empty chunk, a cell that is not "
            "what the stage reads) need their input fixed, or --max-error-rate to go on"
        )


class BatchPending(RagexamError):
    """Requests wait for results under --batch-dir: a pause, not a failure (EX_TEMPFAIL)."""

    exit_code = 75
    label = "Waiting"

    def __init__(self, waiting: int, folder: str) -> None:
        self.waiting, self.folder = waiting, folder
        super().__init__(
            f"{waiting} requests wait for their results: run each file of {folder}/requests/ "
            f"(e.g. vllm run-batch -i {folder}/requests/FILE -o {folder}/results/FILE), then "
            "rerun the same command (see docs/batch.md)"
        )


class RunFolderBusy(RagexamError):
    """Another ragexam process holds the run folder's lock."""

    def __init__(self, out: Path, pid: str) -> None:
        self.out, self.pid = out, pid
        super().__init__(
            f"another ragexam (pid {pid}) is writing to {out}; wait for it to finish, "
            "or choose another --out"
        )
