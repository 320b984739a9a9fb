"""5. The embedded model: a whole team task on ``local:smollm2`` (SmolLM2-135M in llama.cpp)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from _common import Section, Stats, Verdict, log, table

REQUEST = "What do the docs say about checkpoint durability? Write a short report."
ROUTES = {
    "supervisor": [
        {
            "route": {
                "next": "researcher",
                "task": "Find what the docs say about checkpoint durability",
                "reason": "a question about the docs",
            }
        },
        {
            "route": {
                "next": "writer",
                "task": "Write a short report on checkpoint durability from the findings",
                "reason": "the user asked for a report",
            }
        },
        {"route": {"next": "FINISH", "task": "", "reason": "the report is written"}},
    ]
}
"""A fixed path for the two-agent task: the supervisor's routes are scripted, so the task
visits exactly two agents whatever the small model would route; the agents and finalize run
on the embedded model."""


def run(home: Path, *, runs: int) -> Section:
    section = Section("5. The embedded model")
    if importlib.util.find_spec("llama_cpp") is None:
        section.add(
            "**Skipped:** `llama_cpp` is not importable here (install `relaygraph[local]`; see "
            "the README), so no task ran on `local:smollm2`.",
            "",
        )
        section.verdicts.append(
            Verdict("5. embedded model", "wall time (reported, no target)", "skipped", None)
        )
        return section
    from relaygraph.runner import run_task

    cores = len(os.sched_getaffinity(0))
    home.mkdir(parents=True, exist_ok=True)
    routes = home / "local-routes.json"
    routes.write_text(json.dumps(ROUTES), encoding="utf-8")
    kinds = {
        "two agents, routes scripted": {"supervisor": f"scripted:{routes}"},
        "every role on the model": {},
    }
    measured: dict[str, tuple[Any, list[Any]]] = {}
    for i in range(runs):
        for label, agent_models in kinds.items():
            log(f"  local model: {label}, run {i + 1} of {runs}")
            started = time.perf_counter()
            result = run_task(REQUEST, model="local:smollm2", agent_models=agent_models, home=home)
            walls, results = measured.setdefault(label, ([], []))
            walls.append(time.perf_counter() - started)
            results.append(result)
    section.add(
        f"The embedded default model (`local:smollm2`), {runs} run(s) of each kind in this "
        f"process on {cores} core(s), alternating (the first run includes loading the "
        f"weights), the request of the slow end-to-end test: *{REQUEST}* The two-agent task "
        "scripts the supervisor's routes (researcher, then writer, then FINISH) so that its "
        "path is fixed; its agents and finalize run on the model. The other lets the model "
        "route too, wherever it goes.",
        "",
    )
    rows = []
    for label, (walls, results) in measured.items():
        s = Stats.of(walls)
        first = results[0]
        same = all(r.agents_run == first.agents_run and r.status == first.status for r in results)
        rows.append(
            [
                label,
                s.n,
                f"{s.median:.1f} s",
                f"{s.minimum:.1f} s",
                f"{s.maximum:.1f} s",
                " → ".join(first.agents_run) or "none",
                f"{first.status}"
                + (f" ({first.stop_reason})" if first.stop_reason else "")
                + ("" if same else " (runs took different paths)"),
            ]
        )
    section.add(
        *table(["task", "runs", "median wall time", "min", "max", "agents run", "status"], rows),
        "",
    )
    walls, results = measured["two agents, routes scripted"]
    first = results[0]
    role_rows = []
    for role, usage in first.usage.items():
        tokens = usage["output_tokens"]
        seconds = usage["seconds"]
        role_rows.append(
            [
                role,
                usage["model_calls"],
                usage["input_tokens"],
                tokens,
                f"{seconds:.1f}",
                f"{tokens / seconds:.1f}" if seconds >= 0.1 else "",
            ]
        )
    section.add(
        "Per role of the two-agent task (first run; tokens as llama.cpp counted them; the "
        "supervisor's are the script's estimates):",
        "",
        *table(
            ["role", "model calls", "input tokens", "output tokens", "seconds", "output tokens/s"],
            role_rows,
        ),
        "",
    )
    section.verdicts.append(
        Verdict(
            "5. embedded model",
            f"wall time of a {len(first.agents_run)}-agent task (reported, no target)",
            f"{Stats.of(walls).median:.1f} s",
            None,
        )
    )
    return section
