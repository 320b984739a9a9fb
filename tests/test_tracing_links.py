"""Where a task run's trace is found: the ``trace`` of its ``run_started`` event.

Each run records, before it starts, the OpenTelemetry trace id of its root span and the
id (and page) of its LangSmith root run; these tests hold them against what the tracers
exported: spans to an in-memory exporter, LangSmith runs to a ``langsmith.Client`` whose
HTTP session answers locally (no network).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.langchain import LangChainTracer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracerProvider, format_trace_id

from relaygraph.errors import ConfigError
from relaygraph.runner import Decision, resume_task, run_task
from relaygraph.store import Ledger
from relaygraph.tracing._config import langsmith_project_url, trace_reference
from tests.builtin_team import parse_policy

from .conftest import EXAMPLE_RELAY
from .test_tracing import LangSmithRecorder, langsmith_client, python_with_tracing_off

RELAY = f"scripted:{EXAMPLE_RELAY}"
PROJECT_PAGE = "https://smith.example.com/o/0c1d/projects/p/5e6f"
APPROVAL = {"agents": {"coder": {"approval": ["run_python"]}}}


def in_memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def otel_handlers(provider: Any) -> list[BaseCallbackHandler]:
    from relaygraph.tracing import tracing_callbacks

    return tracing_callbacks(task_id="t", thread_id="th", tracer_provider=provider)


def traces_of(home: Path, task_id: str) -> list[dict[str, Any] | None]:
    """The ``trace`` of each of the task's ``run_started`` events, in order."""
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        started = [e for e in ledger.events_after(task_id) if e.type == "run_started"]
    return [e.data.get("trace") for e in started]


def roots(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is None]


# -- recorded by the run --------------------------------------------------------------------


def test_the_otel_trace_id_recorded_is_the_root_spans(home: Path) -> None:
    provider, exporter = in_memory()
    result = run_task("go", model=RELAY, callbacks=otel_handlers(provider))
    assert result.status == "succeeded"

    spans = list(exporter.get_finished_spans())
    [root] = roots(spans)
    assert root.name == "invoke_workflow relaygraph"
    assert root.context is not None
    assert {s.context.trace_id for s in spans if s.context} == {root.context.trace_id}
    assert traces_of(home, result.task_id) == [
        {"otel_trace_id": format_trace_id(root.context.trace_id)}
    ]


def test_the_langsmith_run_recorded_is_the_root_run_posted(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from relaygraph.tracing import LangSmithTracer

    monkeypatch.setenv("RELAYGRAPH_LANGSMITH_PROJECT_URL", PROJECT_PAGE + "/?timeModel=7d")
    langsmith = LangSmithRecorder()
    tracer = LangSmithTracer(client=langsmith_client(langsmith))
    result = run_task("go", model=RELAY, callbacks=[tracer])
    assert result.status == "succeeded"

    [root] = [r for r in langsmith.runs.values() if r.get("parent_run_id") is None]
    assert root["name"] == "relaygraph" and root["trace_id"] == root["id"]
    assert UUID(root["id"]).version == 7  # what LangSmith asks of run ids
    assert traces_of(home, result.task_id) == [
        {
            "langsmith_run_id": root["id"],
            "langsmith_url": f"{PROJECT_PAGE}/r/{root['id']}?poll=true",
        }
    ]


def test_both_tracers_on_and_a_run_per_trace_after_a_decision(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed task's runs are traces of their own, each recorded by its run_started."""
    import relaygraph.tracing._config as config

    provider, exporter = in_memory()
    langsmith = LangSmithRecorder()
    client = langsmith_client(langsmith)
    # Tracing from the environment, as a server runs it: the resumed run's tracers are
    # made by the runner, not passed in.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setattr(config, "exporting_provider", lambda exporters: provider)
    monkeypatch.setattr(config, "langsmith_enabled", lambda: True)
    monkeypatch.setattr("langchain_core.tracers.langchain.get_client", lambda: client)

    paused = run_task("Compute it", model=RELAY, policy=parse_policy(APPROVAL))
    assert paused.status == "interrupted"
    done = resume_task(paused.task_id, Decision(decision="approve"))
    assert done.status == "succeeded"

    spans = list(exporter.get_finished_spans())
    span_roots = sorted(roots(spans), key=lambda s: s.start_time or 0)
    run_roots = sorted(
        (r for r in langsmith.runs.values() if r.get("parent_run_id") is None),
        key=lambda r: r["dotted_order"],
    )
    assert len(span_roots) == len(run_roots) == 2
    # Model and tool calls stay in their run's trace, though LangSmith's own runs (the
    # agent middleware's) come between them and the agent's run.
    assert {s.context.trace_id for s in spans if s.context} == {
        s.context.trace_id for s in span_roots if s.context
    }
    assert len(spans) > 10
    assert traces_of(home, paused.task_id) == [
        {
            "otel_trace_id": format_trace_id(span.context.trace_id),
            "langsmith_run_id": run["id"],
        }
        for span, run in zip(span_roots, run_roots, strict=True)
        if span.context is not None
    ]


def test_an_untraced_run_records_no_trace(home: Path) -> None:
    result = run_task("go", model=RELAY)
    assert traces_of(home, result.task_id) == [None]


# -- trace_reference ------------------------------------------------------------------------


def test_a_reference_names_only_the_tracers_that_are_on() -> None:
    assert trace_reference({}) is None
    assert trace_reference({"callbacks": [BaseCallbackHandler()], "run_id": "x"}) is None
    # A LangSmith tracer without a fixed root run id: its run cannot be named in advance.
    tracer = LangChainTracer(client=langsmith_client(LangSmithRecorder()))
    assert trace_reference({"callbacks": [tracer]}) is None
    run_id = UUID("01890a5d-ac96-774b-bcce-b302099a8057")
    assert trace_reference({"callbacks": [tracer], "run_id": run_id}) == {
        "langsmith_run_id": str(run_id)
    }


def test_no_trace_id_for_spans_no_collector_will_see() -> None:
    for provider in (NoOpTracerProvider(), TracerProvider(sampler=ALWAYS_OFF)):
        assert trace_reference({"callbacks": otel_handlers(provider)}) is None


def test_the_trace_id_is_known_before_the_run_and_the_run_keeps_it() -> None:
    from langchain_core.runnables import RunnableLambda

    provider, exporter = in_memory()
    handlers = otel_handlers(provider)
    reference = trace_reference({"callbacks": handlers})
    assert reference is not None and exporter.get_finished_spans() == ()
    RunnableLambda(lambda x: x).invoke(1, {"callbacks": handlers})
    [root] = exporter.get_finished_spans()
    assert root.context is not None
    assert reference == {"otel_trace_id": format_trace_id(root.context.trace_id)}


def test_the_langsmith_project_page_comes_from_the_environment() -> None:
    assert langsmith_project_url({}) is None
    assert langsmith_project_url({"RELAYGRAPH_LANGSMITH_PROJECT_URL": PROJECT_PAGE}) == (
        PROJECT_PAGE
    )
    with pytest.raises(ConfigError, match="not a web address"):
        langsmith_project_url({"RELAYGRAPH_LANGSMITH_PROJECT_URL": "javascript:alert(1)"})


def test_with_tracing_off_a_reference_imports_no_tracer(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from relaygraph.tracing._config import trace_reference\n"
        "assert trace_reference({'callbacks': [], 'run_id': 'x'}) is None\n"
        "tracers = ('relaygraph.tracing._otel', 'opentelemetry', 'langsmith')\n"
        "assert not [m for m in tracers if m in sys.modules], sys.modules.keys()\n"
    )
    proc = python_with_tracing_off(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
