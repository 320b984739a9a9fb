"""The scripted conversations both sides play, and their translation for the bare supervisor.

A scenario is a relaygraph script (``docs/scripted-models.md``): supervisor routes, agent turns,
a finalize answer. :func:`to_bare` plays the same conversation for a bare
``langgraph_supervisor`` team: each route becomes a ``transfer_to_<agent>`` tool call of the
supervisor, a direct handoff between agents becomes the agent's reply followed by a supervisor
transfer (bare workers have no peer handoffs), and ``FINISH`` plus finalize's answer becomes the
supervisor's final reply. Agents' tool calls and results are the same turns on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RELAY_EXAMPLE = REPO / "examples" / "scripts" / "relay.json"

Script = dict[str, list[dict[str, Any]]]


def _route(
    next_: str, task: str = "", reason: str = "", then: list[str] | None = None
) -> dict[str, Any]:
    route: dict[str, Any] = {"next": next_, "task": task, "reason": reason}
    if then:
        route["then"] = then
    return {"route": route}


def _call(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "args": args}]}


def relay3() -> Script:
    """supervisor → researcher → writer → finish: two handoffs (the issue's short case). The
    supervisor knows both steps at the start: its first route plans the writer's (``then``)."""
    return {
        "supervisor": [
            _route(
                "researcher",
                "Find out when LangGraph writes checkpoints and how durable they are",
                "the request needs facts from the docs, then a report",
                then=[
                    "writer: Write a short report on checkpoint durability from the research "
                    "results"
                ],
            ),
            _route("FINISH", "", "the report answers the request"),
        ],
        "researcher": [
            _call("search_docs", query="checkpoint durability super-step"),
            {
                "content": "LangGraph saves a checkpoint after every super-step [checkpoints]; "
                "the durability mode (exit, async, sync) decides when it reaches the database."
            },
        ],
        "writer": [
            _call(
                "save_artifact",
                name="report.md",
                content="# Checkpoint durability\n\nA checkpoint is saved after every "
                "super-step; the durability mode (exit, async or sync) decides when it is "
                "persisted [checkpoints].",
            ),
            {"content": "Saved report.md: checkpoints after every super-step; three modes."},
        ],
        "finalize": [
            {
                "content": "LangGraph writes a checkpoint after every super-step; the durability "
                "mode (exit, async or sync) decides when it is persisted. See report.md."
            }
        ],
    }


_WORK = [
    (
        "researcher",
        "Find what the docs say about checkpoints and super-steps",
        lambda i: _call("search_docs", query=f"checkpoint super-step {i}"),
        "Checkpoints are saved after every super-step [checkpoints].",
    ),
    (
        "coder",
        "Write the numbers of checkpoints per step count to a notes file",
        lambda i: _call(
            "write_file",
            path=f"notes/steps-{i}.txt",
            content="\n".join(f"{s} steps -> {s + 1} checkpoints" for s in range(1, 9)),
        ),
        "Wrote the table of steps and checkpoints to the notes file.",
    ),
    (
        "writer",
        "Save a draft of the report from the results so far",
        lambda i: _call(
            "save_artifact",
            name=f"draft-{i}.md",
            content="# Checkpoints\n\nOne checkpoint per super-step, plus the input.",
        ),
        "Saved the draft report.",
    ),
]


def long_script(visits: int, *, plan: bool = True) -> Script:
    """``visits`` routes, cycling researcher → coder → writer, each visit one tool call and a
    reply, every task different (so no ping-pong or repeated-call rule fires). The steps are
    a plan: the supervisor's first route carries the rest of it (``then``), and it is asked
    again when the plan is done; ``plan=False``: one route per supervisor call."""
    script: Script = {"supervisor": [], "researcher": [], "coder": [], "writer": []}
    steps: list[tuple[str, str]] = []
    for i in range(visits):
        agent, task, call, reply = _WORK[i % len(_WORK)]
        n = i // len(_WORK) + 1
        steps.append((agent, f"{task} (part {n})"))
        script[agent].append(call(n))
        script[agent].append({"content": f"{reply} (part {n})"})
    (first, task), rest = steps[0], steps[1:]
    script["supervisor"].append(
        _route(first, task, f"a plan of {visits} steps", then=[f"{a}: {t}" for a, t in rest])
    )
    script["supervisor"].append(_route("FINISH", "", "the plan is done"))
    if not plan:
        script = step_by_step(script) or script
    script["finalize"] = [{"content": "Checkpoints are written after every super-step."}]
    return script


def relay_example() -> Script:
    """The shipped example (``examples/scripts/relay.json``), with a direct handoff."""
    return json.loads(RELAY_EXAMPLE.read_text(encoding="utf-8"))


SCENARIOS: dict[str, tuple[str, Any]] = {
    "relay-3": ("supervisor → researcher → writer → finish (2 handoffs)", relay3),
    "long-6": ("6 supervisor handoffs: researcher, coder, writer, twice", lambda: long_script(6)),
    "long-12": (
        "12 supervisor handoffs: researcher, coder, writer, four times",
        lambda: long_script(12),
    ),
    "relay.json": (
        "the shipped example: researcher → coder (direct handoff) → writer, run_python",
        relay_example,
    ),
}
"""Name → (description, script factory)."""

REQUEST = "When are checkpoints written, and how durable are they? Write a short report."


def handoffs_of(script: Script) -> int:
    """Transfers of work the relaygraph run makes: routes to an agent plus direct handoffs."""
    routes = sum(
        1 + len(t["route"].get("then", []))
        for t in script["supervisor"]
        if t["route"]["next"] != "FINISH"
    )
    direct = sum(
        1
        for agent, turns in script.items()
        if agent not in ("supervisor", "finalize")
        for t in turns
        for c in t.get("tool_calls") or []
        if c["name"].startswith("transfer_to_")
    )
    return routes + direct


def step_by_step(script: Script) -> Script | None:
    """The same script with its supervisor's plans (``then``) played as one route per
    supervisor call, as bare's supervisor plays them (the eval's translation for the other
    topologies does the same); None when the script has no plan."""
    from relaygraph.evals._translate import one_route_per_turn

    if not any(t["route"].get("then") for t in script["supervisor"]):
        return None
    return {**script, "supervisor": one_route_per_turn(script["supervisor"])}


def to_bare(script: Script) -> Script:
    """The same conversation for a bare ``create_supervisor`` team (see the module docstring)."""
    # A relaygraph plan (``then``): bare's supervisor has no plans and routes each step in
    # a call of its own.
    script = step_by_step(script) or script
    cursors = dict.fromkeys(script, 0)

    def take(role: str) -> dict[str, Any]:
        turn = script[role][cursors[role]]
        cursors[role] += 1
        return turn

    bare: Script = {role: [] for role in script if role != "finalize"}
    while True:
        route = take("supervisor")["route"]
        if route["next"] == "FINISH":
            bare["supervisor"].append({"content": take("finalize")["content"]})
            return bare
        target: str | None = route["next"]
        bare["supervisor"].append(_call(f"transfer_to_{target}"))
        while target is not None:
            turn = take(target)
            calls = turn.get("tool_calls") or []
            handoff = next((c for c in calls if c["name"].startswith("transfer_to_")), None)
            if handoff is None:
                bare[target].append({k: v for k, v in turn.items() if k != "usage"})
                if "content" in turn:
                    target = None
                continue
            # A direct handoff: the agent reports, the supervisor transfers to the peer.
            peer = handoff["name"].removeprefix("transfer_to_")
            bare[target].append({"content": f"Over to {peer}: {handoff['args']['task']}"})
            bare["supervisor"].append(_call(f"transfer_to_{peer}"))
            target = peer


GOLDEN = REPO / "examples" / "golden" / "golden.jsonl"


def golden_cases() -> tuple[list[tuple[str, str, Script]], list[tuple[str, str]]]:
    """The golden set's cases both sides can play: ``(id, request, script)``, and the others
    with the reason they are left out. Empty when the golden set is not there."""
    if not GOLDEN.exists():
        return [], []
    playable: list[tuple[str, str, Script]] = []
    skipped: list[tuple[str, str]] = []
    for line in GOLDEN.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        case = json.loads(line)
        expect = case.get("expect", {})
        if case.get("policy"):
            skipped.append((case["id"], "runs under its own policy"))
        elif expect.get("status") != "succeeded":
            skipped.append((case["id"], f"expects status {expect.get('status')!r}"))
        elif not case.get("script"):
            skipped.append((case["id"], "has no script"))
        else:
            script = json.loads((GOLDEN.parent / case["script"]).read_text(encoding="utf-8"))
            playable.append((case["id"], case["input"], script))
    return playable, skipped
