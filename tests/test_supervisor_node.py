"""The structured team's nodes (supervisor, agent, finalize), their parts each called alone
(the whole turn is covered by the team's runs in test_supervisor_plan, test_topologies and
test_policies)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import ParentCommand
from langgraph.types import Command

from relaygraph._calls import run_sync
from relaygraph.events import Assignment, events_to
from relaygraph.models import ModelCallError
from relaygraph.supervisor._agent_node import read_visit
from relaygraph.supervisor._finalize_node import Asked, FinalizeNode
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


class FailingCall(GenericFakeChatModel):
    """A finalize model whose server fails the call."""

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise ModelCallError(role="finalize", model="m", status=500, detail="down")


def finalize(model: Any = None) -> FinalizeNode:
    return FinalizeNode(model or NoCall(messages=iter(())), parse_policy({}))


def test_finalize_answers_nothing_when_every_agent_failed_its_model_call() -> None:
    state = TeamState(turn=1, visits=[visit("researcher", ended="model_error", output="")])
    sent: list[Any] = []
    with events_to(sent.append):
        update = run_sync(finalize().steps(state, CONFIG))
    assert update == {"answer": None, "status": "failed", "stop_reason": None}
    assert [(e["type"], e["status"]) for e in sent] == [("final", "failed")]


def test_finalize_s_failed_call_is_asked_and_answers_nothing() -> None:
    state = TeamState(turn=1, request="q", visits=[visit("researcher")])
    asked = run_sync(finalize(FailingCall(messages=iter(()))).ask(state, CONFIG))
    assert asked.reply.text == ""
    assert asked.failed is not None and asked.failed.reason == "HTTP 500: down"


def test_finalize_s_tool_call_is_refused_and_leaves_the_run_degraded() -> None:
    reply = AIMessage(content="", tool_calls=[{"name": "search", "args": {}, "id": "c1"}])
    state = TeamState(turn=1, visits=[visit("researcher")])
    sent: list[Any] = []
    with events_to(sent.append):
        update = finalize().close(state, CONFIG, "succeeded", Asked(reply, None, 0.5))
    assert (update["answer"], update["status"]) == (None, "degraded")
    assert update["stop_reason"] == (
        "no answer: finalize wrote no text (it called a tool, which it may not)"
    )
    assert [(v["id"], v["kind"]) for v in update["violations"]] == [
        ("supervisor:t:c1:tool_not_allowed", "tool_not_allowed")
    ]
    assert update["usage"][0]["model_calls"] == 1
    assert "messages" not in update
    assert sent[-1]["type"] == "final"


def test_a_visit_read_tells_how_it_ended() -> None:
    reply = AIMessage(content="Found it.")
    finished = read_visit({"messages": [reply]}, None, "coder:v1")
    assert (finished.ended, finished.output) == ("finished", "Found it.")
    error = ModelCallError(role="coder", model="m", status=503, detail="busy")
    failed = read_visit({"messages": [reply]}, error, "coder:v1")
    assert (failed.ended, failed.output) == ("model_error", "Its model call failed: HTTP 503: busy")
    assert failed.budget_note is None


def test_a_command_from_another_graph_is_no_handoff_of_the_visit() -> None:
    foreign = ParentCommand(Command(graph="other:v9", goto="writer", update={}))
    with pytest.raises(ParentCommand):
        read_visit({"messages": [AIMessage(content="")]}, foreign, "coder:v1")
