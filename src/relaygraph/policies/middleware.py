"""Policy enforcement inside each agent, as LangChain agent middleware.

LangChain's ``ModelCallLimitMiddleware`` and ``ToolCallLimitMiddleware`` count calls per
thread or per run of one agent graph; relaygraph's budgets span all visits of an agent in a
task, the whole team, tokens, cost and time, so the checks are written here on the same
hooks LangChain's middleware offers (``wrap_model_call``, ``wrap_tool_call``).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol, runtime_checkable

from langchain.agents.middleware import (
    AgentMiddleware,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, StreamWriter, interrupt
from pydantic import BaseModel

from relaygraph._calls import Call, Steps, run_async, run_sync
from relaygraph._deadline import due_within
from relaygraph._names import HANDOFF_PREFIX, USAGE_ESTIMATED_KEY
from relaygraph.events import (
    ViolationKind,
    approval_event,
    approval_request,
    event_sink,
    violation_event,
)
from relaygraph.handoffs import (
    arguments_problem,
    handoff_args_problem,
    handoff_call_problem,
    handoff_target,
)
from relaygraph.policies._policy import AgentPolicy, TeamPolicy
from relaygraph.policies.budget import (
    BudgetHit,
    ProjectDayBudget,
    UsageTotals,
    check_agent_budget,
    check_team_budget,
    cost_usd,
    day_budget_of,
    seconds_left,
)
from relaygraph.policies.pingpong import normalize_call

__all__ = [
    "BUDGET_KEY",
    "MODEL_CALL_MARK",
    "NOT_RUN_KEY",
    "VIOLATION_KEY",
    "PolicyMiddleware",
    "ToolStepsMiddleware",
    "VisitBudget",
    "is_model_output",
    "model_outputs",
    "refuse_call",
    "replies_usage",
    "transcript_usage",
    "usage_estimated",
    "was_run",
]

MODEL_CALL_MARK = "relaygraph_agent"
"""``response_metadata`` key set on every AI message a model produced (not a middleware)."""
VIOLATION_KEY = "relaygraph_violation"
"""``additional_kwargs`` key on a message that records a violation: ``{"kind", "detail"}``."""
NOT_RUN_KEY = "relaygraph_approval_rejected"
"""``additional_kwargs`` key on the ToolMessage that stands in for a call a person (or the
approval rule) did not let run."""
BUDGET_KEY = "relaygraph_budget"
"""``config["configurable"]`` key holding the :class:`VisitBudget` of the running visit."""


def is_model_output(message: BaseMessage) -> bool:
    """True for an AI message that came from a model call (as marked by the middleware)."""
    return isinstance(message, AIMessage) and MODEL_CALL_MARK in message.response_metadata


def was_run(message: ToolMessage) -> bool:
    """Whether the tool behind this ToolMessage ran: not refused by the policy, not rejected
    or held back for approval. Tools that ran and reported an error did run."""
    return VIOLATION_KEY not in message.additional_kwargs and (
        NOT_RUN_KEY not in message.additional_kwargs
    )


def _executed(message: BaseMessage) -> bool:
    """A ToolMessage of a work tool that actually ran (not refused, not a handoff)."""
    return (
        isinstance(message, ToolMessage)
        and handoff_target(message.name or "") is None
        and was_run(message)
    )


def replies_usage(
    replies: Sequence[BaseMessage], policy: TeamPolicy, *, tool_calls: int = 0, seconds: float = 0.0
) -> UsageTotals:
    """What model replies spent: one model call each, the tokens each reported, and their
    price from the policy. The one place a model call's usage is computed: an agent's
    visit (:func:`transcript_usage`), a routing decision and finalize's answer all count
    their replies here.

    Args:
        replies: The AI messages the model calls returned.
        tool_calls: Tool calls that ran beside them.
        seconds: Wall-clock time spent.
    """
    input_tokens = output_tokens = 0
    cost = 0.0
    for reply in replies:
        meta = getattr(reply, "usage_metadata", None)
        if not meta:
            continue
        input_tokens += meta["input_tokens"]
        output_tokens += meta["output_tokens"]
        cost += cost_usd(
            policy,
            str(reply.response_metadata.get("model_name", "")),
            meta["input_tokens"],
            meta["output_tokens"],
        )
    return UsageTotals(
        model_calls=len(replies),
        tool_calls=tool_calls,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost,
        seconds=seconds,
    )


def usage_estimated(replies: Sequence[BaseMessage]) -> bool:
    """Whether some reply's tokens were estimated (the provider reported none)."""
    return any(
        not isinstance(m, AIMessage)
        or m.usage_metadata is None
        or m.response_metadata.get(USAGE_ESTIMATED_KEY, False)
        for m in replies
    )


def model_outputs(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The AI messages of a transcript that model calls produced (see :func:`is_model_output`)."""
    return [m for m in messages if is_model_output(m)]


def transcript_usage(
    messages: Sequence[BaseMessage], policy: TeamPolicy, *, seconds: float = 0.0
) -> UsageTotals:
    """What a visit's transcript spent: model calls, executed tool calls, tokens, cost."""
    return replies_usage(
        model_outputs(messages),
        policy,
        tool_calls=sum(1 for m in messages if _executed(m)),
        seconds=seconds,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class VisitBudget:
    """What the team graph tells an agent's middleware when a visit starts."""

    agent_before: UsageTotals
    """This agent's usage in its earlier visits for this request."""
    team_before: UsageTotals
    """The whole team's usage for this request so far."""
    started: float
    """``time.monotonic()`` when the visit started."""
    earlier_results: Mapping[str, str] = field(default_factory=dict)
    """Results of this agent's earlier tool calls, by :func:`normalize_call` key."""
    step: int | None = None
    """The team graph's super-step of this visit, for approval payloads."""
    barred: Mapping[str, str] = field(default_factory=dict)
    """Peers this agent may not hand work to now (a barred ping-pong pair, a peer out of
    budget), with the reason."""


def _visit_budget() -> VisitBudget | None:
    try:
        value = get_config().get("configurable", {}).get(BUDGET_KEY)
    except RuntimeError:  # Outside a graph (an agent used on its own): no budget to apply.
        return None
    return value if isinstance(value, VisitBudget) else None


def _day_budget() -> ProjectDayBudget | None:
    try:
        return day_budget_of(get_config().get("configurable", {}))
    except RuntimeError:  # Outside a graph: no project, no day budget.
        return None


def _refusal(
    call: Mapping[str, Any], kind: ViolationKind, detail: str, content: str
) -> ToolMessage:
    return ToolMessage(
        content=content,
        name=call["name"],
        tool_call_id=call["id"] or "",
        status="error",
        additional_kwargs={VIOLATION_KEY: {"kind": kind, "detail": detail}},
    )


def refuse_call(
    call: Mapping[str, Any],
    *,
    agent: str,
    kind: ViolationKind,
    detail: str,
    content: str,
    emit: StreamWriter,
) -> ToolMessage:
    """Refuse a tool call that did not run: its violation's live event, and the ToolMessage
    that answers the call and records the violation (the agent node reads it into the
    task's violations; :func:`was_run` is False for it, so no budget counts it).

    Args:
        call: The refused call.
        agent: Who made it.
        kind: The violation's kind (``tool_not_allowed``, ``invalid_arguments``, ...).
        detail: What happened, for the audit trail.
        content: What the model reads: why, and what to do instead.
        emit: The run's stream writer.
    """
    emit(violation_event(agent, kind, detail))
    return _refusal(call, kind, detail, content)


@dataclass(frozen=True, slots=True)
class _Refused:
    """Why a call may not run: its violation and the answer the model reads."""

    kind: ViolationKind
    detail: str
    content: str


def _calls_of(messages: Sequence[BaseMessage], call_id: str) -> list[Mapping[str, Any]]:
    """The calls of the AI message that made ``call_id`` (the call's own message)."""
    for message in reversed(messages):
        if isinstance(message, AIMessage) and any(c["id"] == call_id for c in message.tool_calls):
            return list(message.tool_calls)
    return []


def _schema(tool: BaseTool | None) -> type[BaseModel] | None:
    """The model the tool's arguments are validated with, when it has one (an MCP tool's
    schema is plain JSON Schema, left to the tool)."""
    schema = tool.tool_call_schema if tool is not None else None
    return schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None


@runtime_checkable
class ToolAvailability(Protocol):
    """A run's context that knows which tools this host cannot run now
    (``relaygraph.agents.TaskContext``)."""

    def unavailable_tool(self, name: str) -> str | None:
        """Why tool ``name`` cannot run here, or None when it can."""
        ...


def _unavailable(context: Any, tool: str) -> str | None:
    return context.unavailable_tool(tool) if isinstance(context, ToolAvailability) else None


class ToolStepsMiddleware(AgentMiddleware[Any, Any, Any], ABC):
    """One agent's middleware whose tool-call wrapper is written once as steps
    (:mod:`relaygraph._calls`, its :meth:`_tool_call`): run on the thread under
    ``wrap_tool_call``, awaited on the event loop under ``awrap_tool_call``."""

    label: ClassVar[str]
    """The middleware's name before its agent's (``Policy[coder]``): an agent's
    middleware names differ."""

    def __init__(self, agent: str) -> None:
        super().__init__()
        self.agent = agent

    @property
    def name(self) -> str:
        return f"{self.label}[{self.agent}]"

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        return run_sync(self._tool_call(request, handler))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        return await run_async(self._tool_call(request, handler))

    @abstractmethod
    def _tool_call(
        self, request: ToolCallRequest, handler: Callable[..., Any]
    ) -> Steps[ToolMessage | Command[Any]]:
        """The tool call's steps: ``yield Call.handler(handler, request)`` runs the call."""


class PolicyMiddleware(ToolStepsMiddleware):
    """Enforces one agent's policy: budgets, allowlists, repeated calls, approvals."""

    label = "Policy"

    def __init__(self, agent: str, policy: TeamPolicy) -> None:
        super().__init__(agent)
        self.policy = policy
        self.rules: AgentPolicy = policy.agent(agent)
        self.allowed = set(self.rules.tools) | {f"{HANDOFF_PREFIX}{p}" for p in self.rules.handoffs}

    # -- budgets ----------------------------------------------------------------------

    def _spent(
        self, messages: list[BaseMessage], budget: VisitBudget
    ) -> tuple[UsageTotals, UsageTotals]:
        visit = transcript_usage(messages, self.policy, seconds=time.monotonic() - budget.started)
        return budget.agent_before + visit, budget.team_before + visit

    def _hit(
        self, messages: list[BaseMessage], budget: VisitBudget, before: Any
    ) -> BudgetHit | None:
        agent_used, team_used = self._spent(messages, budget)
        return check_agent_budget(
            self.agent, self.rules.limits, agent_used, before=before
        ) or check_team_budget(self.policy.team, team_used, _day_budget())

    def _seconds_left(self, messages: list[BaseMessage]) -> float | None:
        """What the agent's and the team's ``max_seconds`` leave for the next model call."""
        budget = _visit_budget()
        if budget is None:
            return None
        agent_used, team_used = self._spent(messages, budget)
        return seconds_left(
            (self.rules.limits.max_seconds, agent_used), (self.policy.team.max_seconds, team_used)
        )

    def _budget_note(self, messages: list[BaseMessage]) -> AIMessage | None:
        """The note that ends the visit, if a budget forbids the next model call."""
        budget = _visit_budget()
        if budget is None:
            return None
        hit = self._hit(messages, budget, "model")
        if hit is None:
            # A tool call refused for the tool budget spends the agent's budget too.
            refused = [
                m.additional_kwargs[VIOLATION_KEY]
                for m in messages
                if isinstance(m, ToolMessage) and VIOLATION_KEY in m.additional_kwargs
            ]
            for violation in refused:
                if violation.get("budget"):
                    hit = BudgetHit(**violation["budget"])
                    break
        if hit is None:
            return None
        return AIMessage(
            content=f"Stopped: {hit.message} ({hit.stop_reason}).",
            additional_kwargs={BUDGET_KEY: hit.to_json()},
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return run_sync(self._model_call(request, handler))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await run_async(self._model_call(request, handler))

    def _model_call(
        self, request: ModelRequest[Any], handler: Callable[..., Any]
    ) -> Steps[ModelResponse[Any]]:
        # The budgets are checked here, before the call, rather than in a `before_model`
        # hook: a hook is a node of the agent's graph, so a step of its own, with its own
        # checkpoint and writes (sync durability), before every model call. A spent budget
        # answers with the note instead of the model: a reply without tool calls, which
        # ends the visit as a `jump_to: end` would.
        messages: list[BaseMessage] = list(request.state["messages"])
        note = self._budget_note(messages)
        if note is not None:
            return ModelResponse(result=[note])
        with due_within(self._seconds_left(messages)):
            response: ModelResponse[Any] = yield Call.handler(handler, request)
        # Marking the model's own messages lets usage be counted from the checkpointed
        # transcript alone (re-runs cannot double count), apart from notes middleware adds.
        for message in response.result:
            if isinstance(message, AIMessage):
                message.response_metadata[MODEL_CALL_MARK] = self.agent
        return response

    # -- tools ------------------------------------------------------------------------

    def _tool_call(
        self, request: ToolCallRequest, handler: Callable[..., Any]
    ) -> Steps[ToolMessage | Command[Any]]:
        call = request.tool_call
        messages: list[BaseMessage] = list(request.state.get("messages", []))
        calls = _calls_of(messages, call["id"] or "")
        tools = {t.name: t for t in request.runtime.tools}
        budget = _visit_budget()
        refused = self._refusal(call, calls, tools, budget)
        if refused is not None:
            return self._refused(request, refused)
        if handoff_target(call["name"]) is not None:
            answer = yield Call.handler(handler, request)
            return self._with_others_answered(answer, call, calls, tools, budget)
        if budget is not None:
            spent = self._check_tool(call, messages, calls, tools, budget)
            if spent is not None:
                refused = spent.additional_kwargs[VIOLATION_KEY]
                (event_sink() or request.runtime.stream_writer)(
                    violation_event(
                        self.agent, refused["kind"], refused["detail"], budget=refused.get("budget")
                    )
                )
                return spent
        unavailable = _unavailable(request.runtime.context, call["name"])
        if unavailable is not None:
            # Before an approval: a person is never asked to approve a call this host will
            # refuse anyway (run_python where the server cannot isolate code).
            return self._refused(
                request,
                _Refused(
                    kind="tool_unavailable",
                    detail=f"{self.agent!r} called {call['name']!r}, which this server cannot "
                    "run: it has no filesystem isolation (bubblewrap) for code",
                    content=f"Not run: {unavailable}",
                ),
            )
        if call["name"] in self.rules.approval:
            return (yield from self._with_approval(request, handler, budget))
        return (yield Call.handler(handler, request))

    def _refused(self, request: ToolCallRequest, refused: _Refused) -> ToolMessage:
        """Refuse the call: its violation's live event, and the answer that records it."""
        return refuse_call(
            request.tool_call,
            agent=self.agent,
            kind=refused.kind,
            detail=refused.detail,
            content=refused.content,
            emit=(event_sink() or request.runtime.stream_writer),
        )

    def _refusal(
        self,
        call: Mapping[str, Any],
        calls: Sequence[Mapping[str, Any]],
        tools: Mapping[str, BaseTool],
        budget: VisitBudget | None,
    ) -> _Refused | None:
        """Why ``call`` may not run whatever was spent: a tool outside the allowlist, a peer
        barred now, arguments that do not fit, or a call its message (``calls``) rules out
        (a second transfer, a transfer or an approval beside other calls). ``None`` when
        it may run as far as these rules go."""
        name = call["name"]
        if name not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "none"
            return _Refused(
                "handoff_not_allowed" if handoff_target(name) else "tool_not_allowed",
                f"{self.agent!r} called {name!r}, which it is not allowed",
                f"Not run: {name!r} is not allowed for {self.agent}. Allowed tools: {allowed}.",
            )
        if (peer := handoff_target(name)) is not None:
            if budget is not None and peer in budget.barred:
                why = budget.barred[peer]
                return _Refused(
                    "handoff_not_allowed",
                    f"{self.agent!r} called {name!r}, which is barred now: {why}",
                    f"Not run: {self.agent} may not hand work to {peer} now ({why}). "
                    "Finish your task yourself, or answer so the supervisor decides.",
                )
            if (problem := handoff_args_problem(call["args"])) is not None:
                # Refused here rather than by the tool's schema, so that the transfer that
                # did not happen is recorded like every other refused call.
                return _Refused(
                    "invalid_arguments",
                    f"{self.agent!r} called {name!r} with invalid arguments: {problem}",
                    f"Not run: the arguments of {name} do not fit: {problem}. Call it again "
                    "with a 'task' (text saying what to do) and, optionally, a 'reason'.",
                )
            if (shape := handoff_call_problem(calls, call["id"] or "")) is not None:
                # Refused here rather than by the tool, so that it is recorded; the words
                # are the tool's own.
                return _Refused(
                    "handoff_not_allowed",
                    f"{self.agent!r} called {name!r}, which was not carried out: {shape}",
                    f"Handoff not carried out: {shape}",
                )
            return None
        schema = _schema(tools.get(name))
        if schema is not None and (problem := arguments_problem(schema, call["args"])):
            # The tool node would answer these with its own error as if the tool had run.
            return _Refused(
                "invalid_arguments",
                f"{self.agent!r} called {name!r} with invalid arguments: {problem}",
                f"Not run: the arguments of {name} do not fit: {problem}. Call it again with "
                f"arguments that fit: {', '.join(schema.model_fields) or 'none'}.",
            )
        if name in self.rules.approval and len(calls) > 1:
            # Everything else in the message would run before the approval; nothing with a
            # side effect may happen before the interrupt, so the call must come alone.
            return _Refused(
                "tool_not_allowed",
                f"{self.agent!r} called {name!r}, which needs a person's approval, beside "
                "other calls in one message",
                f"Not run: {name} needs a person's approval, so call it in a message of its own.",
            )
        return None

    def _with_others_answered(
        self,
        result: ToolMessage | Command[Any],
        call: Mapping[str, Any],
        calls: Sequence[Mapping[str, Any]],
        tools: Mapping[str, BaseTool],
        budget: VisitBudget | None,
    ) -> ToolMessage | Command[Any]:
        """A carried-out handoff, with the refusals of the other calls of its message.

        LangGraph leaves the agent's subgraph with the handoff's command alone: the answers
        to the other calls, written in the same step, are lost (each sent its violation's
        event). The command carries the same answers, so that the visit's transcript
        records each refusal as the violation its event announced.
        """
        if not (isinstance(result, Command) and isinstance(result.update, dict)):
            return result
        others = []
        for other in calls:
            if other["id"] == call["id"]:
                continue
            refused = self._refusal(other, calls, tools, budget)
            if refused is not None:  # Always: only the first transfer may be carried out.
                others.append(_refusal(other, refused.kind, refused.detail, refused.content))
        messages = [*result.update.get("messages", []), *others]
        return replace(result, update={**result.update, "messages": messages})

    def _check_tool(
        self,
        call: Mapping[str, Any],
        messages: list[BaseMessage],
        calls: Sequence[Mapping[str, Any]],
        tools: Mapping[str, BaseTool],
        budget: VisitBudget,
    ) -> ToolMessage | None:
        """A refusal for a call that would repeat an earlier one or go over a budget."""
        key = normalize_call(call["name"], call["args"])
        earlier = dict(budget.earlier_results)
        answered = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
        siblings: list[Mapping[str, Any]] = []
        for message in messages:
            if not isinstance(message, AIMessage):
                continue
            for other in message.tool_calls:
                if other["id"] == call["id"]:
                    break
                if other["id"] in answered and _executed(answered[other["id"]]):
                    earlier.setdefault(
                        normalize_call(other["name"], other["args"]),
                        str(answered[other["id"]].content),
                    )
                elif (
                    other["id"] not in answered
                    and handoff_target(other["name"]) is None
                    and self._refusal(other, calls, tools, budget) is None
                ):
                    siblings.append(other)  # Same message, running beside this call.
        if key in earlier:
            detail = f"{self.agent!r} repeated {call['name']}({json.dumps(call['args'])})"
            return _refusal(
                call,
                "repeated_tool_call",
                detail,
                f"{earlier[key]}\n\n[Not run again: this exact call was already made; "
                "above is its earlier result.]",
            )
        agent_used, team_used = self._spent(messages, budget)
        agent_used = agent_used + UsageTotals(tool_calls=len(siblings))
        hit = check_agent_budget(
            self.agent, self.rules.limits, agent_used, before="tool"
        ) or check_team_budget(self.policy.team, team_used, _day_budget())
        if hit is not None:
            message = _refusal(
                call, "budget", hit.message, f"Not run: {hit.message} ({hit.stop_reason})."
            )
            message.additional_kwargs[VIOLATION_KEY]["budget"] = hit.to_json()
            return message
        return None

    def _with_approval(
        self,
        request: ToolCallRequest,
        handler: Callable[..., Any],
        budget: VisitBudget | None,
    ) -> Steps[ToolMessage | Command[Any]]:
        call = request.tool_call
        decision = interrupt(
            approval_request(
                self.agent,
                tool=call["name"],
                args=call["args"],
                tool_call_id=call["id"],
                step=budget.step if budget is not None else None,
            )
        )
        verdict = decision.get("decision") if isinstance(decision, Mapping) else decision
        reason = decision.get("reason") if isinstance(decision, Mapping) else None
        edited_args = (
            dict(decision.get("args") or {})
            if verdict == "edit" and isinstance(decision, Mapping)
            else None
        )
        (event_sink() or request.runtime.stream_writer)(
            approval_event(
                self.agent,
                tool=call["name"],
                decision=verdict,
                reason=reason,
                tool_call_id=call["id"],
                args=edited_args,
            )
        )
        if verdict == "approve":
            return (yield Call.handler(handler, request))
        if edited_args is not None:
            edited = {**call, "args": edited_args}
            overridden = request.override(tool_call=edited)  # type: ignore[arg-type]
            return (yield Call.handler(handler, overridden))
        return ToolMessage(
            content=f"A person rejected this call of {call['name']}: "
            f"{reason or 'no reason given'}. Do not make it again as it was.",
            name=call["name"],
            tool_call_id=call["id"] or "",
            status="error",
            additional_kwargs={NOT_RUN_KEY: True},
        )
