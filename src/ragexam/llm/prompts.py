"""Prompt files: TOML in `prompts/` that declare their variables, loaded and hashed."""

from __future__ import annotations

import hashlib
import re
import string
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from pydantic import BaseModel, ValidationError, model_validator

from ragexam.errors import PromptError

# Data delimiters that a prompt wraps around untrusted text (chunks, answers, questions).
DATA_TAGS = ("chunk", "question", "answer", "ground_truth", "key_points", "context")


_DATA_TAG = re.compile(rf"<(?=\s*/?\s*(?:{'|'.join(DATA_TAGS)})(?:[\s/>]|$))", re.IGNORECASE)


class Delimited(str):
    """Text built by ragexam whose untrusted parts were already delimited and neutralised."""

    __slots__ = ()


class PromptFile(BaseModel):
    """One prompt: a system and a user template with declared variables."""

    name: str
    variables: list[str]
    system: str
    user: str

    @model_validator(mode="after")
    def _variables_match(self) -> PromptFile:
        used = _fields(self.system) | _fields(self.user)
        if used != set(self.variables):
            raise ValueError(f"templates use {sorted(used)} but declare {sorted(self.variables)}")
        return self


class Prompt:
    """A loaded prompt: its template, its declared variables and the hash of its file."""

    def __init__(self, spec: PromptFile, digest: str) -> None:
        self.name = spec.name
        self.variables = tuple(spec.variables)
        self.hash = digest
        self.template = ChatPromptTemplate.from_messages(
            [("system", spec.system.strip()), ("human", spec.user.strip())]
        )

    def fill(self, **values: str) -> dict[str, str]:
        """The template's inputs, with data delimiters inside values neutralised."""
        missing = set(self.variables) - values.keys()
        if missing:
            raise PromptError(f"prompt {self.name!r} needs values for {sorted(missing)}")
        return {
            name: values[name] if isinstance(values[name], Delimited) else neutralise(values[name])
            for name in self.variables
        }


def neutralise(text: str) -> str:
    """Stop data from opening or closing a delimiter: `</chunk>` in a chunk becomes `&lt;/chunk>`.

    In any case and spacing (`</ANSWER>`, `< /Answer >`), as a model reads them all alike.
    """
    return _DATA_TAG.sub(r"&lt;", text)


def context_block(texts: list[str]) -> Delimited:
    """Retrieved chunks as numbered <chunk> blocks, each neutralised."""
    blocks = (
        f'<chunk rank="{rank}">\n{neutralise(text)}\n</chunk>'
        for rank, text in enumerate(texts, start=1)
    )
    return Delimited("\n".join(blocks))


def system_as_user(messages: list[BaseMessage]) -> list[BaseMessage]:
    """The system text moved to the head of the first user message (RAGEXAM_SYSTEM_PROMPT=user)."""
    # Some chat templates (llama-cpp-python's gemma format) silently drop system messages.
    system = [str(m.content) for m in messages if isinstance(m, SystemMessage)]
    rest = [m for m in messages if not isinstance(m, SystemMessage)]
    first = next((i for i, m in enumerate(rest) if isinstance(m, HumanMessage)), None)
    if not system or first is None:
        return messages
    merged = HumanMessage(content="\n\n".join([*system, str(rest[first].content)]))
    return [*rest[:first], merged, *rest[first + 1 :]]


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def prompts_dir() -> Path:
    """Where the prompt files are: packaged in a wheel, or `prompts/` in a checkout."""
    packaged = Path(str(resources.files("ragexam"))) / "prompts"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[3] / "prompts"


@cache
def load_prompt(name: str, directory: Path | None = None) -> Prompt:
    """Load and validate `prompts/<name>.toml`."""
    path = (directory or prompts_dir()) / f"{name}.toml"
    try:
        raw = path.read_bytes()
        spec = PromptFile.model_validate(tomllib.loads(raw.decode("utf-8")))
    except OSError as exc:
        raise PromptError(f"cannot read prompt file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, ValidationError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0]
        raise PromptError(f"prompt file {path} is malformed: {first}") from None
    return Prompt(spec, hashlib.sha256(raw).hexdigest()[:16])
