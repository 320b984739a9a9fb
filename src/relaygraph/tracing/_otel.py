"""OpenTelemetry spans in the GenAI semantic conventions, from LangChain callbacks.

One span per task (``invoke_workflow relaygraph``), per team node run (``invoke_agent
<agent>``: every agent visit, the supervisor's routing decisions, finalize), per model call
(``chat <model>``) and per tool call (``execute_tool <tool>``). Parent and child come from
LangChain's run ids, so the tree is right even when LangGraph runs nodes on other threads.
The task's span can be opened before the graph runs (:meth:`task_trace_id`), so that the
run's ``run_started`` event records the trace id a collector will show.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langgraph.errors import GraphInterrupt, ParentCommand
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, format_trace_id

from relaygraph._names import HANDOFF_PREFIX, SUPERVISOR
from relaygraph.events import Handoff, handoff_attributes
from relaygraph.tracing import _runs
from relaygraph.tracing._runs import NodeRecords, RunTree

INSTRUMENTATION = "relaygraph.tracing"
WORKFLOW = "relaygraph"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int, float and sequences of them, never None."""
    clean: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, str | bool | int | float):
            clean[key] = value
        else:
            clean[key] = json.dumps(value, ensure_ascii=False, default=str)
    return clean


def _langsmith_ancestors() -> list[UUID]:
    """The runs above LangSmith's current run, outermost first, read from its dotted
    order; empty where LangSmith traces nothing (or is not even loaded)."""
    helpers = sys.modules.get("langsmith.run_helpers")
    if helpers is None:
        return []
    order = getattr(helpers.get_current_run_tree(), "dotted_order", None)
    return [UUID(found) for found in _UUID.findall(order)] if isinstance(order, str) else []


@dataclass(eq=False, repr=False)
class OpenTelemetryCallbackHandler(BaseCallbackHandler):
    """Turns one task's LangChain callbacks into OpenTelemetry GenAI spans.

    Handoffs (``ParentCommand``) and pauses for a person (``GraphInterrupt``) end their
    spans without an error status; any other exception sets ``ERROR`` and is recorded.
    Routes, handoffs, violations and budget hits become span events on the node that
    made them.

    Args:
        tracer: Where spans go (``TracerProvider.get_tracer``).
        task_id: The ledger's task id.
        thread_id: The conversation (``gen_ai.conversation.id``).
        project: The project (tenant) the task belongs to.
        team: The team that runs it, as the task records it (name, version, digest).
        policy_source: Where the policy came from (a file path, ``default``).
        policy_digest: A digest of the policy the task ran under: equal digests, equal rules.
        models: The model spec of each role.
    """

    raise_error = False
    run_inline = True

    tracer: trace.Tracer
    _: KW_ONLY
    task_id: str
    thread_id: str
    project: str | None = None
    team: Mapping[str, Any] | None = None
    policy_source: str | None = None
    policy_digest: str | None = None
    models: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        self._runs = RunTree()
        self._task_span: Span | None = None
        """The task's span, once opened (by the task's run, or earlier by :meth:`task_trace_id`)."""
        self._spans: dict[UUID, Span] = {}
        self._tokens: dict[UUID, list[int]] = {}
        """Input and output tokens of the model calls under each node span, so far."""
        self._lock = threading.Lock()

    def task_trace_id(self) -> str | None:
        """The trace id of the task's span, as an OTLP collector shows it (32 hex digits).

        Asked before the graph runs, this opens the task's span now, and the task's run
        then continues it: the id is known before the first step (the ``run_started``
        event records it). None when the span is not recorded (a no-op tracer provider,
        or a sampler that dropped the trace): no collector will show it.
        """
        with self._lock:
            span = self._task_span or self._start_task_span()
        context = span.get_span_context()
        if not (context.is_valid and context.trace_flags.sampled):
            return None
        return format_trace_id(context.trace_id)

    # -- span bookkeeping -------------------------------------------------------------

    def _start_task_span(self) -> Span:
        """Open the task's span (``invoke_workflow relaygraph``), the root of its trace."""
        team = self.team or {}
        self._task_span = self.tracer.start_span(
            f"invoke_workflow {WORKFLOW}",
            context=None,
            kind=SpanKind.INTERNAL,
            attributes=_clean(
                {
                    "gen_ai.operation.name": "invoke_workflow",
                    "gen_ai.conversation.id": self.thread_id,
                    "relaygraph.task_id": self.task_id,
                    "relaygraph.project": self.project,
                    "relaygraph.team.name": team.get("name"),
                    "relaygraph.team.version": team.get("version"),
                    "relaygraph.team.digest": team.get("digest"),
                    "relaygraph.policy.source": self.policy_source,
                    "relaygraph.policy.digest": self.policy_digest,
                    "relaygraph.models": dict(self.models or {}) or None,
                }
            ),
        )
        return self._task_span

    def _known(self, parent_run_id: UUID | None) -> UUID | None:
        """The run to put a new run under: its parent, or, when this handler never saw
        that parent, the nearest run above it that it saw.

        With LangSmith tracing on, LangChain's agent middleware wraps each model and tool
        call in a LangSmith ``traceable`` run, which is no callback: the call's parent is
        then a run only LangSmith knows, and the runs above it are in its dotted order.
        """
        if parent_run_id is None or parent_run_id in self._runs.parents:
            return parent_run_id
        for run_id in reversed(_langsmith_ancestors()):
            if run_id in self._runs.parents:
                return run_id
        return parent_run_id

    def _parent_span(self, parent_run_id: UUID | None) -> Span | None:
        run_id = parent_run_id
        for _ in range(1000):
            if run_id is None:
                return None
            if run_id in self._spans:
                return self._spans[run_id]
            run_id = self._runs.parents.get(run_id)
        return None

    def _open(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
    ) -> Span:
        parent = self._parent_span(parent_run_id)
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            name, context=context, kind=kind, attributes=_clean(attributes)
        )
        self._spans[run_id] = span
        return span

    def _close(self, run_id: UUID, error: BaseException | None = None) -> Span | None:
        span = self._spans.pop(run_id, None)
        self._runs.forget(run_id)
        if span is None:
            return None
        if error is None:
            pass
        elif _runs.is_control_flow(error):
            self._control_flow(span, error)
        else:
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute("error.type", type(error).__qualname__)
            span.record_exception(error)
        span.end()
        return span

    @staticmethod
    def _control_flow(span: Span, error: BaseException) -> None:
        """A handoff, a pause or a drain passed through this run: say so, leave the status."""
        span.set_attribute("relaygraph.control_flow", _runs.control_flow_kind(error))
        if (handoff := _runs.handoff_of(error)) is not None and handoff["kind"] == "direct":
            span.add_event(
                "relaygraph.handoff", _clean(handoff_attributes(handoff, "relaygraph.handoff"))
            )
            span.set_attribute("relaygraph.agent.ended", "handed_off")
        if isinstance(error, GraphInterrupt):
            span.set_attribute("relaygraph.interrupted", True)
            for value in _runs.interrupt_values(error):
                span.add_event("relaygraph.interrupt", _clean({"relaygraph.waits_for": value}))

    def _add_tokens(self, run_id: UUID, input_tokens: int, output_tokens: int) -> None:
        run: UUID | None = run_id
        for _ in range(1000):
            run = self._runs.parents.get(run) if run is not None else None
            if run is None:
                return
            if run in self._tokens:
                self._tokens[run][0] += input_tokens
                self._tokens[run][1] += output_tokens
                if run == self._runs.root:
                    return

    # -- chains: the task and the team's nodes ----------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or ""
        with self._lock:
            parent_run_id = self._known(parent_run_id)
            if not self._runs.start(run_id, parent_run_id, name):
                return
            if run_id == self._runs.root:
                self._tokens[run_id] = [0, 0]
                self._spans[run_id] = self._task_span or self._start_task_span()
                return
            role = _runs.node_role(name)
            if role is None:
                return
            meta = metadata or {}
            self._tokens[run_id] = [0, 0]
            self._open(
                run_id,
                parent_run_id,
                f"invoke_agent {name}",
                SpanKind.INTERNAL,
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": name,
                    "gen_ai.conversation.id": self.thread_id,
                    "gen_ai.request.model": (self.models or {}).get(name),
                    "relaygraph.task_id": self.task_id,
                    "relaygraph.role": role,
                    "relaygraph.step": meta.get("langgraph_step"),
                    "relaygraph.checkpoint_ns": meta.get("langgraph_checkpoint_ns"),
                },
            )

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
            if span is None:
                self._runs.forget(run_id)
                return
            if run_id == self._runs.root:
                self._end_task(span, run_id, outputs)
            else:
                name = self._runs.nodes.get(run_id, "")
                self._end_node(span, run_id, name, _runs.node_records(outputs))
            self._tokens.pop(run_id, None)
            self._close(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
            name = self._runs.nodes.get(run_id)
            if span is not None and name is not None and isinstance(error, ParentCommand):
                # A team node that leaves with a command to the team graph (the tool
                # supervisor's transfers and answer): its records travel in the command.
                command = error.args[0] if error.args else None
                self._end_node(span, run_id, name, _runs.node_records(command))
                self._tokens.pop(run_id, None)
                self._close(run_id, error)
                return
            if span is not None:
                tokens = self._tokens.pop(run_id, [0, 0])
                if any(tokens):
                    self._set_usage(span, {"input_tokens": tokens[0], "output_tokens": tokens[1]})
            self._close(run_id, error)

    def _end_task(self, span: Span, run_id: UUID, outputs: Any) -> None:
        tokens = self._tokens.get(run_id, [0, 0])
        self._set_usage(span, {"input_tokens": tokens[0], "output_tokens": tokens[1]})
        if isinstance(outputs, Mapping):
            if outputs.get("__interrupt__"):
                span.set_attribute("relaygraph.interrupted", True)
            span.set_attributes(
                _clean(
                    {
                        "relaygraph.task.status": outputs.get("status"),
                        "relaygraph.task.stop_reason": outputs.get("stop_reason"),
                    }
                )
            )

    def _end_node(self, span: Span, run_id: UUID, name: str, records: NodeRecords) -> None:
        tokens = self._tokens.get(run_id, [0, 0])
        usage = dict(records.usage or {"input_tokens": tokens[0], "output_tokens": tokens[1]})
        self._set_usage(span, usage)
        if records.usage is not None and self._runs.root in self._tokens:
            # The node's own record counts what its model calls did not report as calls
            # (the scripted router's decisions), so the task's total follows the records.
            root = self._tokens[self._runs.root]
            root[0] += int(records.usage.get("input_tokens", 0)) - tokens[0]
            root[1] += int(records.usage.get("output_tokens", 0)) - tokens[1]
        if records.ended:
            span.set_attribute("relaygraph.agent.ended", records.ended)
        is_router = _runs.node_role(name) == SUPERVISOR
        route = next((h for h in records.handoffs if h["kind"] == "route"), None)
        relay = next((h for h in records.handoffs if h["kind"] == "direct"), None)
        if is_router and route is None and relay is not None:
            # The tool supervisor passing on an agent's own handoff: not a route of its own.
            span.add_event(
                "relaygraph.relay", _clean(handoff_attributes(relay, "relaygraph.handoff"))
            )
        elif is_router and records.goto is not None:
            span.add_event(
                "relaygraph.route",
                _clean(
                    {
                        "relaygraph.route.next": route["target"] if route else records.goto,
                        "relaygraph.route.task": route["task"] if route else None,
                        "relaygraph.route.reason": route["reason"] if route else None,
                    }
                ),
            )
        for handoff in records.handoffs:
            if handoff["kind"] == "direct" and not is_router:
                self._handoff(span, handoff)
        for violation in records.violations:
            budget = violation.get("kind") == "budget"
            span.add_event(
                "relaygraph.budget_hit" if budget else "relaygraph.violation",
                _clean(
                    {
                        "relaygraph.violation.kind": violation.get("kind"),
                        "relaygraph.violation.agent": violation.get("agent"),
                        "relaygraph.violation.detail": violation.get("detail"),
                    }
                ),
            )
        if records.stop_reason:
            span.set_attribute("relaygraph.stop_reason", records.stop_reason)

    @staticmethod
    def _handoff(span: Span, handoff: Handoff) -> None:
        attributes = _clean(handoff_attributes(handoff, "relaygraph.handoff"))
        span.add_event("relaygraph.handoff", attributes)
        span.set_attributes(attributes)

    @staticmethod
    def _set_usage(span: Span, usage: Mapping[str, Any]) -> None:
        span.set_attributes(
            _clean(
                {
                    "gen_ai.usage.input_tokens": usage.get("input_tokens"),
                    "gen_ai.usage.output_tokens": usage.get("output_tokens"),
                    "relaygraph.usage.model_calls": usage.get("model_calls"),
                    "relaygraph.usage.tool_calls": usage.get("tool_calls"),
                    "relaygraph.usage.cost_usd": usage.get("cost_usd"),
                }
            )
        )

    # -- model calls ------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start("chat", run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._model_start("text_completion", run_id, parent_run_id, metadata, kwargs)

    def _model_start(
        self,
        operation: str,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: Mapping[str, Any],
    ) -> None:
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = meta.get("ls_model_name") or params.get("model") or params.get("model_name")
        with self._lock:
            parent_run_id = self._known(parent_run_id)
            self._runs.note(run_id, parent_run_id)
            agent = meta.get("lc_agent_name") or self._runs.node_of(parent_run_id)
            self._open(
                run_id,
                parent_run_id,
                f"{operation} {model}" if model else operation,
                SpanKind.CLIENT,
                {
                    "gen_ai.operation.name": operation,
                    "gen_ai.request.model": model,
                    "gen_ai.provider.name": meta.get("ls_provider"),
                    "gen_ai.request.temperature": meta.get("ls_temperature"),
                    "gen_ai.request.max_tokens": meta.get("ls_max_tokens"),
                    "gen_ai.agent.name": agent,
                    "gen_ai.conversation.id": self.thread_id,
                },
            )

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
            if span is not None:
                usage = _runs.token_usage(response)
                if usage is not None:
                    span.set_attribute("gen_ai.usage.input_tokens", usage[0])
                    span.set_attribute("gen_ai.usage.output_tokens", usage[1])
                    self._add_tokens(run_id, *usage)
                if model := _runs.response_model(response):
                    span.set_attribute("gen_ai.response.model", model)
            self._close(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._close(run_id, error)

    # -- tool calls -------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        meta = metadata or {}
        with self._lock:
            parent_run_id = self._known(parent_run_id)
            self._runs.note(run_id, parent_run_id)
            agent = meta.get("lc_agent_name") or self._runs.node_of(parent_run_id)
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": kwargs.get("tool_call_id"),
                "gen_ai.tool.type": "function",
                "gen_ai.agent.name": agent,
            }
            if name.startswith(HANDOFF_PREFIX) and isinstance(inputs, Mapping):
                # The handoff as the tool was asked for it (source, target, task, reason):
                # the same attributes as the carried-out handoff's span event below.
                asked = {
                    "source": agent,
                    "target": name.removeprefix(HANDOFF_PREFIX),
                    "task": inputs.get("task"),
                    "reason": inputs.get("reason"),
                }
                attributes |= handoff_attributes(asked, "relaygraph.handoff")
            self._open(run_id, parent_run_id, f"execute_tool {name}", SpanKind.INTERNAL, attributes)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
            if span is not None:
                if (handoff := _runs.handoff_of(output)) is not None:
                    span.set_attribute("relaygraph.handoff.carried_out", True)
                    span.add_event(
                        "relaygraph.handoff",
                        _clean(handoff_attributes(handoff, "relaygraph.handoff")),
                    )
                status = getattr(output, "status", None)
                if isinstance(status, str):
                    span.set_attribute("relaygraph.tool.status", status)
            self._close(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._close(run_id, error)

    # -- anything else under the task -------------------------------------------------

    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        with self._lock:
            self._runs.note(run_id, self._known(parent_run_id))

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._runs.forget(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._runs.forget(run_id)
