"""An agent's node in the team graph: one visit of its subgraph, scoped, accounted, and
handed on (to the supervisor, or straight to a peer)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.config import get_stream_writer
from langgraph.errors import ParentCommand
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from relaygraph._calls import Call, Steps, run_async, run_sync
from relaygraph._names import FINALIZE, HANDOFF_PREFIX, SUPERVISOR
from relaygraph.agents import Agent
from relaygraph.events import (
    Handoff,
    VisitEnded,
    agent_finished_event,
    agent_started_event,
    event_sink,
    handoff_event,
)
from relaygraph.handoffs import Assignment, answer_unanswered_calls, handoff_target
from relaygraph.models import ModelCallError
from relaygraph.policies import AgentLimits, TeamPolicy
from relaygraph.policies.budget import BudgetHit, check_agent_budget
from relaygraph.policies.middleware import (
    BUDGET_KEY,
    VisitBudget,
    model_outputs,
    transcript_usage,
)
from relaygraph.policies.pingpong import detect_ping_pong
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._control import exhausted, on_ping_pong, team_stop
from relaygraph.supervisor._node import steps_node
from relaygraph.supervisor._node_config import call_config, replays_by_position, step_of, task_ns
from relaygraph.supervisor._refusals import (
    add_bar,
    bars_now,
    earlier_results,
    transcript_violations,
    violation,
)
from relaygraph.supervisor._state import TeamState, Visit
from relaygraph.supervisor._usage import agent_tokens, turn_usage, usage_record


def _agent_recursion_limit(rules: AgentLimits) -> int:
    """The recursion limit of one visit's subgraph: above what the agent's own budget allows.

    A model call takes at most three of its super-steps (the policy check, the model, the
    tools); the team's recursion limit counts the team's steps and is far too low for an
    agent's loop, which its ``max_model_calls`` ends gracefully instead.
    """
    calls = rules.max_model_calls if rules.max_model_calls is not None else 1000
    return 3 * (calls + 1) + 10


ExitKind = Literal["finished", "spent", "handoff", "stop", "bounced", "failed"]
"""How a visit ends: done; the agent's budget spent; work handed to a peer; the task stops
(a team limit, a ping-pong to finalize); a handoff refused as ping-pong (the pair barred);
its model call failed (the agent barred, the task degraded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Exit:
    """An agent node's outcome, in the structured team's terms (``command``), for the
    topology to carry out in its own graph."""

    kind: ExitKind
    command: Command[Any]
    """Where the structured team goes next (supervisor, finalize or the peer), and the update."""
    agent: str
    assignment: Assignment
    visit: Visit | None = None
    """The visit's record; None when the agent did not run (a limit reached first)."""
    step: int | None = None
    """The team graph's step the node ran in."""
    hit: BudgetHit | None = None
    """The agent budget that was spent, for ``spent``."""


class Exits(Protocol):
    """How a topology carries out an agent node's outcome."""

    entry_source: str
    """Who gives the first agent of a request its task: ``supervisor`` or ``user``."""

    def __call__(self, outcome: Exit, state: TeamState) -> Any: ...


class StructuredExits:
    """The structured team: the node's ``Command`` as it is."""

    entry_source = SUPERVISOR

    def __call__(self, outcome: Exit, state: TeamState) -> Any:
        return outcome.command


class AgentNode:
    """An agent's node: one visit of its subgraph per call, written once as steps
    (:mod:`relaygraph._calls`) that run on a thread (``stream``) or on the event loop
    (``astream``), where the visit's subgraph is awaited and holds no thread."""

    def __init__(
        self,
        spec: Agent,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        policy: TeamPolicy,
        exits: Exits | None = None,
        *,
        replays: bool = False,
    ) -> None:
        self.name = spec.name
        self.graph = graph
        self.policy = policy
        self.rules = policy.agent(spec.name)
        self.recursion_limit = _agent_recursion_limit(self.rules.limits)
        self.leave = exits or StructuredExits()
        self.replays = replays

    def __call__(self, state: TeamState, config: RunnableConfig) -> Any:
        return run_sync(self.steps(state, config))

    async def acall(self, state: TeamState, config: RunnableConfig) -> Any:
        return await run_async(self.steps(state, config))

    def runnable(self) -> Any:
        """The node as LangGraph runs it (see :func:`steps_node`)."""
        return steps_node(self.steps, self.name, subgraph=self.graph)

    def steps(self, state: TeamState, config: RunnableConfig) -> Steps[Any]:
        name, graph, policy, rules = self.name, self.graph, self.policy, self.rules
        leave, recursion_limit, replays = self.leave, self.recursion_limit, self.replays
        assignment = state.get("assignment") or Assignment(
            agent=name,
            task=state.get("request", ""),
            reason="",
            source=leave.entry_source,
            kind="route",
        )

        def out(kind: ExitKind, command: Command[Any], **more: Any) -> Any:
            return leave(
                Exit(
                    kind=kind,
                    command=command,
                    agent=name,
                    assignment=assignment,
                    step=step_of(config),
                    **more,
                ),
                state,
            )

        if hit := team_stop(state, policy, config):
            return out("stop", exhausted(policy, hit, state, config))
        turn, visit_id = state.get("turn", 0), task_ns(config)
        agent_before = turn_usage(state, name)
        if spent := check_agent_budget(name, rules.limits, agent_before, before="model"):
            # Reached through a direct handoff: the supervisor already could not route here.
            record = violation(f"{visit_id}:budget", turn, name, "budget", spent.message)
            return out(
                "spent",
                Command(
                    goto=SUPERVISOR,
                    update={
                        "violations": [record],
                        "assignment": None,
                        "barred": add_bar(state, name, f"out of budget: {spent.message}"),
                    },
                ),
                hit=spent,
            )
        emit = event_sink() or get_stream_writer()
        emit(agent_started_event(name, task=assignment["task"], source=assignment["source"]))
        scoped = HumanMessage(content=_prompts.agent_input(state, assignment))
        started = time.monotonic()
        budget = VisitBudget(
            agent_before=agent_before,
            team_before=turn_usage(state),
            started=started,
            earlier_results=earlier_results(state, name),
            step=step_of(config),
            barred=bars_now(state, name),
        )
        handoff: Command[Any] | None = None
        failed: ModelCallError | None = None
        visit_config = call_config(config, state, name, replays=replays, **{BUDGET_KEY: budget})
        visit_config["recursion_limit"] = recursion_limit
        values, stopped = yield _visit_call(graph, {"messages": [scoped]}, visit_config)
        if isinstance(stopped, ParentCommand):
            command = stopped.args[0]
            if command.graph != visit_id or not isinstance(command.update, dict):
                raise stopped  # Not a handoff from this agent's tools: let LangGraph route it.
            handoff = command
        elif isinstance(stopped, ModelCallError):
            # The server failed the agent's model call after the client's retries (its
            # model_error event is sent): the visit ends here and the team goes on without
            # this agent, as with a spent budget.
            failed = stopped
        transcript: list[BaseMessage] = list(values["messages"])
        target = str(handoff.goto) if handoff is not None else None
        if handoff is not None:
            transcript += handoff.update.get("messages", [])  # type: ignore[union-attr]
            transcript += answer_unanswered_calls(
                transcript, carried_out=f"{HANDOFF_PREFIX}{target}"
            )
        totals = transcript_usage(transcript, policy, seconds=time.monotonic() - started)
        usage = usage_record(visit_id, name, turn, totals, model_outputs(transcript))
        violations = transcript_violations(transcript, name, turn)
        last = transcript[-1]
        budget_note = (
            last.additional_kwargs.get(BUDGET_KEY) if handoff is None and failed is None else None
        )
        ended: VisitEnded = (
            "handed_off"
            if handoff
            else "model_error"
            if failed
            else "budget"
            if budget_note
            else "finished"
        )
        output = (
            f"Handed off to {target}: {handoff.update['handoffs'][0]['task']}"  # type: ignore[index]
            if handoff is not None
            else f"Its model call failed: {failed.reason}"
            if failed is not None
            else last.text
            if isinstance(last, AIMessage)
            else ""
        )
        visit = _visit(visit_id, name, turn, assignment, output, ended, transcript)
        update: dict[str, Any] = {"visits": [visit], "usage": [usage], "violations": violations}
        emit(agent_finished_event(name, ended=ended, output=output, usage=usage))
        if failed is not None:
            why = f"its model call failed: {failed.reason}"
            update |= {
                "barred": add_bar(state, name, why),
                "status": "degraded",
                "stop_reason": f"model_error: {name}: {failed.reason}",
            }
            back = Command(goto=SUPERVISOR, update={**update, "assignment": None})
            return out("failed", back, visit=visit)
        if budget_note is not None:
            hit = BudgetHit(**budget_note)
            # A tool call refused at the same limit recorded it already (and sent its
            # event then): one record, one event.
            kept = [
                v for v in violations if not (v["kind"] == "budget" and v["detail"] == hit.message)
            ]
            fresh = len(kept) == len(violations)
            update["violations"] = violations = kept
            if hit.scope == "team":
                stop = exhausted(policy, hit, state, config, update, announce=fresh)
                return out("stop", stop, visit=visit)
            update["violations"] = [
                *violations,
                violation(f"{visit_id}:budget", turn, name, "budget", hit.message, announce=fresh),
            ]
            update["barred"] = add_bar(state, name, f"out of budget: {hit.message}")
            back = Command(goto=SUPERVISOR, update={**update, "assignment": None})
            return out("spent", back, visit=visit, hit=hit)
        if handoff is None or target is None:
            back = Command(goto=SUPERVISOR, update={**update, "assignment": None})
            return out("finished", back, visit=visit)

        sent: Handoff = handoff.update["handoffs"][0]  # type: ignore[index]
        sent = {**sent, "step": step_of(config), "turn": turn}
        tokens_so_far = (
            agent_tokens(state, policy.agents) + usage["input_tokens"] + usage["output_tokens"]
        )

        def report(carried_out: bool) -> None:
            # As a route: sent once the handoff is carried out or stopped (a ping-pong); one
            # waiting for a person's decision is reported after it. A stopped handoff moved
            # no work: it is not among the task's handoffs.
            emit(
                handoff_event(
                    sent,
                    checkpoint_ns=visit_id,
                    tokens_so_far=tokens_so_far,
                    carried_out=carried_out,
                )
            )

        proceed = Command(
            goto=target,
            update={"handoffs": [sent], "assignment": handoff.update["assignment"]},  # type: ignore[index]
        )
        visited = [v["agent"] for v in _prompts.turn_visits(state)] + [name]
        found = detect_ping_pong(visited, target, max_bounces=policy.ping_pong.max_bounces)
        if found is not None:
            decided = on_ping_pong(
                policy, found, state, config, source=name, proceed=proceed, update=update
            )
            report(decided.goto == target)
            kind: ExitKind = (
                "stop"
                if decided.goto == FINALIZE
                else "bounced"
                if decided.goto == SUPERVISOR
                else "handoff"
            )
            return out(kind, decided, visit=visit)
        report(True)
        return out(
            "handoff",
            Command(goto=target, update={**update, **(proceed.update or {})}),
            visit=visit,
        )


def _visit_call(
    graph: CompiledStateGraph[Any, Any, Any, Any], visit_input: Any, config: RunnableConfig
) -> Call:
    """The visit's subgraph, streamed to its end: its latest state, and what stopped it
    early (a handoff's ``ParentCommand``, a failed model call) or None. Streaming keeps the
    latest state, so a handoff (raised mid-run) still leaves the visit's transcript and
    usage in hand."""

    def sync() -> tuple[dict[str, Any], Exception | None]:
        values: dict[str, Any] = visit_input
        try:
            for values in graph.stream(visit_input, config, stream_mode="values"):  # noqa: B007
                pass
        except (ParentCommand, ModelCallError) as exc:
            return values, exc
        return values, None

    async def async_() -> tuple[dict[str, Any], Exception | None]:
        values: dict[str, Any] = visit_input
        try:
            async for values in graph.astream(visit_input, config, stream_mode="values"):  # noqa: B007
                pass
        except (ParentCommand, ModelCallError) as exc:
            return values, exc
        return values, None

    return Call(sync, async_)


def _visit(
    visit_id: str,
    agent: str,
    turn: int,
    assignment: Assignment,
    output: str,
    ended: VisitEnded,
    transcript: list[BaseMessage],
) -> Visit:
    from langchain_core.messages import ToolMessage

    return Visit(
        id=visit_id,
        agent=agent,
        turn=turn,
        task=assignment["task"],
        source=assignment["source"],
        output=output,
        ended=ended,
        tools=[
            m.name or ""
            for m in transcript
            if isinstance(m, ToolMessage) and handoff_target(m.name or "") is None
        ],
        messages=transcript,  # type: ignore[typeddict-item]
    )


def agent_nodes(
    models: Mapping[str, BaseChatModel], team: Any, policy: TeamPolicy, exits: Exits | None
) -> dict[str, Any]:
    """Each agent of the team's policy, by name, as the node that runs it.

    Args:
        team: The team (``relaygraph.team.Team``): its agents and its tools by name.
    """
    return {
        name: node.runnable() for name, node in _agent_node_objects(models, team, policy, exits)
    }


def _agent_node_objects(
    models: Mapping[str, BaseChatModel], team: Any, policy: TeamPolicy, exits: Exits | None
) -> list[tuple[str, AgentNode]]:
    from relaygraph.agents import build_agent

    members = {agent.name: agent for agent in team.agents}
    return [
        (
            name,
            AgentNode(
                members[name],
                build_agent(members[name], models[name], policy, team.tools),
                policy,
                exits,
                replays=replays_by_position(models[name]),
            ),
        )
        for name in policy.agents
    ]


def agent_members(
    models: Mapping[str, BaseChatModel], team: Any, policy: TeamPolicy, exits: Exits
) -> list[RunnableLambda[Any, Any]]:
    """Each agent as a named runnable running its node, for the prebuilt multi-agent graphs
    (a swarm's members, a tool supervisor's workers), which take any named runnable and add
    it as the agent's node."""
    return [_member(name, node) for name, node in _agent_node_objects(models, team, policy, exits)]


def _member(name: str, node: AgentNode) -> RunnableLambda[Any, Any]:
    """``node`` as a named runnable in both forms. Its functions name ``node.graph``:
    LangGraph finds a node's subgraph (for its state and its interrupts) among the values
    the source of the node's function names."""

    def member(state: TeamState, config: RunnableConfig) -> Any:
        node.graph  # noqa: B018 (see the docstring)
        return node(state, config)

    async def amember(state: TeamState, config: RunnableConfig) -> Any:
        return await node.acall(state, config)

    return RunnableLambda(member, afunc=amember, name=name)
