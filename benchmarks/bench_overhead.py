"""1. Orchestration overhead per handoff: relaygraph against a bare create_supervisor team.

Both sides play the same scripted conversation (``_scenarios``) in this process, with the same
tools doing real work (the SQLite knowledge base, the workspace, the artifact store) and the
same SQLite checkpointer settings (WAL, ``synchronous=NORMAL``). Models answer instantly, so
what is timed is orchestration: graphs, state, checkpoints, policies, the ledger.

Sides, interleaved round by round:

* ``bare``: ``create_supervisor`` over ``create_agent`` workers, compiled once (as its docs use
  it), one ``invoke`` per task on a new thread. **The baseline of the target.**
* ``relaygraph run_task``: :func:`relaygraph.run.run_task` with a scripted model, as
  ``relaygraph run`` does in process: policies on, every event in the SQL ledger, the team
  graph built for the task. **The side the target is about.**
* ``bare, compiled per task`` and ``relaygraph graph only`` (``build_team`` + ``stream`` +
  ``get_state``, no ledger): diagnostics that split the difference into its causes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _bare import build_bare_team, turn_models
from _common import Section, Stats, Verdict, alternate, log, ms, profile_top, ratio_ci, table
from _scenarios import REQUEST, SCENARIOS, handoffs_of, to_bare

TARGET = 1.10
CASES = ("relay-3", "long-6")
BASELINE = "bare"
SUBJECT = "relaygraph run_task"
SERVICE = "relaygraph TaskRunner, long-lived ledger"
SUBJECTS = (SUBJECT, SERVICE)


def _sides(name: str, home: Path, stack: ExitStack) -> dict[str, Callable[[], Any]]:
    from relaygraph._checkpoint import sqlite_checkpointer
    from relaygraph.agents import TaskContext
    from relaygraph.models import load_model
    from relaygraph.policies import default_policy, policy_to_mapping
    from relaygraph.run import TaskRunner, _ledger_for, run_task
    from relaygraph.store import LOCAL_TEAM_ID
    from relaygraph.supervisor import FINALIZE, SUPERVISOR, build_team

    script = SCENARIOS[name][1]()
    path = home / f"{name}.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    spec = f"scripted:{path}"
    bare_script = to_bare(script)
    models = turn_models(bare_script)
    context = TaskContext.for_task(home, task_id=f"bare-{name}", thread_id="bare")
    context.workspace.mkdir(parents=True, exist_ok=True)
    context.artifacts.mkdir(parents=True, exist_ok=True)
    bare_saver = stack.enter_context(sqlite_checkpointer(home / f"bare-{name}.sqlite"))
    graph_saver = stack.enter_context(sqlite_checkpointer(home / f"graph-{name}.sqlite"))
    bare_graph = build_bare_team(models, checkpointer=bare_saver)
    policy = default_policy()
    roles = (SUPERVISOR, *policy.agents, FINALIZE)
    expected = len([t for t in bare_script["supervisor"] if "tool_calls" in t])

    def invoke_bare(graph: Any) -> None:
        for model in models.values():
            model.reset()
        thread = {"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 200}
        out = graph.invoke(
            {"messages": [{"role": "user", "content": REQUEST}]}, thread, context=context
        )
        transfers = sum(
            1
            for m in out["messages"]
            if m.type == "tool" and (m.name or "").startswith("transfer_to_")
        )
        assert transfers == expected, f"bare run made {transfers} transfers, not {expected}"

    def bare() -> None:
        invoke_bare(bare_graph)

    def bare_per_task() -> None:
        invoke_bare(build_bare_team(models, checkpointer=bare_saver))

    def graph_only() -> None:
        team_models = {role: load_model(spec, agent=role) for role in roles}
        graph = build_team(team_models, policy=policy, checkpointer=graph_saver)
        config: Any = {
            "configurable": {"thread_id": str(uuid.uuid4())},
            "recursion_limit": policy.recursion_limit,
        }
        task = TaskContext.for_task(home, task_id=str(uuid.uuid4()), thread_id="g")
        task.workspace.mkdir(parents=True, exist_ok=True)
        task.artifacts.mkdir(parents=True, exist_ok=True)
        for _ in graph.stream(
            {"request": REQUEST}, config, context=task, stream_mode=["custom"], subgraphs=True
        ):
            pass
        state = graph.get_state(config).values
        assert state["status"] == "succeeded", state.get("stop_reason")

    def check(result: Any) -> None:
        assert result.status == "succeeded", result.stop_reason
        assert len(result.handoffs) == handoffs_of(script), result.handoffs

    def relaygraph() -> None:
        check(run_task(REQUEST, model=spec, home=home))

    # A long-lived ledger and runner, as the task service holds them (TaskRunner with a ledger).
    ledger = _ledger_for(home)
    stack.callback(ledger.close)
    runner = TaskRunner(ledger=ledger, home=home)
    mapping = policy_to_mapping(policy)
    specs = dict.fromkeys(roles, spec)

    def task_runner() -> None:
        task, _ = ledger.create_task(
            team_id=LOCAL_TEAM_ID, input=REQUEST, policy=mapping, models=specs, metadata={}
        )
        check(runner.run(task, {"request": REQUEST}))

    return {
        BASELINE: bare,
        SUBJECT: relaygraph,
        SERVICE: task_runner,
        "bare, compiled per task": bare_per_task,
        "relaygraph graph only (no ledger)": graph_only,
    }


def _breakdown(name: str, home: Path, runs: int) -> tuple[list[list[str]], int, dict[str, float]]:
    """Where run_task's time goes: wrap its parts (timing only, nothing else changes)."""
    import relaygraph.agents.kb as kb_module
    import relaygraph.models as models_module
    import relaygraph.run as run_module
    import relaygraph.supervisor as supervisor_module
    from relaygraph.store import Ledger

    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    originals: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started
                calls[label] = calls.get(label, 0) + 1

        originals.append((owner, attr, original))
        setattr(owner, attr, timed)

    wrap(run_module, "_ledger_for", "ledger: open + schema check")
    wrap(Ledger, "create_task", "ledger: create_task")
    wrap(Ledger, "append_event", "ledger: append_event (one per event)")
    wrap(Ledger, "set_status", "ledger: set_status")
    wrap(Ledger, "record_usage", "ledger: record_usage")
    wrap(Ledger, "close", "ledger: close")
    wrap(supervisor_module, "build_team", "build_team (compile the team graph)")
    wrap(models_module, "load_model", "load_model (parse the script, per role)")
    wrap(kb_module, "ensure_sample_corpus", "knowledge base check")
    path = home / f"{name}.json"
    total = 0.0
    try:
        for _ in range(runs):
            started = time.perf_counter()
            run_module.run_task(REQUEST, model=f"scripted:{path}", home=home)
            total += time.perf_counter() - started
    finally:
        for owner, attr, original in reversed(originals):
            setattr(owner, attr, original)
    rows = []
    accounted = 0.0
    for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        accounted += seconds
        rows.append(
            [
                label,
                f"{calls[label] / runs:g}",
                ms(seconds / runs),
                f"{100 * seconds / total:.0f}%",
            ]
        )
    rest = total - accounted
    rows.append(
        [
            "the rest: graph run (stream, checkpoints, tools), get_state, result",
            "",
            ms(rest / runs),
            f"{100 * rest / total:.0f}%",
        ]
    )
    rows.append(["**total run_task**", "", f"**{ms(total / runs)}**", "100%"])
    events = calls.get("ledger: append_event (one per event)", 0) // runs
    return rows, events, {label: seconds / runs for label, seconds in spent.items()}


def run(home: Path, *, runs: int, profile_runs: int) -> Section:
    section = Section("1. Orchestration overhead per handoff")
    section.add(
        "The same scripted conversation through both sides, interleaved in one process "
        f"(rounds rotate the order of the sides; {runs} timed runs per side after 3 warm-up "
        "runs; a full garbage collection before each run, outside the timing). Models answer "
        "instantly, tools do their real work, both sides checkpoint to SQLite with the same "
        "settings (WAL, synchronous=NORMAL).",
        "",
        f"- **{BASELINE}**: `langgraph_supervisor.create_supervisor` over "
        "`langchain.agents.create_agent` workers (relaygraph's tools and prompts, a scripted "
        "model playing the same turns with `transfer_to_<agent>` calls), compiled once, one "
        "`invoke` per task on a new thread. The baseline of the target.",
        f"- **{SUBJECT}**: `relaygraph.run.run_task(..., model='scripted:...')`: policies on, "
        "every event written to the SQL ledger (SQLite), the team graph built per task, as "
        "`relaygraph run` does (it opens the ledger for each task).",
        f"- **{SERVICE}**: `TaskRunner.run` on a task from `Ledger.create_task`, with one "
        "ledger and runner kept for all runs, as the task service holds them. The target is "
        "judged for both relaygraph sides.",
        "- **bare, compiled per task** and **relaygraph graph only (no ledger)** "
        "(`build_team` + `stream` + `get_state` on the same checkpointer): diagnostics.",
        "",
    )
    results: dict[str, dict[str, list[float]]] = {}
    for name in CASES:
        log(f"  overhead: {name} ({runs} runs per side)")
        with ExitStack() as stack:
            results[name] = alternate(_sides(name, home, stack), runs=runs)
    handoffs = {name: handoffs_of(SCENARIOS[name][1]()) for name in CASES}

    rows = []
    for name in CASES:
        base = Stats.of(results[name][BASELINE])
        for side, times in results[name].items():
            s = Stats.of(times)
            if side == BASELINE:
                ratio = "1 (baseline)"
            else:
                low, high = ratio_ci(times, results[name][BASELINE])
                ratio = f"{s.median / base.median:.2f}× ({low:.2f}–{high:.2f})"
            rows.append(
                [
                    f"{name} ({handoffs[name]} handoffs)",
                    side,
                    s.n,
                    ms(s.median),
                    f"{ms(s.p25)}–{ms(s.p75)} (±{s.iqr_pct / 2:.0f}%)",
                    f"{ms(s.minimum)} / {ms(s.maximum)}",
                    ms(s.median / handoffs[name]),
                    ratio,
                ]
            )
    section.add(
        "Per task (times in ms; the ratio's 95% bootstrap interval in brackets):",
        "",
        *table(
            [
                "scenario",
                "side",
                "runs",
                "median",
                "IQR",
                "min / max",
                "median per handoff",
                "ratio to bare",
            ],
            rows,
        ),
        "",
    )

    # Marginal cost of one more handoff: the difference between the two scenarios.
    short, long = CASES
    extra = handoffs[long] - handoffs[short]
    marginal: dict[str, float] = {}
    for side in results[short]:
        diff = Stats.of(results[long][side]).median - Stats.of(results[short][side]).median
        marginal[side] = diff / extra
    mrows = [
        [side, ms(value), f"{value / marginal[BASELINE]:.2f}×"] for side, value in marginal.items()
    ]
    section.add(
        f"Marginal cost of one handoff: (median {long} − median {short}) / {extra} handoffs. "
        "This leaves out the fixed cost of a task (building graphs, opening the ledger):",
        "",
        *table(["side", "ms per extra handoff", "ratio to bare"], mrows),
        "",
    )

    verdicts: list[tuple[str, bool]] = []
    for subject in SUBJECTS:
        for name in CASES:
            ratio = (
                Stats.of(results[name][subject]).median / Stats.of(results[name][BASELINE]).median
            )
            verdicts.append((subject, ratio <= TARGET))
            section.verdicts.append(
                Verdict(
                    "1. overhead",
                    f"{name}: {subject} ≤ {TARGET:.2f}× bare per task",
                    f"{ratio:.2f}×",
                    ratio <= TARGET,
                )
            )
        per_handoff = marginal[subject] / marginal[BASELINE]
        verdicts.append((subject, per_handoff <= TARGET))
        section.verdicts.append(
            Verdict(
                "1. overhead",
                f"marginal cost per handoff: {subject} ≤ {TARGET:.2f}× bare",
                f"{per_handoff:.2f}×",
                per_handoff <= TARGET,
            )
        )
    for subject in SUBJECTS:
        met = all(ok for who, ok in verdicts if who == subject)
        section.add(
            f"**Target (relaygraph ≤ {TARGET:.2f}× bare, policies and ledger on), "
            f"{subject}: " + ("met.**" if met else "MISSED.**"),
            "",
        )

    log("  overhead: where run_task's time goes")
    rows, events, parts = _breakdown(short, home, profile_runs)
    section.add(
        f"Where `run_task`'s time goes ({short}, mean of {profile_runs} runs, each part timed "
        f"by wrapping it; {events} ledger events per task). Ledger events are written on the "
        "thread that consumes the stream while LangGraph's worker threads run the graph, so "
        "these parts overlap the graph run in part; *run_task − graph only* above is the "
        "ledger's net cost:",
        "",
        *table(["part", "calls per task", "ms per task", "share"], rows),
        "",
    )
    med = {n: {side: Stats.of(t).median for side, t in results[n].items()} for n in CASES}
    graph = "relaygraph graph only (no ledger)"
    net_ledger = med[short][SUBJECT] - med[short][graph]
    net_service = med[short][SERVICE] - med[short][graph]
    build = parts.get("build_team (compile the team graph)", 0.0)
    graph_long = med[long][graph] / med[long][BASELINE]
    graph_marginal = marginal[graph] / marginal[BASELINE]
    par = graph_long <= TARGET and graph_marginal <= TARGET
    per_task_bare = med[short]["bare, compiled per task"] / med[short][BASELINE]
    section.add(
        "**What costs the time.** "
        + ("The orchestration itself is on a par with bare: " if par else "")
        + f"*graph only* (the same policies and middleware, no ledger) is {graph_long:.2f}× "
        f"bare on {long} and {graph_marginal:.2f}× per extra handoff. The rest of the gap:",
        "",
        f"1. **The ledger**: run_task − graph only = {ms(net_ledger)} ms per {short} task "
        f"({ms(net_service)} ms with a long-lived ledger), about "
        f"{ms(net_service / max(events, 1))} ms per event for {events} events. "
        "`Ledger.append_event` (src/relaygraph/store/_ledger.py) runs one synchronous "
        "SQLAlchemy ORM transaction per event (UPDATE … RETURNING on the task row, an INSERT, "
        "the derived rows with their SELECTs, a COMMIT) inside `TaskRunner.run`'s `emit`, on "
        "the thread that drives the graph. `run_task` also opens a new engine per task "
        "(`_ledger_for`: schema check, cold statement cache).",
        f"2. **A fixed cost per task**: `build_team` ({ms(build)} ms per task) compiles the "
        "team graph and three `create_agent` subgraphs for every task; most of it is "
        "LangGraph's `compile` → `find_subgraph_pregel` → `get_function_nonlocals`, which "
        "disassembles every node function (see the profile). The bare team is compiled once; "
        f"compiled per task it takes {per_task_bare:.2f}× as long on {short}. relaygraph also "
        "runs one more node (`begin`) and one more model call (`finalize`) per task.",
        "",
    )
    path = home / f"{short}.json"
    from relaygraph.run import run_task

    top = profile_top(
        lambda: run_task(REQUEST, model=f"scripted:{path}", home=home),
        repeat=profile_runs,
        limit=25,
    )
    section.add(
        f"cProfile of `run_task` ({short}, {profile_runs} runs, top 25 by cumulative time; "
        "wall-clock, main thread):",
        "",
        "```text",
        top,
        "```",
        "",
    )
    return section
