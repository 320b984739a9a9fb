"""Run one task through the team: build the models and graph, stream events, return a result."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaygraph._home import data_home
from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.models import DEFAULT_MODEL, parse_model_spec
from relaygraph.policies import TeamPolicy, default_policy

__all__ = ["RunResult", "resolve_model_specs", "run_task", "sqlite_checkpointer"]

EventHandler = Callable[[dict[str, Any]], None]
USAGE_FIELDS = ("model_calls", "tool_calls", "input_tokens", "output_tokens")


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """The outcome of one task, as ``relaygraph run --json`` prints it."""

    task_id: str
    thread_id: str
    status: str
    """``succeeded``, ``degraded``, ``failed`` or ``interrupted``."""
    answer: str | None
    stop_reason: str | None
    agents_run: list[str]
    handoffs: list[dict[str, Any]]
    """Every transfer of work in order: routes (``kind: route``) and direct handoffs."""
    artifacts: list[str]
    usage: dict[str, dict[str, int]]
    models: dict[str, str] = field(default_factory=dict)
    """The model spec each role ran on."""

    @property
    def ok(self) -> bool:
        return self.status in ("succeeded", "degraded")

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "thread_id": self.thread_id,
            "status": self.status,
            "answer": self.answer,
            "stop_reason": self.stop_reason,
            "agents_run": self.agents_run,
            "handoffs": self.handoffs,
            "artifacts": self.artifacts,
            "usage": self.usage,
            "models": self.models,
        }


def resolve_model_specs(
    model: str | None, agent_models: Mapping[str, str], roles: tuple[str, ...]
) -> dict[str, str]:
    """Which spec each role uses: its own ``agent_models`` entry, else ``model``.

    Raises:
        ConfigError: ``agent_models`` names an unknown role, or a spec is invalid.
    """
    unknown = [role for role in agent_models if role not in roles]
    if unknown:
        raise ConfigError(
            f"--agent-model names unknown agent(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(roles)}"
        )
    specs = {role: agent_models.get(role) or model or DEFAULT_MODEL for role in roles}
    for spec in set(specs.values()):
        parse_model_spec(spec)
    return specs


@contextmanager
def sqlite_checkpointer(path: Path) -> Iterator[Any]:
    """A SqliteSaver in WAL mode.

    A default-settings SqliteSaver measured about 5x slower than in-memory on these
    machines; with WAL and ``synchronous=NORMAL`` it is about the same as in-memory.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        yield SqliteSaver(conn)
    finally:
        conn.close()


def _summarize(state: dict[str, Any], roles: tuple[str, ...]) -> dict[str, Any]:
    turn = state.get("turn", 0)
    visits = [v for v in state.get("visits", []) if v["turn"] == turn]
    handoffs = [
        {
            "kind": h["kind"],
            "from": h["source"],
            "to": h["target"],
            "task": h["task"],
            "reason": h["reason"],
        }
        for h in state.get("handoffs", [])
        if h.get("turn") == turn
    ]
    usage: dict[str, dict[str, int]] = {}
    for record in state.get("usage", []):
        if record["turn"] != turn:
            continue
        totals = usage.setdefault(record["agent"], dict.fromkeys(USAGE_FIELDS, 0))
        for key in USAGE_FIELDS:
            totals[key] += record[key]
    ordered = {role: usage[role] for role in roles if role in usage}
    return {"agents_run": [v["agent"] for v in visits], "handoffs": handoffs, "usage": ordered}


def _token_text(chunk: Any) -> str:
    from langchain_core.messages import AIMessageChunk

    return chunk.text if isinstance(chunk, AIMessageChunk) else ""


def run_task(
    request: str,
    *,
    model: str | None = None,
    agent_models: Mapping[str, str] | None = None,
    thread_id: str | None = None,
    policy: TeamPolicy | None = None,
    home: Path | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
) -> RunResult:
    """Run ``request`` through the team and return the result.

    Args:
        request: What the user asks for.
        model: Spec of the model every role uses unless ``agent_models`` says otherwise;
            defaults to the embedded model.
        agent_models: Per-role specs: agent names, ``supervisor``, ``finalize``.
        thread_id: Continue this earlier conversation; a new thread when None.
        policy: The team policy; the defaults when None.
        home: The data directory; ``$RELAYGRAPH_HOME`` or ``~/.relaygraph`` when None.
        on_event: Called with each event (route, handoff, tool call, ...) as it happens.
        stream_tokens: Also emit ``token`` events as models stream their text (models are
            then called in streaming mode).

    Raises:
        ConfigError: Bad input (empty request, unknown thread, bad model spec) — before
            anything runs. Failures while running are reported as ``status="failed"``.
    """
    from relaygraph.agents.context import TaskContext
    from relaygraph.agents.kb import KnowledgeBase, ensure_sample_corpus
    from relaygraph.models import load_model
    from relaygraph.supervisor import FINALIZE, SUPERVISOR, build_team

    if not request.strip():
        raise ConfigError("the task is empty: say what the team should do")
    policy = policy or default_policy()
    roles = (SUPERVISOR, *policy.agents, FINALIZE)
    specs = resolve_model_specs(model, agent_models or {}, roles)
    models = {role: load_model(spec, agent=role) for role, spec in specs.items()}
    home = data_home(home)
    emit = on_event or (lambda event: None)

    with sqlite_checkpointer(home / "checkpoints.sqlite") as checkpointer:
        graph = build_team(models, policy=policy, checkpointer=checkpointer)
        known = {"configurable": {"thread_id": thread_id}}
        if thread_id is not None and checkpointer.get_tuple(known) is None:
            raise ConfigError(
                f"thread {thread_id!r} has no earlier run in {home}; "
                "leave out --thread to start a new conversation"
            )
        thread_id = thread_id or str(uuid.uuid4())
        task_id = str(uuid.uuid4())
        context = TaskContext.for_task(home, task_id=task_id, thread_id=thread_id)
        context.workspace.mkdir(parents=True, exist_ok=True)
        context.artifacts.mkdir(parents=True, exist_ok=True)
        with KnowledgeBase(context.knowledge_base) as kb:
            ensure_sample_corpus(kb)
        config: Any = {
            "configurable": {"thread_id": thread_id, "relaygraph_task_id": task_id},
            "recursion_limit": policy.recursion_limit,
            "run_name": "relaygraph",
            "metadata": {"task_id": task_id},
        }
        emit({"type": "run_started", "task_id": task_id, "thread_id": thread_id, "models": specs})
        status, stop_reason, answer = "failed", None, None
        try:
            modes = ["custom", "messages"] if stream_tokens else ["custom"]
            for _ns, mode, data in graph.stream(  # type: ignore[call-overload]
                {"request": request},
                config,
                context=context,
                stream_mode=modes,
                subgraphs=True,
            ):
                if mode == "custom":
                    emit(data)
                elif text := _token_text(data[0]):
                    role = data[1].get("lc_agent_name") or data[1].get("langgraph_node")
                    emit({"type": "token", "role": role, "text": text})
        except RelaygraphError as exc:
            stop_reason = f"error: {exc}"
        except Exception as exc:  # A provider or tool failure ends this task, not the process.
            stop_reason = f"error: {type(exc).__name__}: {exc}"
        state = graph.get_state(config).values
        if stop_reason is None:
            status = state.get("status") or "failed"
            stop_reason, answer = state.get("stop_reason"), state.get("answer")
        summary = _summarize(state, roles)
        artifacts = sorted(p.name for p in context.artifacts.iterdir() if p.is_file())

    result = RunResult(
        task_id=task_id,
        thread_id=thread_id,
        status=status,
        answer=answer,
        stop_reason=stop_reason,
        artifacts=artifacts,
        models=specs,
        **summary,
    )
    emit({"type": "run_finished", "status": result.status, "stop_reason": result.stop_reason})
    return result
