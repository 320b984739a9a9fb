"""4. Cold start: wall time of fresh ``relaygraph`` processes (subprocesses, interleaved)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from _common import PYTHON, REPO, Section, Stats, Verdict, isolated_env, log, ms, table
from _scenarios import RELAY_EXAMPLE

TARGET = 0.3
RELAYGRAPH = PYTHON.parent / "relaygraph"


def _commands() -> dict[str, list[str]]:
    return {
        "relaygraph --help": [str(RELAYGRAPH), "--help"],
        "relaygraph run --model scripted:examples/scripts/relay.json": [
            str(RELAYGRAPH),
            "run",
            "When are checkpoints written?",
            "--model",
            f"scripted:{RELAY_EXAMPLE.relative_to(REPO)}",
        ],
        "reference: python -c pass": [str(PYTHON), "-c", "pass"],
        "reference: python -c 'import langgraph_supervisor, langchain.agents'": [
            str(PYTHON),
            "-c",
            "import langgraph_supervisor, langchain.agents",
        ],
    }


def _once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return elapsed


def _import_profile(argv: list[str], env: dict[str, str], limit: int = 15) -> str:
    """The slowest imports of one run (``-X importtime``, cumulative microseconds)."""
    done = subprocess.run(
        [str(PYTHON), "-X", "importtime", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), len(m.group(3)), m.group(4)))
    top = [r for r in sorted(rows, reverse=True) if r[1] <= 5][:limit]
    return "\n".join(
        f"{cum / 1000:8.1f} ms  {'  ' * (depth - 1)}{name}" for cum, depth, name in top
    )


def run(home: Path, *, runs: int) -> Section:
    section = Section("4. Cold start")
    env = isolated_env(home / "coldstart")
    commands = _commands()
    for argv in commands.values():  # warm the OS page cache and bytecode caches once
        _once(argv, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    log(f"  cold start: {runs} rounds of {len(commands)} commands")
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(_once(argv, env))
    rows = []
    for name, values in times.items():
        s = Stats.of(values)
        rows.append([f"`{name}`", s.n, ms(s.median), f"{ms(s.p25)}–{ms(s.p75)}", ms(s.minimum)])
    section.add(
        f"Each command as a fresh subprocess, {runs} rounds, commands interleaved within a "
        "round (after one untimed round that warms the page cache and bytecode caches); a "
        "throwaway data directory, tracing off. Times in ms.",
        "",
        *table(["command", "runs", "median", "IQR", "min"], rows),
        "",
    )
    help_median = Stats.of(times["relaygraph --help"]).median
    met = help_median <= TARGET
    section.verdicts.append(
        Verdict(
            "4. cold start",
            f"`relaygraph --help` ≤ {TARGET} s",
            f"{help_median:.3f} s",
            met,
        )
    )
    run_median = Stats.of(
        times["relaygraph run --model scripted:examples/scripts/relay.json"]
    ).median
    section.verdicts.append(
        Verdict(
            "4. cold start",
            "`relaygraph run --model scripted:...` (reported, no target)",
            f"{run_median:.2f} s",
            None,
        )
    )
    section.add(
        f"**Target (`relaygraph --help` ≤ {TARGET} s): " + ("met.**" if met else "NOT met.**"), ""
    )
    run_argv = [
        "-c",
        "import sys; from relaygraph.cli import main; sys.exit(main())",
        *commands["relaygraph run --model scripted:examples/scripts/relay.json"][1:],
    ]
    section.add(
        "Slowest imports of one `relaygraph run --model scripted:...` "
        "(`python -X importtime`, cumulative, top-level and nested up to 5 deep):",
        "",
        "```text",
        _import_profile(run_argv, env),
        "```",
        "",
    )
    if not met:
        help_argv = [
            "-c",
            "import sys; from relaygraph.cli import main; sys.exit(main())",
            "--help",
        ]
        section.add(
            "Slowest imports of `relaygraph --help`:",
            "",
            "```text",
            _import_profile(help_argv, env),
            "```",
            "",
        )
    return section
