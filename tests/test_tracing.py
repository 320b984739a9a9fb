"""Tracing and audit: OpenTelemetry GenAI spans, LangSmith runs, the ledger's timeline.

Everything runs offline: spans go to an in-memory exporter, the console (stderr) or an
OTLP endpoint on loopback; LangSmith runs go to a real ``langsmith.Client`` whose HTTP
session answers locally and keeps what was posted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import pytest
import requests
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.langchain import LangChainTracer
from langgraph.errors import ParentCommand
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from rich.console import Console

from relaygraph.errors import ConfigError
from relaygraph.runner import RunResult, run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, RecordNotFound
from tests.builtin_team import parse_policy

from ._scripts import call, route, say
from .conftest import EXAMPLE_RELAY

Script = Callable[[dict[str, Any]], str]
RELAY = f"scripted:{EXAMPLE_RELAY}"
TASK, THREAD = "task-1", "thread-1"

# A run with a violation (a tool the researcher may not use) and a budget hit (the coder
# has one model call), both recorded by the team graph.
VIOLATIONS = {
    "supervisor": [route("researcher"), route("coder"), route("FINISH")],
    "researcher": [call("run_python", code="print(1)"), say("done without code")],
    "coder": [call("run_python", code="print(2)"), say("never said")],
    "finalize": [say("final")],
}
VIOLATIONS_POLICY = {"agents": {"coder": {"max_model_calls": 1}}}


# -- OpenTelemetry helpers ----------------------------------------------------------------


def traced_run(
    model: str, *, policy: dict[str, Any] | None = None, **extra: Any
) -> tuple[RunResult, list[ReadableSpan]]:
    from relaygraph.tracing import tracing_callbacks

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handlers = tracing_callbacks(
        task_id=TASK,
        thread_id=THREAD,
        project="local",
        team={"name": "docs-review", "version": 3, "digest": "sha256:abc"},
        policy_source="default",
        models={"researcher": model},
        tracer_provider=provider,
    )
    result = run_task(
        "go",
        model=model,
        policy=parse_policy(policy) if policy else None,
        callbacks=[*handlers, *extra.pop("callbacks", [])],
        **extra,
    )
    return result, list(exporter.get_finished_spans())


def span_tree(spans: list[ReadableSpan]) -> list[Any]:
    """Span names nested as ``[name, [children...]]``, children in start order."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent, []).append(span)

    def node(span: ReadableSpan) -> Any:
        kids = sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time or 0)
        return [span.name, [node(k) for k in kids]] if kids else span.name

    return [node(s) for s in children[None]]


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


class ChainErrors(BaseCallbackHandler):
    """Records which exceptions passed through chain runs."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def on_chain_error(self, error: BaseException, **kwargs: Any) -> None:
        self.errors.append(error)


# -- configuration ------------------------------------------------------------------------


def test_public_names_import_and_node_names_match_the_team_graph() -> None:
    import relaygraph.tracing as tracing
    from relaygraph.supervisor import FINALIZE, SUPERVISOR
    from relaygraph.tracing import _runs

    for name in tracing.__all__:
        assert getattr(tracing, name) is not None, name
    assert (_runs.SUPERVISOR, _runs.FINALIZE) == (SUPERVISOR, FINALIZE)


def test_exporters_come_from_the_environment() -> None:
    from relaygraph.tracing import otel_exporters

    assert otel_exporters({}) == ()
    assert otel_exporters({"OTEL_TRACES_EXPORTER": "none"}) == ()
    assert otel_exporters({"OTEL_TRACES_EXPORTER": "console, OTLP"}) == ("console", "otlp")
    with pytest.raises(ConfigError, match=r"'jaeger'.*supports otlp, console, none"):
        otel_exporters({"OTEL_TRACES_EXPORTER": "jaeger"})


def python_with_tracing_off(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with a bare environment and LangSmith tracing
    off: what the code imports there, tracing off imports."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANGSMITH_TRACING": "false"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def test_with_tracing_off_no_handler_is_made_and_no_tracer_is_loaded(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from relaygraph.tracing import langsmith_config, tracing_callbacks\n"
        "assert tracing_callbacks(task_id='t', thread_id='th') == []\n"
        "assert langsmith_config(task_id='t', thread_id='th') == {}\n"
        "tracers = ('relaygraph.tracing._otel', 'relaygraph.tracing._langsmith',\n"
        "           'opentelemetry.exporter.otlp.proto.http')\n"
        "loaded = [m for m in tracers if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = python_with_tracing_off(code, tmp_path)
    assert proc.returncode == 0, proc.stderr


# -- OpenTelemetry ------------------------------------------------------------------------


def test_relay_run_spans_nest_as_task_visits_calls_and_tools(home: Path) -> None:
    chain_errors = ChainErrors()
    result, spans = traced_run(RELAY, callbacks=[chain_errors])
    assert result.status == "succeeded"

    chat = "chat scripted:relay.json"
    assert span_tree(spans) == [
        [
            "invoke_workflow relaygraph",
            [
                # Each supervisor decision is one chat call (its structured route).
                ["invoke_agent supervisor", [chat]],
                [
                    "invoke_agent researcher",
                    [chat, "execute_tool search_docs", chat, "execute_tool transfer_to_coder"],
                ],
                ["invoke_agent coder", [chat, "execute_tool run_python", chat]],
                ["invoke_agent supervisor", [chat]],
                ["invoke_agent writer", [chat, "execute_tool save_artifact", chat]],
                # The writer's reply is the answer: the supervisor's FINISH ends the run in
                # its own step (no finalize step, no model call for the answer).
                ["invoke_agent supervisor", [chat]],
            ],
        ]
    ]
    assert len({s.context.trace_id for s in spans}) == 1

    [root] = named(spans, "invoke_workflow relaygraph")
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert root.attributes["gen_ai.conversation.id"] == THREAD
    assert root.attributes["relaygraph.task_id"] == TASK
    assert root.attributes["relaygraph.project"] == "local"
    assert root.attributes["relaygraph.team.name"] == "docs-review"
    assert root.attributes["relaygraph.team.version"] == 3
    assert root.attributes["relaygraph.task.status"] == "succeeded"
    team_tokens = sum(u["input_tokens"] for u in result.usage.values())
    assert root.attributes["gen_ai.usage.input_tokens"] == team_tokens

    [researcher] = named(spans, "invoke_agent researcher")
    attrs = researcher.attributes or {}
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["gen_ai.agent.name"] == "researcher"
    assert attrs["gen_ai.conversation.id"] == THREAD
    assert attrs["gen_ai.usage.input_tokens"] == result.usage["researcher"]["input_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == result.usage["researcher"]["output_tokens"]
    assert str(attrs["relaygraph.checkpoint_ns"]).startswith("researcher:")

    # The handoff travelled as a ParentCommand through the agent's runs, yet it is a
    # handoff on the span, not an error.
    assert any(isinstance(e, ParentCommand) for e in chain_errors.errors)
    assert researcher.status.status_code is StatusCode.UNSET
    assert attrs["relaygraph.agent.ended"] == "handed_off"
    handoff = {
        "relaygraph.handoff.from": "researcher",
        "relaygraph.handoff.to": "coder",
        "relaygraph.handoff.task": result.handoffs[1]["task"],
        "relaygraph.handoff.reason": "a calculation is best checked by running code",
    }
    assert events(researcher, "relaygraph.handoff") == [handoff]
    [transfer] = named(spans, "execute_tool transfer_to_coder")
    assert {k: (transfer.attributes or {})[k] for k in handoff} == handoff
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)

    [first_call, *_] = [s for s in spans if s.parent == researcher.context and "chat" in s.name]
    assert first_call.attributes is not None
    assert first_call.attributes["gen_ai.operation.name"] == "chat"
    assert first_call.attributes["gen_ai.request.model"] == "scripted:relay.json"
    assert first_call.attributes["gen_ai.agent.name"] == "researcher"
    assert cast(int, first_call.attributes["gen_ai.usage.input_tokens"]) > 0

    [search] = named(spans, "execute_tool search_docs")
    assert search.attributes is not None
    assert search.attributes["gen_ai.operation.name"] == "execute_tool"
    assert search.attributes["gen_ai.tool.name"] == "search_docs"
    assert search.attributes["gen_ai.tool.call.id"] == "call_researcher_1_0"

    [route_to_researcher] = events(named(spans, "invoke_agent supervisor")[0], "relaygraph.route")
    assert route_to_researcher["relaygraph.route.next"] == "researcher"
    assert route_to_researcher["relaygraph.route.reason"] == "the request needs facts from the docs"


def test_violations_and_budget_hits_are_span_events(home: Path, script: Script) -> None:
    result, spans = traced_run(script(VIOLATIONS), policy=VIOLATIONS_POLICY)
    assert [(v["agent"], v["kind"]) for v in result.violations] == [
        ("researcher", "tool_not_allowed"),
        ("coder", "budget"),
    ]
    [researcher] = named(spans, "invoke_agent researcher")
    assert events(researcher, "relaygraph.violation") == [
        {
            "relaygraph.violation.kind": "tool_not_allowed",
            "relaygraph.violation.agent": "researcher",
            "relaygraph.violation.detail": result.violations[0]["detail"],
        }
    ]
    [coder] = named(spans, "invoke_agent coder")
    [hit] = events(coder, "relaygraph.budget_hit")
    assert hit["relaygraph.violation.detail"] == "agent 'coder' used 1 of 1 model calls"
    assert (coder.attributes or {})["relaygraph.agent.ended"] == "budget"
    assert coder.status.status_code is StatusCode.UNSET


def test_a_pause_for_approval_is_not_an_error(home: Path, script: Script) -> None:
    spec = script(
        {
            "supervisor": [route("coder"), route("FINISH")],
            "coder": [call("run_python", code="print(1)"), say("ran")],
            "finalize": [say("final")],
        }
    )
    policy = {"agents": {"coder": {"approval": ["run_python"]}}}
    result, spans = traced_run(spec, policy=policy)
    assert result.status == "interrupted"
    [coder] = named(spans, "invoke_agent coder")
    assert coder.status.status_code is StatusCode.UNSET
    assert (coder.attributes or {})["relaygraph.interrupted"] is True
    [waiting] = events(coder, "relaygraph.interrupt")
    assert json.loads(str(waiting["relaygraph.waits_for"]))["tool"] == "run_python"
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)


def test_a_real_failure_is_an_error(home: Path, script: Script) -> None:
    spec = script({"supervisor": [route("coder")], "coder": [], "finalize": [say("final")]})
    result, spans = traced_run(spec)
    assert result.status == "failed"
    failed = {s.name for s in spans if s.status.status_code is StatusCode.ERROR}
    assert failed == {
        "invoke_workflow relaygraph",
        "invoke_agent coder",
        "chat scripted:" + (Path(spec.removeprefix("scripted:")).name),
    }
    [coder] = named(spans, "invoke_agent coder")
    assert (coder.attributes or {})["error.type"] == "ScriptError"
    assert [e.name for e in coder.events] == ["exception"]


def test_a_drained_run_is_not_an_error() -> None:
    """A cancel or a shutdown stops the run with ``GraphDrained``, not a failure."""
    from langgraph.errors import GraphDrained

    from relaygraph.tracing import OpenTelemetryCallbackHandler

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handler = OpenTelemetryCallbackHandler(
        provider.get_tracer("test"), task_id=TASK, thread_id=THREAD
    )
    root, node = UUID(int=1), UUID(int=2)
    handler.on_chain_start({}, {}, run_id=root, name="relaygraph")
    handler.on_chain_start({}, {}, run_id=node, parent_run_id=root, name="coder")
    handler.on_chain_error(GraphDrained("shutdown"), run_id=node, parent_run_id=root)
    handler.on_chain_error(GraphDrained("shutdown"), run_id=root)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["invoke_agent coder", "invoke_workflow relaygraph"]
    assert all(s.status.status_code is StatusCode.UNSET for s in spans)
    assert all((s.attributes or {})["relaygraph.control_flow"] == "drain" for s in spans)


def test_console_exporter_prints_spans_on_stderr_only(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from relaygraph.tracing import tracing_callbacks

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "relaygraph-console-test")
    handlers = tracing_callbacks(task_id=TASK, thread_id=THREAD)
    assert len(handlers) == 1
    run_task("go", model=RELAY, callbacks=handlers)
    out, err = capsys.readouterr()
    assert out == ""
    assert '"name": "invoke_agent researcher"' in err
    assert '"name": "relaygraph.handoff"' in err
    assert '"service.name": "relaygraph-console-test"' in err


@pytest.fixture
def otlp_collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """An OTLP/HTTP endpoint on loopback that keeps each request's path and body."""
    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()


def test_otlp_exporter_sends_spans_to_the_configured_endpoint(
    home: Path,
    monkeypatch: pytest.MonkeyPatch,
    otlp_collector: tuple[str, list[tuple[str, bytes]]],
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from relaygraph.tracing import exporting_provider

    endpoint, received = otlp_collector
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "relaygraph-otlp-test")
    run_task("go", model=RELAY)  # the runner adds the OTLP tracer from the environment
    provider = exporting_provider(("otlp",))
    assert provider.force_flush()
    provider.shutdown()

    names: list[str] = []
    services: set[str] = set()
    for path, body in received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for attr in resource_spans.resource.attributes:
                if attr.key == "service.name":
                    services.add(attr.value.string_value)
            for scope in resource_spans.scope_spans:
                names += [span.name for span in scope.spans]
    assert services == {"relaygraph-otlp-test"}
    assert "invoke_workflow relaygraph" in names
    assert names.count("invoke_agent supervisor") == 3


# -- LangSmith ----------------------------------------------------------------------------


class LangSmithRecorder(requests.Session):
    """A LangSmith API on no network: accepts every call and keeps the runs posted."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, dict[str, Any]] = {}

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
        body = kwargs.get("data")
        path = str(url)
        if body and "/runs" in path:
            run = json.loads(body)
            key = path.rsplit("/", 1)[-1] if method == "PATCH" else run["id"]
            self.runs.setdefault(key, {}).update(run)
        response = requests.Response()
        response.status_code = 200
        response._content = b"{}"
        response.url = path
        response.headers["Content-Type"] = "application/json"
        return response

    def children(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        kids = [r for r in self.runs.values() if r.get("parent_run_id") == run["id"]]
        return sorted(kids, key=lambda r: r["dotted_order"])

    def named(self, name: str) -> list[dict[str, Any]]:
        return sorted(
            (r for r in self.runs.values() if r["name"] == name), key=lambda r: r["dotted_order"]
        )

    def below(self, run: dict[str, Any]) -> list[dict[str, Any]]:
        found = [r for r in self.runs.values() if r["dotted_order"].startswith(run["dotted_order"])]
        return sorted(found, key=lambda r: r["dotted_order"])


def metadata(run: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = (run.get("extra") or {}).get("metadata") or {}
    return meta


@pytest.fixture
def langsmith() -> LangSmithRecorder:
    return LangSmithRecorder()


def langsmith_client(session: LangSmithRecorder) -> Any:
    from langsmith import Client

    return Client(
        api_url="http://127.0.0.1:9", api_key="test", session=session, auto_batch_tracing=False
    )


def test_langsmith_trace_is_one_tree_with_agent_runs_and_a_handoff_that_is_not_an_error(
    home: Path, langsmith: LangSmithRecorder
) -> None:
    from relaygraph.tracing import LangSmithTracer

    tracer = LangSmithTracer(client=langsmith_client(langsmith))
    result = run_task("go", model=RELAY, callbacks=[tracer])
    assert result.status == "succeeded"

    [root] = [r for r in langsmith.runs.values() if r.get("parent_run_id") is None]
    assert root["name"] == "relaygraph"
    assert metadata(root)["task_id"] == result.task_id
    assert {r["trace_id"] for r in langsmith.runs.values()} == {root["id"]}
    assert [r["name"] for r in langsmith.children(root)] == [
        "begin",
        "supervisor",
        "researcher",
        "coder",
        "supervisor",
        "writer",
        "supervisor",  # Its FINISH is answered with the writer's reply: no finalize step.
    ]

    [researcher] = langsmith.named("researcher")[:1]
    meta = metadata(researcher)
    assert meta["relaygraph_agent"] == "researcher"
    assert meta["langgraph_node"] == "researcher"
    visit_ns = meta["langgraph_checkpoint_ns"]
    assert visit_ns.startswith("researcher:") and "|" not in visit_ns
    # Model and tool runs nest under the visit, with LangGraph's namespaces kept.
    nested = langsmith.below(researcher)
    models = [r for r in nested if r["run_type"] == "llm"]
    tools = [r["name"] for r in nested if r["run_type"] == "tool"]
    assert len(models) == 2
    assert tools == ["search_docs", "transfer_to_coder"]
    for model in models:
        ns = metadata(model)["langgraph_checkpoint_ns"]
        assert ns.startswith(f"{visit_ns}|model:")

    # The handoff: metadata and an event on the agent run, and a run of its own.
    handoff = {
        "kind": "direct",
        "from": "researcher",
        "to": "coder",
        "task": result.handoffs[1]["task"],
        "reason": "a calculation is best checked by running code",
    }
    assert meta["relaygraph_handoff"] == handoff
    assert meta["relaygraph_ended"] == "handed_off"
    assert "handoff" in researcher["tags"]
    assert [e["kwargs"] for e in researcher["events"] if e["name"] == "handoff"] == [handoff]
    [transfer] = langsmith.named("transfer_to_coder")
    assert metadata(transfer)["relaygraph_handoff"] == handoff
    assert "handoff" in transfer["tags"]

    # No run failed: the runs the ParentCommand passed through end with the handoff.
    assert [r["name"] for r in langsmith.runs.values() if r.get("error")] == []
    marked = [r for r in nested if metadata(r).get("relaygraph_control_flow") == "handoff"]
    assert {r["name"] for r in marked} == {"researcher", "tools"}
    assert all(r["outputs"] == {"handoff": handoff} for r in marked)

    [first_route] = [metadata(r)["relaygraph_route"] for r in langsmith.named("supervisor")][:1]
    assert first_route["to"] == "researcher"


def test_langchain_tracer_alone_marks_the_handoff_as_failed(
    home: Path, langsmith: LangSmithRecorder
) -> None:
    """The upstream behaviour LangSmithTracer corrects (langsmith-sdk #1127)."""
    tracer = LangChainTracer(client=langsmith_client(langsmith))
    run_task("go", model=RELAY, callbacks=[tracer])
    failed = {r["name"] for r in langsmith.runs.values() if r.get("error")}
    assert failed == {"researcher", "tools"}


def test_langsmith_still_records_real_errors(
    home: Path, langsmith: LangSmithRecorder, script: Script
) -> None:
    from relaygraph.tracing import LangSmithTracer

    spec = script({"supervisor": [route("coder")], "coder": [], "finalize": [say("final")]})
    run_task("go", model=spec, callbacks=[LangSmithTracer(client=langsmith_client(langsmith))])
    [coder] = langsmith.named("coder")[:1]
    assert "ScriptError" in coder["error"]
    assert "ScriptError" in langsmith.named("relaygraph")[0]["error"]


def test_langsmith_records_violations_and_budget_hits(
    home: Path, langsmith: LangSmithRecorder, script: Script
) -> None:
    from relaygraph.tracing import LangSmithTracer

    run_task(
        "go",
        model=script(VIOLATIONS),
        policy=parse_policy(VIOLATIONS_POLICY),
        callbacks=[LangSmithTracer(client=langsmith_client(langsmith))],
    )
    [researcher] = langsmith.named("researcher")[:1]
    assert [e["kwargs"]["kind"] for e in researcher["events"] if e["name"] == "violation"] == [
        "tool_not_allowed"
    ]
    [coder] = langsmith.named("coder")[:1]
    [hit] = [e["kwargs"] for e in coder["events"] if e["name"] == "budget_hit"]
    assert hit["detail"] == "agent 'coder' used 1 of 1 model calls"
    assert metadata(coder)["relaygraph_violations"] == [{"agent": "coder", **hit}]


def forget_langsmith_env() -> None:
    from langsmith.utils import get_env_var

    cast(Any, get_env_var).cache_clear()


@pytest.fixture
def fresh_langsmith_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """LangSmith caches the environment variables it read: forget them before the test,
    and after it once the environment is restored, so no later test sees tracing on."""
    forget_langsmith_env()
    yield
    monkeypatch.undo()
    forget_langsmith_env()


@pytest.mark.usefixtures("fresh_langsmith_env")
def test_langsmith_config_when_on_and_off(
    monkeypatch: pytest.MonkeyPatch, langsmith: LangSmithRecorder
) -> None:
    import langchain_core.tracers.langchain as langchain_tracer

    from relaygraph.tracing import LangSmithTracer, langsmith_config, tracing_callbacks

    # The tracer made with tracing on must not reach for the real LangSmith.
    client = langsmith_client(langsmith)
    monkeypatch.setattr(langchain_tracer, "get_client", lambda: client)

    assert langsmith_config(task_id="t", thread_id="th") == {}
    assert tracing_callbacks(task_id="t", thread_id="th") == []

    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGSMITH_API_KEY", "test")
    forget_langsmith_env()
    config = langsmith_config(
        task_id="t1",
        thread_id="th1",
        request="Find out  when LangGraph writes checkpoints\nand how durable they are, in detail",
        project="research",
        team={"name": "docs-review", "version": 3, "digest": "sha256:abc", "source": None},
        policy_source="policy.toml",
        policy_digest="sha256:0123456789abcdef",
        models={"supervisor": "openai:gpt-4.1-mini"},
    )
    assert config == {
        "run_name": "relaygraph: Find out when LangGraph writes checkpoints and how durable…",
        "metadata": {
            "task_id": "t1",
            "thread_id": "th1",
            "project": "research",
            "team_name": "docs-review",
            "team_version": 3,
            "team_digest": "sha256:abc",
            "policy_source": "policy.toml",
            "policy_digest": "sha256:0123456789abcdef",
            "models": {"supervisor": "openai:gpt-4.1-mini"},
        },
        "tags": ["relaygraph", "project:research", "team:docs-review"],
    }
    assert langsmith_config(task_id="t1", thread_id="th1")["run_name"] == "relaygraph task t1"
    [handler] = tracing_callbacks(task_id="t1", thread_id="th1")
    assert isinstance(handler, LangSmithTracer)
    assert handler.client is client


# -- the audit view -----------------------------------------------------------------------


def ledger_of(home: Path) -> Ledger:
    return Ledger(f"sqlite:///{home / 'ledger.sqlite'}")


def outline(node: dict[str, Any]) -> list[Any]:
    def label(child: dict[str, Any]) -> Any:
        if child["kind"] == "agent":
            return [child["agent"], [label(c) for c in child["children"]]]
        if child["kind"] == "tool":
            return f"tool {child['tool']} {child['status']}"
        if child["kind"] in ("route", "handoff"):
            return f"{child['kind']} {child['from']}->{child['to']}"
        if child["kind"] in ("violation", "budget_hit"):
            return f"{child['kind']} {child['agent']}"
        return child["kind"]

    return [label(c) for c in node["children"]]


def test_timeline_of_a_relay_run(home: Path) -> None:
    from relaygraph.tracing import build_timeline, render_timeline

    result = run_task("go", model=RELAY)
    with ledger_of(home) as ledger:
        timeline = build_timeline(ledger, result.task_id, project_id=LOCAL_PROJECT_ID)
    assert outline(timeline) == [
        "run_started",
        "route supervisor->researcher",
        ["researcher", ["tool search_docs success"]],
        "handoff researcher->coder",
        ["coder", ["tool run_python success"]],
        "route supervisor->writer",
        ["writer", ["tool save_artifact success"]],
        "route supervisor->FINISH",
        "run_finished",
    ]
    assert (timeline["task_id"], timeline["status"]) == (result.task_id, "succeeded")
    assert timeline["thread_id"] == result.thread_id
    researcher = timeline["children"][2]
    assert researcher["ended"] == "handed_off"
    assert researcher["duration_s"] >= 0
    assert researcher["usage"]["input_tokens"] == result.usage["researcher"]["input_tokens"]
    assert researcher["children"][0]["args"] == {"query": "checkpoint durability super-step"}
    handoff = timeline["children"][3]
    assert handoff["reason"] == "a calculation is best checked by running code"
    assert timeline["children"][1]["reason"] == "the request needs facts from the docs"
    total = timeline["usage"]["total"]
    assert total["input_tokens"] == sum(u["input_tokens"] for u in result.usage.values())
    assert set(timeline["usage"]["agents"]) == set(result.usage)
    json.dumps(timeline)  # the API returns it as it is

    console = Console(record=True, width=200, color_system=None)
    console.print(render_timeline(timeline))
    text = console.export_text()
    assert f"task {result.task_id} succeeded" in text
    assert "handoff researcher → coder: Compute how many checkpoints" in text
    assert "route supervisor → researcher" in text
    assert "search_docs(" in text


def test_timeline_shows_violations_and_budget_hits(home: Path, script: Script) -> None:
    from relaygraph.tracing import build_timeline, render_timeline

    result = run_task("go", model=script(VIOLATIONS), policy=parse_policy(VIOLATIONS_POLICY))
    with ledger_of(home) as ledger:
        timeline = build_timeline(ledger, result.task_id, project_id=LOCAL_PROJECT_ID)
    assert outline(timeline) == [
        "run_started",
        "route supervisor->researcher",
        ["researcher", ["tool run_python error", "violation researcher"]],
        "route supervisor->coder",
        ["coder", ["tool run_python success"]],
        "budget_hit coder",
        "route supervisor->FINISH",
        "run_finished",
    ]
    [hit] = [c for c in timeline["children"] if c["kind"] == "budget_hit"]
    assert hit["detail"] == "agent 'coder' used 1 of 1 model calls"
    console = Console(record=True, width=200, color_system=None)
    console.print(render_timeline(timeline))
    assert "budget hit (coder): agent 'coder' used 1 of 1 model calls" in console.export_text()


def test_timeline_of_an_unknown_or_foreign_task(home: Path) -> None:
    from relaygraph.tracing import build_timeline

    result = run_task("go", model=RELAY)
    with ledger_of(home) as ledger:
        with pytest.raises(RecordNotFound):
            build_timeline(ledger, "no-such-task", project_id=LOCAL_PROJECT_ID)
        with pytest.raises(RecordNotFound):
            build_timeline(ledger, result.task_id, project_id="another-project")


def test_run_tree_finds_the_team_node_of_a_nested_run() -> None:
    from relaygraph.tracing._runs import RunTree

    tree = RunTree()
    root, node = UUID(int=1), UUID(int=2)
    assert tree.start(root, None, "relaygraph")
    assert tree.start(node, root, "researcher")
    assert tree.node_of(UUID(int=3)) is None
    tree.note(UUID(int=3), node)
    assert tree.node_of(UUID(int=3)) == "researcher"
