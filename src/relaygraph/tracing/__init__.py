"""Tracing and audit: OpenTelemetry GenAI spans, LangSmith traces, the ledger's timeline.

Both tracers are LangChain callback handlers made per task run by
:func:`tracing_callbacks` from the standard environment variables
(``OTEL_TRACES_EXPORTER``, ``LANGSMITH_TRACING``); with neither set it returns no handler.
:func:`trace_reference` names where a run's trace will be before it starts (its OTel
trace id, its LangSmith run), for the run's ``run_started`` event.
A handoff is shown as a handoff, never as an error. :func:`build_timeline` rebuilds a
task's timeline from the ledger for ``relaygraph trace`` and ``GET /v1/tasks/{id}/trace``.
:func:`model_call_markup` says a model call's retry or failure alike there and in a
run's live progress.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaygraph._lazy import lazy_imports
from relaygraph.tracing._config import (
    TracedTask,
    exporting_provider,
    langsmith_config,
    langsmith_enabled,
    langsmith_project_url,
    otel_exporters,
    trace_reference,
    tracing_callbacks,
)
from relaygraph.tracing._timeline import build_timeline, model_call_markup, render_timeline

if TYPE_CHECKING:
    from relaygraph.tracing._langsmith import LangSmithTracer
    from relaygraph.tracing._otel import OpenTelemetryCallbackHandler

__all__ = [
    "LangSmithTracer",
    "OpenTelemetryCallbackHandler",
    "TracedTask",
    "build_timeline",
    "exporting_provider",
    "langsmith_config",
    "langsmith_enabled",
    "langsmith_project_url",
    "model_call_markup",
    "otel_exporters",
    "render_timeline",
    "trace_reference",
    "tracing_callbacks",
]

# The tracers import LangChain's tracer and OpenTelemetry; loaded on first use, so that
# importing this package (the CLI's `trace`, the API) costs neither.
__getattr__ = lazy_imports(
    __name__,
    {
        "LangSmithTracer": "._langsmith",
        "OpenTelemetryCallbackHandler": "._otel",
    },
)
