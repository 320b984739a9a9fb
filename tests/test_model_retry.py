"""A model call's retries over HTTP: what is retried, how long it waits, what is reported.

Each test points a real ``openai:`` model (``ChatOpenAI`` and the SDK under it) at the local
Chat Completions server, which injects the faults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph

from relaygraph.models import ModelCallError, load_model
from relaygraph.models._retry import retry_after

from .openai_server import (
    LLAMA_CPP_PYTHON,
    FakeOpenAI,
    Faults,
    script_servers,
)

SCRIPT = {
    "researcher": [
        {"content": "first answer", "usage": {"input_tokens": 11, "output_tokens": 3}},
        {"content": "second answer", "usage": {"input_tokens": 13, "output_tokens": 5}},
    ],
    "supervisor": [{"route": {"next": "writer", "task": "t", "reason": "r"}}],
}


pytestmark = pytest.mark.usefixtures("quick_backoff")


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeOpenAI]]:
    with script_servers(SCRIPT, monkeypatch.setenv) as start:
        yield start


class _State(TypedDict, total=False):
    reply: Any


def in_graph(call: Callable[[], Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``call`` inside a LangGraph node; returns its result (or error) and the events."""

    def node(state: _State) -> _State:
        try:
            return {"reply": call()}
        except ModelCallError as exc:
            return {"reply": exc}

    builder = StateGraph(_State)
    builder.add_node("call", node)
    builder.add_edge(START, "call")
    builder.add_edge("call", END)
    graph = builder.compile()
    events: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    for mode, data in graph.stream({}, stream_mode=["custom", "values"]):
        if mode == "custom":
            events.append(data)
        else:
            result = data
    return result.get("reply"), events


def test_429_waits_for_retry_after_and_the_call_counts_once(serve: Any) -> None:
    server = serve(Faults(sequence=["429"], retry_after=0.6))
    model = load_model("openai:script-researcher", agent="researcher")
    reply, events = in_graph(lambda: model.invoke("hello"))
    assert isinstance(reply, AIMessage)
    assert reply.content == "first answer"
    # One answer, one usage: the rejected attempt spent nothing.
    assert reply.usage_metadata is not None
    assert (reply.usage_metadata["input_tokens"], reply.usage_metadata["output_tokens"]) == (11, 3)
    first, second = server.log
    assert (first["fault"], second["fault"]) == ("429", None)
    assert first["digest"] == second["digest"]  # the same request, sent again
    assert second["at"] - first["at"] >= 0.6
    assert events == [
        {
            "type": "model_retry",
            "role": "researcher",
            "model": "openai:script-researcher",
            "attempt": 1,
            "status": 429,
            "error": "Rate limit reached for requests. Please try again in 0.6s.",
            "wait_seconds": 0.6,
            "retry_after": 0.6,
        }
    ]
    assert server.remaining()["researcher"] == 1


def test_server_errors_timeouts_and_cut_bodies_are_retried(serve: Any) -> None:
    server = serve(Faults(sequence=["500", "503", "truncated", "timeout"], stall_seconds=1.5))
    model = load_model("openai:script-researcher?max_retries=4&timeout=0.5", agent="researcher")
    reply, events = in_graph(lambda: model.invoke("hello"))
    assert isinstance(reply, AIMessage), reply
    assert reply.content == "first answer"
    assert [e["fault"] for e in server.log] == ["500", "503", "truncated", "timeout", None]
    assert [(e["attempt"], e["status"]) for e in events] == [
        (1, 500),
        (2, 503),
        (3, None),
        (4, None),
    ]
    assert "RemoteProtocolError" in events[2]["error"]
    assert "Timeout" in events[3]["error"]


def test_a_request_error_is_not_retried(serve: Any) -> None:
    server = serve(profile=LLAMA_CPP_PYTHON)
    model = load_model("openai:script-supervisor?structured=json_schema", agent="supervisor")
    schema = {"title": "Route", "type": "object", "properties": {"next": {"type": "string"}}}
    structured = model.with_structured_output(schema)
    error, events = in_graph(lambda: structured.invoke("who is next?"))
    assert isinstance(error, ModelCallError)
    # llama-cpp-python answers 500 to a response_format it does not know: a validation
    # error of the request, which fails again however often it is sent.
    assert (error.status, error.attempts) == (500, 1)
    assert error.detail == "response_format.type: Input should be 'text' or 'json_object'"
    assert len(server.log) == 1
    assert events == [error.to_event()]
    assert str(error) == (
        "model call of 'supervisor' (openai:script-supervisor?structured=json_schema) failed: "
        "HTTP 500: response_format.type: Input should be 'text' or 'json_object'"
    )

    exhausted = load_model("openai:script-writer", agent="writer")
    error, _ = in_graph(lambda: exhausted.invoke("hi"))
    assert isinstance(error, ModelCallError)
    assert error.status == 404 and error.attempts == 1
    assert len(server.log) == 2


def test_retries_run_out_with_the_servers_words(serve: Any) -> None:
    server = serve(Faults(sequence=["503", "503", "503"]))
    model = load_model("openai:script-researcher", agent="researcher")
    error, events = in_graph(lambda: model.invoke("hello"))
    assert isinstance(error, ModelCallError)
    assert (error.status, error.attempts) == (503, 3)
    assert error.reason == (
        "HTTP 503: The engine is currently overloaded, please try again later. (after 3 attempts)"
    )
    assert [e["type"] for e in events] == ["model_retry", "model_retry", "model_error"]
    assert len(server.log) == 3
    assert server.remaining()["researcher"] == 2  # no fault played a turn


def test_a_long_retry_after_fails_the_call_instead_of_retrying_early(serve: Any) -> None:
    server = serve(Faults(sequence=["429"], retry_after=120))
    model = load_model("openai:script-researcher", agent="researcher")
    error, events = in_graph(lambda: model.invoke("hello"))
    assert isinstance(error, ModelCallError)
    assert error.status == 429 and error.attempts == 1
    assert len(server.log) == 1
    assert [e["type"] for e in events] == ["model_error"]


def test_a_stream_cut_short_is_a_model_error(serve: Any) -> None:
    server = serve(Faults(sequence=["truncated"]))
    model = load_model("openai:script-researcher", agent="researcher")
    error, events = in_graph(lambda: list(model.stream("hello")))
    assert isinstance(error, ModelCallError)
    assert error.status is None
    assert error.detail.startswith(
        "the connection broke before the answer was complete (RemoteProtocolError: peer closed"
    )
    assert len(server.log) == 1  # half a stream cannot be asked for again
    assert events[-1]["type"] == "model_error"
    # The next call goes through: the cut stream played no turn.
    assert "".join(str(c.content) for c in model.stream("hello")) == "first answer"


def test_async_calls_retry_too(serve: Any) -> None:
    server = serve(Faults(sequence=["503", "429"], retry_after=0.2))
    model = load_model("openai:script-researcher", agent="researcher")

    async def call() -> Any:
        try:
            return await model.ainvoke("hello")
        finally:
            await model.http_async_client.aclose()

    reply = asyncio.run(call())
    assert reply.content == "first answer"
    assert [e["fault"] for e in server.log] == ["503", "429", None]
    assert server.log[2]["at"] - server.log[1]["at"] >= 0.2


def test_an_unreachable_server_is_named() -> None:
    # conftest points OPENAI_BASE_URL at a dead port.
    model = load_model("openai:m?max_retries=0", agent="coder")
    with pytest.raises(ModelCallError) as info:
        model.invoke("hello")
    assert info.value.status is None
    assert info.value.detail.startswith("could not reach http://127.0.0.1:9/v1 (ConnectError: ")


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_header(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers) == seconds


def test_retry_after_as_an_http_date() -> None:
    import email.utils
    import time

    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    wait = retry_after({"retry-after": when})
    assert wait is not None and 28 <= wait <= 30


MALFORMED = ["empty_choices", "null_message", "not_json", "html"]


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_200_is_a_model_error_naming_the_server(
    serve: Any, kind: str, stream: bool
) -> None:
    """A 200 with no chat completion in it (no choices, a null message, a body that is not
    JSON, an HTML page) is a failed call, as a 500 is: not a bare IndexError or
    JSONDecodeError that names no role, spec or server."""
    server = serve(Faults(sequence=[kind]))
    model = load_model("openai:script-researcher", agent="researcher")
    error, events = in_graph(
        (lambda: list(model.stream("hello"))) if stream else (lambda: model.invoke("hello"))
    )
    assert isinstance(error, ModelCallError), error
    assert error.status == 200 and error.role == "researcher"
    assert error.model == "openai:script-researcher"
    assert f"the server at {server.base_url} answered with " in error.detail
    assert events[-1]["type"] == "model_error" and events[-1]["role"] == "researcher"
    # The faulted request played no turn: the next call gets the script's answer.
    assert model.invoke("hello").content == "first answer"


@pytest.mark.parametrize("kind", ["500", "html"])
def test_a_malformed_200_ends_a_swarm_as_a_500_does(
    serve: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.runner import run_task
    from relaygraph.topology import Topology

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    serve(Faults(sequence=[kind] * 8, models=frozenset({"script-researcher"})))
    result = run_task(
        "When are checkpoints written?",
        model="openai:script-researcher?max_retries=0",
        topology=Topology.parse("swarm"),
    )
    # The same ending for both (it failed the whole task on a malformed 200): the failed
    # call is named, with its role and the server's answer. No agent's work is left to
    # answer from, so the task failed.
    assert result.status == "failed"
    assert result.answer is None
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("model_error: researcher: HTTP ")


def test_a_model_called_by_hundreds_of_tasks_at_once_keeps_its_connections() -> None:
    """A second round of 120 calls at once goes over the first round's connections: the
    SDK's own limits keep only 100 open, and would open a new one for each call past it."""
    from relaygraph.models._retry import RetryingAsyncClient, RetryPolicy

    at_once = 120

    async def main() -> tuple[int, int]:
        connections = 0
        waiting: list[asyncio.Future[None]] = []

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    released = asyncio.get_running_loop().create_future()
                    waiting.append(released)
                    if len(waiting) == at_once:  # Every call of the round is in flight.
                        for each in waiting:
                            each.set_result(None)
                        waiting.clear()
                    await released
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    await writer.drain()
            except asyncio.IncompleteReadError:
                pass  # The client closed the connection.
            finally:
                writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RetryingAsyncClient(policy=RetryPolicy(max_retries=0), timeout=60)
        rounds = []
        for _ in range(2):
            replies = await asyncio.gather(
                *(client.get(f"http://127.0.0.1:{port}/") for _ in range(at_once))
            )
            assert {reply.status_code for reply in replies} == {200}
            rounds.append(connections)
        await client.aclose()
        server.close()
        await server.wait_closed()
        return rounds[0], rounds[1]

    first, second = asyncio.run(main())
    assert first == at_once
    assert second == first
