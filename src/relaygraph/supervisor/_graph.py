"""The team graph: begin → supervisor ⇄ agents (and agent → agent handoffs) → finalize."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.errors import ParentCommand
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer, Command

from relaygraph.agents import AGENTS, AgentSpec, TaskContext, build_agent
from relaygraph.agents._middleware import is_model_output
from relaygraph.errors import ConfigError
from relaygraph.handoffs import (
    Assignment,
    HandoffRecord,
    answer_unanswered_calls,
    handoff_target,
)
from relaygraph.models.scripted import PRIOR_CALLS_KEY
from relaygraph.policies import TeamPolicy, default_policy
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._route import FINISH, route_next_agent
from relaygraph.supervisor._state import TeamState, Usage, Visit

SUPERVISOR = "supervisor"
FINALIZE = "finalize"
ROLES = (SUPERVISOR, FINALIZE)


def _task_ns(config: RunnableConfig) -> str:
    """The running task's checkpoint namespace (``node:<task id>``): stable across re-runs."""
    return str(config.get("configurable", {}).get("checkpoint_ns") or "")


def _step(config: RunnableConfig) -> int | None:
    step = config.get("metadata", {}).get("langgraph_step")
    return int(step) if step is not None else None


def _with_prior_calls(config: RunnableConfig, prior: int) -> RunnableConfig:
    """The node's config plus how many calls this role made before (for scripted models)."""
    return {
        **config,
        "configurable": {**config.get("configurable", {}), PRIOR_CALLS_KEY: prior},
        "metadata": {**config.get("metadata", {}), PRIOR_CALLS_KEY: prior},
    }


def _prior_calls(state: TeamState, role: str) -> int:
    return sum(u["model_calls"] for u in state.get("usage", []) if u["agent"] == role)


def _usage(
    id: str, role: str, turn: int, outputs: list[AIMessage], *, tool_calls: int = 0
) -> Usage:
    metas = [m.usage_metadata for m in outputs]
    return Usage(
        id=id,
        agent=role,
        turn=turn,
        model_calls=len(outputs),
        tool_calls=tool_calls,
        input_tokens=sum(m["input_tokens"] for m in metas if m),
        output_tokens=sum(m["output_tokens"] for m in metas if m),
        estimated=any(
            meta is None or m.response_metadata.get("relaygraph_usage_estimated", False)
            for m, meta in zip(outputs, metas, strict=True)
        ),
    )


def _stop(reason: str) -> Command[Any]:
    return Command(goto=FINALIZE, update={"status": "degraded", "stop_reason": reason})


def _runs_exhausted(state: TeamState, policy: TeamPolicy) -> str | None:
    runs = len(_prompts.turn_visits(state))
    if runs >= policy.max_agent_runs:
        return f"max_agent_runs: the team used {runs} of {policy.max_agent_runs} agent visits"
    return None


def _begin(state: TeamState) -> dict[str, Any]:
    request = state.get("request", "")
    return {
        "turn": state.get("turn", 0) + 1,
        "messages": [HumanMessage(content=request)],
        "assignment": None,
        "barred": [],
        "answer": None,
        "status": None,
        "stop_reason": None,
    }


def _make_supervisor(model: BaseChatModel, policy: TeamPolicy, agents: tuple[str, ...]) -> Any:
    system = _prompts.supervisor_prompt({a: AGENTS[a] for a in agents})

    def supervisor(state: TeamState, config: RunnableConfig) -> Command[Any]:
        if exhausted := _runs_exhausted(state, policy):
            return _stop(exhausted)
        barred = state.get("barred", [])
        messages: list[BaseMessage] = [
            SystemMessage(content=system),
            HumanMessage(content=_prompts.supervisor_input(state, barred)),
        ]
        decision = route_next_agent(
            model,
            messages,
            agents=agents,
            config=_with_prior_calls(config, _prior_calls(state, SUPERVISOR)),
            may_finish=bool(_prompts.turn_visits(state)),
        )
        route, ns, turn = decision.route, _task_ns(config), state.get("turn", 0)
        usage = _usage(ns, SUPERVISOR, turn, list(decision.raw))
        get_stream_writer()(
            {
                "type": "route",
                "next": route.next,
                "task": route.task,
                "reason": route.reason,
                "repaired": decision.error is not None and not decision.fallback,
                "fallback": decision.fallback,
                "error": decision.error,
            }
        )
        if route.next == FINISH:
            update: dict[str, Any] = {"usage": [usage]}
            if decision.fallback:
                update |= {"status": "degraded", "stop_reason": f"invalid_route: {decision.error}"}
            return Command(goto=FINALIZE, update=update)
        record = HandoffRecord(
            id=ns,
            kind="route",
            source=SUPERVISOR,
            target=route.next,
            task=route.task,
            reason=route.reason,
            step=_step(config),
            turn=turn,
        )
        assignment = Assignment(
            agent=route.next, task=route.task, reason=route.reason, source=SUPERVISOR, kind="route"
        )
        return Command(
            goto=route.next,
            update={"usage": [usage], "handoffs": [record], "assignment": assignment},
        )

    return supervisor


def _visit_usage(visit_id: str, agent: str, turn: int, transcript: list[BaseMessage]) -> Usage:
    outputs = [m for m in transcript if is_model_output(m)]
    tool_calls = sum(
        1 for m in transcript if isinstance(m, ToolMessage) and handoff_target(m.name or "") is None
    )
    return _usage(visit_id, agent, turn, outputs, tool_calls=tool_calls)  # type: ignore[arg-type]


def _make_agent_node(
    spec: AgentSpec, graph: CompiledStateGraph[Any, Any, Any, Any], policy: TeamPolicy
) -> Any:
    name = spec.name
    allowed_handoffs = set(policy.agent(name).handoffs)

    def agent_node(state: TeamState, config: RunnableConfig) -> Command[Any]:
        if exhausted := _runs_exhausted(state, policy):
            return _stop(exhausted)
        emit = get_stream_writer()
        assignment = state.get("assignment") or Assignment(
            agent=name, task=state.get("request", ""), reason="", source=SUPERVISOR, kind="route"
        )
        visit_id, turn = _task_ns(config), state.get("turn", 0)
        emit(
            {
                "type": "agent_started",
                "agent": name,
                "task": assignment["task"],
                "source": assignment["source"],
            }
        )
        scoped = HumanMessage(content=_prompts.agent_input(state, assignment))
        values: dict[str, Any] = {"messages": [scoped]}
        handoff: Command[Any] | None = None
        try:
            # Streaming keeps the latest state, so a handoff (raised mid-run) still leaves
            # the visit's transcript and usage in hand.
            for values in graph.stream(  # noqa: B007
                {"messages": [scoped]},
                _with_prior_calls(config, _prior_calls(state, name)),
                stream_mode="values",
            ):
                pass
        except ParentCommand as exc:
            command = exc.args[0]
            if command.graph != visit_id or not isinstance(command.update, dict):
                raise  # Not a handoff from this agent's tools: let LangGraph route it.
            handoff = command
        transcript: list[BaseMessage] = list(values["messages"])
        if handoff is None:
            last = transcript[-1]
            output = last.text if isinstance(last, AIMessage) else ""
            ended = "finished" if is_model_output(last) else "model_call_limit"
            visit = _visit(visit_id, name, turn, assignment, output, ended, transcript)
            emit(
                {
                    "type": "agent_finished",
                    "agent": name,
                    "ended": ended,
                    "output": output,
                    "usage": _visit_usage(visit_id, name, turn, transcript),
                }
            )
            return Command(
                goto="supervisor",
                update={
                    "visits": [visit],
                    "usage": [_visit_usage(visit_id, name, turn, transcript)],
                    "assignment": None,
                },
            )
        update: dict[str, Any] = handoff.update  # type: ignore[assignment]
        target = str(handoff.goto)
        transcript += update.get("messages", [])
        transcript += answer_unanswered_calls(transcript, carried_out=f"transfer_to_{target}")
        record: HandoffRecord = update["handoffs"][0]
        record = {**record, "step": _step(config), "turn": turn}
        if target not in allowed_handoffs:
            raise ConfigError(f"agent {name!r} handed off to {target!r}, which it may not")
        output = f"Handed off to {target}: {record['task']}"
        visit = _visit(visit_id, name, turn, assignment, output, "handed_off", transcript)
        emit(
            {
                "type": "handoff",
                "source": name,
                "target": target,
                "task": record["task"],
                "reason": record["reason"],
            }
        )
        return Command(
            goto=target,
            update={
                "visits": [visit],
                "usage": [_visit_usage(visit_id, name, turn, transcript)],
                "handoffs": [record],
                "assignment": update["assignment"],
            },
        )

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


def _make_finalize(model: BaseChatModel) -> Any:
    def finalize(state: TeamState, config: RunnableConfig) -> dict[str, Any]:
        messages: list[BaseMessage] = [
            SystemMessage(content=_prompts.FINALIZE_PROMPT),
            HumanMessage(content=_prompts.finalize_input(state)),
        ]
        reply = model.invoke(messages, _with_prior_calls(config, _prior_calls(state, FINALIZE)))
        answer = reply.text
        status = state.get("status") or "succeeded"
        get_stream_writer()(
            {
                "type": "final",
                "status": status,
                "answer": answer,
                "stop_reason": state.get("stop_reason"),
            }
        )
        return {
            "answer": answer,
            "status": status,
            "messages": [AIMessage(content=answer, name="relaygraph")],
            "usage": [_usage(_task_ns(config), FINALIZE, state.get("turn", 0), [reply])],
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
        checkpointer: Where runs are checkpointed (needed for ``--thread`` continuation).

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
        destinations=(*agents, FINALIZE),
    )
    for name in agents:
        spec = AGENTS[name]
        subgraph = build_agent(spec, models[name], policy.agents[name])
        builder.add_node(
            name,
            _make_agent_node(spec, subgraph, policy),
            destinations=(SUPERVISOR, FINALIZE, *policy.agents[name].handoffs),
        )
    builder.add_node(FINALIZE, _make_finalize(models[FINALIZE]))
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
