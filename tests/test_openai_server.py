"""The local Chat Completions server works with the real ``ChatOpenAI`` client and SDK."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from .openai_server import FakeOpenAI, serve_script

_ENV_TO_CLEAR = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "OPENAI_PROXY",
    "OPENAI_ORG_ID",
    "OPENAI_ORGANIZATION",
    "LANGSMITH_TRACING",
    "LANGCHAIN_TRACING_V2",
)


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)


def _model(server: FakeOpenAI, key: str = "researcher", **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=f"script-{key}",
        base_url=server.base_url,
        api_key="test",
        max_retries=0,
        timeout=10,
        **kwargs,
    )


@tool
def search(query: str) -> str:
    """Search the notes for a query."""
    return f"results for {query}"


@tool
def read_doc(name: str) -> str:
    """Read a document by name."""
    return name


class Route(BaseModel):
    next: str
    reason: str


ROUTE_SCHEMA = {
    "title": "route",
    "description": "Where to go next.",
    "type": "object",
    "properties": {"next": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["next", "reason"],
}


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    script = {
        "researcher": [
            {"content": "Found three sources.", "usage": {"input_tokens": 12, "output_tokens": 4}},
            {"content": "An estimated answer."},
        ],
        "supervisor": [{"route": {"next": "writer", "reason": "draft it"}}],
    }
    with serve_script(script) as fake:
        yield fake


def test_plain_content_with_usage(server: FakeOpenAI) -> None:
    model = _model(server)
    first = model.invoke("find sources")
    assert isinstance(first, AIMessage)
    assert first.content == "Found three sources."
    assert first.usage_metadata is not None
    assert first.usage_metadata["input_tokens"] == 12
    assert first.usage_metadata["output_tokens"] == 4
    assert first.usage_metadata["total_tokens"] == 16
    assert first.response_metadata["finish_reason"] == "stop"
    assert first.response_metadata["model_name"] == "script-researcher"

    prompt = [HumanMessage("find sources"), first, HumanMessage("and?")]
    second = model.invoke(prompt)
    assert second.content == "An estimated answer."
    # Estimated as ScriptedChatModel does: message texts joined by newlines, ~4 chars a token.
    text = "find sources\nFound three sources.\nand?"
    assert second.usage_metadata is not None
    assert second.usage_metadata["input_tokens"] == math.ceil(len(text) / 4)
    assert second.usage_metadata["output_tokens"] == math.ceil(len("An estimated answer.[]") / 4)

    assert [r["model"] for r in server.requests] == ["script-researcher"] * 2
    assert server.requests[1]["messages"][1] == {
        "role": "assistant",
        "content": "Found three sources.",
    }
    assert server.remaining() == {"researcher": 0, "supervisor": 1}


def test_script_from_file_and_models_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"researcher": [], "finalize": [{"content": "done"}]}))
    with serve_script(path) as fake, openai.OpenAI(base_url=fake.base_url, api_key="t") as client:
        assert [m.id for m in client.models.list()] == ["script-researcher", "script-finalize"]
        assert client.models.retrieve("script-finalize").id == "script-finalize"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4o")
        assert _model(fake, "finalize").invoke("wrap up").content == "done"


def test_tool_calls_round_trip() -> None:
    script = {
        "researcher": [
            {
                "tool_calls": [
                    {"name": "search", "args": {"query": "langgraph"}, "id": "call_given"},
                    {"name": "read_doc", "args": {"name": "README"}},
                ]
            },
            {"content": "Summarised."},
        ]
    }
    with serve_script(script) as fake:
        model = _model(fake).bind_tools([search, read_doc])
        prompt: list[Any] = [HumanMessage("research langgraph")]
        reply = model.invoke(prompt)
        assert isinstance(reply, AIMessage)
        assert reply.tool_calls == [
            {
                "name": "search",
                "args": {"query": "langgraph"},
                "id": "call_given",
                "type": "tool_call",
            },
            {"name": "read_doc", "args": {"name": "README"}, "id": "call_1", "type": "tool_call"},
        ]
        assert reply.response_metadata["finish_reason"] == "tool_calls"
        sent = fake.requests[0]
        assert [t["function"]["name"] for t in sent["tools"]] == ["search", "read_doc"]
        assert all(t["type"] == "function" for t in sent["tools"])

        prompt += [reply] + [
            ToolMessage(f"result {c['id']}", tool_call_id=c["id"]) for c in reply.tool_calls
        ]
        assert model.invoke(prompt).content == "Summarised."
        messages = fake.requests[1]["messages"]
        assert messages[1]["role"] == "assistant"
        assert messages[1]["content"] is None
        assert [m["tool_call_id"] for m in messages[2:]] == ["call_given", "call_1"]


def test_tool_not_in_request_is_rejected() -> None:
    script = {"researcher": [{"tool_calls": [{"name": "delete_all", "args": {}}]}]}
    with serve_script(script) as fake:
        with pytest.raises(openai.BadRequestError) as info:
            _model(fake).bind_tools([search]).invoke("go")
        assert "'delete_all', which is not among the request's tools: search" in str(info.value)
        assert info.value.body["param"] == "tools"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="the request has no 'tools'"):
            _model(fake).invoke("go")
        assert fake.remaining() == {"researcher": 1}  # rejected requests do not advance


def test_structured_output_pydantic(server: FakeOpenAI) -> None:
    structured = _model(server, "supervisor").with_structured_output(
        Route, method="json_schema", include_raw=True
    )
    result = structured.invoke("who is next?")
    assert result["parsed"] == Route(next="writer", reason="draft it")
    assert result["parsing_error"] is None
    assert json.loads(result["raw"].content) == {"next": "writer", "reason": "draft it"}
    response_format = server.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Route"
    assert response_format["json_schema"]["strict"] is True
    assert server.requests[0]["stream"] is False  # the SDK's parse() sends it explicitly


def test_structured_output_json_schema_dict() -> None:
    script = {"supervisor": [{"route": {"next": "critic"}}]}  # invalid: passed on unvalidated
    with serve_script(script) as fake:
        structured = _model(fake, "supervisor").with_structured_output(
            ROUTE_SCHEMA, method="json_schema", include_raw=True
        )
        result = structured.invoke("who is next?")
        assert result["parsed"] == {"next": "critic"}
        spec = fake.requests[0]["response_format"]["json_schema"]
        assert spec["name"] == "route"
        assert spec["schema"]["required"] == ["next", "reason"]


def test_pydantic_structured_output_is_parsed_by_the_sdk() -> None:
    # With a Pydantic schema the openai SDK's parse() validates the content inside the model
    # call, so a bad route raises from the call: include_raw's parsing_error is not used.
    script = {"supervisor": [{"route": {"next": "critic"}}, {"content": "not json"}]}
    with serve_script(script) as fake:
        structured = _model(fake, "supervisor").with_structured_output(
            Route, method="json_schema", include_raw=True
        )
        with pytest.raises(ValidationError, match="reason"):
            structured.invoke("who is next?")
        with pytest.raises(ValidationError, match="Invalid JSON"):
            structured.invoke("who is next?")
        assert fake.remaining() == {"supervisor": 0}


def test_route_turn_needs_response_format(server: FakeOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="'route' turn") as info:
        _model(server, "supervisor").invoke("who is next?")
    assert info.value.body["param"] == "response_format"  # type: ignore[index]


def test_streaming_content_with_usage(server: FakeOpenAI) -> None:
    chunks = list(_model(server, stream_usage=True).stream("find sources"))
    assert len(chunks) > 3
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert isinstance(total, AIMessageChunk)
    assert total.content == "Found three sources."
    assert total.usage_metadata is not None
    assert total.usage_metadata["input_tokens"] == 12
    assert total.usage_metadata["output_tokens"] == 4
    assert total.response_metadata["finish_reason"] == "stop"
    assert server.requests[0]["stream"] is True
    assert server.requests[0]["stream_options"] == {"include_usage": True}


def test_streaming_without_stream_usage_sends_no_stream_options(server: FakeOpenAI) -> None:
    # With a custom base_url ChatOpenAI leaves stream_usage off unless asked.
    message = _model(server, streaming=True).invoke("find sources")
    assert message.content == "Found three sources."
    assert message.usage_metadata is None
    assert server.requests[0]["stream"] is True
    assert "stream_options" not in server.requests[0]


def test_streaming_tool_call_aggregates() -> None:
    args = {"query": "a longer query so the arguments arrive in several fragments"}
    script = {
        "researcher": [
            {"tool_calls": [{"name": "search", "args": args, "id": "call_s"}]},
            {"tool_calls": [{"name": "search", "args": {"query": "x"}}]},
        ]
    }
    with serve_script(script) as fake:
        model = _model(fake, stream_usage=True).bind_tools([search])
        chunks = list(model.stream("research"))
        argument_chunks = [c for c in chunks if c.tool_call_chunks]
        assert len(argument_chunks) > 3
        total = chunks[0]
        for chunk in chunks[1:]:
            total += chunk
        assert total.tool_calls == [
            {"name": "search", "args": args, "id": "call_s", "type": "tool_call"}
        ]
        assert total.usage_metadata is not None
        assert total.response_metadata["finish_reason"] == "tool_calls"

        streamed = _model(fake, streaming=True).bind_tools([search]).invoke("again")
        assert streamed.tool_calls == [
            {"name": "search", "args": {"query": "x"}, "id": "call_1", "type": "tool_call"}
        ]


def test_llama_cpp_python_repeats_a_streamed_tool_calls_fields() -> None:
    """The profile streams a tool call as llama-cpp-python does (its
    ``_convert_completion_to_chat_function``): id, type and name in every chunk, so that
    LangChain's own join repeats the name; relaygraph's model joins it once
    (tests/test_model_streams.py)."""
    from .openai_server import LLAMA_CPP_PYTHON

    args = {"query": "a longer query so the arguments arrive in several fragments"}
    script = {"researcher": [{"tool_calls": [{"name": "search", "args": args, "id": "c_7"}]}]}
    with serve_script(script, profile=LLAMA_CPP_PYTHON) as fake:
        chunks = list(_model(fake, stream_usage=True).bind_tools([search]).stream("research"))
    fragments = [t for c in chunks for t in c.tool_call_chunks]
    assert len(fragments) > 3
    assert all(t["name"] == "search" and t["id"] == "c_7" for t in fragments)
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert isinstance(total, AIMessageChunk)
    assert total.tool_call_chunks[0]["name"] == "search" * len(fragments)
    assert total.usage_metadata is None  # no usage in its streams
    assert total.response_metadata["finish_reason"] == "tool_calls"


def test_dangling_tool_call_is_rejected(server: FakeOpenAI) -> None:
    dangling = AIMessage("", tool_calls=[{"name": "search", "args": {}, "id": "call_x"}])
    with pytest.raises(openai.BadRequestError) as info:
        _model(server).invoke([HumanMessage("hi"), dangling, HumanMessage("well?")])
    assert "must be followed by tool messages" in info.value.message
    assert "call_x" in info.value.message
    assert info.value.body["param"] == "messages.[1].role"  # type: ignore[index]

    orphan = ToolMessage("result", tool_call_id="call_y")
    with pytest.raises(openai.BadRequestError, match="role 'tool' must be a response"):
        _model(server).invoke([HumanMessage("hi"), orphan])
    assert _model(server).invoke("hi").content == "Found three sources."  # cursor unmoved


def test_exhausted_script_and_unknown_model(server: FakeOpenAI) -> None:
    model = _model(server, "supervisor").with_structured_output(Route, method="json_schema")
    model.invoke("next?")
    with pytest.raises(openai.BadRequestError) as info:
        model.invoke("next?")
    assert "script 'supervisor', turn 2: the script has only 1 turn(s)" in info.value.message
    assert info.value.body["code"] == "script_exhausted"  # type: ignore[index]

    with pytest.raises(openai.NotFoundError) as missing:
        _model(server, "writer").invoke("hi")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_async_client(server: FakeOpenAI) -> None:
    async def run() -> tuple[AIMessage, list[Any]]:
        model = _model(server, stream_usage=True)
        first = await model.ainvoke("find sources")
        chunks = [c async for c in model.astream("more")]
        return first, chunks

    first, chunks = asyncio.run(run())
    assert first.content == "Found three sources."
    assert "".join(str(c.content) for c in chunks) == "An estimated answer."


def test_raw_http_errors(server: FakeOpenAI) -> None:
    def post(body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions", data=body, headers=headers, method="POST"
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=5) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.load(err)

    status, body = post(b"{}", {"Content-Type": "application/json"})
    assert status == 401
    assert body["error"]["type"] == "invalid_request_error"
    auth = {"Content-Type": "application/json", "Authorization": "Bearer test"}
    status, body = post(b"not json", auth)
    assert status == 400
    assert "could not parse the JSON body" in body["error"]["message"]
    status, body = post(json.dumps({"model": "script-researcher", "messages": []}).encode(), auth)
    assert (status, body["error"]["param"]) == (400, "messages")
    ok = {"model": "script-researcher", "messages": [{"role": "user", "content": "hi"}], "x": 1}
    status, body = post(json.dumps(ok).encode(), auth)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "Found three sources."


# -- profiles and faults ------------------------------------------------------------------


def _raw_post(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(
        f"{fake.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer t"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            return response.status, dict(response.headers), json.load(response)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), json.load(err)


def test_profiles_refuse_in_their_servers_words() -> None:
    from .openai_server import LLAMA_CPP_PYTHON, OLLAMA, STRICT_FIELDS, VLLM_NO_TOOL_PARSER

    hi = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "search"}}]
    schema = {"type": "json_schema", "json_schema": {"name": "R", "schema": {}}}
    with serve_script({"a": [{"content": "ok"}]}, profile=LLAMA_CPP_PYTHON) as fake:
        status, _, body = _raw_post(
            fake, {"model": "script-a", "messages": hi, "response_format": schema}
        )
        assert status == 500
        assert "'loc': ('body', 'response_format', 'type')" in body["error"]["message"]
        trip = [
            *hi,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "search", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ]
        status, _, body = _raw_post(fake, {"model": "script-a", "messages": trip})
        assert status == 500 and "Input should be a valid string" in body["error"]["message"]
        trip[1]["content"] = ""
        assert _raw_post(fake, {"model": "script-a", "messages": trip})[0] == 200
    with serve_script({"a": [{"content": "ok"}]}, profile=VLLM_NO_TOOL_PARSER) as fake:
        status, _, body = _raw_post(fake, {"model": "script-a", "messages": hi, "tools": tools})
        assert status == 400 and body["object"] == "error"  # vLLM's body, not OpenAI's
        assert body["message"].startswith('"auto" tool choice requires')
    with serve_script({"a": [{"content": "ok"}]}, profile=STRICT_FIELDS) as fake:
        status, _, body = _raw_post(
            fake, {"model": "script-a", "messages": hi, "parallel_tool_calls": False}
        )
        assert (status, body["error"]["param"]) == (400, "parallel_tool_calls")
    with serve_script({"a": [{"content": "ok"}]}, profile=OLLAMA) as fake:
        forced = {"type": "function", "function": {"name": "search"}}
        status, _, body = _raw_post(
            fake, {"model": "script-a", "messages": hi, "tools": tools, "tool_choice": forced}
        )
        assert status == 200  # tool_choice ignored: the script's text answer is played
        assert body["choices"][0]["message"]["content"] == "ok"


def test_faults_come_in_sequence_and_play_no_turn() -> None:
    from .openai_server import Faults

    hi = {"model": "script-a", "messages": [{"role": "user", "content": "hi"}]}
    faults = Faults(sequence=["429", "503", None, "500"], retry_after=2)
    with serve_script({"a": [{"content": "one"}, {"content": "two"}]}, faults=faults) as fake:
        status, headers, body = _raw_post(fake, hi)
        assert (status, headers["Retry-After"]) == (429, "2")
        assert body["error"]["code"] == "rate_limit_exceeded"
        assert _raw_post(fake, hi)[0] == 503
        assert _raw_post(fake, hi)[2]["choices"][0]["message"]["content"] == "one"
        assert _raw_post(fake, hi)[0] == 500
        assert _raw_post(fake, hi)[2]["choices"][0]["message"]["content"] == "two"
        assert [e["fault"] for e in fake.log] == ["429", "503", None, "500", None]
        assert [e["status"] for e in fake.log] == [None, None, 200, None, 200]
        assert len(fake.injected) == 3
    with pytest.raises(ValueError, match="unknown fault kinds"):
        Faults(kinds=("418",))


def test_a_truncated_body_breaks_the_client() -> None:
    from .openai_server import Faults

    with serve_script(
        {"researcher": [{"content": "x"}]}, faults=Faults(sequence=["truncated"])
    ) as fake:
        with pytest.raises(openai.APIConnectionError):
            _model(fake).invoke("hi")
        assert _model(fake).invoke("hi").content == "x"


def test_key_from_lets_conversations_share_one_model_name() -> None:
    def by_task(body: dict[str, Any]) -> str | None:
        for message in body["messages"]:
            if str(message.get("content", "")).startswith("task "):
                return str(message["content"]).split()[1]
        return None

    script = {
        "a": [{"content": "A1"}, {"content": "A2"}],
        "b": [{"content": "B1"}, {"content": "B2"}],
    }
    with serve_script(script, key_from=by_task) as fake:
        # One model name; the task text in the request picks each conversation's turns.
        assert _model(fake, "shared").invoke("task a").content == "A1"
        assert _model(fake, "shared").invoke("task b").content == "B1"
        assert _model(fake, "shared").invoke("task a").content == "A2"
        # Where it picks nothing, the model's key plays.
        assert _model(fake, "b").invoke("hello").content == "B2"
        with pytest.raises(openai.NotFoundError) as missing:
            _model(fake, "shared").invoke("task c")
    assert "no key 'c'" in missing.value.message


def test_keep_alive_answers_do_not_wait_for_a_delayed_ack() -> None:
    # The head and the body of an answer are two writes; with Nagle's algorithm on, the
    # second waits for the client's delayed ACK of the first (40 ms on Linux) every call.
    hi = {"model": "script-a", "messages": [{"role": "user", "content": "hi"}]}
    seconds = []
    with (
        serve_script({"a": [{"content": "x"}] * 21}) as fake,
        openai.DefaultHttpxClient() as client,
    ):
        for _ in range(21):
            started = time.perf_counter()
            response = client.post(
                f"{fake.base_url}/chat/completions",
                json=hi,
                headers={"Authorization": "Bearer test"},
            )
            seconds.append(time.perf_counter() - started)
            assert response.status_code == 200
    assert statistics.median(seconds[1:]) < 0.02, seconds
