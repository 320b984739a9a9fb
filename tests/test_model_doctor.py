"""``relaygraph doctor`` against the local server playing each server profile.

The script answers the doctor's probes in order: plain chat, the route by json_schema,
function_calling and json_mode, a named tool_choice, tool_choice "auto", a tool round trip,
parallel_tool_calls, a stream. A refused request does not advance it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from relaygraph.cli._doctor import add_doctor_parser
from relaygraph.errors import ModelSpecError
from relaygraph.models._doctor import diagnose, run_doctor

from .openai_server import (
    LITELLM_LLAMA_CPP_PYTHON,
    LLAMA_CPP_PYTHON,
    OLLAMA,
    OPENAI,
    STRICT_FIELDS,
    VLLM_NO_TOOL_PARSER,
    Faults,
    ServerProfile,
    serve_script,
)

VERDICT = {"route": {"answer": "yes", "reason": "Rayleigh scattering."}}


def probes_script(
    named: str = "get_time", routes: int = 3, verdict: dict[str, Any] = VERDICT
) -> dict[str, Any]:
    """The probes' answers; ``routes``: how many structured methods the server accepts."""
    return {
        "doctor": [
            {"content": "ready"},
            *[verdict] * routes,
            {"tool_calls": [{"name": named, "args": {"city": "Paris"}}]},
            {"tool_calls": [{"name": "get_weather", "args": {"city": "Paris"}}]},
            {"content": "It is sunny in Paris."},
            {"tool_calls": [{"name": "get_weather", "args": {"city": "Paris"}}]},
            {"content": "one two three four five"},
        ]
    }


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    contexts: list[Any] = []

    def run(
        profile: ServerProfile,
        spec: str = "openai:script-doctor",
        faults: Faults | None = None,
        **script: Any,
    ) -> Any:
        context = serve_script(probes_script(**script), profile=profile, faults=faults)
        server = context.__enter__()
        contexts.append(context)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        report = diagnose(spec, timeout=10)
        return report, server

    yield run
    for context in contexts:
        context.__exit__(None, None, None)


def doctor_args(*argv: str) -> argparse.Namespace:
    """``relaygraph doctor`` with ``argv``, parsed as the command line parses it."""
    parser = argparse.ArgumentParser(prog="relaygraph")
    add_doctor_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["doctor", *argv])


def statuses(report: Any) -> dict[str, str]:
    return {p.name: p.status for p in report.probes}


def test_a_server_that_takes_everything_needs_no_options(doctor: Any) -> None:
    report, server = doctor(OPENAI)
    assert set(statuses(report).values()) == {"ok"}, report.probes
    assert report.options == {}
    assert report.spec == "openai:script-doctor"
    assert report.notes == []
    assert report.usable
    assert server.remaining() == {"doctor": 0}  # every probe was answered once
    by_name = {p.name: p for p in report.probes}
    assert by_name["streaming"].detail.endswith("chunks, with usage")
    assert by_name["tool_choice: named"].detail == 'called get_time({"city": "Paris"})'


def test_llama_cpp_python_needs_function_calling_and_empty_content(doctor: Any) -> None:
    report, server = doctor(LLAMA_CPP_PYTHON, routes=2)
    assert statuses(report) == {
        "chat": "ok",
        "structured: json_schema": "rejected",
        "structured: function_calling": "ok",
        "structured: json_mode": "ok",
        "tool_choice: named": "ok",
        "tool_choice: auto": "ok",
        "tool round trip": "weak",
        "parallel_tool_calls": "ok",
        "streaming": "ok",
    }
    by_name = {p.name: p for p in report.probes}
    assert by_name["structured: json_schema"].detail == (
        "HTTP 500: response_format.type: Input should be 'text' or 'json_object'"
    )
    assert report.options == {"structured": "function_calling", "tool_call_content": "empty"}
    assert report.spec == (
        "openai:script-doctor?structured=function_calling&tool_call_content=empty"
    )
    assert report.notes == [
        "streamed answers carry no usage: where a run streams, tokens are estimated"
    ]
    assert report.usable
    assert server.remaining() == {"doctor": 0}


def test_vllm_without_a_tool_parser_is_told_to_start_one(doctor: Any) -> None:
    report, _ = doctor(VLLM_NO_TOOL_PARSER)
    found = statuses(report)
    assert found["structured: json_schema"] == "ok"
    assert found["tool_choice: named"] == "ok"
    assert found["tool_choice: auto"] == "rejected"
    assert found["tool round trip"] == "rejected"
    assert found["parallel_tool_calls"] == "ok"
    assert report.options == {}
    assert any("--enable-auto-tool-choice --tool-call-parser" in n for n in report.notes)
    assert not report.usable


def test_ollama_ignoring_tool_choice_is_seen(doctor: Any) -> None:
    report, _ = doctor(OLLAMA, named="get_weather")
    by_name = {p.name: p for p in report.probes}
    assert by_name["tool_choice: named"].status == "weak"
    assert by_name["tool_choice: named"].detail == (
        "called get_weather, not the named get_time: tool_choice is ignored"
    )
    assert report.options == {}
    assert report.usable


def test_a_server_refusing_parallel_tool_calls_gets_omit(doctor: Any) -> None:
    report, _ = doctor(STRICT_FIELDS, spec="openai:script-doctor?header.X-Team=a&timeout=5")
    assert statuses(report)["parallel_tool_calls"] == "rejected"
    assert report.options == {"parallel_tool_calls": "omit"}
    # The user's own options stay in the spec to use.
    assert report.spec == "openai:script-doctor?timeout=5&parallel_tool_calls=omit&header.X-Team=a"


def test_cli_json_and_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_script(probes_script(routes=2), profile=LLAMA_CPP_PYTHON) as server:
        args = doctor_args(
            "--model", "openai:script-doctor", "--base-url", server.base_url, "--json"
        )
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # --base-url wins
        assert run_doctor(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["usable"] is True
    assert out["spec"] == "openai:script-doctor?structured=function_calling&tool_call_content=empty"
    assert out["base_url"] == server.base_url
    assert [p["name"] for p in out["probes"]][:2] == ["chat", "structured: json_schema"]

    # Nothing listens: plain chat fails, the rest is skipped, exit code 1.
    args = doctor_args("--model", "openai:m?max_retries=0", "--base-url", "http://127.0.0.1:9/v1")
    assert run_doctor(args) == 1
    text = capsys.readouterr().out
    assert "could not reach http://127.0.0.1:9/v1" in text
    assert "skipped" in text
    assert "a team cannot run on this server as it is" in text


def test_doctor_probes_only_chat_completions() -> None:
    with pytest.raises(ModelSpecError, match="doctor probes Chat Completions servers"):
        diagnose("scripted:relay.json")


def _assistant_contents(server: Any) -> list[Any]:
    return [
        m.get("content", "(dropped)")
        for r in server.requests
        for m in r["messages"]
        if m["role"] == "assistant" and m.get("tool_calls")
    ]


def test_the_round_trip_is_probed_with_the_specs_tool_call_content(doctor: Any) -> None:
    spec = "openai:script-doctor?tool_call_content=empty"
    report, server = doctor(LLAMA_CPP_PYTHON, spec=spec, routes=2)
    by_name = {p.name: p for p in report.probes}
    assert by_name["tool round trip"].status == "ok"
    assert by_name["tool round trip"].detail == (
        'tool result answered (assistant content "", as the spec says)'
    )
    assert _assistant_contents(server) == [""]  # no null sent first
    assert report.spec == (
        "openai:script-doctor?structured=function_calling&tool_call_content=empty"
    )
    assert report.usable


def test_behind_litellm_the_round_trip_sends_empty_content(doctor: Any) -> None:
    """LiteLLM drops ``content: null`` beside tool calls, and the backend's failure comes
    back as a 500 naming nothing: the doctor knows the proxy and sends "" instead."""
    report, server = doctor(LITELLM_LLAMA_CPP_PYTHON, routes=2)
    by_name = {p.name: p for p in report.probes}
    assert by_name["tool round trip"].status == "weak"
    assert "behind LiteLLM" in by_name["tool round trip"].detail
    assert _assistant_contents(server) == [""]
    assert report.options == {"structured": "function_calling", "tool_call_content": "empty"}
    assert report.usable


def test_a_tool_call_with_broken_arguments_is_not_text(doctor: Any) -> None:
    # The fifth request is the named tool_choice probe.
    faults = Faults(sequence=[None, None, None, None, "broken_arguments"])
    report, _ = doctor(OPENAI, faults=faults)
    named = {p.name: p for p in report.probes}["tool_choice: named"]
    assert named.status == "weak"
    assert named.detail.startswith("called get_time with arguments that are not JSON: ")
    assert "text" not in named.detail


def test_no_reliable_structured_method_is_not_usable(doctor: Any) -> None:
    report, _ = doctor(OPENAI, routes=2, verdict={"content": "maybe"})
    found = statuses(report)
    assert "ok" not in [found[f"structured: {m}"] for m in ("json_schema", "json_mode")]
    assert found["structured: function_calling"] == "rejected"
    assert not report.usable
    assert any("no method gives the route reliably" in n for n in report.notes)


def test_broken_streaming_is_not_usable(doctor: Any) -> None:
    # The ninth request is the stream; it ends with no finish_reason.
    report, _ = doctor(OPENAI, faults=Faults(sequence=[None] * 8 + ["unfinished_stream"]))
    streaming = {p.name: p for p in report.probes}["streaming"]
    assert streaming.status == "error"
    assert "ended without a finish_reason" in streaming.detail
    assert not report.usable
    assert any(n.startswith("streaming is broken") for n in report.notes)


def test_the_printed_spec_is_quoted_for_the_shell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_script(probes_script(routes=2), profile=LLAMA_CPP_PYTHON) as server:
        args = doctor_args("--model", "openai:script-doctor", "--base-url", server.base_url)
        monkeypatch.setenv("COLUMNS", "200")
        assert run_doctor(args) == 0
    out = capsys.readouterr().out
    assert (
        "use: --model 'openai:script-doctor?structured=function_calling&tool_call_content=empty'"
        in out
    )
