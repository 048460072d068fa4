"""Prompt files: TOML in `prompts/` that declare their variables, loaded and hashed."""

from __future__ import annotations

import hashlib
import re
import string
import tomllib
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.prompts.chat import HumanMessagePromptTemplate, SystemMessagePromptTemplate
from pydantic import BaseModel, PrivateAttr, ValidationError, model_validator

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


class PlainTemplate(ChatPromptTemplate):
    """A ChatPromptTemplate whose messages are plain `{name}` text, formatted with str.format.

    The messages are ChatPromptTemplate's own, equal to what it makes (a test holds it to
    that), without its per-call machinery: ~20 µs a row, which at a million batch requests was
    half the time of writing their shards.
    """

    _parts: list[tuple[type[BaseMessage], str]] | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        """Note each message's class and text, when every one is plain."""
        super().model_post_init(context)
        parts = [_plain(message) for message in self.messages]
        if not self.partial_variables and all(part is not None for part in parts):
            self._parts = [part for part in parts if part is not None]

    @property
    def plain(self) -> bool:
        """Whether every message is plain `{name}` text: each value goes in as it is."""
        return self._parts is not None

    def format_messages(self, **kwargs: Any) -> list[BaseMessage]:
        """The messages, with these values in."""
        if self._parts is None:
            return super().format_messages(**kwargs)
        return [kind(content=text.format(**kwargs)) for kind, text in self._parts]


_KINDS: dict[type[Any], type[BaseMessage]] = {
    SystemMessagePromptTemplate: SystemMessage,
    HumanMessagePromptTemplate: HumanMessage,
}


def _plain(message: Any) -> tuple[type[BaseMessage], str] | None:
    """(class, text) of a message template of plain f-string text, else None."""
    kind = _KINDS.get(type(message))
    prompt = getattr(message, "prompt", None)
    if kind is None or message.additional_kwargs or not isinstance(prompt, PromptTemplate):
        return None
    if prompt.template_format != "f-string" or prompt.partial_variables:
        return None
    fields = [(n, f, c) for _, n, f, c in string.Formatter().parse(prompt.template) if n]
    simple = all(
        name.isidentifier() and not spec and not conversion for name, spec, conversion in fields
    )
    return (kind, prompt.template) if simple else None


class Prompt:
    """A loaded prompt: its template, its declared variables and the hash of its file."""

    def __init__(self, spec: PromptFile, digest: str) -> None:
        self.name = spec.name
        self.variables = tuple(spec.variables)
        self.hash = digest
        template = PlainTemplate.from_messages(
            [("system", spec.system.strip()), ("human", spec.user.strip())]
        )
        assert isinstance(template, PlainTemplate)  # from_messages makes its own class
        self.template = template

    @property
    def plain(self) -> bool:
        """Whether each value goes into the messages as it is (no format spec, no conversion)."""
        return self.template.plain

    def fill(self, **values: str) -> dict[str, str]:
        """The template's inputs, with data delimiters inside values neutralised."""
        return self.filled(values)

    def filled(self, values: Mapping[str, str]) -> dict[str, str]:
        """`fill`, from a mapping of the values."""
        try:
            return {
                name: value if isinstance(value := values[name], Delimited) else neutralise(value)
                for name in self.variables
            }
        except KeyError:
            missing = sorted(set(self.variables) - values.keys())
            raise PromptError(f"prompt {self.name!r} needs values for {missing}") from None


class Call(NamedTuple):
    """A structured call, as its prompt's inputs: the prompt, the values it is filled with, and
    the schema of the reply. Its messages are the prompt's; the batch road renders its request
    from the values alone (llm/requests.py). A tuple: made a million times on the batch road."""

    prompt: Prompt
    values: Mapping[str, str]
    schema: type[BaseModel]

    def messages(self) -> list[BaseMessage]:
        """The prompt's messages, with the values in."""
        return self.prompt.template.format_messages(**self.prompt.fill(**self.values))


def neutralise(text: str) -> str:
    """Stop data from opening or closing a delimiter: `</chunk>` in a chunk becomes `&lt;/chunk>`.

    In any case and spacing (`</ANSWER>`, `< /Answer >`), as a model reads them all alike.
    """
    return _DATA_TAG.sub("&lt;", text) if "<" in text else text  # most have none: no regex


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
