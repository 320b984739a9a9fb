"""The ``supervisor-tools`` topology: ``langgraph_supervisor.create_supervisor`` over the
team's agents, routing by tool calls.

LangGraph's supervisor is a prebuilt tool-calling agent whose ``transfer_to_<agent>`` tools
send work to an agent, which always returns to it; it answers the user in its last message.
relaygraph gives it its own transfer tools (``create_supervisor`` accepts them when one
exists per agent) and two hooks of the prebuilt agent, so that the policy holds here as in
the structured team:

- Before each of its model calls: the team's limits, a stop an agent asked for, a direct
  handoff to relay, or no agent left (``pre_model_hook``).
- After each call: its usage, its final answer carried to ``finalize``, and a refusal for
  each call it may not make — a tool it does not have, a transfer whose arguments do not
  fit, every transfer after the first that fits (parallel transfers lose agents upstream,
  langgraph-supervisor #230; ``parallel_tool_calls`` stays off too) — answered and
  recorded as a violation before any tool runs (``post_model_hook``).
- Each transfer is checked like a structured route: an agent out of budget or barred is
  refused with a ToolMessage saying why, the team's agent runs are counted, and ping-pong
  is detected.

An agent's peer handoff cannot leave the agent's node for the peer directly here (the node's
edge back to the supervisor would run the supervisor beside the peer), so the supervisor
relays it, without a model call, still recorded as a ``direct`` handoff.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_stream_writer
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import ToolRuntime
from langgraph.types import Command

from relaygraph._names import BEGIN, FINALIZE, FINISH, HANDOFF_PREFIX, SUPERVISOR
from relaygraph.agents import Agent, TaskContext
from relaygraph.events import ViolationKind, event_sink, record_handoff, route_event
from relaygraph.handoffs import (
    Assignment,
    HandoffArgs,
    handoff_args_problem,
    handoff_target,
)
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import UsageTotals, check_agent_budget
from relaygraph.policies.middleware import replies_usage
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._agent_node import Exit
from relaygraph.supervisor._begin_node import begin_turn
from relaygraph.supervisor._control import (
    exhausted,
    on_ping_pong,
    route_ping_pong,
    team_stop,
    visits_spent,
)
from relaygraph.supervisor._node_config import task_ns
from relaygraph.supervisor._prebuilt import PrebuiltTeam
from relaygraph.supervisor._refusals import bars_now, violation
from relaygraph.supervisor._state import TeamState, ToolsTeamState, Violation
from relaygraph.supervisor._usage import agent_tokens, announce_usage, turn_usage, usage_record
from relaygraph.supervisor._verdict import non_answer

# langgraph_supervisor's marker for a handoff tool (langgraph_supervisor.handoff
# METADATA_KEY_HANDOFF_DESTINATION): with one such tool per agent, create_supervisor uses
# these instead of making its own.
HANDOFF_DESTINATION = "__handoff_destination"
CARRIED = ("messages", "usage", "violations", "handoffs")


class ToolsExits:
    """An agent's visit always returns to the supervisor, as a state update: the messages
    its ``output_mode`` keeps, and its records. A stop or a peer handoff is left in the
    state for the supervisor's hook to carry out."""

    entry_source = SUPERVISOR

    def __call__(self, outcome: Exit, state: TeamState) -> dict[str, Any]:
        update = dict(outcome.command.update or {})
        update["messages"] = _visit_messages(outcome)
        if outcome.step is not None:
            update["supervisor_step"] = outcome.step + 1  # The edge back: the next step.
        return update


def _visit_messages(outcome: Exit) -> list[BaseMessage]:
    """The visit's transcript as the supervisor's thread gets it: the agent's own messages
    (not its scoped input), ending with its result as a message of its own."""
    visit, agent = outcome.visit, outcome.agent
    if visit is None:
        reason = (outcome.command.update or {}).get("stop_reason") or (
            outcome.hit.message if outcome.hit else "a limit was reached"
        )
        return [AIMessage(content=f"{agent} did not run: {reason}", name=agent)]
    # Every AI message carries the agent's name, as LangGraph's supervisor expects (a
    # policy note written for the agent has none): the supervisor's own are told apart so.
    messages: list[BaseMessage] = [
        m.model_copy(update={"name": agent}) if isinstance(m, AIMessage) and not m.name else m
        for m in visit["messages"]
        if not isinstance(m, HumanMessage)
    ]
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and not last.tool_calls:
        return messages
    result = AIMessage(
        content=visit["output"] or "(no output)", name=agent, id=f"{visit['id']}:result"
    )
    return [*messages, result]


def _team_step(state: TeamState) -> int:
    """The team graph's step the supervisor runs in: after ``begin`` in a request's first
    run, else after the agent that returned to it (an older request's value is lower)."""
    found: Mapping[str, Any] = state
    return max(int(found.get("supervisor_step") or 0), int(found.get("turn_step") or 0) + 1)


def _this_run(config: RunnableConfig) -> str:
    """The supervisor node run's namespace (``supervisor:<task id>``): its usage record's id."""
    ns = task_ns(config)
    return ns.rsplit("|", 1)[0] if "|" in ns else ns


def _to_parent(
    state: TeamState,
    config: RunnableConfig,
    goto: str,
    update: dict[str, Any] | None = None,
    messages: Sequence[BaseMessage] = (),
) -> Command[Any]:
    """Leave the supervisor's own graph for ``goto`` in the team graph, carrying what this
    run of it wrote: its messages, and the usage and violations recorded under its
    namespace. A command to the parent graph replaces the subgraph's output, so nothing
    else would arrive; the tracers read this run's records from it too."""
    update = dict(update or {})
    run = _this_run(config)
    found: Mapping[str, Any] = state
    carried: dict[str, Any] = {
        key: [r for r in found.get(key) or [] if str(r["id"]).startswith(run)]
        for key in ("usage", "violations")
    }
    carried["messages"] = [*found.get("messages", []), *messages]
    carried["handoffs"] = []
    for key in CARRIED:
        carried[key] += update.pop(key, [])
    carried["barred"] = list(found.get("barred") or [])
    return Command(graph=Command.PARENT, goto=goto, update={**carried, **update})


def _answer(name: str, call_id: str, content: str) -> list[ToolMessage]:
    """The answer to the transfer call that ran; the hook answered every other call of its
    message already (see :func:`_refuse_calls`), and the answers are carried out of the
    supervisor's graph with the rest of its thread."""
    return [ToolMessage(content=content, name=name, tool_call_id=call_id)]


def _refuse_calls(
    reply: AIMessage, tools: Sequence[str], config: RunnableConfig, turn: int
) -> tuple[list[ToolMessage], list[Violation]]:
    """Answers and violations for the calls of the supervisor's reply that may not run: a
    tool it does not have (models invent names), a transfer whose arguments do not fit, and
    every transfer after the first one that may run (only one is carried out). Answered
    here, before the prebuilt agent's tools run, so that each leaves a record; the one call
    left unanswered runs as usual."""
    answers: list[ToolMessage] = []
    violations: list[Violation] = []
    first: str | None = None
    for call in reply.tool_calls:
        name = call["name"]
        kind: ViolationKind
        if name not in tools:
            kind = "handoff_not_allowed" if handoff_target(name) else "tool_not_allowed"
            detail = f"{SUPERVISOR!r} called {name!r}, which is not one of its tools"
            content = (
                f"Not run: {name!r} is not a tool of the supervisor. Its tools: "
                f"{', '.join(tools)}; to answer the user, reply without a tool call."
            )
        elif (problem := handoff_args_problem(call["args"])) is not None:
            kind = "invalid_arguments"
            detail = f"{SUPERVISOR!r} called {name!r} with invalid arguments: {problem}"
            content = (
                f"Not carried out: the arguments of {name} do not fit: {problem}. Call it "
                "again with a 'task' (text saying what to do) and, optionally, a 'reason'."
            )
        elif first is not None:
            kind = "handoff_not_allowed"
            detail = (
                f"{SUPERVISOR!r} called {name!r} after {first!r} in one message; only one "
                "transfer per message is carried out"
            )
            content = (
                "Not carried out: only one transfer per message is carried out, and "
                f"{first!r} came first in this message."
            )
        else:
            first = name
            continue
        call_id = call["id"] or ""
        answers.append(
            ToolMessage(content=content, name=name, tool_call_id=call_id, status="error")
        )
        violations.append(
            violation(f"{_this_run(config)}:{call_id}:{kind}", turn, SUPERVISOR, kind, detail)
        )
    return answers, violations


def _make_transfer(member: Agent, policy: TeamPolicy) -> BaseTool:
    target, description = member.name, member.description
    name = f"{HANDOFF_PREFIX}{target}"
    limits = policy.agent(target).limits

    def refuse(runtime: ToolRuntime[Any, Any], why: str, **update: Any) -> Command[Any]:
        reply = ToolMessage(
            content=f"Not carried out: {why}",
            name=name,
            tool_call_id=runtime.tool_call_id or "",
            status="error",
        )
        return Command(update={"messages": [reply], **update})

    def transfer(task: str, runtime: ToolRuntime[Any, Any], reason: str = "") -> Command[Any]:
        state: TeamState = runtime.state
        config = runtime.config
        call_id = runtime.tool_call_id or ""
        turn = state.get("turn", 0)
        visits = _prompts.turn_visits(state)
        last = visits[-1]["agent"] if visits else None
        why = bars_now(state, last).get(target)
        if why is None and (
            spent := check_agent_budget(target, limits, turn_usage(state, target), before="model")
        ):
            why = f"out of budget: {spent.message}"
        if why is not None:
            detail = f"supervisor called {name!r}, which is barred now: {why}"
            refused = violation(
                f"{_this_run(config)}:{call_id}:handoff_not_allowed",
                turn,
                SUPERVISOR,
                "handoff_not_allowed",
                detail,
            )
            return refuse(runtime, f"{target} may not take work now ({why}).", violations=[refused])
        if hit := visits_spent(state, policy):
            stop = exhausted(policy, hit, state, config)
            answers = _answer(name, call_id, f"Not carried out: {hit.message}")
            return _to_parent(state, config, FINALIZE, dict(stop.update or {}), answers)
        assignment = Assignment(
            agent=target, task=task, reason=reason, source=SUPERVISOR, kind="route"
        )
        record = record_handoff(assignment, id=call_id, step=_team_step(state), turn=turn)
        answers = _answer(name, call_id, f"Transferred to {target}: {task}")
        proceed = _to_parent(
            state, config, target, {"handoffs": [record], "assignment": assignment}, answers
        )
        found = route_ping_pong(policy, state, visits, target, task)
        if found is None:
            _emit_route(config, state, target, task, reason, policy, carried_out=True)
            return proceed
        carried = dict(proceed.update or {})
        violations = carried.pop("violations")
        decided = on_ping_pong(
            policy,
            found,
            state,
            config,
            source=SUPERVISOR,
            proceed=Command(goto=target, update=carried),
            update={},
        )
        update = dict(decided.update or {})
        _emit_route(config, state, target, task, reason, policy, carried_out=decided.goto == target)
        if decided.goto == FINALIZE:
            stopped = _answer(name, call_id, f"Not carried out: {found.detail}")
            return _to_parent(state, config, FINALIZE, update, stopped)
        if decided.goto == SUPERVISOR:  # The pair is barred; the supervisor chooses again.
            return refuse(
                runtime,
                f"{found.detail}; choose another agent or answer.",
                barred=update["barred"],
                violations=update["violations"],
            )
        update["violations"] = [*violations, *update["violations"]]
        return Command(graph=Command.PARENT, goto=target, update=update)

    return StructuredTool.from_function(
        func=transfer,
        name=name,
        description=f"Give work to the {target} agent ({description}), with a self-contained task.",
        args_schema=HandoffArgs,
        metadata={HANDOFF_DESTINATION: target},
    )


def _emit_route(
    config: RunnableConfig,
    state: TeamState,
    target: str,
    task: str,
    reason: str,
    policy: TeamPolicy,
    *,
    carried_out: bool = True,
) -> None:
    """Report a route once it is carried out or stopped (by a ping-pong), as the structured
    supervisor does."""
    (event_sink() or get_stream_writer())(
        route_event(
            next=target,
            task=task,
            reason=reason,
            step=_team_step(state),
            checkpoint_ns=_this_run(config),
            tokens_so_far=agent_tokens(state, policy.agents),
            carried_out=carried_out,
        )
    )


def _make_hooks(policy: TeamPolicy, agents: tuple[str, ...]) -> tuple[Any, Any]:
    tools = [f"{HANDOFF_PREFIX}{agent}" for agent in agents]

    def before_model(state: ToolsTeamState, config: RunnableConfig) -> Any:
        if state.get("status"):  # An agent's visit stopped the task (a limit, a ping-pong).
            return _to_parent(state, config, FINALIZE)
        pending = state.get("assignment")
        if pending is not None and pending["kind"] == "direct":
            # An agent's own handoff, relayed; its record goes along, so that traces show
            # it as a relay and not as a route of the supervisor's.
            sent = [
                h
                for h in state.get("handoffs", [])
                if h["kind"] == "direct" and h["target"] == pending["agent"]
            ][-1:]
            return _to_parent(state, config, pending["agent"], {"handoffs": sent})
        if hit := team_stop(state, policy, config, visits=False, own_graph=True):
            stop = exhausted(policy, hit, state, config)
            return _to_parent(state, config, FINALIZE, dict(stop.update or {}))
        visits = _prompts.turn_visits(state)
        unavailable = bars_now(state, visits[-1]["agent"] if visits else None)
        spent = [
            hit
            for agent in agents
            if (
                hit := check_agent_budget(
                    agent, policy.agent(agent).limits, turn_usage(state, agent), before="model"
                )
            )
        ]
        if all(a in unavailable or any(h.agent == a for h in spent) for a in agents):
            status = "failed" if spent and policy.team.on_exhausted == "fail" else "degraded"
            reason = (
                spent[0].stop_reason
                if spent
                else "no agent left: " + "; ".join(f"{a}: {why}" for a, why in unavailable.items())
            )
            return _to_parent(state, config, FINALIZE, {"status": status, "stop_reason": reason})
        return {"call_started": time.time()}

    def after_model(state: ToolsTeamState, config: RunnableConfig) -> Any:
        reply = state["messages"][-1]
        assert isinstance(reply, AIMessage)
        record_id = _this_run(config)
        seconds = max(0.0, time.time() - state.get("call_started", time.time()))
        earlier = [u for u in state.get("usage", []) if u["id"] == record_id]
        totals = UsageTotals.of(earlier) + replies_usage([reply], policy, seconds=seconds)
        usage = usage_record(record_id, SUPERVISOR, state.get("turn", 0), totals, [reply])
        usage["estimated"] = usage["estimated"] or any(u["estimated"] for u in earlier)
        # The record grows by each call of this run; each version replaces the last.
        announce_usage(usage)
        if reply.tool_calls:
            refusals, violations = _refuse_calls(reply, tools, config, state.get("turn", 0))
            return {"usage": [usage], "messages": refusals, "violations": violations}
        _emit_route(config, state, FINISH, "", "the supervisor answered", policy)
        update: dict[str, Any] = {"usage": [usage], "answer": reply.text}
        # Whether the reply answers (not cut, not a broken call) only the reply tells:
        # finalize gets its text alone.
        if (why := non_answer(reply.text, reply)) is not None and not state.get("status"):
            update |= {"status": "degraded", "stop_reason": why}
        return _to_parent(state, config, FINALIZE, update)

    return before_model, after_model


def build_tool_supervisor_team(parts: PrebuiltTeam) -> StateGraph[Any, Any, Any, Any]:
    """The tool supervisor's graph over the team's agents, ready to compile."""
    from langgraph_supervisor import create_supervisor

    team, policy, agents = parts.team, parts.policy, parts.agents
    members = {a.name: a for a in team.agents}
    workers = parts.members(ToolsExits())
    before_model, after_model = _make_hooks(policy, agents)
    builder = create_supervisor(
        workers,  # type: ignore[arg-type]  # Any named runnable serves as a worker.
        model=parts.models[SUPERVISOR],
        tools=[_make_transfer(members[name], policy) for name in agents],
        prompt=_prompts.tool_supervisor_prompt(
            [members[a] for a in agents], extra=team.supervisor_prompt
        ),
        pre_model_hook=before_model,
        post_model_hook=after_model,
        parallel_tool_calls=False,
        state_schema=ToolsTeamState,
        context_schema=TaskContext,
        output_mode=parts.topology.mode,
        supervisor_name=SUPERVISOR,
    )
    # A new request first goes through ``begin`` (a new turn: fresh per-request fields).
    builder.edges.discard((START, SUPERVISOR))
    builder.add_node(BEGIN, begin_turn)
    builder.add_edge(START, BEGIN)
    builder.add_edge(BEGIN, SUPERVISOR)
    # Its hooks and tools leave for finalize (not END) with a command to this graph;
    # declaring it draws the edge.
    builder.nodes[SUPERVISOR] = replace(builder.nodes[SUPERVISOR], ends=(*agents, FINALIZE))
    return parts.close(builder)
