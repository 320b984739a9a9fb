"""Streamed answers of ``openai:`` models, assembled as the server meant them.

Against the Chat Completions double playing llama-cpp-python's streams: a tool call's name and
id repeated in every chunk, no usage in a stream; and a stream that ends without saying why.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessageChunk
from langchain_core.tools import tool

from relaygraph._names import USAGE_ESTIMATED_KEY
from relaygraph.models import ModelCallError, load_model
from relaygraph.runner import run_task

from .conftest import EXAMPLE_RELAY
from .openai_server import (
    LLAMA_CPP_PYTHON,
    OPENAI,
    FakeOpenAI,
    Faults,
    script_servers,
)
from .test_model_retry import in_graph

ARGS = {"query": "when are checkpoints written, and by which part of the runner?"}
SCRIPT = {
    "researcher": [
        {"tool_calls": [{"name": "search_docs", "args": ARGS, "id": "call_s"}]},
        {"content": "Checkpoints are written after every step."},
    ],
    "writer": [{"content": "a draft", "usage": {"input_tokens": 17, "output_tokens": 9}}],
}


@tool
def search_docs(query: str) -> str:
    """Search the docs."""
    return query


pytestmark = pytest.mark.usefixtures("quick_backoff")


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeOpenAI]]:
    with script_servers(SCRIPT, monkeypatch.setenv) as start:
        yield start


def _joined(chunks: list[BaseMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert isinstance(total, AIMessageChunk)
    return total


def _streamed(model: Any, runnable: Any, text: str, mode: str) -> list[BaseMessageChunk]:
    """``runnable``'s chunks, streamed by ``mode`` (sync or async) from ``model``'s server."""
    if mode == "sync":
        return list(runnable.stream(text))

    async def chunks() -> list[BaseMessageChunk]:
        try:
            return [chunk async for chunk in runnable.astream(text)]
        finally:  # Its connections belong to this event loop, which ends here.
            await model.http_async_client.aclose()

    return asyncio.run(chunks())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_tool_call_repeated_in_every_chunk_is_joined_once(serve: Any, mode: str) -> None:
    server = serve(profile=LLAMA_CPP_PYTHON)
    model = load_model("openai:script-researcher", agent="researcher")
    chunks = _streamed(model, model.bind_tools([search_docs]), "research", mode)
    # The server did repeat them: several chunks each carry the whole name.
    assert sum(1 for c in chunks for t in c.tool_call_chunks if t["name"]) == 1
    assert len(server.requests) == 1
    total = _joined(chunks)
    assert total.tool_calls == [
        {"name": "search_docs", "args": ARGS, "id": "call_s", "type": "tool_call"}
    ]
    assert total.invalid_tool_calls == []
    assert total.additional_kwargs["function_call"]["name"] == "search_docs"


def test_streamed_invoke_of_a_tool_call_on_llama_cpp_python(serve: Any) -> None:
    serve(profile=LLAMA_CPP_PYTHON)
    model = load_model("openai:script-researcher", agent="researcher")
    model.streaming = True  # as LangGraph's token stream makes every call stream
    reply = model.bind_tools([search_docs]).invoke("research")
    assert isinstance(reply, AIMessage)
    assert [(c["name"], c["args"], c["id"]) for c in reply.tool_calls] == [
        ("search_docs", ARGS, "call_s")
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_stream_without_usage_counts_estimated_tokens(serve: Any, mode: str) -> None:
    server = serve(profile=LLAMA_CPP_PYTHON)
    model = load_model("openai:script-researcher", agent="researcher")
    chunks = _streamed(model, model.bind_tools([search_docs]), "research", mode)
    assert server.requests[0]["stream_options"] == {"include_usage": True}
    total = _joined(chunks)
    assert total.usage_metadata is not None
    assert total.usage_metadata["input_tokens"] > 0
    # The name once and the arguments: about four characters a token.
    assert total.usage_metadata["output_tokens"] >= len(json.dumps(ARGS)) // 4
    assert total.response_metadata[USAGE_ESTIMATED_KEY] is True


def test_stream_with_usage_keeps_the_servers_figures(serve: Any) -> None:
    serve(profile=OPENAI)
    model = load_model("openai:script-writer", agent="writer")
    total = _joined(list(model.stream("write")))
    assert total.usage_metadata is not None
    assert (total.usage_metadata["input_tokens"], total.usage_metadata["output_tokens"]) == (17, 9)
    assert USAGE_ESTIMATED_KEY not in total.response_metadata


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_stream_that_ends_without_finish_reason_is_a_failed_call(serve: Any, mode: str) -> None:
    server = serve(faults=Faults(sequence=["unfinished_stream"]))
    model = load_model("openai:script-writer", agent="writer")
    model.streaming = True

    def call() -> Any:
        if mode == "sync":
            return model.invoke("hello")

        async def answer() -> Any:
            try:
                return await model.ainvoke("hello")
            finally:
                await model.http_async_client.aclose()

        return asyncio.run(answer())

    error, events = in_graph(call)
    assert isinstance(error, ModelCallError), error
    said = str(error)
    assert "'writer'" in said and "openai:script-writer" in said
    assert server.base_url in said
    assert "ended without a finish_reason" in said
    assert [e["type"] for e in events] == ["model_error"]
    assert events[0]["role"] == "writer"
    # The turn was not played: the next call gets the whole answer.
    assert server.remaining()["writer"] == 1


def test_streamed_team_on_llama_cpp_python_routes_and_counts_tokens(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structured team, its tokens streamed, on llama-cpp-python: every route comes by
    function calling, streamed with the name in every chunk; the tokens are counted."""
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    script = json.loads(EXAMPLE_RELAY.read_text())
    roles = ("supervisor", "researcher", "coder", "writer", "finalize")
    events: list[dict[str, Any]] = []
    with script_servers(script, monkeypatch.setenv) as start:
        start(profile=LLAMA_CPP_PYTHON)
        result = run_task(
            "When are checkpoints written?",
            agent_models={r: f"openai:script-{r}?tool_call_content=empty" for r in roles},
            on_event=events.append,
            stream_tokens=True,
        )
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "coder", "writer"]
    assert not [e for e in events if e["type"] == "model_error"], events
    for role in ("supervisor", "researcher", "writer"):
        assert result.usage[role]["input_tokens"] > 0, (role, result.usage)
        assert result.usage[role]["output_tokens"] > 0, (role, result.usage)
        assert result.usage[role]["estimated"] is True, (role, result.usage)
