"""The HTTP clients of ``openai:`` models are the process's: built once, shared by every role.

A service that builds its models per task (a team cache miss, a model picked per request)
would otherwise pay for a new TLS context and new connections with every model.
Each retry must still be reported as the role that made the call, whichever shares the client.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from relaygraph.models import load_model

from .openai_server import FakeOpenAI, Faults, script_servers
from .test_model_retry import in_graph

SCRIPT = {
    "researcher": [{"content": "facts"}, {"content": "more facts"}],
    "writer": [{"content": "a draft"}, {"content": "a second draft"}],
}


pytestmark = pytest.mark.usefixtures("quick_backoff")


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeOpenAI]]:
    with script_servers(SCRIPT, monkeypatch.setenv) as start:
        yield start


def test_models_of_one_server_share_one_client(monkeypatch: pytest.MonkeyPatch) -> None:
    researcher = load_model("openai:script-researcher", agent="researcher")
    writer = load_model("openai:script-writer", agent="writer")
    assert researcher.http_client is writer.http_client
    # Async connections belong to the loop that opened them: one client per model.
    assert researcher.http_async_client is not writer.http_async_client

    # What makes a client differ gets a client of its own.
    assert load_model("openai:script-writer?timeout=5", agent="w").http_client is not (
        writer.http_client
    )
    assert load_model("openai:script-writer?max_retries=0", agent="w").http_client is not (
        writer.http_client
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert load_model("openai:script-writer", agent="w").http_client is not writer.http_client
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:10/v1")
    other = load_model("openai:script-writer", agent="w")
    assert other.http_client is not writer.http_client

    # A closed client is not handed out again.
    other.http_client.close()
    assert not load_model("openai:script-writer", agent="w").http_client.is_closed


def test_building_a_model_loads_no_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    load_model("openai:script-researcher", agent="researcher")
    loads: list[Any] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    for role in ("supervisor", "researcher", "coder", "writer", "finalize"):
        load_model("openai:script-researcher", agent=role)
    assert loads == []


def test_each_retry_is_reported_as_the_role_that_called(serve: Any) -> None:
    server = serve(Faults(sequence=["503", None, "503", None]))
    researcher = load_model("openai:script-researcher", agent="researcher")
    writer = load_model("openai:script-writer", agent="writer")
    assert researcher.http_client is writer.http_client

    reply, events = in_graph(lambda: researcher.invoke("find it"))
    assert isinstance(reply, AIMessage) and reply.content == "facts"
    assert [(e["type"], e["role"], e["model"]) for e in events] == [
        ("model_retry", "researcher", "openai:script-researcher")
    ]

    reply, events = in_graph(lambda: "".join(str(c.content) for c in writer.stream("write it")))
    assert reply == "a draft"
    assert [(e["type"], e["role"], e["model"]) for e in events] == [
        ("model_retry", "writer", "openai:script-writer")
    ]
    assert [e["fault"] for e in server.log] == ["503", None, "503", None]

    # No call, no reporter: a retry outside a model's call is retried, not misattributed.
    server.faults = Faults(sequence=["503"])
    response = writer.http_client.post(
        f"{server.base_url}/chat/completions",
        json={"model": "script-researcher", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": "Bearer test"},
    )
    assert response.status_code == 200
    reply, events = in_graph(lambda: writer.invoke("again"))
    assert reply.content == "a second draft" and events == []


def test_async_calls_report_their_role_too(serve: Any) -> None:
    serve(Faults(sequence=["429", None, None, "503"], retry_after=0.05))
    researcher = load_model("openai:script-researcher", agent="researcher")
    writer = load_model("openai:script-writer", agent="writer")

    async def calls() -> list[Any]:
        try:
            first = await researcher.ainvoke("find it")
            chunks = [c async for c in writer.astream("write it")]
            second = await writer.ainvoke("again")
            return [first.content, "".join(str(c.content) for c in chunks), second.content]
        finally:
            await researcher.http_async_client.aclose()
            await writer.http_async_client.aclose()

    reply, events = in_graph(lambda: asyncio.run(calls()))
    assert reply == ["facts", "a draft", "a second draft"]
    assert [(e["role"], e["status"]) for e in events] == [("researcher", 429), ("writer", 503)]
