"""The team graph: begin → supervisor ⇄ agents (and agent → agent handoffs) → finalize."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from relaygraph._calls import Call, Steps
from relaygraph._deadline import due_within
from relaygraph._names import ANSWER_NAME, BEGIN, FINALIZE, SUPERVISOR
from relaygraph.agents import TaskContext
from relaygraph.errors import ConfigError
from relaygraph.events import event_sink, final_event
from relaygraph.models import ModelCallError
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import seconds_left
from relaygraph.policies.middleware import replies_usage
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._agent_node import agent_nodes
from relaygraph.supervisor._last_reply import last_reply_answer, reply_answered, writes_final_answer
from relaygraph.supervisor._node import steps_node
from relaygraph.supervisor._node_config import call_config, replays_by_position, step_of, task_ns
from relaygraph.supervisor._refusals import violation
from relaygraph.supervisor._state import TeamState, Violation, ending_status
from relaygraph.supervisor._supervisor_node import SupervisorNode
from relaygraph.supervisor._usage import announce_usage, turn_usage, usage_record
from relaygraph.supervisor._verdict import closing_verdict, failed_calls_only
from relaygraph.topology import Topology


def _begin(state: TeamState, config: RunnableConfig) -> dict[str, Any]:
    return {
        "turn": state.get("turn", 0) + 1,
        # LangGraph numbers a thread's steps on from request to request, while its
        # recursion limit holds per request: the step guard counts from here.
        "turn_step": step_of(config) or 0,
        "messages": [HumanMessage(content=state.get("request", ""))],
        "assignment": None,
        "plan": [],
        "barred": [],
        "answer": None,
        "status": None,
        "stop_reason": None,
    }


def _make_finalize(model: BaseChatModel, policy: TeamPolicy) -> Any:
    replays = replays_by_position(model)

    def finalize(state: TeamState, config: RunnableConfig) -> Steps[dict[str, Any]]:
        status = ending_status(state)
        stop_reason = state.get("stop_reason")
        emit = event_sink() or get_stream_writer()
        if status != "failed" and failed_calls_only(_prompts.turn_visits(state)):
            # Every agent that was given work failed its model call: there is nothing to
            # answer from, and an answer written anyway would only say so.
            status = "failed"
        if status == "failed":  # Nothing to answer from (on_exhausted = "fail", above).
            emit(final_event(status, None, stop_reason))
            return {"answer": None, "status": status, "stop_reason": stop_reason}
        # A model that writes the answer itself (the embedded model cites its sources
        # there) is always asked; any other is asked only when the policy says so.
        reply_answer = None if writes_final_answer(model) else last_reply_answer(state, policy)
        if reply_answer is not None:
            return reply_answered(state, reply_answer)
        messages: list[BaseMessage] = [
            SystemMessage(content=_prompts.FINALIZE_PROMPT),
            HumanMessage(content=_prompts.finalize_input(state)),
        ]
        started = time.monotonic()
        failed: ModelCallError | None = None
        try:
            with due_within(seconds_left((policy.team.max_seconds, turn_usage(state)))):
                reply = yield Call.invoke(
                    model, messages, call_config(config, state, FINALIZE, replays=replays)
                )
        except ModelCallError as exc:
            # As a route's failed call: the task ends without an answer, saying why (the
            # time limit the stop already spent, a server that failed), not as an error.
            reply, failed = AIMessage(content=""), exc
        violations = _finalize_calls_refused(reply, state, config)
        # An empty answer is no answer: the run did not deliver what it was asked for.
        answer = reply.text if reply.text.strip() else None
        if answer is None and status == "succeeded":
            status = "degraded"
            stop_reason = (
                f"model_error: {FINALIZE}: {failed.reason}"
                if failed is not None
                else "no answer: finalize wrote no text"
                + (" (it called a tool, which it may not)" if violations else "")
            )
        status, stop_reason = closing_verdict(
            {**state, "status": status, "stop_reason": stop_reason}, answer, reply
        )
        if status == "failed":
            answer = None
        # A failed call answered nothing: like a route's, it counts no model call.
        replies: list[BaseMessage] = [] if failed is not None else [reply]
        totals = replies_usage(replies, policy, seconds=time.monotonic() - started)
        usage = announce_usage(
            usage_record(task_ns(config), FINALIZE, state.get("turn", 0), totals, replies)
        )
        emit(final_event(status, answer, stop_reason))
        update: dict[str, Any] = {
            "answer": answer,
            "status": status,
            "stop_reason": stop_reason,
            "violations": violations,
            "usage": [usage],
        }
        if answer is not None:
            update["messages"] = [AIMessage(content=answer, name=ANSWER_NAME)]
        return update

    return steps_node(finalize, FINALIZE)


def _finalize_calls_refused(
    reply: AIMessage, state: TeamState, config: RunnableConfig
) -> list[Violation]:
    """Violations for the tool calls of finalize's reply: none is run.

    Finalize is bound to no tools, yet a model may answer with a call all the same (a
    scripted or embedded model, a server that ignores the tool list); the call is dropped,
    its text (if any) is the answer, and the attempt is recorded. There is no conversation
    to answer it in: finalize makes one model call.
    """
    return [
        violation(
            f"{task_ns(config)}:{call['id'] or index}:tool_not_allowed",
            state.get("turn", 0),
            FINALIZE,
            "tool_not_allowed",
            f"{FINALIZE!r} called {call['name']!r}, which it may not: finalize has no tools, "
            "so the call was not run",
        )
        for index, call in enumerate(reply.tool_calls)
    ]


def build_team(
    models: Mapping[str, BaseChatModel],
    *,
    team: Any,
    policy: TeamPolicy | None = None,
    checkpointer: Checkpointer = None,
    topology: Topology | None = None,
) -> CompiledStateGraph[TeamState, TaskContext, TeamState, TeamState]:
    """Compile the team graph.

    Args:
        models: A chat model for each role of the topology (:meth:`Topology.roles`): each
            agent of the team, and ``supervisor`` and ``finalize`` where it has them.
        team: The team (``relaygraph.team.Team``): its agents, tools and supervisor prompt.
        policy: Tools, handoffs and limits; the team's own policy if None.
        checkpointer: Where runs are checkpointed (needed for ``--thread`` and approvals).
        topology: How the agents are arranged; the team's own if None.

    Raises:
        ConfigError: A model is missing for a role, or the policy does not fit the team.
    """
    policy = policy or team.resolved_policy
    topology = topology or team.arrangement
    members = {agent.name: agent for agent in team.agents}
    agents = tuple(policy.agents)
    if set(agents) != set(members):
        raise ConfigError(
            f"the policy is over agents {', '.join(agents)}; the team has {', '.join(members)}"
        )
    missing = [role for role in topology.roles(agents) if role not in models]
    if missing:
        raise ConfigError(f"no model given for: {', '.join(missing)}")
    for name in agents:
        for peer in policy.agents[name].handoffs:
            if peer not in agents or peer == name:
                raise ConfigError(f"agent {name!r} may not hand off to {peer!r}: not a peer")
    topology.check_agents(agents)
    if topology.kind in ("swarm", "supervisor-tools"):
        if topology.kind == "swarm":
            from relaygraph.supervisor._swarm import build_swarm_team as build
        else:
            from relaygraph.supervisor._tool_supervisor import (
                build_tool_supervisor_team as build,
            )
        return build(
            dict(models),
            team=team,
            policy=policy,
            topology=topology,
            checkpointer=checkpointer,
            begin=_begin,
        )

    builder = StateGraph(TeamState, context_schema=TaskContext)
    builder.add_node(BEGIN, _begin)
    builder.add_node(
        SUPERVISOR,
        SupervisorNode(
            models[SUPERVISOR],
            policy,
            [members[a] for a in agents],
            team.supervisor_prompt,
            finalize_model=models[FINALIZE],
        ).runnable(),
        # It may also go to itself (a re-route after a refused ping-pong); that edge is not
        # declared because LangChain's ASCII renderer cannot draw a self-loop. Nor is its
        # end (a FINISH answered with the last reply): the drawing keeps one way out,
        # through finalize, which every other end takes.
        destinations=(*agents, FINALIZE),
    )
    for name, node in agent_nodes(models, team, policy, None).items():
        builder.add_node(
            name, node, destinations=(SUPERVISOR, FINALIZE, *policy.agents[name].handoffs)
        )
    builder.add_node(FINALIZE, _make_finalize(models[FINALIZE], policy))
    builder.add_edge(START, BEGIN)
    builder.add_edge(BEGIN, SUPERVISOR)
    builder.add_edge(FINALIZE, END)
    return builder.compile(checkpointer=checkpointer, name="relaygraph")


class _Unused(BaseChatModel):
    """A stand-in for a role's model in a graph that is drawn, never run: it binds tools (a
    prebuilt agent binds them as it is built) and refuses every call."""

    role: str

    @property
    def _llm_type(self) -> str:
        return "relaygraph-unused"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        raise RuntimeError(f"the drawing's stand-in for {self.role!r} was called")

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def draw_team(
    *,
    team: Any,
    policy: TeamPolicy | None = None,
    ascii: bool = False,
    topology: Topology | None = None,
) -> str:
    """The team graph's topology as Mermaid (default) or ASCII art.

    The drawing needs no model: each role gets a stand-in, which is never called.
    """
    policy = policy or team.resolved_policy
    topology = topology or team.arrangement
    models = {role: _Unused(role=role) for role in topology.roles(tuple(policy.agents))}
    graph = build_team(models, team=team, policy=policy, topology=topology).get_graph()
    return graph.draw_ascii() if ascii else graph.draw_mermaid()
