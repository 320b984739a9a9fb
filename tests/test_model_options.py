"""An ``openai:`` spec's options: one syntax, parsed strictly, carried into every request."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from relaygraph.errors import ConfigError, ModelSpecError
from relaygraph.models import (
    STRUCTURED_ENV,
    ModelSpec,
    OpenAIOptions,
    load_model,
    parse_model_spec,
)
from relaygraph.models._openai import RelaygraphChatOpenAI

FULL = (
    "openai:smollm2?structured=function_calling&timeout=30&max_retries=1&max_tokens=512"
    "&parallel_tool_calls=omit&tool_call_content=empty&header.X-Api-Team=search"
    "&body.top_k=40&body.options=%7B%22num_ctx%22%3A4096%7D&body.mirostat=off"
)
ROUND_TRIP = [
    HumanMessage("hi"),
    AIMessage("", tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "c1"}]),
    ToolMessage("found", tool_call_id="c1"),
]


def test_every_option_parses_into_typed_values() -> None:
    spec = parse_model_spec(FULL)
    assert (spec.provider, spec.name) == ("openai", "smollm2")
    options = spec.options
    assert options is not None
    assert options.structured == "function_calling"
    assert (options.timeout, options.max_retries, options.max_tokens) == (30.0, 1, 512)
    assert options.parallel_tool_calls == "omit"
    assert options.tool_call_content == "empty"
    assert options.extra_headers == {"X-Api-Team": "search"}
    # Body values are JSON where they parse as JSON, else strings.
    assert options.extra_body == {"top_k": 40, "options": {"num_ctx": 4096}, "mirostat": "off"}


def test_a_spec_prints_canonically_and_parses_back() -> None:
    spec = parse_model_spec(FULL)
    text = str(spec)
    assert text.startswith("openai:smollm2?structured=function_calling&timeout=30&")
    assert parse_model_spec(text) == spec
    # Defaults are left out: equal options, equal text.
    assert str(parse_model_spec("openai:m?max_retries=2&tool_call_content=null")) == "openai:m"
    assert str(parse_model_spec("openai:m")) == "openai:m"
    assert parse_model_spec("openai:m").options is None
    assert str(ModelSpec(provider="openai", name="m", options=OpenAIOptions(timeout=0.5))) == (
        "openai:m?timeout=0.5"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("openai:m?temperature=0", "unknown option 'temperature'; known options: structured"),
        ("openai:m?timeout=soon", "option 'timeout' must be a number of seconds, got 'soon'"),
        ("openai:m?timeout=0", "option 'timeout' must be between"),
        ("openai:m?timeout=nan", "option 'timeout' must be between"),
        ("openai:m?max_retries=1.5", "option 'max_retries' must be a whole number"),
        ("openai:m?max_retries=11", "option 'max_retries' must be between 0 and 10"),
        ("openai:m?max_tokens=0", "option 'max_tokens' must be between 1"),
        ("openai:m?structured=xml", "option 'structured' must be one of auto, json_schema"),
        ("openai:m?parallel_tool_calls=false", "must be one of send, omit; got 'false'"),
        ("openai:m?tool_call_content=none", "must be one of null, empty; got 'none'"),
        ("openai:m?timeout=1&timeout=2", "option 'timeout' is given twice"),
        ("openai:m?header.X-A=1&header.x-a=2", "option 'header.x-a' is given twice"),
        ("openai:m?body.k=1&body.k=2", "option 'body.k' is given twice"),
        ("openai:m?structured", "option 'structured' must be written name=value"),
        ("openai:m?", "nothing follows '?'"),
        ("openai:m?&timeout=1", "option '' must be written name=value"),
        ("openai:?timeout=1", "the openai model's name is empty"),
        ("openai:m?header.Authorization=Bearer%20x", "the client sets Authorization itself"),
        ("openai:m?header.bad%20name=1", "is no HTTP header name"),
        ("openai:m?header.X-A=a%0D%0Ab", "a header value is one line"),
        ("openai:m?body.messages=%5B%5D", "'messages' is set by the conversation"),
        ("openai:m?body.max_tokens=5", "'max_tokens' is set by option max_tokens"),
        ("openai:m?body.=1", "names no body field"),
        ("local:smollm2?timeout=1", "local models take no options"),
        ("openai-responses:m?tool_call_content=empty", "is for Chat Completions"),
    ],
)
def test_a_bad_option_is_an_error_that_names_it(spec: str, message: str) -> None:
    with pytest.raises(ModelSpecError, match="invalid model spec") as info:
        parse_model_spec(spec)
    assert message in str(info.value)
    assert info.value.spec == spec


def test_scripted_paths_keep_their_question_marks() -> None:
    assert parse_model_spec("scripted:odd?name.json").name == "odd?name.json"


def _model(spec: str, monkeypatch: pytest.MonkeyPatch, base_url: str | None) -> Any:
    if base_url is None:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    model = load_model(spec, agent="researcher")
    assert isinstance(model, RelaygraphChatOpenAI)
    return model


def test_options_shape_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(FULL, monkeypatch, "http://127.0.0.1:9/v1")
    payload = model._get_request_payload(ROUND_TRIP, parallel_tool_calls=False)
    assert payload["messages"][1] == {
        "content": "",
        "role": "assistant",
        "tool_calls": [
            {
                "type": "function",
                "id": "c1",
                "function": {"name": "search", "arguments": '{"q": "x"}'},
            }
        ],
    }
    assert "parallel_tool_calls" not in payload
    # A server other than OpenAI's reads max_tokens; max_completion_tokens is OpenAI's own.
    assert payload["max_tokens"] == 512
    assert "max_completion_tokens" not in payload
    assert payload["extra_body"] == {"mirostat": "off", "options": {"num_ctx": 4096}, "top_k": 40}
    assert model.default_headers == {"X-Api-Team": "search"}
    assert model.request_timeout == 30.0
    assert model.max_retries == 0  # retries happen in relaygraph's HTTP client instead
    assert model.root_client._client._policy.max_retries == 1


def test_defaults_send_what_openai_expects(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("openai:gpt-4o-mini?max_tokens=64", monkeypatch, None)
    payload = model._get_request_payload(ROUND_TRIP, parallel_tool_calls=False)
    assert payload["messages"][1]["content"] is None
    assert payload["parallel_tool_calls"] is False
    assert payload["max_completion_tokens"] == 64
    assert model.root_client._client._policy.max_retries == 2


def test_structured_method_from_spec_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STRUCTURED_ENV, raising=False)
    base = "http://127.0.0.1:9/v1"
    assert _model("openai:m", monkeypatch, base).chosen_structured_method() == "auto"
    monkeypatch.setenv(STRUCTURED_ENV, "json_mode")
    assert _model("openai:m", monkeypatch, base).chosen_structured_method() == "json_mode"
    pinned = _model("openai:m?structured=json_schema", monkeypatch, base)
    assert pinned.chosen_structured_method() == "json_schema"
    monkeypatch.setenv(STRUCTURED_ENV, "xml")
    with pytest.raises(ConfigError, match=f"{STRUCTURED_ENV}='xml' is not a structured"):
        _model("openai:m", monkeypatch, base).chosen_structured_method()
