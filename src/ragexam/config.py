"""Settings: the only reader of the environment and `.env`.

Precedence, highest first: command-line flags, environment variables, `.env` in the
working directory, then the defaults below. Keys are SecretStr and never leave this object
unmasked except to build the HTTP client.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragexam.errors import ConfigError
from ragexam.urls import mask_url, parse_http_url

Stage = Literal["generate", "answer", "judge"]
DEFAULT_MODEL = "gpt-4o-mini"


class StructuredMethod(StrEnum):
    """How the model is asked for structured output."""

    json_schema = "json_schema"
    function_calling = "function_calling"
    json_mode = "json_mode"
    prompt = "prompt"  # no server support needed: the schema is in the prompt, the reply parsed


class SystemRole(StrEnum):
    """Where the prompts' system text goes: a system message, or the first user message."""

    system = "system"
    user = "user"


# Every call carries a bound on its reply, so a server without one cannot run until its
# context is full; RAGEXAM_MAX_TOKENS overrides these.
STAGE_MAX_TOKENS: dict[Stage, int] = {"generate": 1024, "answer": 1024, "judge": 2048}


class Scale(StrEnum):
    """How the judge grades: verdicts per key point, floats 0..1, or integers 0..10 (stored
    divided by 10)."""

    key_points = "key-points"
    unit = "unit"
    ten = "ten"


class LabelScale(StrEnum):
    """How a person's grades are given (calibrate): floats 0..1, or integers 0..10."""

    unit = "unit"
    ten = "ten"


class AnswerContext(StrEnum):
    """What the answerer is given: the retrieved chunks, the source chunk alone, or nothing."""

    retrieved = "retrieved"
    gold = "gold"
    none = "none"


def _env(*names: str) -> Any:
    return Field(None, validation_alias=AliasChoices(*names))


OPENAI_HOST = "api.openai.com"  # a base URL of OpenAI's own needs the key as the default does
# What the clients are given when no base URL is set: else the SDK reads OPENAI_BASE_URL
# itself, and takes one set empty (a `.env` line `OPENAI_BASE_URL=`) for a URL.
OPENAI_URL = "https://api.openai.com/v1"


class Settings(BaseSettings):
    """Everything a run needs from flags, the environment and `.env`."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", populate_by_name=True, frozen=True
    )

    openai_api_key: SecretStr | None = _env("openai_api_key", "OPENAI_API_KEY")
    openai_base_url: str | None = _env("openai_base_url", "OPENAI_BASE_URL")
    model: str = Field(DEFAULT_MODEL, validation_alias=AliasChoices("model", "RAGEXAM_MODEL"))
    generate_model: str | None = _env("generate_model", "RAGEXAM_GENERATE_MODEL")
    answer_model: str | None = _env("answer_model", "RAGEXAM_ANSWER_MODEL")
    judge_model: str | None = _env("judge_model", "RAGEXAM_JUDGE_MODEL")
    embedding: str = Field(
        "collection", validation_alias=AliasChoices("embedding", "RAGEXAM_EMBEDDING")
    )
    embedding_base_url: str | None = _env("embedding_base_url", "RAGEXAM_EMBEDDING_BASE_URL")
    concurrency: int = Field(
        16, ge=1, le=1024, validation_alias=AliasChoices("concurrency", "RAGEXAM_CONCURRENCY")
    )
    timeout: float = Field(60.0, gt=0, validation_alias=AliasChoices("timeout", "RAGEXAM_TIMEOUT"))
    store_timeout: float = Field(
        60.0, gt=0, validation_alias=AliasChoices("store_timeout", "RAGEXAM_STORE_TIMEOUT")
    )
    max_retries: int = Field(
        4, ge=0, le=20, validation_alias=AliasChoices("max_retries", "RAGEXAM_MAX_RETRIES")
    )
    retry_backoff: float = Field(
        1.0, ge=0, validation_alias=AliasChoices("retry_backoff", "RAGEXAM_RETRY_BACKOFF")
    )
    structured_output: StructuredMethod = Field(
        StructuredMethod.json_schema,
        validation_alias=AliasChoices("structured_output", "RAGEXAM_STRUCTURED_OUTPUT"),
    )
    prompts_dir: Path | None = _env("prompts_dir", "RAGEXAM_PROMPTS_DIR")
    max_error_rate: float = Field(
        0.05, ge=0, le=1, validation_alias=AliasChoices("max_error_rate", "RAGEXAM_MAX_ERROR_RATE")
    )
    chroma_api_key: SecretStr | None = _env("chroma_api_key", "CHROMA_API_KEY")
    chroma_tenant: str | None = _env("chroma_tenant", "CHROMA_TENANT")
    chroma_database: str | None = _env("chroma_database", "CHROMA_DATABASE")
    rate_limit_wait: float = Field(
        600.0, ge=0, validation_alias=AliasChoices("rate_limit_wait", "RAGEXAM_RATE_LIMIT_WAIT")
    )
    rpm: int | None = Field(None, ge=1, validation_alias=AliasChoices("rpm", "RAGEXAM_RPM"))
    tpm: int | None = Field(None, ge=1, validation_alias=AliasChoices("tpm", "RAGEXAM_TPM"))
    price_input: float | None = Field(
        None, ge=0, validation_alias=AliasChoices("price_input", "RAGEXAM_PRICE_INPUT")
    )
    price_output: float | None = Field(
        None, ge=0, validation_alias=AliasChoices("price_output", "RAGEXAM_PRICE_OUTPUT")
    )

    batch_poll: float = Field(
        30.0, gt=0, validation_alias=AliasChoices("batch_poll", "RAGEXAM_BATCH_POLL")
    )
    max_tokens: int | None = Field(
        None, ge=1, validation_alias=AliasChoices("max_tokens", "RAGEXAM_MAX_TOKENS")
    )
    system_prompt: SystemRole = Field(
        SystemRole.system, validation_alias=AliasChoices("system_prompt", "RAGEXAM_SYSTEM_PROMPT")
    )

    def max_tokens_for(self, stage: Stage) -> int:
        """The bound on one reply of a stage: RAGEXAM_MAX_TOKENS, else the stage's default."""
        return self.max_tokens or STAGE_MAX_TOKENS[stage]

    @field_validator("openai_base_url", "embedding_base_url")
    @classmethod
    def _http_url(cls, value: str | None, info: Any) -> str | None:
        names = {"openai_base_url": "OPENAI_BASE_URL"}
        if value and value.strip():
            parse_http_url(value, names.get(info.field_name, "RAGEXAM_EMBEDDING_BASE_URL"))
        return value if value and value.strip() else None  # set empty (`.env`'s `KEY=`): unset

    def model_for(self, stage: Stage) -> str:
        """The model a stage uses: its own variable if set, else RAGEXAM_MODEL."""
        own = {"generate": self.generate_model, "answer": self.answer_model}
        own["judge"] = self.judge_model
        return own[stage] or self.model

    def api_key(self) -> SecretStr:
        """The key to send; a local server (custom base URL) may do without one."""
        if self.openai_api_key and self.openai_api_key.get_secret_value():
            return self.openai_api_key
        if self.openai_base_url and not _openai(self.openai_base_url):
            return SecretStr("not-needed")
        raise ConfigError(
            "OPENAI_API_KEY is not set: export it or put it in .env, or set OPENAI_BASE_URL "
            "to a local server (Ollama, vLLM, llama.cpp) that needs no key"
        )

    def redact(self, text: str) -> str:
        """Remove the API key and any URL credentials from text bound for a file or screen."""
        for secret in (self.openai_api_key, self.chroma_api_key):
            key = secret.get_secret_value() if secret else ""
            if len(key) >= 4:
                text = text.replace(key, "***")
        return mask_url(text)

    def public(self) -> dict[str, Any]:
        """The settings as plain values, without secrets, for the run manifest."""
        data = self.model_dump(mode="json", exclude={"openai_api_key", "chroma_api_key"})
        data["openai_api_key"] = "set" if self.openai_api_key else "unset"
        data["chroma_api_key"] = "set" if self.chroma_api_key else "unset"
        for name in ("openai_base_url", "embedding_base_url"):
            if data[name]:
                data[name] = self.redact(data[name])
        return data


def load_settings(env_file: Path | None = Path(".env"), **flags: Any) -> Settings:
    """Build settings; flags that are None were not given and do not override."""
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        settings = Settings(_env_file=env_file, **given)
    except ValueError as exc:
        raise ConfigError(f"invalid setting: {mask_url(_first_error(exc))}") from None
    return settings


def export_env_file(env_file: Path = Path(".env")) -> None:
    """Give `.env` to libraries that read the process environment, never over a set variable.

    Chroma rebuilds a collection's stored embedding function from a variable name
    (`api_key_env_var`), and a --rag module builds its own OpenAI client: both need the key.
    Only the command line calls this: a process it starts is its own. A Python caller (a
    notebook) keeps its environment as it was, and sets what its libraries need itself.
    """
    for name, value in _env_file_values(env_file).items():
        if value is not None:
            os.environ.setdefault(name, value)
    if not os.environ.get("OPENAI_BASE_URL", "x").strip():  # set empty: unset, for libraries
        del os.environ["OPENAI_BASE_URL"]
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not os.environ.get("OPENAI_API_KEY") and base_url and not _openai(base_url):
        os.environ["OPENAI_API_KEY"] = "not-needed"  # a local server: libraries insist on one


def _openai(base_url: str) -> bool:
    """Whether a base URL is OpenAI's own, which needs the key."""
    return urlparse(base_url).hostname == OPENAI_HOST


@contextmanager
def env_file_lent(env_file: Path = Path(".env")) -> Iterator[None]:
    """`.env`'s variables in the environment while a library that reads them there is set up
    (Chroma rebuilding a stored embedding function from its key variable), then gone again.

    The command line exports `.env` for the whole process (export_env_file); a Python caller's
    environment is only lent these for the moment, never left changed.
    """
    values = _env_file_values(env_file)
    lent = {name: value for name, value in values.items() if value and name not in os.environ}
    os.environ.update(lent)
    try:
        yield
    finally:
        for name in lent:
            os.environ.pop(name, None)


class _SaidOnce(logging.Filter):
    """python-dotenv's warnings (a line it cannot parse) once each, naming the file: `.env`
    is read by every Settings and every lending of it, and said it eleven times."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        record.msg, record.args = f"{message} (in the .env file)", ()
        return True


logging.getLogger("dotenv.main").addFilter(_SaidOnce())


def _env_file_values(env_file: Path) -> dict[str, str | None]:
    """The variables `.env` sets, or a ConfigError that says why it cannot be read."""
    from dotenv import dotenv_values

    if not env_file.is_file():
        return {}
    try:
        return dict(dotenv_values(env_file))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{env_file} cannot be read as a .env file: {exc}") from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return f"{_variable(where)}: {first.get('msg')}"
    return str(exc).splitlines()[0]


def _variable(name: str) -> str:
    """The environment variable a setting is read from, as the user wrote it (a flag's bad
    value is refused before settings are read)."""
    field = Settings.model_fields.get(name)
    alias = field.validation_alias if field is not None else None
    choices = alias.choices if isinstance(alias, AliasChoices) else []
    named = [choice for choice in choices if isinstance(choice, str) and choice.isupper()]
    return f"{named[0]} (environment or .env)" if named else name


def debug_enabled() -> bool:
    """True when RAGEXAM_DEBUG asks for full tracebacks."""
    return os.environ.get("RAGEXAM_DEBUG", "").lower() in {"1", "true", "yes"}
