"""The team graph: begin → supervisor ⇄ agents (and agent → agent handoffs) → finalize."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.errors import ParentCommand
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer, Command, interrupt

from relaygraph.agents import AGENTS, AgentSpec, TaskContext, build_agent
from relaygraph.errors import ConfigError
from relaygraph.handoffs import Assignment, HandoffRecord, answer_unanswered_calls
from relaygraph.policies import AgentLimits, TeamPolicy, default_policy
from relaygraph.policies.budget import BudgetHit, check_agent_budget, check_team_budget
from relaygraph.policies.middleware import (
    BUDGET_KEY,
    VisitBudget,
    is_model_output,
    transcript_usage,
)
from relaygraph.policies.pingpong import PingPong, detect_ping_pong
from relaygraph.supervisor import _accounting as acc
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._route import FINISH, route_next_agent
from relaygraph.supervisor._state import TeamState, Visit

SUPERVISOR = "supervisor"
FINALIZE = "finalize"
ROLES = (SUPERVISOR, FINALIZE)
_STEP_MARGIN = 3
"""Steps kept in reserve below the recursion limit: enough to reach finalize and end."""


def _begin(state: TeamState) -> dict[str, Any]:
    return {
        "turn": state.get("turn", 0) + 1,
        "messages": [HumanMessage(content=state.get("request", ""))],
        "assignment": None,
        "barred": [],
        "answer": None,
        "status": None,
        "stop_reason": None,
    }


def _exhausted(
    policy: TeamPolicy,
    hit: BudgetHit,
    state: TeamState,
    config: RunnableConfig,
    update: dict[str, Any] | None = None,
) -> Command[Any]:
    """Stop the task at a budget: finalize answers from what exists (or the task fails)."""
    turn = state.get("turn", 0)
    record = acc.violation(
        f"{acc.task_ns(config)}:{hit.stop_reason}",
        turn,
        hit.agent or "team",
        "budget",
        hit.message,
    )
    update = dict(update or {})
    update["violations"] = [*update.get("violations", []), record]
    status = "failed" if policy.team.on_exhausted == "fail" else "degraded"
    return Command(
        goto=FINALIZE, update={**update, "status": status, "stop_reason": hit.stop_reason}
    )


def _visits_spent(state: TeamState, policy: TeamPolicy) -> BudgetHit | None:
    runs = len(_prompts.turn_visits(state))
    if runs >= policy.team.max_agent_runs:
        return BudgetHit(
            scope="team",
            agent=None,
            limit="max_agent_runs",
            used=runs,
            allowed=policy.team.max_agent_runs,
        )
    return None


def _team_stop(
    state: TeamState, policy: TeamPolicy, config: RunnableConfig, *, visits: bool = True
) -> BudgetHit | None:
    """A team limit reached before the next step: visits, tokens, cost, time, graph steps."""
    if visits and (hit := _visits_spent(state, policy)):
        return hit
    step, limit = acc.step_of(config), config.get("recursion_limit")
    if step is not None and limit is not None and step + _STEP_MARGIN >= limit:
        return BudgetHit(
            scope="team", agent=None, limit="recursion_limit", used=step, allowed=limit
        )
    return check_team_budget(policy.team, acc.turn_usage(state))


def _on_ping_pong(
    policy: TeamPolicy,
    found: PingPong,
    state: TeamState,
    config: RunnableConfig,
    *,
    source: str,
    proceed: Command[Any],
    update: dict[str, Any],
) -> Command[Any]:
    """Act on a detected ping-pong as the policy says; ``proceed`` is the transfer itself."""
    turn, candidate = state.get("turn", 0), str(proceed.goto)
    record = acc.violation(
        f"{acc.task_ns(config)}:ping_pong", turn, candidate, "ping_pong", found.detail
    )
    update = {**update, "violations": [*update.get("violations", []), record]}
    action = policy.ping_pong.on_detect
    if action == "human":
        answer = interrupt(
            {
                "type": "ping_pong",
                "detail": found.detail,
                "agents": list(found.agents),
                "next": candidate,
                "source": source,
            }
        )
        verdict = answer.get("decision") if isinstance(answer, Mapping) else answer
        if verdict == "approve":
            return Command(goto=proceed.goto, update={**update, **(proceed.update or {})})
        action = "finalize"
    if action == "supervisor":
        if len(found.agents) == 2:
            # Bar the pair both ways: neither may pass work to the other, directly or
            # through a route taken right after the other's visit.
            a, b = found.agents
            bar = acc.add_bar(state, b, found.detail, after=a)
            bar = acc.add_bar({"barred": bar}, a, found.detail, after=b)
        else:  # The same task sent again: that agent gets no more routes this turn.
            bar = acc.add_bar(state, candidate, found.detail)
        return Command(goto=SUPERVISOR, update={**update, "barred": bar, "assignment": None})
    return Command(
        goto=FINALIZE,
        update={**update, "status": "degraded", "stop_reason": found.stop_reason},
    )


def _make_supervisor(model: BaseChatModel, policy: TeamPolicy, agents: tuple[str, ...]) -> Any:
    system = _prompts.supervisor_prompt({a: AGENTS[a] for a in agents})

    def supervisor(state: TeamState, config: RunnableConfig) -> Command[Any]:
        if hit := _team_stop(state, policy, config, visits=False):
            return _exhausted(policy, hit, state, config)
        # With every visit spent the supervisor may still say FINISH: only a route to one
        # more agent goes over max_agent_runs.
        visits_spent = _visits_spent(state, policy)
        visits = _prompts.turn_visits(state)
        last = visits[-1]["agent"] if visits else None
        unavailable = acc.bars_now(state, last)
        spent_agents: list[BudgetHit] = []
        for agent in agents:
            spent = check_agent_budget(
                agent, policy.agent(agent).limits, acc.turn_usage(state, agent), before="model"
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
        messages: list[BaseMessage] = [
            SystemMessage(content=system),
            HumanMessage(
                content=_prompts.supervisor_input(
                    state, [f"{a} ({why})" for a, why in unavailable.items()]
                )
            ),
        ]
        started = time.monotonic()
        decision = route_next_agent(
            model,
            messages,
            agents=available,
            config=acc.with_prior_calls(config, acc.prior_calls(state, SUPERVISOR)),
            may_finish=bool(visits),
        )
        route, ns, turn = decision.route, acc.task_ns(config), state.get("turn", 0)
        replies = list(decision.raw)
        usage = acc.usage_record(
            ns,
            SUPERVISOR,
            turn,
            acc.calls_usage(policy, replies, time.monotonic() - started),
            list(replies),
        )
        get_stream_writer()(
            {
                "type": "route",
                "step": acc.step_of(config),
                "checkpoint_ns": ns,
                "next": route.next,
                "task": route.task,
                "reason": route.reason,
                "repaired": decision.error is not None and not decision.fallback,
                "fallback": decision.fallback,
                "error": decision.error,
            }
        )
        if route.next == FINISH:
            finish: dict[str, Any] = {"usage": [usage]}
            if decision.fallback:
                finish |= {"status": "degraded", "stop_reason": f"invalid_route: {decision.error}"}
            return Command(goto=FINALIZE, update=finish)
        if visits_spent is not None:
            return _exhausted(policy, visits_spent, state, config, {"usage": [usage]})
        record = HandoffRecord(
            id=ns,
            kind="route",
            source=SUPERVISOR,
            target=route.next,
            task=route.task,
            reason=route.reason,
            step=acc.step_of(config),
            turn=turn,
        )
        proceed = Command(
            goto=route.next,
            update={
                "handoffs": [record],
                "assignment": Assignment(
                    agent=route.next,
                    task=route.task,
                    reason=route.reason,
                    source=SUPERVISOR,
                    kind="route",
                ),
            },
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
            return _on_ping_pong(
                policy,
                found,
                state,
                config,
                source=SUPERVISOR,
                proceed=proceed,
                update={"usage": [usage]},
            )
        return Command(goto=proceed.goto, update={"usage": [usage], **(proceed.update or {})})

    return supervisor


def _agent_recursion_limit(rules: AgentLimits) -> int:
    """The recursion limit of one visit's subgraph: above what the agent's own budget allows.

    A model call takes at most three of its super-steps (the policy check, the model, the
    tools); the team's recursion limit counts the team's steps and is far too low for an
    agent's loop, which its ``max_model_calls`` ends gracefully instead.
    """
    calls = rules.max_model_calls if rules.max_model_calls is not None else 1000
    return 3 * (calls + 1) + 10


def _make_agent_node(
    spec: AgentSpec, graph: CompiledStateGraph[Any, Any, Any, Any], policy: TeamPolicy
) -> Any:
    name = spec.name
    rules = policy.agent(name)
    recursion_limit = _agent_recursion_limit(rules.limits)

    def agent_node(state: TeamState, config: RunnableConfig) -> Command[Any]:
        if hit := _team_stop(state, policy, config):
            return _exhausted(policy, hit, state, config)
        turn, visit_id = state.get("turn", 0), acc.task_ns(config)
        agent_before = acc.turn_usage(state, name)
        if spent := check_agent_budget(name, rules.limits, agent_before, before="model"):
            # Reached through a direct handoff: the supervisor already could not route here.
            record = acc.violation(f"{visit_id}:budget", turn, name, "budget", spent.message)
            return Command(
                goto=SUPERVISOR,
                update={
                    "violations": [record],
                    "assignment": None,
                    "barred": acc.add_bar(state, name, f"out of budget: {spent.message}"),
                },
            )
        emit = get_stream_writer()
        assignment = state.get("assignment") or Assignment(
            agent=name, task=state.get("request", ""), reason="", source=SUPERVISOR, kind="route"
        )
        emit(
            {
                "type": "agent_started",
                "agent": name,
                "task": assignment["task"],
                "source": assignment["source"],
            }
        )
        scoped = HumanMessage(content=_prompts.agent_input(state, assignment))
        started = time.monotonic()
        budget = VisitBudget(
            agent_before=agent_before,
            team_before=acc.turn_usage(state),
            started=started,
            earlier_results=acc.earlier_results(state, name),
            step=acc.step_of(config),
            barred=acc.bars_now(state, name),
        )
        values: dict[str, Any] = {"messages": [scoped]}
        handoff: Command[Any] | None = None
        try:
            # Streaming keeps the latest state, so a handoff (raised mid-run) still leaves
            # the visit's transcript and usage in hand.
            visit_config = acc.with_prior_calls(
                config, acc.prior_calls(state, name), **{BUDGET_KEY: budget}
            )
            visit_config["recursion_limit"] = recursion_limit
            for values in graph.stream(  # noqa: B007
                {"messages": [scoped]}, visit_config, stream_mode="values"
            ):
                pass
        except ParentCommand as exc:
            command = exc.args[0]
            if command.graph != visit_id or not isinstance(command.update, dict):
                raise  # Not a handoff from this agent's tools: let LangGraph route it.
            handoff = command
        transcript: list[BaseMessage] = list(values["messages"])
        target = str(handoff.goto) if handoff is not None else None
        if handoff is not None:
            transcript += handoff.update.get("messages", [])  # type: ignore[union-attr]
            transcript += answer_unanswered_calls(transcript, carried_out=f"transfer_to_{target}")
        totals = transcript_usage(transcript, policy, seconds=time.monotonic() - started)
        outputs = [m for m in transcript if is_model_output(m)]
        usage = acc.usage_record(visit_id, name, turn, totals, outputs)
        violations = acc.transcript_violations(transcript, name, turn)
        last = transcript[-1]
        budget_note = last.additional_kwargs.get(BUDGET_KEY) if handoff is None else None
        ended = "handed_off" if handoff else "budget" if budget_note else "finished"
        output = (
            f"Handed off to {target}: {handoff.update['handoffs'][0]['task']}"  # type: ignore[index]
            if handoff is not None
            else last.text
            if isinstance(last, AIMessage)
            else ""
        )
        visit = _visit(visit_id, name, turn, assignment, output, ended, transcript)
        update: dict[str, Any] = {"visits": [visit], "usage": [usage], "violations": violations}
        emit(
            {
                "type": "agent_finished",
                "agent": name,
                "ended": ended,
                "output": output,
                "usage": usage,
            }
        )
        if budget_note is not None:
            hit = BudgetHit(**budget_note)
            # A tool call refused at the same limit recorded it already: record it once.
            violations = [
                v for v in violations if not (v["kind"] == "budget" and v["detail"] == hit.message)
            ]
            update["violations"] = violations
            if hit.scope == "team":
                return _exhausted(policy, hit, state, config, update)
            update["violations"] = [
                *violations,
                acc.violation(f"{visit_id}:budget", turn, name, "budget", hit.message),
            ]
            update["barred"] = acc.add_bar(state, name, f"out of budget: {hit.message}")
            return Command(goto=SUPERVISOR, update={**update, "assignment": None})
        if handoff is None or target is None:
            return Command(goto=SUPERVISOR, update={**update, "assignment": None})

        sent: HandoffRecord = handoff.update["handoffs"][0]  # type: ignore[index]
        sent = {**sent, "step": acc.step_of(config), "turn": turn}
        emit(
            {
                "type": "handoff",
                "step": acc.step_of(config),
                "checkpoint_ns": visit_id,
                "source": name,
                "target": target,
                "task": sent["task"],
                "reason": sent["reason"],
            }
        )
        proceed = Command(
            goto=target,
            update={"handoffs": [sent], "assignment": handoff.update["assignment"]},  # type: ignore[index]
        )
        visited = [v["agent"] for v in _prompts.turn_visits(state)] + [name]
        found = detect_ping_pong(visited, target, max_bounces=policy.ping_pong.max_bounces)
        if found is not None:
            return _on_ping_pong(
                policy,
                found,
                state,
                config,
                source=name,
                proceed=proceed,
                update={**update, "handoffs": [sent]},
            )
        return Command(goto=target, update={**update, **(proceed.update or {})})

    return agent_node


def _visit(
    visit_id: str,
    agent: str,
    turn: int,
    assignment: Assignment,
    output: str,
    ended: Any,
    transcript: list[BaseMessage],
) -> Visit:
    from langchain_core.messages import ToolMessage

    from relaygraph.handoffs import handoff_target

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


def _make_finalize(model: BaseChatModel, policy: TeamPolicy) -> Any:
    def finalize(state: TeamState, config: RunnableConfig) -> dict[str, Any]:
        status = state.get("status") or "succeeded"
        emit = get_stream_writer()
        if status == "failed":  # on_exhausted = "fail": no answer from a partial result.
            emit(
                {
                    "type": "final",
                    "status": status,
                    "answer": None,
                    "stop_reason": state.get("stop_reason"),
                }
            )
            return {"answer": None, "status": status}
        messages: list[BaseMessage] = [
            SystemMessage(content=_prompts.FINALIZE_PROMPT),
            HumanMessage(content=_prompts.finalize_input(state)),
        ]
        started = time.monotonic()
        reply = model.invoke(
            messages, acc.with_prior_calls(config, acc.prior_calls(state, FINALIZE))
        )
        answer = reply.text
        emit(
            {
                "type": "final",
                "status": status,
                "answer": answer,
                "stop_reason": state.get("stop_reason"),
            }
        )
        totals = acc.calls_usage(policy, [reply], time.monotonic() - started)
        return {
            "answer": answer,
            "status": status,
            "messages": [AIMessage(content=answer, name="relaygraph")],
            "usage": [
                acc.usage_record(
                    acc.task_ns(config), FINALIZE, state.get("turn", 0), totals, [reply]
                )
            ],
        }

    return finalize


def build_team(
    models: Mapping[str, BaseChatModel],
    *,
    policy: TeamPolicy | None = None,
    checkpointer: Checkpointer = None,
) -> CompiledStateGraph[TeamState, TaskContext, TeamState, TeamState]:
    """Compile the team graph.

    Args:
        models: A chat model for ``supervisor``, ``finalize`` and each agent of the policy.
        policy: Tools, handoffs and limits; :func:`~relaygraph.policies.default_policy` if None.
        checkpointer: Where runs are checkpointed (needed for ``--thread`` and approvals).

    Raises:
        ConfigError: A model is missing for a role, or the policy is inconsistent.
    """
    policy = policy or default_policy()
    agents = tuple(policy.agents)
    missing = [role for role in (*ROLES, *agents) if role not in models]
    if missing:
        raise ConfigError(f"no model given for: {', '.join(missing)}")
    for name in agents:
        if name not in AGENTS:
            raise ConfigError(f"unknown agent {name!r}; known agents: {', '.join(AGENTS)}")
        for peer in policy.agents[name].handoffs:
            if peer not in agents or peer == name:
                raise ConfigError(f"agent {name!r} may not hand off to {peer!r}: not a peer")

    builder = StateGraph(TeamState, context_schema=TaskContext)
    builder.add_node("begin", _begin)
    builder.add_node(
        SUPERVISOR,
        _make_supervisor(models[SUPERVISOR], policy, agents),
        # It may also go to itself (a re-route after a refused ping-pong); that edge is not
        # declared because LangChain's ASCII renderer cannot draw a self-loop.
        destinations=(*agents, FINALIZE),
    )
    for name in agents:
        spec = AGENTS[name]
        subgraph = build_agent(spec, models[name], policy)
        builder.add_node(
            name,
            _make_agent_node(spec, subgraph, policy),
            destinations=(SUPERVISOR, FINALIZE, *policy.agents[name].handoffs),
        )
    builder.add_node(FINALIZE, _make_finalize(models[FINALIZE], policy))
    builder.add_edge(START, "begin")
    builder.add_edge("begin", SUPERVISOR)
    builder.add_edge(FINALIZE, END)
    return builder.compile(checkpointer=checkpointer, name="relaygraph")


def draw_team(*, policy: TeamPolicy | None = None, ascii: bool = False) -> str:
    """The team graph's topology as Mermaid (default) or ASCII art.

    The drawing needs no model: each role gets an empty script, which is never called.
    """
    from pathlib import Path

    from relaygraph.models.scripted import Script, ScriptedChatModel

    policy = policy or default_policy()
    empty = Script(path=Path("topology.json"), turns={})
    models = {
        role: ScriptedChatModel(script=empty, agent=role) for role in (*ROLES, *policy.agents)
    }
    graph = build_team(models, policy=policy).get_graph()
    return graph.draw_ascii() if ascii else graph.draw_mermaid()
