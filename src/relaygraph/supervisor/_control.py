"""How work stops or bounces: team limits, budgets, ping-pong; and the closing ``finalize``
of the topologies without a finalize model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, interrupt

from relaygraph._names import ANSWER_NAME, FINALIZE, NO_RESULT, SUPERVISOR
from relaygraph.events import event_sink, final_event, ping_pong_request
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import BudgetHit, check_team_budget, day_budget_of
from relaygraph.policies.pingpong import PingPong, detect_ping_pong
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._node_config import step_of, task_ns
from relaygraph.supervisor._refusals import add_bar, violation
from relaygraph.supervisor._state import TeamState, Visit
from relaygraph.supervisor._usage import turn_usage
from relaygraph.supervisor._verdict import closing_verdict, source_message

_STEP_MARGIN = 3
"""Steps kept in reserve below the recursion limit: enough to reach finalize and end."""


def exhausted(
    policy: TeamPolicy,
    hit: BudgetHit,
    state: TeamState,
    config: RunnableConfig,
    update: dict[str, Any] | None = None,
    *,
    announce: bool = True,
) -> Command[Any]:
    """Stop the task at a budget: finalize answers from what exists (or the task fails)."""
    turn = state.get("turn", 0)
    record = violation(
        f"{task_ns(config)}:{hit.stop_reason}",
        turn,
        hit.agent or "team",
        "budget",
        hit.message,
        announce=announce,
    )
    update = dict(update or {})
    update["violations"] = [*update.get("violations", []), record]
    status = "failed" if policy.team.on_exhausted == "fail" else "degraded"
    return Command(
        goto=FINALIZE, update={**update, "status": status, "stop_reason": hit.stop_reason}
    )


def visits_spent(state: TeamState, policy: TeamPolicy) -> BudgetHit | None:
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


def team_stop(
    state: TeamState,
    policy: TeamPolicy,
    config: RunnableConfig,
    *,
    visits: bool = True,
    own_graph: bool = False,
) -> BudgetHit | None:
    """A team limit reached before the next step: visits, tokens, cost, time, graph steps.

    Steps are counted from the request's first (a thread's step numbers run on across its
    requests, and LangGraph's recursion limit holds per request); ``own_graph``: the caller
    runs in a graph of its own (the tool supervisor's), whose steps count from its start.
    """
    if visits and (hit := visits_spent(state, policy)):
        return hit
    step, limit = step_of(config), config.get("recursion_limit")
    if step is not None and not own_graph:
        step -= state.get("turn_step", 0)
    if step is not None and limit is not None and step + _STEP_MARGIN >= limit:
        return BudgetHit(
            scope="team", agent=None, limit="recursion_limit", used=step, allowed=limit
        )
    day = day_budget_of(config.get("configurable", {}))
    return check_team_budget(policy.team, turn_usage(state), day)


def route_ping_pong(
    policy: TeamPolicy, state: TeamState, visits: Sequence[Visit], target: str, task: str
) -> PingPong | None:
    """Whether the supervisor's route of ``task`` to ``target`` would be a ping-pong: too
    many bounces between two agents, or the same task routed to the same agent again in
    this request (:func:`detect_ping_pong`)."""
    turn = state.get("turn", 0)
    routes = [
        (h["target"], h["task"])
        for h in state.get("handoffs", [])
        if h.get("turn") == turn and h["kind"] == "route"
    ]
    return detect_ping_pong(
        [v["agent"] for v in visits],
        target,
        max_bounces=policy.ping_pong.max_bounces,
        task=task,
        earlier_tasks=routes,
    )


def on_ping_pong(
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
    action = policy.ping_pong.on_detect
    # Waiting for a person, the step runs again when the decision comes: the runner
    # reports this violation from the pause itself (relaygraph.runner._run), once.
    record = violation(
        f"{task_ns(config)}:ping_pong",
        turn,
        candidate,
        "ping_pong",
        found.detail,
        announce=action != "human",
    )
    update = {**update, "violations": [*update.get("violations", []), record]}
    if action == "human":
        answer = interrupt(
            ping_pong_request(
                detail=found.detail, agents=list(found.agents), next=candidate, source=source
            )
        )
        verdict = answer.get("decision") if isinstance(answer, Mapping) else answer
        if verdict == "approve":
            return Command(goto=proceed.goto, update={**update, **(proceed.update or {})})
        action = FINALIZE
    if action == SUPERVISOR:
        if len(found.agents) == 2:
            # Bar the pair both ways: neither may pass work to the other, directly or
            # through a route taken right after the other's visit.
            a, b = found.agents
            bar = add_bar(state, b, found.detail, after=a)
            bar = add_bar({"barred": bar}, a, found.detail, after=b)
        else:  # The same task sent again: that agent gets no more routes this turn.
            bar = add_bar(state, candidate, found.detail)
        return Command(goto=SUPERVISOR, update={**update, "barred": bar, "assignment": None})
    return Command(
        goto=FINALIZE,
        update={**update, "status": "degraded", "stop_reason": found.stop_reason},
    )


def closing_answer(state: TeamState) -> tuple[str, Visit | None]:
    """The answer when no model writes one, and the visit it came from: the last result an
    agent finished with, else the last text of a visit cut short (a budget); never a failed
    model call's text or a handoff's note, which are no results. With none, the
    placeholder :data:`NO_RESULT` (a non-answer)."""
    visits = [
        v for v in _prompts.turn_visits(state) if v["ended"] not in ("model_error", "handed_off")
    ]
    finished = [v for v in visits if v["ended"] == "finished" and v["output"].strip()]
    if finished:
        return finished[-1]["output"], finished[-1]
    if visits and visits[-1]["output"].strip():
        return visits[-1]["output"], visits[-1]
    return f"{NO_RESULT}.", visits[-1] if visits else None


def make_closing() -> Any:
    """``finalize`` for the topologies without a finalize model (swarm, supervisor-tools).

    The answer is the one the graph already has (the tool supervisor's last message), else
    the last result an agent finished with; a non-answer (``closing_verdict``) is not a
    success, a stop reason is reported as in the structured team, and a failed run
    (``on_exhausted = "fail"``, a failed model call with no answer) gives no answer.
    """

    def finalize(state: TeamState) -> dict[str, Any]:
        from langchain_core.messages import AIMessage
        from langgraph.config import get_stream_writer

        answer: str | None = state.get("answer")
        source = None
        if not answer:
            answer, visit = closing_answer(state)
            source = source_message(visit)
        status, stop_reason = closing_verdict(state, answer, source)
        if status == "failed":
            answer = None
        (event_sink() or get_stream_writer())(final_event(status, answer, stop_reason))
        update: dict[str, Any] = {"answer": answer, "status": status, "stop_reason": stop_reason}
        messages = state.get("messages", [])
        if answer is not None and not (messages and messages[-1].text == answer):
            update["messages"] = [AIMessage(content=answer, name=ANSWER_NAME)]
        return update

    return finalize
