"""The fake OpenAI server, exercised through the real openai SDK and langchain-openai."""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import suppress
from typing import Any, Literal
from urllib.error import HTTPError

import openai
import pytest
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionMessageParam
from openai_server import FakeOpenAI, Faults, Reply
from pydantic import BaseModel, Field

USER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What colour is the sky over Lisbon in June?"}
]


class Source(BaseModel):
    title: str
    page: int = Field(ge=1, le=9)


class Verdict(BaseModel):
    score: float = Field(ge=0, le=1)
    correct: bool
    reason: str
    source: Source
    note: str | None
    tags: list[str]


Method = Literal["json_schema", "function_calling", "json_mode"]


def client(server: FakeOpenAI, **options: Any) -> openai.OpenAI:
    """A real SDK client without retries, so each call is exactly one request."""
    return openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, **options)


def chat(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    """One chat completion with USER as the prompt unless messages are given."""
    kwargs.setdefault("messages", USER)
    return sdk.chat.completions.create(model="gpt-test", **kwargs)


@pytest.fixture
def sdk(fake_llm: FakeOpenAI) -> openai.OpenAI:
    """One client per test: building a client (TLS context and all) is the slow part."""
    return client(fake_llm)


def json_schema_format(model: type[BaseModel]) -> dict[str, Any]:
    """The response_format asking for model's JSON schema."""
    schema = {"name": model.__name__, "schema": model.model_json_schema(), "strict": True}
    return {"type": "json_schema", "json_schema": schema}


def schema_prompt(model: type[BaseModel]) -> list[ChatCompletionMessageParam]:
    """A system prompt embedding model's schema in a ```json fence, as json_mode prompts do."""
    fence = f"```json\n{json.dumps(model.model_json_schema())}\n```"
    return [{"role": "system", "content": f"Answer as JSON matching:\n{fence}"}, *USER]


def tool(model: type[BaseModel]) -> dict[str, Any]:
    """A function tool whose parameters are model's JSON schema."""
    function = {"name": model.__name__, "parameters": model.model_json_schema()}
    return {"type": "function", "function": function}


def test_plain_reply_is_deterministic_and_echoes_model(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI
) -> None:
    first, second = chat(sdk), chat(sdk)
    text = first.choices[0].message.content
    assert text == second.choices[0].message.content
    assert text.startswith("Reply ") and "Lisbon" in text
    assert first.model == "gpt-test" and first.choices[0].finish_reason == "stop"
    assert first.usage.prompt_tokens == 9 and first.usage.total_tokens > 9
    assert fake_llm.count() == 2 and fake_llm.requests[0].status == 200


def test_json_schema_reply_validates_with_bounds(sdk: openai.OpenAI) -> None:
    reply = chat(sdk, response_format=json_schema_format(Verdict))
    verdict = Verdict.model_validate_json(reply.choices[0].message.content)
    assert 0 <= verdict.score <= 1 and 1 <= verdict.source.page <= 9
    assert verdict.reason.startswith("reason ") and len(verdict.tags) == 1


def test_sdk_parse_helper_gets_a_parsed_model(sdk: openai.OpenAI) -> None:
    parsed = sdk.chat.completions.parse(model="gpt-test", messages=USER, response_format=Verdict)
    assert isinstance(parsed.choices[0].message.parsed, Verdict)


def test_tool_call_has_parseable_arguments(sdk: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "Verdict"}}  # not the first tool
    reply = chat(sdk, tools=[tool(Source), tool(Verdict)], tool_choice=choice).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    call = reply.message.tool_calls[0]
    assert call.function.name == "Verdict"
    Verdict.model_validate_json(call.function.arguments)


def test_json_object_uses_schema_from_prompt(sdk: openai.OpenAI) -> None:
    reply = chat(sdk, messages=schema_prompt(Verdict), response_format={"type": "json_object"})
    Verdict.model_validate_json(reply.choices[0].message.content)


def test_schema_in_prompt_without_format_gets_a_fenced_answer(sdk: openai.OpenAI) -> None:
    text = chat(sdk, messages=schema_prompt(Verdict)).choices[0].message.content
    body = text.split("```json\n", 1)[1].split("```", 1)[0]
    Verdict.model_validate_json(body)


def test_responder_overrides_the_default(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.responder = lambda body: Reply(content="custom") if "Lisbon" in str(body) else None
    assert chat(sdk).choices[0].message.content == "custom"
    fake_llm.responder = lambda body: Reply(status=503, error_message="down for tests")
    with pytest.raises(openai.InternalServerError, match="down for tests"):
        chat(sdk)


def test_429_carries_retry_after(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(rate_429=1.0, retry_after="7")
    with pytest.raises(openai.RateLimitError) as caught:
        chat(sdk)
    assert caught.value.response.headers["retry-after"] == "7"
    assert fake_llm.requests[-1].fault == "429" and fake_llm.requests[-1].status == 429


def test_500_raises_internal_server_error(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(rate_500=1.0)
    with pytest.raises(openai.InternalServerError):
        chat(sdk)


def test_hang_times_out_and_does_not_delay_stop() -> None:
    with FakeOpenAI() as server:
        server.faults = Faults(rate_hang=1.0, hang_seconds=30)
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            chat(client(server, timeout=0.5))
        assert time.monotonic() - started < 2
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 1
    assert server.requests[0].fault == "hang"


def test_latency_and_reset(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.latency = 0.2
    fake_llm.faults = Faults(rate_500=1.0)
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError):
        chat(sdk)
    assert time.monotonic() - started >= 0.2
    fake_llm.reset()
    assert fake_llm.requests == [] and fake_llm.latency == 0
    assert chat(sdk).choices[0].finish_reason == "stop" and fake_llm.count() == 1


def test_truncate_cuts_content_with_finish_reason_length(
    fake_llm: FakeOpenAI, sdk: openai.OpenAI
) -> None:
    whole = chat(sdk, response_format=json_schema_format(Verdict)).choices[0].message.content
    fake_llm.faults = Faults(rate_truncate=1.0)
    reply = chat(sdk, response_format=json_schema_format(Verdict)).choices[0]
    assert reply.finish_reason == "length" and reply.message.content == whole[: len(whole) // 2]


def test_malformed_content_is_not_json(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(rate_malformed=1.0)
    reply = chat(sdk, response_format=json_schema_format(Verdict)).choices[0]
    assert reply.finish_reason == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.message.content)


def test_random_faults_stop_after_the_cap(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(rate_429=1.0, max_faults_per_body=2)
    for _ in range(2):
        with pytest.raises(openai.RateLimitError):
            chat(sdk)
    assert chat(sdk).choices[0].message.content
    # Another body has its own budget.
    with pytest.raises(openai.RateLimitError):
        chat(sdk, messages=[{"role": "user", "content": "another question"}])
    assert [r.fault for r in fake_llm.requests] == ["429", "429", None, "429"]


def test_fault_draws_are_reproducible() -> None:
    def faults_seen(seed: int) -> list[str | None]:
        with FakeOpenAI(seed=seed) as server:
            sdk = client(server)
            server.faults = Faults(rate_500=0.5, max_faults_per_body=99)
            for _ in range(12):
                with suppress(openai.InternalServerError):
                    chat(sdk)
            return [r.fault for r in server.requests]

    assert faults_seen(1) == faults_seen(1) != faults_seen(2)
    assert set(faults_seen(1)) == {"500", None}


def test_malformed_if_is_always_malformed(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(malformed_if=lambda text: "Lisbon" in text, max_faults_per_body=0)
    for _ in range(4):
        content = chat(sdk, response_format=json_schema_format(Verdict))
        with pytest.raises(json.JSONDecodeError):
            json.loads(content.choices[0].message.content)


def test_status_if_always_fails(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.faults = Faults(status_if=lambda text: 400 if "Lisbon" in text else None)
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            chat(sdk)
    assert chat(sdk, messages=[{"role": "user", "content": "Porto"}]).choices


def test_embeddings_float_and_base64_agree(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.embedding_dim = 16
    texts = ["the sky is blue", "the sea is blue", "tax forms"]
    as_floats = sdk.embeddings.create(model="emb", input=texts, encoding_format="float")
    default = sdk.embeddings.create(model="emb", input=texts)  # the SDK asks for base64
    assert fake_llm.requests[-1].body["encoding_format"] == "base64"
    vectors = [item.embedding for item in default.data]
    assert vectors == [item.embedding for item in as_floats.data]
    assert [len(v) for v in vectors] == [16] * 3
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0, abs=1e-5)
    sky_sea = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    sky_tax = sum(a * b for a, b in zip(vectors[0], vectors[2], strict=True))
    assert sky_sea > sky_tax
    assert sdk.embeddings.create(model="emb", input=texts).data[0].embedding == vectors[0]
    assert default.usage.prompt_tokens == 10 and fake_llm.count("/embeddings") == 3


def test_embed_override_and_token_input(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.embed = lambda text: [float(len(text)), 0.0]
    result = sdk.embeddings.create(model="emb", input=[[1, 2, 3]])
    assert result.data[0].embedding == [float(len("[1, 2, 3]")), 0.0]


def test_wrong_key_is_echoed_in_401() -> None:
    with FakeOpenAI(api_key="right-key") as server:
        wrong = openai.OpenAI(base_url=server.base_url, api_key="sk-wrong-123", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="sk-wrong-123"):
            chat(wrong)
        right = openai.OpenAI(base_url=server.base_url, api_key="right-key", max_retries=0)
        assert chat(right).choices
        assert server.requests[0].headers["authorization"] == "Bearer sk-wrong-123"


def test_models_404_400_and_streaming(fake_llm: FakeOpenAI, sdk: openai.OpenAI) -> None:
    fake_llm.quirks.models = ["fake-model"]
    assert [m.id for m in sdk.models.list()] == ["fake-model"]
    with pytest.raises(openai.NotFoundError):
        sdk.post("/nowhere", cast_to=object, body={})
    with pytest.raises(openai.BadRequestError, match="streaming not supported"):
        chat(sdk, stream=True)
    broken = urllib.request.Request(
        f"{fake_llm.base_url}/chat/completions", data=b"{not json", method="POST"
    )
    with pytest.raises(HTTPError) as caught:
        urllib.request.urlopen(broken, timeout=5)
    assert caught.value.code == 400


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_structured_output(fake_llm: FakeOpenAI, method: Method) -> None:
    llm = ChatOpenAI(
        model="gpt-test", base_url=fake_llm.base_url, api_key="test", max_retries=0, timeout=5
    )
    structured = llm.with_structured_output(Verdict, method=method, include_raw=True)
    messages = schema_prompt(Verdict) if method == "json_mode" else USER
    result = structured.invoke([dict(m) for m in messages])
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], Verdict)
