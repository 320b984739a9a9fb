"""Structured output by the method each server takes, and the supervisor's route through it.

``auto`` tries ``json_schema``, then ``function_calling``, then ``json_mode`` with the schema
in the prompt, keeps the first the server accepts for the process, and says so once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from relaygraph.models import ModelCallError, load_model
from relaygraph.models._openai import learned_structured_method
from relaygraph.models._retry import RetryPolicy
from relaygraph.supervisor import route_next_agent

from .openai_server import (
    LLAMA_CPP_PYTHON,
    OLLAMA,
    OPENAI,
    FakeOpenAI,
    Faults,
    ServerProfile,
    serve_script,
)
from .test_model_retry import in_graph

ROUTE = {"next": "writer", "task": "write it", "reason": "facts are in"}
SCHEMA = {
    "title": "Route",
    "type": "object",
    "properties": {k: {"type": "string"} for k in ROUTE},
    "required": list(ROUTE),
}
PROMPT = [SystemMessage("You route work."), HumanMessage("Who is next?")]
NO_SCHEMA_NO_TOOLS = replace(LLAMA_CPP_PYTHON, name="no-schema-no-tools", tools=False)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.01)
    monkeypatch.delenv("RELAYGRAPH_OPENAI_STRUCTURED", raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    contexts: list[Any] = []

    def start(profile: ServerProfile, turns: int = 3, **kwargs: Any) -> FakeOpenAI:
        script = {"supervisor": [{"route": ROUTE}] * turns, "writer": [{"route": ROUTE}]}
        context = serve_script(script, profile=profile, **kwargs)
        contexts.append(context)
        server = context.__enter__()
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        return server

    yield start
    for context in contexts:
        context.__exit__(None, None, None)


def method_of(request: dict[str, Any]) -> str:
    """Which structured method a request used."""
    if isinstance(request.get("tool_choice"), dict):
        return "function_calling"
    return {"json_schema": "json_schema", "json_object": "json_mode"}[
        request["response_format"]["type"]
    ]


def test_auto_falls_back_to_function_calling_and_remembers(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve(LLAMA_CPP_PYTHON)
    model = load_model("openai:script-supervisor", agent="supervisor")
    structured = model.with_structured_output(SCHEMA, include_raw=True)
    with caplog.at_level(logging.WARNING, logger="relaygraph.models"):
        first, events = in_graph(lambda: structured.invoke(PROMPT))
        second, again = in_graph(lambda: structured.invoke(PROMPT))
    assert first["parsed"] == ROUTE and second["parsed"] == ROUTE
    assert first["raw"].tool_calls[0]["name"] == "Route"
    # The rejected json_schema call was asked once; after that the method is known.
    assert [method_of(r) for r in server.requests] == [
        "json_schema",
        "function_calling",
        "function_calling",
    ]
    assert learned_structured_method(server.base_url, "script-supervisor") == "function_calling"
    assert events == [
        {
            "type": "structured_method",
            "role": "supervisor",
            "model": "openai:script-supervisor",
            "base_url": server.base_url,
            "method": "function_calling",
            "rejected": {
                "json_schema": "HTTP 500: response_format.type: Input should be 'text' or "
                "'json_object'"
            },
        }
    ]
    assert again == []  # said once
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1
    assert "refused json_schema" in said[0]
    assert "?structured=function_calling" in said[0]
    # Nothing reported the expected rejection as a failed call.
    assert not any(e["type"] == "model_error" for e in events)


def test_auto_reaches_json_mode_with_the_schema_in_the_system_message(serve: Any) -> None:
    server = serve(NO_SCHEMA_NO_TOOLS)
    model = load_model("openai:script-supervisor", agent="supervisor")
    out, events = in_graph(lambda: model.with_structured_output(SCHEMA).invoke(PROMPT))
    assert out == ROUTE
    assert [method_of(r) for r in server.requests] == [
        "json_schema",
        "function_calling",
        "json_mode",
    ]
    messages = server.requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]  # no second system message
    assert messages[0]["content"].startswith("You route work.\n\nReply with one JSON object")
    assert json.loads(messages[0]["content"].split("\n")[-1]) == SCHEMA
    assert events[0]["method"] == "json_mode"
    assert list(events[0]["rejected"]) == ["json_schema", "function_calling"]
    assert "does not support tools" in events[0]["rejected"]["function_calling"]


def test_json_schema_that_works_is_kept_silently(serve: Any) -> None:
    server = serve(OLLAMA)
    model = load_model("openai:script-supervisor", agent="supervisor")
    out, events = in_graph(lambda: model.with_structured_output(SCHEMA).invoke(PROMPT))
    assert out == ROUTE
    assert events == []
    assert [method_of(r) for r in server.requests] == ["json_schema"]
    assert learned_structured_method(server.base_url, "script-supervisor") == "json_schema"


def test_a_structured_runnable_is_built_once_per_schema(serve: Any) -> None:
    """A supervisor asks for its route schema at every call: the model keeps what it built,
    and once ``auto`` has learned the server's method, asks by that method alone."""
    server = serve(OPENAI)
    model = load_model("openai:script-supervisor", agent="supervisor")
    first = model.with_structured_output(SCHEMA, include_raw=True)
    assert model.with_structured_output(dict(SCHEMA), include_raw=True) is first
    assert model.with_structured_output(SCHEMA) is not first  # include_raw is part of the key
    assert first.invoke(PROMPT)["parsed"] == ROUTE
    learned = model.with_structured_output(SCHEMA, include_raw=True)
    assert learned is not first
    assert learned is model.with_structured_output(SCHEMA, method="json_schema", include_raw=True)
    out = learned.invoke(PROMPT)
    assert out == {"raw": out["raw"], "parsed": ROUTE, "parsing_error": None}
    assert [method_of(r) for r in server.requests] == ["json_schema", "json_schema"]


def test_a_schema_given_as_json_goes_without_the_sdks_parse(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's parse() has no class to fill for a JSON schema: the request goes through
    create(), in the same body, and the parser checks the answer."""
    import openai.resources.chat.completions as completions

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("parse() called for a JSON schema")

    monkeypatch.setattr(completions.Completions, "parse", refuse)
    server = serve(OPENAI)
    model = load_model("openai:script-supervisor?structured=json_schema", agent="supervisor")
    assert model.with_structured_output(SCHEMA).invoke(PROMPT) == ROUTE
    assert (
        server.requests[0]["response_format"]["json_schema"]["schema"]["properties"]
        == (SCHEMA["properties"])
    )


def test_a_parsing_error_is_returned_with_the_raw_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve_script({"supervisor": [{"content": "not json"}]}) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        model = load_model("openai:script-supervisor?structured=json_schema", agent="supervisor")
        out = model.with_structured_output(SCHEMA, include_raw=True).invoke(PROMPT)
    assert out["raw"].content == "not json"
    assert out["parsed"] is None and out["parsing_error"] is not None


def test_a_pinned_method_is_used_as_it_is(serve: Any) -> None:
    server = serve(LLAMA_CPP_PYTHON)
    pinned = load_model("openai:script-supervisor?structured=json_mode", agent="supervisor")
    assert pinned.with_structured_output(SCHEMA).invoke(PROMPT) == ROUTE
    # An explicit method in the call wins over the spec's.
    calling = pinned.with_structured_output(SCHEMA, method="function_calling")
    assert calling.invoke(PROMPT) == ROUTE
    assert [method_of(r) for r in server.requests] == ["json_mode", "function_calling"]
    assert learned_structured_method(server.base_url, "script-supervisor") is None


def test_errors_that_are_no_rejection_do_not_fall_back(serve: Any) -> None:
    server = serve(OPENAI)
    model = load_model("openai:script-nobody", agent="supervisor")
    error, events = in_graph(lambda: model.with_structured_output(SCHEMA).invoke(PROMPT))
    assert isinstance(error, ModelCallError)
    assert error.status == 404
    assert len(server.requests) == 1
    assert [e["type"] for e in events] == ["model_error"]


def test_every_method_refused_is_one_error(serve: Any) -> None:
    server = serve(replace(NO_SCHEMA_NO_TOOLS, name="nothing"), faults=None, turns=0)
    model = load_model("openai:script-supervisor", agent="supervisor")
    error, events = in_graph(lambda: model.with_structured_output(SCHEMA).invoke(PROMPT))
    assert isinstance(error, ModelCallError)
    assert error.status == 400 and "ran out" in error.detail  # json_mode's answer, the last
    assert len(server.requests) == 3
    assert [e["type"] for e in events] == ["model_error"]
    assert learned_structured_method(server.base_url, "script-supervisor") is None


def test_a_learned_method_refused_later_fails_the_call_without_probing(serve: Any) -> None:
    # The server took json_schema once; a later 400 is about that request (here: the script
    # has no turn left), so the call fails, reported once, and no other method is tried.
    server = serve(OLLAMA, turns=1)
    model = load_model("openai:script-supervisor", agent="supervisor")
    structured = model.with_structured_output(SCHEMA)
    assert structured.invoke(PROMPT) == ROUTE
    error, events = in_graph(lambda: structured.invoke(PROMPT))
    assert isinstance(error, ModelCallError)
    assert error.status == 400 and "ran out" in error.detail
    assert [method_of(r) for r in server.requests] == ["json_schema", "json_schema"]
    assert [e["type"] for e in events] == ["model_error"]
    assert learned_structured_method(server.base_url, "script-supervisor") == "json_schema"


def test_route_asks_again_after_a_failed_call(serve: Any) -> None:
    server = serve(LLAMA_CPP_PYTHON, faults=Faults(sequence=["503"]))
    model = load_model(
        "openai:script-supervisor?structured=function_calling&max_retries=0", agent="supervisor"
    )
    decision, events = in_graph(
        lambda: route_next_agent(model, PROMPT, agents=["writer"], config={})
    )
    assert decision.fallback is False
    assert decision.route.next == "writer"
    assert decision.error == (
        "the model call failed: HTTP 503: The engine is currently overloaded, please try "
        "again later."
    )
    # Asked again as it was: no repair prompt, the model said nothing.
    assert server.requests[0]["messages"] == server.requests[1]["messages"]
    assert len(decision.raw) == 1  # the failed call gave no reply to count
    assert [e["type"] for e in events] == ["model_error"]


def test_route_falls_back_quoting_the_server(serve: Any) -> None:
    serve(LLAMA_CPP_PYTHON)
    model = load_model("openai:script-supervisor?structured=json_schema", agent="supervisor")
    decision, events = in_graph(
        lambda: route_next_agent(model, PROMPT, agents=["writer"], config={})
    )
    assert decision.fallback is True and decision.call_failed is True
    assert decision.route.next == "FINISH"
    assert decision.raw == ()
    assert decision.stop_reason == (
        "model_error: the model call failed: HTTP 500: response_format.type: Input should be "
        "'text' or 'json_object'"
    )
    assert decision.route.reason.startswith("the route could not be asked for: ")
    assert [e["type"] for e in events] == ["model_error", "model_error"]


def test_a_route_by_function_calling_is_repaired_as_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = {"next": "critic", "task": "x", "reason": "y"}
    script = {"supervisor": [{"route": bad}, {"route": ROUTE}]}
    with serve_script(script, profile=LLAMA_CPP_PYTHON) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        model = load_model(
            "openai:script-supervisor?structured=function_calling", agent="supervisor"
        )
        decision = route_next_agent(model, PROMPT, agents=["writer"], config={})
        repair = server.requests[1]["messages"]
    assert decision.fallback is False and decision.route.next == "writer"
    assert "'critic'" in (decision.error or "")
    # The invalid reply is quoted as text: a tool call there would need a tool answer.
    assert repair[2] == {"role": "assistant", "content": json.dumps(bad)}
    assert repair[3]["content"].startswith("Your reply was not a valid route")


def test_an_answer_cut_at_max_tokens_is_repaired_like_invalid_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_reason = {**ROUTE, "reason": "because " * 40}
    script = {"supervisor": [{"route": long_reason}, {"route": ROUTE}]}
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        model = load_model(
            "openai:script-supervisor?structured=json_schema&max_tokens=30", agent="supervisor"
        )
        decision = route_next_agent(model, PROMPT, agents=["writer"], config={})
        first = server.requests[0]
    assert first["max_tokens"] == 30
    assert decision.fallback is False and decision.route.next == "writer"
    assert decision.error == (
        "the answer reached the token limit before its JSON was complete (30 tokens)"
    )


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_an_answer_cut_at_max_tokens_counts_its_tokens(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """The cut reply's tokens were generated (and billed): the decision's raw replies carry
    the server's usage, which the supervisor's accounting records, not 0 "estimated"."""
    long_reason = {**ROUTE, "reason": "because " * 40}
    script = {"supervisor": [{"route": long_reason}, {"route": ROUTE}]}
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        model = load_model(
            f"openai:script-supervisor?structured={method}&max_tokens=30", agent="supervisor"
        )
        decision = route_next_agent(model, PROMPT, agents=["writer"], config={})
    cut, repaired = decision.raw
    assert cut.usage_metadata is not None
    assert cut.usage_metadata["output_tokens"] == 30
    assert cut.usage_metadata["input_tokens"] > 0
    assert repaired.usage_metadata is not None


def test_a_reply_that_is_json_but_no_route_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    script = {"supervisor": [{"content": '{"answer": 42}'}, {"route": ROUTE}]}
    with serve_script(script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        model = load_model("openai:script-supervisor?structured=json_mode", agent="supervisor")
        decision = route_next_agent(model, PROMPT, agents=["writer"], config={})
    assert decision.route.next == "writer"
    assert decision.error is not None
    assert decision.error.startswith("the reply is JSON but not a route")
    assert "Field required" not in decision.error
