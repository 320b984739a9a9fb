"""The supervisor node's parts, each called alone (the whole turn is covered by the team's
runs in test_supervisor_plan, test_topologies and test_policies)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.runnables import RunnableConfig

from relaygraph._calls import run_sync
from relaygraph.events import Assignment, events_to
from relaygraph.supervisor._route import Route, RouteDecision
from relaygraph.supervisor._state import TeamState, Visit
from relaygraph.supervisor._supervisor_node import Availability, Decided, SupervisorNode
from relaygraph.team import default_team
from tests.builtin_team import parse_policy

CONFIG: RunnableConfig = {"configurable": {"checkpoint_ns": "supervisor:t"}}


class NoCall(GenericFakeChatModel):
    """A supervisor model that must not be called."""

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the supervisor model was called")


def node(policy: dict[str, Any] | None = None) -> SupervisorNode:
    model = NoCall(messages=iter(()))
    return SupervisorNode(
        model,
        parse_policy(policy or {}),
        default_team().agents,
        None,
        finalize_model=model,
    )


def visit(agent: str, *, ended: str = "finished", output: str = "done") -> Visit:
    return Visit(
        id=f"v-{agent}",
        agent=agent,
        turn=1,
        task="t",
        source="supervisor",
        output=output,
        ended=ended,  # type: ignore[typeddict-item]
        tools=[],
        messages=[],
    )


def test_a_barred_agent_is_not_available() -> None:
    state = TeamState(
        turn=1, barred=[{"agent": "coder", "after": "researcher", "reason": "ping-pong"}]
    )
    able = node().availability(state, "researcher")
    assert able.available == ("researcher", "writer")
    assert able.unavailable == {"coder": "ping-pong"}
    # The bar holds only after the agent it names.
    assert node().availability(state, "writer").available == ("researcher", "coder", "writer")


def test_with_no_agent_left_the_task_goes_to_finalize_saying_why() -> None:
    able = Availability((), {"researcher": "ping-pong", "coder": "ping-pong"})
    command = node().no_agent_left(able)
    assert command.goto == "finalize"
    assert command.update == {
        "status": "degraded",
        "stop_reason": "no agent left: researcher: ping-pong; coder: ping-pong",
    }


def test_a_planned_step_is_decided_without_a_model_call() -> None:
    step = Assignment(
        agent="writer", task="Report", reason="planned", source="supervisor", kind="route"
    )
    later = Assignment(
        agent="coder", task="Table", reason="planned", source="supervisor", kind="route"
    )
    state = TeamState(turn=1, plan=[step, later], visits=[visit("researcher")])
    sup = node()
    able = sup.availability(state, "researcher")
    decided = run_sync(sup.decide(state, CONFIG, state["visits"], able, ask=False))
    assert (decided.decision.route.next, decided.decision.route.task) == ("writer", "Report")
    assert decided.plan == [later]
    assert decided.recorded == {"usage": []}


@pytest.mark.parametrize("recorded_before", [False, True])
def test_a_refused_route_to_a_spent_agent_is_the_budgets_violation(recorded_before: bool) -> None:
    from relaygraph.policies.budget import BudgetHit

    hit = BudgetHit(scope="agent", agent="writer", limit="max_model_calls", used=1, allowed=1)
    able = Availability(("researcher",), {"writer": "out of budget: 1 of 1"}, [hit])
    decision = RouteDecision(
        route=Route.model_construct(next="researcher", task="t", reason="r"),
        fallback=False,
        error=None,
        raw=(),
        refused=("writer",),
    )
    earlier = (
        [{"id": "x", "turn": 1, "agent": "writer", "kind": "budget", "detail": "hit"}]
        if recorded_before
        else []
    )
    state = TeamState(turn=1, violations=earlier)  # type: ignore[typeddict-item]
    sent: list[Any] = []
    with events_to(sent.append):
        found = node().refusals(state, CONFIG, able, Decided(decision, [], {"usage": []}))
    if recorded_before:
        assert found == sent == []
    else:
        assert [(v["id"], v["agent"], v["kind"]) for v in found] == [
            ("supervisor:t:refused:writer", "writer", "budget")
        ]
        assert len(sent) == 1  # the violation's event
