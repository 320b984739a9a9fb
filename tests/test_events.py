"""One record per fact: every event a run emits is one of ``relaygraph.events``'s shapes,
the handoffs every view shows are made from one record, and each shared name is defined once.

A producer that emits an undeclared type, a key its type does not declare, or leaves out a
required one fails here: the runs below go through every event the team graph, the agents'
middleware and the runner emit on the scripted model (routes, handoffs, tools, violations, an
approval and a ping-pong decision, tokens, each topology).
"""

from __future__ import annotations

import ast
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from relaygraph import events as ev
from relaygraph.runner import Decision, RunResult, resume_task, run_task
from relaygraph.topology import Topology
from tests.builtin_team import parse_policy
from tests.conftest import EXAMPLE_RELAY

from ._scripts import call, route, say

SRC = Path(__file__).resolve().parents[1] / "src" / "relaygraph"
Events = list[dict[str, Any]]


# -- checking a value against a TypedDict ------------------------------------------------


def _fits(value: Any, hint: Any, where: str) -> list[str]:
    """What is wrong with ``value`` for the type ``hint`` (an event field's annotation)."""
    origin = get_origin(hint)
    if hint is Any:
        return []
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where}: {value!r} not in {get_args(hint)}"]
    if origin in (Union, types.UnionType):
        options = [_fits(value, option, where) for option in get_args(hint)]
        return [] if any(not o for o in options) else [f"{where}: {value!r} fits no {hint}"]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    if typing.is_typeddict(hint):
        return shape_problems(value, hint, where)
    expected = origin or hint
    if expected is float:
        expected = (int, float)
    if isinstance(value, bool) and expected in (int, (int, float)):
        return [f"{where}: {value!r} is a bool"]
    return [] if isinstance(value, expected) else [f"{where}: {value!r} is not {hint}"]


def shape_problems(value: Any, shape: Any, where: str) -> list[str]:
    """Keys missing, keys undeclared, and values of the wrong type, for a TypedDict."""
    if not isinstance(value, Mapping):
        return [f"{where}: {value!r} is not an object"]
    required, optional = shape.__required_keys__, shape.__optional_keys__
    problems = [f"{where}: {key!r} is missing" for key in sorted(required - set(value))]
    problems += [
        f"{where}: {key!r} is not declared by {shape.__name__}"
        for key in sorted(set(value) - required - optional)
    ]
    hints = get_type_hints(shape)
    for key in set(value) & set(hints):
        problems += _fits(value[key], hints[key], f"{where}.{key}")
    return problems


def check(events: Events) -> set[str]:
    """Every event is declared and fits its shape; returns the types seen."""
    problems: list[str] = []
    for index, event in enumerate(events):
        shape = ev.EVENT_SHAPES.get(event.get("type"))  # type: ignore[arg-type]
        if shape is None:
            problems.append(f"event {index}: undeclared type {event.get('type')!r}: {event}")
            continue
        problems += shape_problems(event, shape, f"event {index} ({event['type']})")
    assert not problems, "\n".join(problems)
    return {e["type"] for e in events}


# -- the runs ----------------------------------------------------------------------------

RELAY = f"scripted:{EXAMPLE_RELAY}"


def _run(**kwargs: Any) -> tuple[RunResult, Events]:
    seen: Events = []
    result = run_task("When are checkpoints written?", on_event=seen.append, **kwargs)
    return result, seen


def test_the_relay_emits_declared_events_and_one_handoff_record(home: Path) -> None:
    result, seen = _run(model=RELAY)
    assert result.status == "succeeded", result
    kinds = check(seen)
    assert kinds >= {
        "run_started",
        "route",
        "agent_started",
        "tool_call",
        "tool_result",
        "handoff",
        "agent_finished",
        "final",
        "run_finished",
    }
    # The result's handoffs, the events' and the ledger's are one record.
    moved = [h for e in seen if (h := ev.moved_work(e)) is not None]
    assert [ev.handoff_result(h) for h in moved] == result.handoffs
    from relaygraph.store import Ledger

    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        rows = ledger.handoffs(result.task_id)
    assert [(r.kind, r.source, r.target, r.task, r.reason, r.step) for r in rows] == [
        (h["kind"], h["source"], h["target"], h["task"], h["reason"], h["step"]) for h in moved
    ]
    # Usage: the ledger holds the figures of the graph's records.
    finished = [e["usage"] for e in seen if e["type"] == "agent_finished"]
    assert {u["agent"]: u["model_calls"] for u in finished} == {
        role: u["model_calls"]
        for role, u in result.usage.items()
        if role not in ("supervisor", "finalize")
    }


def test_an_approval_and_its_decision_are_declared_events(home: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[agents.coder]\napproval = ["run_python"]\n', encoding="utf-8")
    paused, before = _run(model=RELAY, policy=policy)
    assert paused.status == "interrupted", paused
    [pending] = paused.pending
    assert not shape_problems(
        {k: v for k, v in pending.items() if k != "id"}, ev.ApprovalRequest, "pending"
    )
    after: Events = []
    done = resume_task(paused.task_id, Decision(decision="approve"), on_event=after.append)
    assert done.status == "succeeded", done
    assert {"interrupted"} <= check(before)
    assert {"approval", "run_finished"} <= check(after)


def test_a_ping_pong_a_person_decides_is_declared(home: Path, script: Callable[..., str]) -> None:
    bouncing = [
        route("researcher", task="find A"),
        route("coder", task="check A"),
        route("researcher", task="find B"),
        route("coder", task="check B"),
        route("researcher", task="find C"),
    ]
    spec = script(
        {
            "supervisor": bouncing,
            "researcher": [say("r1"), say("r2")],
            "coder": [say("c1"), say("c2")],
            "finalize": [say("what we have")],
        }
    )
    policy = parse_policy({"ping_pong": {"on_detect": "human"}})
    paused, before = _run(model=spec, policy=policy)
    [pending] = paused.pending
    assert not shape_problems(
        {k: v for k, v in pending.items() if k != "id"}, ev.PingPongRequest, "pending"
    )
    after: Events = []
    resume_task(paused.task_id, Decision(decision="reject"), on_event=after.append)
    assert {"interrupted", "violation"} <= check(before)
    assert "final" in check(after)
    # The route the decision stopped moved no work.
    stopped = [e for e in after if e["type"] == "route" and not ev.is_carried_out(e)]
    assert stopped and all(ev.moved_work(e) is None for e in stopped)


def test_a_tool_call_refused_at_a_budget_is_a_declared_violation(
    home: Path, script: Callable[..., str]
) -> None:
    spec = script(
        {
            "supervisor": [route("researcher"), route("FINISH")],
            "researcher": [
                call("search_docs", query="checkpoints"),
                call("search_docs", query="durability"),
                say("done"),
            ],
            "finalize": [say("answer")],
        }
    )
    policy = parse_policy({"agents": {"researcher": {"max_tool_calls": 1}}})
    _, seen = _run(model=spec, policy=policy)
    check(seen)
    budget = [e for e in seen if e["type"] == "violation" and e["kind"] == "budget"]
    assert budget and "budget" in budget[0]


@pytest.mark.parametrize("kind", ["swarm", "supervisor-tools"])
def test_each_topology_emits_declared_events(home: Path, tmp_path: Path, kind: str) -> None:
    from relaygraph.evals._translate import translate_script

    path, start = translate_script(EXAMPLE_RELAY, kind, tmp_path)
    topology = Topology.parse(kind, start_agent=start)
    result, seen = _run(model=f"scripted:{path}", topology=topology)
    assert result.ok, result
    assert {"agent_started", "agent_finished", "handoff" if kind == "swarm" else "route"} <= check(
        seen
    )


def test_every_declared_type_has_a_shape_and_a_tag() -> None:
    assert len(set(ev.EVENT_TYPES)) == len(ev.EVENT_TYPES)
    for name, shape in ev.EVENT_SHAPES.items():
        assert get_args(get_type_hints(shape)["type"]) == (name,)
    assert "trace" in ev.RunStartedEvent.__optional_keys__


# -- one definition per name ---------------------------------------------------------------

SHARED = {"supervisor", "finalize", "FINISH", "transfer_to_", "begin", "relaygraph_prior_calls"}
PENDING: set[str] = set()
"""Modules that still define a shared name of their own (another change switches them)."""


def test_each_shared_name_is_defined_once() -> None:
    defined: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Constant) and value.value in SHARED:
                defined.setdefault(str(path.relative_to(SRC)), set()).add(value.value)
    assert set(defined.pop("_names.py")) == SHARED
    assert set(defined) <= PENDING, defined


def test_the_supervisor_does_not_import_the_scripted_model() -> None:
    for path in (SRC / "supervisor").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "relaygraph.models.scripted", path


def test_only_a_model_that_replays_by_position_is_told_its_prior_calls(home: Path) -> None:
    """The team graph tells a role's earlier call count only to a model that says it picks
    replies by position (the scripted model); any other model's calls carry nothing of it."""
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatResult
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph._names import FINALIZE, PRIOR_CALLS_KEY, SUPERVISOR
    from relaygraph.agents import TaskContext
    from relaygraph.models import load_model
    from relaygraph.models.scripted import ScriptedChatModel
    from relaygraph.supervisor import build_team
    from relaygraph.team import default_team

    told: list[tuple[str, bool]] = []

    class Listening(ScriptedChatModel):
        def _generate(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            metadata = run_manager.metadata if run_manager is not None else {}
            told.append((self.agent, PRIOR_CALLS_KEY in metadata))
            return super()._generate(messages, stop, run_manager, **kwargs)

    class Plain(Listening):
        relaygraph_replays_by_position: bool = False

    spec = f"scripted:{EXAMPLE_RELAY}"
    models: dict[str, Any] = {
        r: load_model(spec, agent=r) for r in (SUPERVISOR, "researcher", "coder", FINALIZE)
    }
    models["coder"] = Listening(script=models["coder"].script, agent="coder")
    # The writer is visited once: its own messages place each of its calls.
    models["writer"] = Plain(script=models["coder"].script, agent="writer")
    graph = build_team(models, team=default_team(), checkpointer=InMemorySaver())
    ctx = TaskContext.for_task(home, task_id="t1", thread_id="th1")
    config: Any = {"configurable": {"thread_id": "th1"}}
    graph.invoke({"request": "go"}, config, context=ctx)
    assert graph.get_state(config).values["status"] == "succeeded"
    assert {agent for agent, _ in told} == {"coder", "writer"}
    assert all(said for agent, said in told if agent == "coder")
    assert not any(said for agent, said in told if agent == "writer")
