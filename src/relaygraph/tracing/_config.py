"""Which tracers a task run gets, from the standard environment variables.

OpenTelemetry follows ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``; a comma
separated list for more than one), ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (read by the OTLP exporter itself) and
``OTEL_SERVICE_NAME``. LangSmith follows ``LANGSMITH_TRACING`` and its usual companions.
With neither on, :func:`tracing_callbacks` returns no handler and nothing is imported.
:func:`trace_reference` says where a task run's trace will be found, before it runs.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack
from urllib.parse import urlsplit, urlunsplit

from relaygraph.errors import ConfigError
from relaygraph.events import TraceLinks

if TYPE_CHECKING:
    from langchain_core.callbacks import BaseCallbackHandler
    from opentelemetry.sdk.trace import TracerProvider

EXPORTERS_ENV = "OTEL_TRACES_EXPORTER"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
DEFAULT_SERVICE_NAME = "relaygraph"
KNOWN_EXPORTERS = ("otlp", "console", "none")
LANGSMITH_PROJECT_URL_ENV = "RELAYGRAPH_LANGSMITH_PROJECT_URL"
RUN_NAME_CHARS = 60

_providers: dict[tuple[Any, ...], TracerProvider] = {}
_providers_lock = threading.Lock()


def otel_exporters(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` asks for; empty when tracing is off.

    Raises:
        ConfigError: It names an exporter relaygraph does not ship.
    """
    env = os.environ if environ is None else environ
    names = [n.strip().lower() for n in env.get(EXPORTERS_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_EXPORTERS]
    if unknown:
        raise ConfigError(
            f"{EXPORTERS_ENV}={env[EXPORTERS_ENV]!r} names {', '.join(map(repr, unknown))}; "
            f"relaygraph supports {', '.join(KNOWN_EXPORTERS)}"
        )
    return tuple(dict.fromkeys(n for n in names if n != "none"))


class _Stderr:
    """Writes to whatever ``sys.stderr`` is at the time, so stdout stays for the result
    (``relaygraph run --json``) and a redirected stderr still gets the spans."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def exporting_provider(exporters: tuple[str, ...]) -> TracerProvider:
    """The process's tracer provider for these exporters, made once and then reused.

    ``console`` prints each span to stderr as it ends; ``otlp`` batches spans to the
    OTLP/HTTP endpoint from the environment (``http://localhost:4318/v1/traces`` unless set).
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    service = os.environ.get(SERVICE_NAME_ENV) or DEFAULT_SERVICE_NAME
    endpoints = tuple(
        os.environ.get(name, "")
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    key = (exporters, service, endpoints)
    with _providers_lock:
        if key in _providers:
            return _providers[key]
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        for name in exporters:
            if name == "console":
                provider.add_span_processor(
                    SimpleSpanProcessor(ConsoleSpanExporter(out=_Stderr()))  # type: ignore[arg-type]
                )
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _providers[key] = provider
        return provider


def langsmith_enabled() -> bool:
    """Whether LangSmith tracing is on (``LANGSMITH_TRACING=true`` or a tracing context)."""
    from langsmith.utils import tracing_is_enabled

    return bool(tracing_is_enabled())


class TracedTask(TypedDict, total=False):
    """The task a run's traces are labelled with, the same for every tracer."""

    task_id: Required[str]
    """The ledger's task id."""
    thread_id: Required[str]
    """The conversation the task continues."""
    project: str | None
    """The project (tenant) the task belongs to."""
    team: Mapping[str, Any] | None
    """The team that runs it, as the task records it (name, version, digest)."""
    policy_source: str | None
    """Where the team policy came from."""
    policy_digest: str | None
    """A digest of the policy the task runs under."""
    models: Mapping[str, str] | None
    """The model spec of each role."""


def tracing_callbacks(
    *, tracer_provider: Any = None, **task: Unpack[TracedTask]
) -> list[BaseCallbackHandler]:
    """The callback handlers that trace one task run; empty when tracing is off.

    Add them to the graph call's ``callbacks``. With ``OTEL_TRACES_EXPORTER`` set, an
    :class:`OpenTelemetryCallbackHandler`; with LangSmith tracing on, a
    :class:`LangSmithTracer` (in place of LangChain's own, which then is not added), so
    a handoff is recorded as one and not as an error.

    Args:
        tracer_provider: Send OpenTelemetry spans here instead of to the exporters the
            environment names (an application's own provider, or a test's).
        **task: The task the run is of (:class:`TracedTask`).

    Raises:
        ConfigError: ``OTEL_TRACES_EXPORTER`` names an unknown exporter, or LangSmith
            tracing is on and ``RELAYGRAPH_LANGSMITH_PROJECT_URL`` is not a web address.
    """
    handlers: list[BaseCallbackHandler] = []
    exporters = otel_exporters()
    if tracer_provider is not None or exporters:
        from relaygraph.tracing._otel import INSTRUMENTATION, OpenTelemetryCallbackHandler

        provider = tracer_provider or exporting_provider(exporters)
        handlers.append(OpenTelemetryCallbackHandler(provider.get_tracer(INSTRUMENTATION), **task))
    if langsmith_enabled():
        from relaygraph.tracing._langsmith import LangSmithTracer

        langsmith_project_url()  # A bad address fails the task before it starts.
        handlers.append(LangSmithTracer())
    return handlers


def langsmith_project_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The LangSmith project page that ``RELAYGRAPH_LANGSMITH_PROJECT_URL`` names, if set.

    A run's page in LangSmith is ``<project page>/r/<run id>`` (what
    ``langsmith.Client.get_run_url`` builds), and the project page names the workspace
    and the project by their ids, which only LangSmith's API knows. Copied once from the
    browser into this variable, it lets a run's link be made without a network call.

    Raises:
        ConfigError: The value is not an ``http`` or ``https`` address.
    """
    env = os.environ if environ is None else environ
    value = env.get(LANGSMITH_PROJECT_URL_ENV, "").strip()
    if not value:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"{LANGSMITH_PROJECT_URL_ENV}={value!r} is not a web address; copy the project's "
            "page from LangSmith (https://smith.langchain.com/o/<workspace>/projects/p/<project>)"
        )
    # The page's query (its filters, its time range) is the browser's, not the project's.
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _handlers(callbacks: Any) -> list[Any]:
    """The handlers of a graph config's ``callbacks``: a list, or a callback manager."""
    if callbacks is None:
        return []
    handlers = getattr(callbacks, "handlers", callbacks)
    return list(handlers) if isinstance(handlers, list | tuple) else []


def trace_reference(config: Mapping[str, Any]) -> TraceLinks | None:
    """Where the trace of the task run that ``config`` starts will be found, before it runs.

    Call it with the graph call's config (its ``callbacks`` made by
    :func:`tracing_callbacks` or passed by the caller) just before the run starts: the
    runner records the answer in the run's ``run_started`` event, and the dashboard shows
    it. Keys appear only for the tracers that are on:

    - ``otel_trace_id``: the trace id (32 hex digits) of the task's span, as an OTLP
      collector shows it. Asking opens that span (see
      :meth:`OpenTelemetryCallbackHandler.task_trace_id`).
    - ``langsmith_run_id``: the id of the root run LangSmith will show. LangChain gives
      the graph's root run the config's ``run_id``, so the config must carry a fresh one
      (a UUID v7, as LangSmith asks) for every run; without it this key is left out.
    - ``langsmith_url``: that run's page, when ``RELAYGRAPH_LANGSMITH_PROJECT_URL`` names
      the project's (:func:`langsmith_project_url`); nothing is asked of LangSmith.

    Returns:
        The keys above, or None when nothing traces the run.
    """
    handlers = _handlers(config.get("callbacks"))
    if not handlers:
        return None
    reference: TraceLinks = {}
    # A tracer's class is looked up only if its module is loaded: when it is not, no
    # handler can be one, and tracing that is off still imports nothing.
    otel = sys.modules.get("relaygraph.tracing._otel")
    if otel is not None:
        for handler in handlers:
            if isinstance(handler, otel.OpenTelemetryCallbackHandler):
                if trace_id := handler.task_trace_id():
                    reference["otel_trace_id"] = trace_id
                break
    langchain = sys.modules.get("langchain_core.tracers.langchain")
    run_id = config.get("run_id")
    if (
        langchain is not None
        and run_id is not None
        and any(isinstance(handler, langchain.LangChainTracer) for handler in handlers)
    ):
        reference["langsmith_run_id"] = str(run_id)
        try:
            project_url = langsmith_project_url()
        except ConfigError:
            project_url = None  # Refused when the handlers were made; no link then.
        if project_url is not None:
            reference["langsmith_url"] = f"{project_url}/r/{run_id}?poll=true"
    return reference or None


def _run_name(task_id: str, request: str | None) -> str:
    text = " ".join((request or "").split())
    if not text:
        return f"relaygraph task {task_id}"
    if len(text) > RUN_NAME_CHARS:
        text = text[: RUN_NAME_CHARS - 1].rstrip() + "…"
    return f"relaygraph: {text}"


def langsmith_config(
    *, request: str | None = None, tags: tuple[str, ...] = (), **task: Unpack[TracedTask]
) -> dict[str, Any]:
    """What the task's graph config needs for LangSmith: ``run_name``, ``metadata``, ``tags``.

    Empty when LangSmith tracing is off, so merging it changes nothing. The metadata is
    inherited by every run of the task, so any run can be found by ``task_id``; LangSmith
    groups a thread's tasks by ``thread_id``.

    Args:
        request: What was asked; the root run is named for it.
        tags: More tags for every run of the task.
        **task: The task the run is of (:class:`TracedTask`).
    """
    if not langsmith_enabled():
        return {}
    task_id, project, team = task["task_id"], task.get("project"), task.get("team")
    metadata: dict[str, Any] = {
        "task_id": task_id,
        "thread_id": task["thread_id"],
        "project": project,
        "team_name": (team or {}).get("name"),
        "team_version": (team or {}).get("version"),
        "team_digest": (team or {}).get("digest"),
        "policy_source": task.get("policy_source"),
        "policy_digest": task.get("policy_digest"),
        "models": dict(task.get("models") or {}),
    }
    more = [f"project:{project}"] if project else []
    if team and team.get("name"):
        more.append(f"team:{team['name']}")
    return {
        "run_name": _run_name(task_id, request),
        "metadata": {k: v for k, v in metadata.items() if v is not None},
        "tags": ["relaygraph", *more, *tags],
    }
