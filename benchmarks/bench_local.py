"""5. The embedded model: a whole team task on ``local:smollm2`` (SmolLM2-135M in llama.cpp)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

from _common import Section, Stats, Verdict, log, table

REQUEST = "What do the docs say about checkpoint durability? Write a short report."


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
    from relaygraph.run import run_task

    cores = len(os.sched_getaffinity(0))
    walls: list[float] = []
    results = []
    for i in range(runs):
        log(f"  local model: run {i + 1} of {runs}")
        started = time.perf_counter()
        result = run_task(REQUEST, model="local:smollm2", home=home)
        walls.append(time.perf_counter() - started)
        results.append(result)
    first = results[0]
    rows = []
    for role, usage in first.usage.items():
        tokens = usage["output_tokens"]
        seconds = usage["seconds"]
        rows.append(
            [
                role,
                usage["model_calls"],
                usage["input_tokens"],
                tokens,
                f"{seconds:.1f}",
                f"{tokens / seconds:.1f}" if seconds else "",
            ]
        )
    s = Stats.of(walls)
    same = all(r.agents_run == first.agents_run and r.status == first.status for r in results)
    section.add(
        f"Every role on the embedded default model, {runs} run(s) in this process on {cores} "
        "core(s) (the first includes loading the weights), the request of the slow "
        f"end-to-end test: *{REQUEST}*",
        "",
        *table(
            ["runs", "median wall time", "min", "max", "agents run", "status"],
            [
                [
                    s.n,
                    f"{s.median:.1f} s",
                    f"{s.minimum:.1f} s",
                    f"{s.maximum:.1f} s",
                    " → ".join(first.agents_run) or "none",
                    f"{first.status}" + (f" ({first.stop_reason})" if first.stop_reason else ""),
                ]
            ],
        ),
        "",
        "Per role (first run; tokens as llama.cpp counted them):",
        "",
        *table(
            ["role", "model calls", "input tokens", "output tokens", "seconds", "output tokens/s"],
            rows,
        ),
        "",
    )
    if not same:
        section.add("Note: the runs did not all take the same path.", "")
    section.verdicts.append(
        Verdict(
            "5. embedded model",
            f"wall time of a {len(first.agents_run)}-agent task (reported, no target)",
            f"{s.median:.1f} s",
            None,
        )
    )
    return section
