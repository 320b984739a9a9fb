"""The structured team's supervisor node: each turn it routes the next visit (an agent and
its task), follows a plan it made earlier, or finishes.

A class, not one closure, so that each part a turn goes through can be called alone: which
agents may work now (:meth:`SupervisorNode.availability`), the route decided (a planned step
or a model's call, :meth:`SupervisorNode.decide`), the budget refusals it records
(:meth:`SupervisorNode.refusals`) and the visit handed on (:meth:`SupervisorNode.hand_on`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.graph import END
from langgraph.types import Command

from relaygraph._calls import Steps
from relaygraph._deadline import due_within
from relaygraph._names import FINALIZE, FINISH, SUPERVISOR
from relaygraph.agents import Agent
from relaygraph.events import Assignment, event_sink, record_handoff, route_event
from relaygraph.policies import TeamPolicy
from relaygraph.policies.budget import BudgetHit, check_agent_budget, seconds_left
from relaygraph.policies.middleware import replies_usage
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._control import (
    exhausted,
    on_ping_pong,
    route_ping_pong,
    team_stop,
    visits_spent,
)
from relaygraph.supervisor._last_reply import last_reply_answer, reply_answered, writes_final_answer
from relaygraph.supervisor._node import steps_node
from relaygraph.supervisor._node_config import call_config, replays_by_position, step_of, task_ns
from relaygraph.supervisor._refusals import bars_now, violation
from relaygraph.supervisor._route import Route, RouteDecision, route_steps
from relaygraph.supervisor._state import TeamState, Violation, Visit
from relaygraph.supervisor._usage import agent_tokens, announce_usage, turn_usage, usage_record

__all__ = ["Availability", "Decided", "SupervisorNode"]


@dataclass(frozen=True, slots=True)
class Availability:
    """Which of the team's agents may be given work now."""

    available: tuple[str, ...]
    unavailable: dict[str, str]
    """Each agent that may not, with why (a bar, a spent budget)."""
    spent: list[BudgetHit] = field(default_factory=list)
    """The agent budgets that are spent, in the team's order."""


@dataclass(frozen=True, slots=True)
class Decided:
    """The route a turn takes, and what deciding it recorded."""

    decision: RouteDecision
    plan: list[Assignment]
    """The steps planned after this one."""
    recorded: dict[str, Any]
    """The state update of the decision (its model call's usage)."""
    plan_refused: tuple[str, ...] = ()
    """The agent of a planned step that may not work now (refused as a route to it is)."""


class SupervisorNode:
    """The supervisor's node, written once as steps (:mod:`relaygraph._calls`).

    Args:
        model: The supervisor's model.
        policy: The team's policy.
        members: The team's agents, in the policy's order.
        extra: The team's own words for the supervisor's prompt.
        finalize_model: Finalize's model: unless it writes every answer itself, a FINISH
            whose answer is the last agent's reply is answered in the supervisor's step.
    """

    def __init__(
        self,
        model: BaseChatModel,
        policy: TeamPolicy,
        members: Sequence[Agent],
        extra: str | None,
        *,
        finalize_model: BaseChatModel,
    ) -> None:
        self.model = model
        self.policy = policy
        self.system = _prompts.supervisor_prompt(members, extra=extra)
        self.agents = tuple(a.name for a in members)
        self.replays = replays_by_position(model)
        # A FINISH whose answer is the last agent's reply (see last_reply_answer) is
        # answered here, in the supervisor's step, and the run ends: finalize's own step (a
        # checkpoint, its writes, the step's own work) is only for an answer a model writes.
        self.answers_here = not writes_final_answer(finalize_model)

    def runnable(self) -> Any:
        """The node as LangGraph runs it (see :func:`steps_node`)."""
        return steps_node(self.steps, SUPERVISOR)

    def availability(self, state: TeamState, last: str | None) -> Availability:
        """The agents that may work now: not barred (``last`` is the agent of the visit
        that just ended) and with budget left before their next model call."""
        unavailable = bars_now(state, last)
        spent: list[BudgetHit] = []
        for agent in self.agents:
            hit = check_agent_budget(
                agent, self.policy.agent(agent).limits, turn_usage(state, agent), before="model"
            )
            if hit is not None:
                spent.append(hit)
                unavailable.setdefault(agent, f"out of budget: {hit.message}")
        available = tuple(a for a in self.agents if a not in unavailable)
        return Availability(available, unavailable, spent)

    def no_agent_left(self, able: Availability) -> Command[Any]:
        """The task's end when no agent may work."""
        if able.spent:
            # Every agent is barred or spent: the task ends at the agents' budgets (each
            # hit was recorded as a violation when it happened).
            status = "failed" if self.policy.team.on_exhausted == "fail" else "degraded"
            return Command(
                goto=FINALIZE, update={"status": status, "stop_reason": able.spent[0].stop_reason}
            )
        reason = "; ".join(f"{a}: {why}" for a, why in able.unavailable.items())
        return Command(
            goto=FINALIZE, update={"status": "degraded", "stop_reason": f"no agent left: {reason}"}
        )

    def decide(
        self,
        state: TeamState,
        config: RunnableConfig,
        visits: Sequence[Visit],
        able: Availability,
        *,
        ask: bool,
    ) -> Steps[Decided]:
        """The turn's route: the plan's next step when it holds and ``ask`` is False (no
        model call), else the supervisor model's route."""
        step = None if ask else _planned_step(state, visits, able.available)
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
            return Decided(decision, list(state.get("plan") or [])[1:], {"usage": []})
        plan_refused = _plan_refused(state, visits, able.unavailable)
        messages: list[BaseMessage] = [
            SystemMessage(content=self.system),
            HumanMessage(
                content=_prompts.supervisor_input(
                    state, [f"{a} ({why})" for a, why in able.unavailable.items()]
                )
            ),
        ]
        started = time.monotonic()
        # The route (with its repair) gets what the team's time limit leaves.
        with due_within(seconds_left((self.policy.team.max_seconds, turn_usage(state)))):
            decision = yield from route_steps(
                self.model,
                messages,
                agents=able.available,
                config=call_config(config, state, SUPERVISOR, replays=self.replays),
                may_finish=bool(visits),
                unavailable=able.unavailable,
                team=self.agents,
            )
        replies = list(decision.raw)
        usage = announce_usage(
            usage_record(
                task_ns(config),
                SUPERVISOR,
                state.get("turn", 0),
                replies_usage(replies, self.policy, seconds=time.monotonic() - started),
                list(replies),
            )
        )
        return Decided(decision, _plan_of(decision.route), {"usage": [usage]}, plan_refused)

    def refusals(
        self, state: TeamState, config: RunnableConfig, able: Availability, decided: Decided
    ) -> list[Violation]:
        """The budget violations of the routes refused this turn.

        A route to an agent whose budget is spent is refused. When the agent spent it
        exactly, without hitting the limit in its visit, nothing recorded that limit yet:
        the refusal is then the budget's violation. (A bar's ping-pong was recorded when
        the bar was set.)
        """
        ns, turn = task_ns(config), state.get("turn", 0)
        hit_before = {
            v["agent"]
            for v in state.get("violations", [])
            if v["turn"] == turn and v["kind"] == "budget"
        }
        spent_names = {hit.agent for hit in able.spent}
        return [
            violation(
                f"{ns}:refused:{agent}",
                turn,
                agent,
                "budget",
                f"route to {agent!r} refused: {able.unavailable[agent]}",
            )
            for agent in dict.fromkeys((*decided.plan_refused, *decided.decision.refused))
            if agent in spent_names and agent not in hit_before
        ]

    def report(
        self,
        state: TeamState,
        config: RunnableConfig,
        decision: RouteDecision,
        *,
        carried_out: bool,
    ) -> None:
        """Send the turn's ``route`` event: once the route is carried out or stopped (a
        limit, a ping-pong); a route waiting for a person's decision is reported after it,
        not twice."""
        route = decision.route
        (event_sink() or get_stream_writer())(
            route_event(
                next=route.next,
                task=route.task,
                reason=route.reason,
                step=step_of(config),
                checkpoint_ns=task_ns(config),
                tokens_so_far=agent_tokens(state, self.agents),
                carried_out=carried_out,
                repaired=decision.error is not None and not decision.fallback,
                fallback=decision.fallback,
                error=decision.error,
            )
        )

    def finish(self, state: TeamState, decided: Decided) -> Command[Any]:
        """The turn's FINISH: to finalize, or to the end with the last reply as the answer."""
        update: dict[str, Any] = dict(decided.recorded)
        decision = decided.decision
        if decision.fallback:
            update |= {"status": "degraded", "stop_reason": f"invalid_route: {decision.error}"}
        elif self.answers_here and (answer := last_reply_answer(state, self.policy)) is not None:
            return Command(goto=END, update=update | reply_answered(state, answer))
        return Command(goto=FINALIZE, update=update)

    def hand_on(
        self,
        state: TeamState,
        config: RunnableConfig,
        visits: Sequence[Visit],
        decided: Decided,
    ) -> Command[Any]:
        """The visit the route gives to its agent, unless it is a ping-pong the policy
        stops or turns back."""
        route, turn = decided.decision.route, state.get("turn", 0)
        assignment = Assignment(
            agent=route.next, task=route.task, reason=route.reason, source=SUPERVISOR, kind="route"
        )
        record = record_handoff(assignment, id=task_ns(config), step=step_of(config), turn=turn)
        proceed = Command(
            goto=route.next,
            update={"handoffs": [record], "assignment": assignment, "plan": decided.plan},
        )
        found = route_ping_pong(self.policy, state, visits, route.next, route.task)
        if found is not None:
            outcome = on_ping_pong(
                self.policy,
                found,
                state,
                config,
                source=SUPERVISOR,
                proceed=proceed,
                update=decided.recorded,
            )
            self.report(state, config, decided.decision, carried_out=outcome.goto == route.next)
            return outcome
        self.report(state, config, decided.decision, carried_out=True)
        return Command(goto=proceed.goto, update={**decided.recorded, **(proceed.update or {})})

    def steps(self, state: TeamState, config: RunnableConfig) -> Steps[Command[Any]]:
        """One turn of the supervisor."""
        if hit := team_stop(state, self.policy, config, visits=False):
            return exhausted(self.policy, hit, state, config)
        # With every visit spent the supervisor may still say FINISH: only a route to one
        # more agent goes over max_agent_runs.
        no_visits_left = visits_spent(state, self.policy)
        visits = _prompts.turn_visits(state)
        able = self.availability(state, visits[-1]["agent"] if visits else None)
        if not able.available:
            return self.no_agent_left(able)
        # With every visit spent, the supervisor is asked (it may still say FINISH).
        decided = yield from self.decide(
            state, config, visits, able, ask=no_visits_left is not None
        )
        decided.recorded["violations"] = self.refusals(state, config, able, decided)
        if decided.decision.route.next == FINISH:
            self.report(state, config, decided.decision, carried_out=True)
            return self.finish(state, decided)
        if no_visits_left is not None:
            self.report(state, config, decided.decision, carried_out=False)
            return exhausted(self.policy, no_visits_left, state, config, decided.recorded)
        return self.hand_on(state, config, visits, decided)


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
