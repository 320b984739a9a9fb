"""An agent's node in the team graph: one visit of its subgraph, scoped, accounted, and
handed on (to the supervisor, or straight to a peer)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
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


@dataclass(frozen=True, slots=True)
class Visiting:
    """The visit an agent node's call makes: where it runs and the work it was given."""

    agent: str
    state: TeamState
    config: RunnableConfig
    assignment: Assignment

    @property
    def turn(self) -> int:
        return self.state.get("turn", 0)

    @property
    def visit_id(self) -> str:
        """The task namespace the visit runs in: its records' id."""
        return task_ns(self.config)

    def exit(self, kind: ExitKind, command: Command[Any], **more: Any) -> Exit:
        """The node's outcome ``kind``, going on with ``command``."""
        return Exit(
            kind=kind,
            command=command,
            agent=self.agent,
            assignment=self.assignment,
            step=step_of(self.config),
            **more,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Ran:
    """A visit's subgraph run, read: its transcript and what ended it."""

    transcript: list[AnyMessage]
    """The visit's messages, a handoff's own among them, every tool call answered."""
    handoff: dict[str, Any] | None = None
    """The update of the handoff to a peer that ended the visit, if one did."""
    target: str | None = None
    """The peer the handoff goes to."""
    failed: ModelCallError | None = None
    """The failed model call that ended the visit, if one did."""

    @property
    def budget_note(self) -> dict[str, Any] | None:
        """The budget the agent's middleware found spent (:data:`BUDGET_KEY`): it ended
        the visit when neither a handoff nor a failed call did."""
        if self.handoff is not None or self.failed is not None:
            return None
        note: dict[str, Any] | None = self.transcript[-1].additional_kwargs.get(BUDGET_KEY)
        return note

    @property
    def ended(self) -> VisitEnded:
        if self.handoff is not None:
            return "handed_off"
        if self.failed is not None:
            return "model_error"
        return "budget" if self.budget_note else "finished"

    @property
    def output(self) -> str:
        """The visit's result as the team sees it."""
        if self.handoff is not None:
            return f"Handed off to {self.target}: {self.handoff['handoffs'][0]['task']}"
        if self.failed is not None:
            return f"Its model call failed: {self.failed.reason}"
        last = self.transcript[-1]
        return last.text if isinstance(last, AIMessage) else ""


def read_visit(values: dict[str, Any], stopped: Exception | None, visit_id: str) -> Ran:
    """The visit's run from its subgraph's latest state and what stopped it early.

    Raises:
        ParentCommand: A command that is no handoff from this agent's tools: LangGraph
            routes it.
    """
    transcript: list[AnyMessage] = list(values["messages"])
    if isinstance(stopped, ModelCallError):
        # The server failed the agent's model call after the client's retries (its
        # model_error event is sent): the visit ends here and the team goes on without
        # this agent, as with a spent budget.
        return Ran(transcript=transcript, failed=stopped)
    if not isinstance(stopped, ParentCommand):
        return Ran(transcript=transcript)
    command = stopped.args[0]
    if command.graph != visit_id or not isinstance(command.update, dict):
        raise stopped
    target = str(command.goto)
    transcript += command.update.get("messages", [])
    transcript += answer_unanswered_calls(transcript, carried_out=f"{HANDOFF_PREFIX}{target}")
    return Ran(transcript=transcript, handoff=command.update, target=target)


class AgentNode:
    """An agent's node: one visit of its subgraph per call, written once as steps
    (:mod:`relaygraph._calls`) that run on a thread (``stream``) or on the event loop
    (``astream``), where the visit's subgraph is awaited and holds no thread.

    Each part a visit goes through can be called alone: the stop before it
    (:meth:`AgentNode.stopped_before`), the visit's records (:meth:`AgentNode.record`)
    and where the team goes after it (:meth:`AgentNode.after`, :meth:`AgentNode.hand_off`).
    """

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

    def visiting(self, state: TeamState, config: RunnableConfig) -> Visiting:
        """The visit this call makes: the work waiting for the agent, or the request
        itself for the first agent of a topology without a supervisor."""
        assignment = state.get("assignment") or Assignment(
            agent=self.name,
            task=state.get("request", ""),
            reason="",
            source=self.leave.entry_source,
            kind="route",
        )
        return Visiting(self.name, state, config, assignment)

    def stopped_before(self, visiting: Visiting) -> Exit | None:
        """The node's outcome when the agent may not run: a team limit is reached, or its
        own budget is spent (reached through a direct handoff: the supervisor already
        could not route here)."""
        state, config = visiting.state, visiting.config
        if hit := team_stop(state, self.policy, config):
            return visiting.exit("stop", exhausted(self.policy, hit, state, config))
        spent = check_agent_budget(
            self.name, self.rules.limits, turn_usage(state, self.name), before="model"
        )
        if spent is None:
            return None
        record = violation(
            f"{visiting.visit_id}:budget", visiting.turn, self.name, "budget", spent.message
        )
        update = {
            "violations": [record],
            "assignment": None,
            "barred": add_bar(state, self.name, f"out of budget: {spent.message}"),
        }
        return visiting.exit("spent", Command(goto=SUPERVISOR, update=update), hit=spent)

    def visit_config(self, visiting: Visiting, started: float) -> RunnableConfig:
        """The config the visit's subgraph runs with: its budget and recursion limit."""
        state, config = visiting.state, visiting.config
        budget = VisitBudget(
            agent_before=turn_usage(state, self.name),
            team_before=turn_usage(state),
            started=started,
            earlier_results=earlier_results(state, self.name),
            step=step_of(config),
            barred=bars_now(state, self.name),
        )
        visit_config = call_config(
            config, state, self.name, replays=self.replays, **{BUDGET_KEY: budget}
        )
        visit_config["recursion_limit"] = self.recursion_limit
        return visit_config

    def record(self, visiting: Visiting, ran: Ran, *, seconds: float) -> dict[str, Any]:
        """The visit's records: the update with its visit, usage and violations."""
        transcript, turn = ran.transcript, visiting.turn
        totals = transcript_usage(transcript, self.policy, seconds=seconds)
        usage = usage_record(visiting.visit_id, self.name, turn, totals, model_outputs(transcript))
        visit = Visit(
            id=visiting.visit_id,
            agent=self.name,
            turn=turn,
            task=visiting.assignment["task"],
            source=visiting.assignment["source"],
            output=ran.output,
            ended=ran.ended,
            tools=[
                m.name or ""
                for m in transcript
                if isinstance(m, ToolMessage) and handoff_target(m.name or "") is None
            ],
            messages=transcript,
        )
        violations = transcript_violations(transcript, self.name, turn)
        return {"visits": [visit], "usage": [usage], "violations": violations}

    def after(self, visiting: Visiting, ran: Ran, update: dict[str, Any]) -> Exit:
        """Where the team goes after the visit: back to the supervisor (the agent's work
        done, its model call failed, its budget spent), to a stop, or to a peer."""
        state, name, visit = visiting.state, self.name, update["visits"][0]
        back = {**update, "assignment": None}
        if ran.failed is not None:
            back |= {
                "barred": add_bar(state, name, f"its model call failed: {ran.failed.reason}"),
                "status": "degraded",
                "stop_reason": f"model_error: {name}: {ran.failed.reason}",
            }
            return visiting.exit("failed", Command(goto=SUPERVISOR, update=back), visit=visit)
        if (note := ran.budget_note) is not None:
            return self.spent(visiting, BudgetHit(**note), update)
        if ran.handoff is None or ran.target is None:
            return visiting.exit("finished", Command(goto=SUPERVISOR, update=back), visit=visit)
        return self.hand_off(visiting, ran.handoff, ran.target, update)

    def spent(self, visiting: Visiting, hit: BudgetHit, update: dict[str, Any]) -> Exit:
        """The visit ended at a budget: the team's stops the task, the agent's bars it."""
        state, config, visit = visiting.state, visiting.config, update["visits"][0]
        violations = update["violations"]
        # A tool call refused at the same limit recorded it already (and sent its event
        # then): one record, one event.
        kept = [v for v in violations if not (v["kind"] == "budget" and v["detail"] == hit.message)]
        fresh = len(kept) == len(violations)
        update = {**update, "violations": kept}
        if hit.scope == "team":
            stop = exhausted(self.policy, hit, state, config, update, announce=fresh)
            return visiting.exit("stop", stop, visit=visit)
        record = violation(
            f"{visiting.visit_id}:budget",
            visiting.turn,
            self.name,
            "budget",
            hit.message,
            announce=fresh,
        )
        update |= {
            "violations": [*kept, record],
            "barred": add_bar(state, self.name, f"out of budget: {hit.message}"),
            "assignment": None,
        }
        return visiting.exit("spent", Command(goto=SUPERVISOR, update=update), visit=visit, hit=hit)

    def hand_off(
        self, visiting: Visiting, handoff: dict[str, Any], target: str, update: dict[str, Any]
    ) -> Exit:
        """The work the agent's handoff (its command's update) gives the peer ``target``,
        unless it is a ping-pong the policy stops or turns back."""
        state, config = visiting.state, visiting.config
        visit, usage = update["visits"][0], update["usage"][0]
        sent: Handoff = handoff["handoffs"][0]
        sent = {**sent, "step": step_of(config), "turn": visiting.turn}
        tokens_so_far = (
            agent_tokens(state, self.policy.agents) + usage["input_tokens"] + usage["output_tokens"]
        )

        def report(carried_out: bool) -> None:
            # As a route: sent once the handoff is carried out or stopped (a ping-pong); one
            # waiting for a person's decision is reported after it. A stopped handoff moved
            # no work: it is not among the task's handoffs.
            event = handoff_event(
                sent,
                checkpoint_ns=visiting.visit_id,
                tokens_so_far=tokens_so_far,
                carried_out=carried_out,
            )
            (event_sink() or get_stream_writer())(event)

        proceed = Command(
            goto=target, update={"handoffs": [sent], "assignment": handoff["assignment"]}
        )
        visited = [v["agent"] for v in _prompts.turn_visits(state)] + [self.name]
        found = detect_ping_pong(visited, target, max_bounces=self.policy.ping_pong.max_bounces)
        if found is None:
            report(True)
            command = Command(goto=target, update={**update, **(proceed.update or {})})
            return visiting.exit("handoff", command, visit=visit)
        decided = on_ping_pong(
            self.policy, found, state, config, source=self.name, proceed=proceed, update=update
        )
        report(decided.goto == target)
        kind: ExitKind = (
            "stop"
            if decided.goto == FINALIZE
            else "bounced"
            if decided.goto == SUPERVISOR
            else "handoff"
        )
        return visiting.exit(kind, decided, visit=visit)

    def steps(self, state: TeamState, config: RunnableConfig) -> Steps[Any]:
        """One visit of the agent, handed on as the topology carries out its outcome."""
        visiting = self.visiting(state, config)
        if (early := self.stopped_before(visiting)) is not None:
            return self.leave(early, state)
        assignment, emit = visiting.assignment, event_sink() or get_stream_writer()
        emit(agent_started_event(self.name, task=assignment["task"], source=assignment["source"]))
        scoped = HumanMessage(content=_prompts.agent_input(state, assignment))
        started = time.monotonic()
        values, stopped = yield _visit_call(
            self.graph, {"messages": [scoped]}, self.visit_config(visiting, started)
        )
        ran = read_visit(values, stopped, visiting.visit_id)
        update = self.record(visiting, ran, seconds=time.monotonic() - started)
        emit(
            agent_finished_event(
                self.name, ended=ran.ended, output=ran.output, usage=update["usage"][0]
            )
        )
        return self.leave(self.after(visiting, ran, update), state)


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
