"""The bare side of the service benchmark (``bench_service.py``), in a process of its own.

What a bare LangGraph user would run to serve tasks: the bare ``create_supervisor`` team of
:mod:`_bare`, compiled once, on the real ``ChatOpenAI`` client (one client for every role, as
the service's tasks share one model), checkpointing to SQLite, with a ``ThreadPoolExecutor``
whose threads call ``invoke``, one task each, as ``relaygraph serve --workers N`` runs its
tasks on a pool of threads. No HTTP API, no ledger, no policies.

The benchmark drives it a round at a time: one JSON line on its stdin (the round's tasks), one
JSON line back on its stdout (the round's wall time, the CPU time the process used, why tasks
failed). It is a process of its own so that its threads do not share an interpreter lock with
the benchmark's model double, just as ``relaygraph serve`` does not.
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

READY_SECONDS = 120
"""How long the process may take to import and compile its team."""


@dataclass(frozen=True, kw_only=True)
class BareRound:
    """What one round of the bare process measured."""

    seconds: float
    """Wall time from handing the round's tasks to the pool until the last one returned."""
    finished: list[float]
    """When each task returned, in seconds from handing the round's tasks to the pool."""
    cpu_seconds: float
    """CPU time of the whole process (all its threads) in the round."""
    failures: list[str]
    """Why each task that failed did, one line each."""


class BareService:
    """The bare team's process (see the module docstring), started on entering."""

    def __init__(self, *, base_url: str, model: str, home: Path, threads: int) -> None:
        self._argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            f"--base-url={base_url}",
            f"--model={model}",
            f"--home={home}",
            f"--threads={threads}",
        ]
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> BareService:
        # stderr is the benchmark's, so the process's warnings and a traceback show in its log.
        self._process = subprocess.Popen(
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            self._read(READY_SECONDS)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def play(self, tasks: list[tuple[str, str]], *, timeout: float) -> BareRound:
        """Hand ``tasks`` (each its request and the answer it must end with) to the pool at
        once: as many run at a time as it has threads, the others wait their turn."""
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(json.dumps({"tasks": tasks}) + "\n")
        self._process.stdin.flush()
        return BareRound(**self._read(timeout))

    def close(self) -> None:
        """End the process: it exits when its stdin closes."""
        if self._process is None:
            return
        process, self._process = self._process, None
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        # The process writes one line per request and nothing else, so no line waits in the
        # reader's buffer where select cannot see it.
        if not select.select([stdout], [], [], timeout)[0]:
            raise TimeoutError(f"the bare process did not answer within {timeout:g} s")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the bare process ended (exit code {self._process.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply


# -- the process ----------------------------------------------------------------------------


def _task(graph: Any, home: Path, request: str, answer: str) -> str | None:
    """Run one task, on a checkpoint thread of its own; None, or why it failed."""
    from relaygraph.agents import TaskContext

    task_id = uuid.uuid4().hex
    context = TaskContext.for_task(home, task_id=task_id, thread_id=task_id)
    context.workspace.mkdir(parents=True, exist_ok=True)
    context.artifacts.mkdir(parents=True, exist_ok=True)
    try:
        out = graph.invoke(
            {"messages": [{"role": "user", "content": request}]},
            {"configurable": {"thread_id": task_id}},
            context=context,
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    # The double plays a task's turns in order, so its last turn as the final message means
    # the whole conversation was played.
    said = out["messages"][-1].text
    return None if said == answer else f"ended with {said!r}, not {answer!r}"


def _serve(base_url: str, model: str, home: Path, threads: int, channel: IO[str]) -> None:
    from _bare import AGENT_NAMES, build_bare_team
    from langchain_core.language_models import BaseChatModel
    from langchain_openai import ChatOpenAI

    from relaygraph.runner._checkpoint import sqlite_checkpointer

    def say(reply: dict[str, Any]) -> None:
        channel.write(json.dumps(reply) + "\n")
        channel.flush()

    home.mkdir(parents=True, exist_ok=True)
    # No retries: a call the double refuses fails its task instead of being played again.
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="bench", max_retries=0)  # type: ignore[arg-type]
    models: dict[str, BaseChatModel] = dict.fromkeys(("supervisor", *AGENT_NAMES), llm)
    # The same SQLite settings as bench_overhead's bare side and relaygraph's own (WAL,
    # synchronous=NORMAL): one saver, shared by the threads as one compiled graph is.
    with (
        sqlite_checkpointer(home / "checkpoints.sqlite") as saver,
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bare-task") as pool,
    ):
        graph = build_bare_team(models, checkpointer=saver)
        say({"ready": True})
        for line in sys.stdin:
            tasks = json.loads(line)["tasks"]
            cpu, started = time.process_time(), time.perf_counter()

            def timed(task: list[str], started: float = started) -> tuple[str | None, float]:
                why = _task(graph, home, *task)
                return why, time.perf_counter() - started

            outcomes = list(pool.map(timed, tasks))
            say(
                {
                    "seconds": time.perf_counter() - started,
                    "finished": [at for _, at in outcomes],
                    "cpu_seconds": time.process_time() - cpu,
                    "failures": [why for why, _ in outcomes if why is not None],
                }
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base-url", required=True, help="the Chat Completions server")
    parser.add_argument("--model", required=True, help="the model name sent to it")
    parser.add_argument("--home", type=Path, required=True, help="task directories, checkpoints")
    parser.add_argument("--threads", type=int, required=True, help="tasks run at once")
    args = parser.parse_args(argv)
    # Replies go on the real stdout; anything a library prints goes to stderr instead.
    channel, sys.stdout = sys.stdout, sys.stderr
    _serve(args.base_url, args.model, args.home, args.threads, channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
