"""The bare side of the tasks-in-flight benchmark (``bench_inflight.py``), in a process of
its own: bare ``create_supervisor`` (:mod:`_bare`) on the real ``ChatOpenAI`` client, every
task an ``ainvoke`` on one event loop, ``--in-flight`` of them at once, checkpointing to
SQLite (``AsyncSqliteSaver``). What a bare LangGraph user would run to hold many slow tasks
at once. No HTTP API, no ledger, no policies.

Reads the jobs (one JSON list) on stdin; writes one JSON line: each task's finish time (from
the start), the failures, the CPU time and the peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any


async def _run(args: argparse.Namespace, jobs: list[str]) -> dict[str, Any]:
    import aiosqlite
    from _bare import build_bare_team
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    model = ChatOpenAI(model=args.model, base_url=args.base_url, api_key="bench", max_retries=0)  # type: ignore[arg-type]
    conn = await aiosqlite.connect(Path(args.home) / "bare-checkpoints.sqlite")
    # The SQLite settings relaygraph's checkpointer uses (and the other bare sides here).
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=NORMAL")
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    team = build_bare_team(
        {"supervisor": model, "researcher": model, "coder": model, "writer": model},
        checkpointer=saver,
    )
    room = asyncio.Semaphore(args.in_flight)
    finished: list[float] = []
    failures: list[str] = []
    started = time.monotonic()

    async def one(job: str) -> None:
        async with room:
            config = {"configurable": {"thread_id": uuid.uuid4().hex}}
            try:
                await team.ainvoke(
                    {"messages": [{"role": "user", "content": f"[job {job}] Write one line."}]},
                    config,
                )
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            finished.append(time.monotonic() - started)

    cpu = time.process_time()
    await asyncio.gather(*(one(job) for job in jobs))
    await conn.close()
    return {
        "finished": finished,
        "failures": failures,
        "cpu_seconds": time.process_time() - cpu,
        "rss_mb": _peak_rss_mb(),
    }


def _peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM``, its own memory's high-water mark.
    Not ``getrusage``'s ``ru_maxrss``: Linux carries it over ``exec`` from the forked copy
    of the parent, so under ``benchmarks/run.py`` (whose process holds the embedded model by
    this section) it reported the parent's memory, not bare's."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--in-flight", type=int, required=True)
    args = parser.parse_args()
    jobs = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(_run(args, jobs))), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
