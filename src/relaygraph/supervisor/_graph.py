"""The team graph: begin → supervisor ⇄ agents (and agent → agent handoffs) → finalize."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer, Command

from relaygraph._calls import Call, Steps
from relaygraph._deadline import due_within
from relaygraph._names import ANSWER_NAME, BEGIN, FINALIZE, FINISH, SUPERVISOR
from relaygraph.agents import Agent, TaskContext
from relaygraph.errors import ConfigError
from relaygraph.events import Assignment, event_sink, final_event, record_handoff, route_event
from relaygraph.models import ModelCallError
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import BudgetHit, check_agent_budget, seconds_left
from relaygraph.policies.middleware import replies_usage
from relaygraph.policies.pingpong import detect_ping_pong
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._agent_node import agent_nodes
from relaygraph.supervisor._control import exhausted, on_ping_pong, team_stop, visits_spent
from relaygraph.supervisor._node import steps_node
from relaygraph.supervisor._node_config import call_config, replays_by_position, step_of, task_ns
from relaygraph.supervisor._refusals import bars_now, violation
from relaygraph.supervisor._route import Route, RouteDecision, route_steps
from relaygraph.supervisor._state import TeamState, Violation, Visit, ending_status
from relaygraph.supervisor._usage import agent_tokens, announce_usage, turn_usage, usage_record
from relaygraph.supervisor._verdict import closing_verdict, failed_calls_only, source_message
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


def _make_supervisor(
    model: BaseChatModel,
    policy: TeamPolicy,
    members: Sequence[Agent],
    extra: str | None,
    *,
    finalize_model: BaseChatModel,
) -> Any:
    system = _prompts.supervisor_prompt(members, extra=extra)
    agents = tuple(a.name for a in members)
    replays = replays_by_position(model)
    # A FINISH whose answer is the last agent's reply (see _last_reply_answer) is answered
    # here, in the supervisor's step, and the run ends: finalize's own step (a checkpoint,
    # its writes, the step's own work) is only for an answer a model writes.
    answers_here = not writes_final_answer(finalize_model)

    def supervisor(state: TeamState, config: RunnableConfig) -> Steps[Command[Any]]:
        if hit := team_stop(state, policy, config, visits=False):
            return exhausted(policy, hit, state, config)
        # With every visit spent the supervisor may still say FINISH: only a route to one
        # more agent goes over max_agent_runs.
        no_visits_left = visits_spent(state, policy)
        visits = _prompts.turn_visits(state)
        last = visits[-1]["agent"] if visits else None
        unavailable = bars_now(state, last)
        spent_agents: list[BudgetHit] = []
        for agent in agents:
            spent = check_agent_budget(
                agent, policy.agent(agent).limits, turn_usage(state, agent), before="model"
            )
            if spent is not None:
                spent_agents.append(spent)
                unavailable.setdefault(agent, f"out of budget: {spent.message}")
        available = tuple(a for a in agents if a not in unavailable)
        if not available:
            if spent_agents:
                # Every agent is barred or spent: the task ends at the agents' budgets (each
                # hit was recorded as a violation when it happened).
                status = "failed" if policy.team.on_exhausted == "fail" else "degraded"
                return Command(
                    goto=FINALIZE,
                    update={"status": status, "stop_reason": spent_agents[0].stop_reason},
                )
            reason = "; ".join(f"{a}: {why}" for a, why in unavailable.items())
            return Command(
                goto=FINALIZE,
                update={"status": "degraded", "stop_reason": f"no agent left: {reason}"},
            )
        ns, turn = task_ns(config), state.get("turn", 0)
        # With every visit spent, the supervisor is asked (it may still say FINISH).
        step = None if no_visits_left else _planned_step(state, visits, available)
        plan_refused = _plan_refused(state, visits, unavailable) if step is None else ()
        if step is not None:
            # The step the supervisor planned when it routed the visit that just finished
            # with a result: carried out without a model call, through the same checks.
            decision = RouteDecision(
                route=Route.model_construct(
                    next=step["agent"], task=step["task"], reason=step["reason"]
                ),
                fallback=False,
                error=None,
                raw=(),
            )
            plan = list(state.get("plan") or [])[1:]
            recorded: dict[str, Any] = {"usage": []}
        else:
            messages: list[BaseMessage] = [
                SystemMessage(content=system),
                HumanMessage(
                    content=_prompts.supervisor_input(
                        state, [f"{a} ({why})" for a, why in unavailable.items()]
                    )
                ),
            ]
            started = time.monotonic()
            # The route (with its repair) gets what the team's time limit leaves.
            with due_within(seconds_left((policy.team.max_seconds, turn_usage(state)))):
                decision = yield from route_steps(
                    model,
                    messages,
                    agents=available,
                    config=call_config(config, state, SUPERVISOR, replays=replays),
                    may_finish=bool(visits),
                    unavailable=unavailable,
                    team=agents,
                )
            replies = list(decision.raw)
            usage = announce_usage(
                usage_record(
                    ns,
                    SUPERVISOR,
                    turn,
                    replies_usage(replies, policy, seconds=time.monotonic() - started),
                    list(replies),
                )
            )
            plan = _plan_of(decision.route)
            recorded = {"usage": [usage]}
        route = decision.route
        # A route to an agent whose budget is spent is refused. When the agent spent it
        # exactly, without hitting the limit in its visit, nothing recorded that limit yet:
        # the refusal is then the budget's violation. (A bar's ping-pong was recorded when
        # the bar was set.)
        hit_before = {
            v["agent"]
            for v in state.get("violations", [])
            if v["turn"] == turn and v["kind"] == "budget"
        }
        spent_names = {hit.agent for hit in spent_agents}
        recorded["violations"] = [
            violation(
                f"{ns}:refused:{agent}",
                turn,
                agent,
                "budget",
                f"route to {agent!r} refused: {unavailable[agent]}",
            )
            for agent in dict.fromkeys((*plan_refused, *decision.refused))
            if agent in spent_names and agent not in hit_before
        ]
        tokens_so_far = agent_tokens(state, agents)

        def report(carried_out: bool) -> None:
            # Sent once the route is carried out or stopped (a limit, a ping-pong): a route
            # waiting for a person's decision is reported after it, not twice.
            (event_sink() or get_stream_writer())(
                route_event(
                    next=route.next,
                    task=route.task,
                    reason=route.reason,
                    step=step_of(config),
                    checkpoint_ns=ns,
                    tokens_so_far=tokens_so_far,
                    carried_out=carried_out,
                    repaired=decision.error is not None and not decision.fallback,
                    fallback=decision.fallback,
                    error=decision.error,
                )
            )

        if route.next == FINISH:
            report(True)
            finish: dict[str, Any] = dict(recorded)
            if decision.fallback:
                finish |= {"status": "degraded", "stop_reason": f"invalid_route: {decision.error}"}
            elif answers_here and (answer := _last_reply_answer(state, policy)) is not None:
                return Command(goto=END, update=finish | _reply_answered(state, answer))
            return Command(goto=FINALIZE, update=finish)
        if no_visits_left is not None:
            report(False)
            return exhausted(policy, no_visits_left, state, config, recorded)
        assignment = Assignment(
            agent=route.next, task=route.task, reason=route.reason, source=SUPERVISOR, kind="route"
        )
        record = record_handoff(assignment, id=ns, step=step_of(config), turn=turn)
        proceed = Command(
            goto=route.next,
            update={"handoffs": [record], "assignment": assignment, "plan": plan},
        )
        routes = [
            (h["target"], h["task"])
            for h in state.get("handoffs", [])
            if h.get("turn") == turn and h["kind"] == "route"
        ]
        found = detect_ping_pong(
            [v["agent"] for v in visits],
            route.next,
            max_bounces=policy.ping_pong.max_bounces,
            task=route.task,
            earlier_tasks=routes,
        )
        if found is not None:
            outcome = on_ping_pong(
                policy,
                found,
                state,
                config,
                source=SUPERVISOR,
                proceed=proceed,
                update=recorded,
            )
            report(outcome.goto == route.next)
            return outcome
        report(True)
        return Command(goto=proceed.goto, update={**recorded, **(proceed.update or {})})

    return steps_node(supervisor, SUPERVISOR)


def _next_in_plan(state: TeamState, visits: Sequence[Visit]) -> Assignment | None:
    """The next step of the supervisor's plan, if the plan still holds: the visit the
    supervisor routed last finished with a result (not a handoff to a peer, a budget stop,
    a refusal or a failed model call). Any other outcome drops the plan: the supervisor is
    asked and sees what happened."""
    plan = state.get("plan") or []
    if not plan or not visits:
        return None
    last = visits[-1]
    routed = last["source"] == SUPERVISOR and last["ended"] == "finished"
    return plan[0] if routed and last["output"].strip() else None


def _planned_step(
    state: TeamState, visits: Sequence[Visit], available: Sequence[str]
) -> Assignment | None:
    """The planned step that runs now without a supervisor call: the plan holds and its
    agent may work now."""
    step = _next_in_plan(state, visits)
    return step if step is not None and step["agent"] in available else None


def _plan_refused(
    state: TeamState, visits: Sequence[Visit], unavailable: Mapping[str, str]
) -> tuple[str, ...]:
    """The agent of a planned step that would run now but may not work (a spent budget, a
    bar): its step is refused as a model's route to it is, and recorded the same way."""
    step = _next_in_plan(state, visits)
    return (step["agent"],) if step is not None and step["agent"] in unavailable else ()


def _plan_of(route: Route) -> list[Assignment]:
    """The assignments a route's ``then`` plans after its ``next``."""
    if route.next == FINISH:
        return []
    steps = route.planned_steps()
    return [
        Assignment(
            agent=agent,
            task=task,
            reason=f"planned ({i}/{len(steps)}): {route.reason}",
            source=SUPERVISOR,
            kind="route",
        )
        for i, (agent, task) in enumerate(steps, start=1)
    ]


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
        reply_answer = None if writes_final_answer(model) else _last_reply_answer(state, policy)
        if reply_answer is not None:
            return _reply_answered(state, reply_answer)
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


def writes_final_answer(model: BaseChatModel) -> bool:
    """Whether ``model``, as finalize's, writes every answer itself (the embedded model
    cites its sources there), so that no answer is taken from an agent's reply."""
    return bool(getattr(model, "writes_final_answer", False))


def _reply_answered(state: TeamState, answer: str) -> dict[str, Any]:
    """The run's end with the last agent's reply as its answer (a writer's deliverable),
    without a model call: the ``final`` event, and the update that records it."""
    visits = _prompts.turn_visits(state)
    source = source_message(visits[-1] if visits else None)
    status, stop_reason = closing_verdict(state, answer, source)
    (event_sink() or get_stream_writer())(final_event(status, answer, stop_reason))
    return {
        "answer": answer,
        "status": status,
        "stop_reason": stop_reason,
        "messages": [AIMessage(content=answer, name=ANSWER_NAME)],
    }


def _last_reply_answer(state: TeamState, policy: TeamPolicy) -> str | None:
    """The answer finalize gives without a model call, or None when its model must write it.

    Under ``finalize.answer = "last_reply"``, a request the team finished normally (FINISH
    routed, no stop, no degraded status) is answered with its last agent's reply when that
    agent ended its visit with text. A task that stopped early, or whose last visit handed
    off, ran out of budget or failed, still gets an answer written from what exists.
    """
    if policy.finalize.answer != "last_reply":
        return None
    if state.get("status") or state.get("stop_reason"):
        return None
    visits = _prompts.turn_visits(state)
    if not visits or visits[-1]["ended"] != "finished":
        return None
    output = visits[-1]["output"].strip()
    return output or None


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
        _make_supervisor(
            models[SUPERVISOR],
            policy,
            [members[a] for a in agents],
            team.supervisor_prompt,
            finalize_model=models[FINALIZE],
        ),
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
