"""The audit view: a task's timeline rebuilt from the ledger, shaped like a span tree.

The ledger keeps every event a run emitted, in order and with the time it was recorded,
so the timeline needs no tracer: ``relaygraph trace TASK_ID`` and
``GET /v1/tasks/{id}/trace`` work for every task, traced or not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from relaygraph._names import FINISH, SUPERVISOR
from relaygraph.events import (
    PREVIEW_CHARS,
    USAGE_AMOUNTS,
    USAGE_COUNTS,
    is_carried_out,
    transfer_of,
)
from relaygraph.store import Ledger, RecordNotFound

USAGE_KEYS = (*USAGE_COUNTS, *USAGE_AMOUNTS, "estimated")
_TEXT_CHARS = 100


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def _usage(record: Mapping[str, Any] | None) -> dict[str, Any]:
    record = record or {}
    return {key: record.get(key, False if key == "estimated" else 0) for key in USAGE_KEYS}


def _entry(kind: str, data: Mapping[str, Any], at: datetime, seq: int) -> dict[str, Any] | None:
    """A timeline node for one event outside the visit bookkeeping, or None to skip it."""
    base: dict[str, Any] = {"kind": kind, "at": _iso(at), "seq": seq}
    if kind in ("route", "handoff"):
        return base | _transfer(data)
    if kind == "violation":
        budget = data.get("kind") == "budget"
        return base | {
            "kind": "budget_hit" if budget else "violation",
            "agent": data.get("agent"),
            "violation": data.get("kind"),
            "detail": data.get("detail", ""),
            # The limit a budget hit stopped at (scope, agent, limit, used, allowed).
            "budget": data.get("budget"),
        }
    fields = _COPIED_FIELDS.get(kind)
    if fields is None:
        return None
    return base | {key: data.get(key, default) for key, default in fields.items()}


_COPIED_FIELDS: dict[str, dict[str, Any]] = {
    "interrupted": dict.fromkeys(("waits_for", "agent", "tool", "detail")),
    "approval": dict.fromkeys(("agent", "tool", "decision", "reason", "args")),
    "model_retry": dict.fromkeys(("role", "model", "attempt", "status"))
    | {"error": "", "wait_seconds": None},
    "model_error": dict.fromkeys(("role", "model", "status")) | {"error": "", "attempts": None},
    "run_started": {},
    "run_suspended": {"reason": None},
    "cancel_requested": {"by": None, "via": None},
    "run_finished": {"status": None, "stop_reason": None},
}
"""The events whose timeline node copies the event's fields as they are: each field, in the
node's order, with its value when the event has none."""


def _transfer(data: Mapping[str, Any]) -> dict[str, Any]:
    """A route's or a handoff's node: the :class:`~relaygraph.events.Handoff` the event
    reports (a route to ``FINISH`` reports none: it ends the work), and whether it was
    carried out."""
    handoff = transfer_of(data)
    if handoff is None:
        fields = {
            "from": SUPERVISOR,
            "to": data.get("next"),
            "task": data.get("task", ""),
            "reason": data.get("reason", ""),
            "step": data.get("step"),
        }
    else:
        fields = {
            "from": handoff["source"],
            "to": handoff["target"],
            "task": handoff["task"],
            "reason": handoff["reason"],
            "step": handoff["step"],
        }
    if data.get("type") == "route":
        fields |= {"repaired": bool(data.get("repaired")), "fallback": bool(data.get("fallback"))}
    return fields | {"carried_out": is_carried_out(data)}


def _outcome(status: str, *, ran: bool, rejected: bool) -> str:
    """What became of a tool call, in the audit's words: ``ok``, ``error`` (it ran and
    failed), ``refused`` (the policy or the host stopped it before it ran) or ``rejected``
    (a person did). The tool message's own ``status`` says ``error`` for all three."""
    if ran:
        return "ok" if status == "success" else "error"
    return "rejected" if rejected else "refused"


_PAUSED = ("interrupted", "suspended", "stopped")
"""How a visit ends when its run stops inside it: the next run goes on with it."""

_IN_A_VISIT = ("violation", "approval", "interrupted", "model_retry", "model_error")
"""Kinds shown under the agent visit they happened in (when one is open)."""


def build_timeline(ledger: Ledger, task_id: str, *, project_id: str) -> dict[str, Any]:
    """The task's timeline, from the ledger, as a JSON-ready span tree.

    The root is the task (status, times, the ``team`` that ran it: name, version, digest,
    and usage per role and in total). Its ``children`` are, in order: ``route``
    (supervisor → agent, with task and reason), ``agent`` visits (start, end, duration,
    usage, and their own ``children``: each ``tool`` call with its status and result
    preview, and the ``violation`` / ``budget_hit`` / ``approval`` / ``interrupted`` /
    ``model_retry`` / ``model_error`` events inside the visit), ``handoff`` (from, to,
    task, reason), violations, budget hits and model call retries and failures outside a
    visit (the supervisor's), and ``run_started`` / ``run_suspended`` / ``run_finished``
    marks (a resumed task has more than one run).

    Raises:
        RecordNotFound: ``project_id`` has no task ``task_id``.
    """
    task = ledger.get_task(task_id, project_id=project_id)
    if task is None:
        raise RecordNotFound("task", task_id)
    children: list[dict[str, Any]] = []
    visit: dict[str, Any] | None = None
    last_visit: dict[str, Any] | None = None
    calls: dict[str, dict[str, Any]] = {}
    # Calls still pending when their visit's run stopped (held for a person): the resumed
    # run issues them again, and the first node then says it was held, not that it hangs.
    held: dict[str, dict[str, Any]] = {}
    rejected: set[str] = set()
    call: dict[str, Any] | None
    for event in ledger.events_after(task_id):
        data, kind, at = event.data, event.type, event.created_at
        if kind == "agent_started":
            stopped = last_visit is not None and last_visit["ended"] in _PAUSED
            same = stopped and last_visit is not None and last_visit["agent"] == data.get("agent")
            visit = {
                "kind": "agent",
                "agent": data.get("agent"),
                "start": _iso(at),
                "end": None,
                "duration_s": None,
                "task": data.get("task", ""),
                "source": data.get("source"),
                "ended": None,
                "output": None,
                "usage": _usage(None),
                "children": [],
                "seq": event.seq,
                # The visit a paused run left, which this one goes on with (its seq).
                "resumes": last_visit["seq"] if same and last_visit is not None else None,
                "_start": at,
            }
            last_visit = visit
            children.append(visit)
            held |= {key: node for key, node in calls.items() if node["status"] == "pending"}
            calls = {}
            continue
        if kind == "agent_finished" and visit is not None:
            visit |= {
                "end": _iso(at),
                "duration_s": _seconds(visit["_start"], at),
                "ended": data.get("ended"),
                "output": data.get("output"),
                "usage": _usage(data.get("usage")),
            }
            visit = None
            continue
        if kind == "tool_call" and visit is not None:
            started: dict[str, Any] = {
                "kind": "tool",
                "tool": data.get("tool"),
                "tool_call_id": data.get("tool_call_id"),
                "args": data.get("args"),
                "start": _iso(at),
                "end": None,
                "duration_s": None,
                "status": "pending",
                "outcome": "pending",
                "preview": None,
                "preview_cut": False,
                "seq": event.seq,
                "_start": at,
            }
            key = str(data.get("tool_call_id") or data.get("tool"))
            earlier = held.pop(key, None)
            if earlier is not None:
                earlier |= {"status": "held", "outcome": "held", "resumed_seq": event.seq}
            calls[key] = started
            visit["children"].append(started)
            continue
        if kind == "tool_result" and visit is not None:
            key = str(data.get("tool_call_id") or data.get("tool"))
            call = calls.pop(key, None)
            if call is None:  # A refused call: it never started, only its answer exists.
                call = {
                    "kind": "tool",
                    "tool": data.get("tool"),
                    "tool_call_id": data.get("tool_call_id"),
                    "args": None,
                    "start": _iso(at),
                    "seq": event.seq,
                    "_start": at,
                }
                visit["children"].append(call)
            preview = data.get("preview")
            status = data.get("status") or "success"
            call |= {
                "end": _iso(at),
                "duration_s": _seconds(call["_start"], at),
                "status": status,
                "outcome": _outcome(status, ran=data.get("ran", True), rejected=key in rejected),
                "preview": preview,
                "preview_cut": isinstance(preview, str) and len(preview) >= PREVIEW_CHARS,
            }
            continue
        if kind == "approval" and data.get("decision") == "reject":
            rejected.add(str(data.get("tool_call_id") or data.get("tool")))
        if kind == "approval" and isinstance(data.get("args"), dict):
            # An edit: the call about to run takes the person's arguments; the model's
            # stay beside them.
            edited = calls.get(str(data.get("tool_call_id") or data.get("tool")))
            if edited is not None:
                edited |= {"model_args": edited["args"], "args": data["args"]}
        entry = _entry(kind, data, at, event.seq)
        if entry is None:
            continue
        if kind in ("run_finished", "run_suspended") and visit is not None:
            # The run stopped inside the visit (a pause for a person, a failure, a server
            # that stopped mid-run).
            visit["ended"] = (
                "interrupted"
                if data.get("status") == "interrupted"
                else "suspended"
                if kind == "run_suspended"
                else "stopped"
            )
            visit = None
        if visit is not None and kind in _IN_A_VISIT:
            visit["children"].append(entry)
        else:
            children.append(entry)
    _drop_private(children)
    usage = {u.agent: _usage(_fields(u)) for u in ledger.usage(task_id)}
    total = {
        key: round(sum(u[key] for u in usage.values()), 6)
        if key != "estimated"
        else any(u[key] for u in usage.values())
        for key in USAGE_KEYS
    }
    start = task.started_at or task.created_at
    return {
        "kind": "task",
        "task_id": task.id,
        "project_id": task.project_id,
        # Which team definition ran it (name, version, digest, source); None: recorded
        # before teams were, the built-in team.
        "team": task.team,
        "thread_id": task.thread_id,
        "input": task.input,
        "status": task.status,
        "stop_reason": task.stop_reason,
        "answer": task.answer,
        "models": task.models,
        "topology": task.topology or {"kind": "structured"},
        "start": _iso(start),
        "end": _iso(task.finished_at),
        "duration_s": _seconds(start, task.finished_at),
        "usage": {"total": total, "agents": usage},
        "children": children,
    }


def _fields(record: Any) -> dict[str, Any]:
    return {key: getattr(record, key) for key in USAGE_KEYS}


def _drop_private(nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        node.pop("_start", None)
        _drop_private(node.get("children", []))


# -- the terminal view -----------------------------------------------------------------


def _short(text: Any, limit: int = _TEXT_CHARS) -> str:
    value = " ".join(str(text or "").split())
    return escape(value if len(value) <= limit else value[: limit - 1] + "…")


def model_call_markup(
    kind: str, fields: Mapping[str, Any], text: Callable[[Any], str] = _short
) -> str:
    """A model call's retry (``model_retry``) or failure (``model_error``) in rich markup,
    so that ``relaygraph trace`` and a run's live progress say it in the same words.

    Args:
        kind: ``model_retry`` or ``model_error``.
        fields: The event, or its timeline node: ``role``, ``model``, ``attempt``,
            ``error``, ``wait_seconds``.
        text: Makes a free-text field (the model, the error) safe markup; by default
            shortened on one line, as the timeline shows it.

    Raises:
        ValueError: ``kind`` is neither.
    """
    if kind == "model_retry":
        wait = fields.get("wait_seconds") or 0
        return (
            f"[yellow]retry[/] {fields.get('role')}'s model call (attempt "
            f"{fields.get('attempt')}, {text(fields.get('error'))}; waiting {wait:g} s)"
        )
    if kind == "model_error":
        return (
            f"[bold red]model call failed[/] ({fields.get('role')}, "
            f"{text(fields.get('model'))}): {text(fields.get('error'))}"
        )
    raise ValueError(f"not a model call's retry or failure: {kind!r}")


def _offset(start: datetime | None, at: str | None) -> str:
    if start is None or at is None:
        return "      "
    return f"+{(datetime.fromisoformat(at) - start).total_seconds():6.2f}s"


def _tokens(usage: Mapping[str, Any]) -> str:
    return f"{usage.get('input_tokens', 0) + usage.get('output_tokens', 0):,} tokens"


def _label(node: Mapping[str, Any], start: datetime | None) -> str:
    kind = node["kind"]
    when = f"[dim]{_offset(start, node.get('at') or node.get('start'))}[/]"
    if kind == "route":
        if node["to"] == FINISH:
            return f"{when} [cyan]route[/] supervisor → FINISH [dim]({_short(node['reason'])})[/]"
        stopped = "" if node.get("carried_out", True) else " [yellow](not carried out)[/]"
        return (
            f"{when} [cyan]route[/] supervisor → [bold]{node['to']}[/]: {_short(node['task'])}"
            f" [dim]({_short(node['reason'])})[/]{stopped}"
        )
    if kind == "handoff":
        stopped = "" if node.get("carried_out", True) else " [yellow](not carried out)[/]"
        return (
            f"{when} [magenta]handoff[/] [bold]{node['from']}[/] → [bold]{node['to']}[/]: "
            f"{_short(node['task'])} [dim]({_short(node['reason']) or 'no reason given'})[/]"
            f"{stopped}"
        )
    if kind == "agent":
        usage = node["usage"]
        duration = f"{node['duration_s']:.2f} s" if node["duration_s"] is not None else "unfinished"
        return (
            f"{when} [bold green]{node['agent']}[/] {duration} · {_tokens(usage)} · "
            f"{usage['model_calls']} model calls · {usage['tool_calls']} tool calls · "
            f"{node['ended'] or 'running'}"
        )
    if kind == "tool":
        outcome = node.get("outcome") or node.get("status") or ""
        ok = {
            "ok": "[green]ok[/]",
            "success": "[green]ok[/]",
            "pending": "[yellow]pending[/]",
            "held": "[yellow]held for approval[/]",
        }.get(outcome, f"[red]{outcome}[/]")
        args = json.dumps(node.get("args"), ensure_ascii=False) if node.get("args") else ""
        edited = " [yellow](arguments edited by a person)[/]" if "model_args" in node else ""
        return f"{when} [magenta]{node['tool']}[/]({_short(args, 60)}) {ok}{edited}"
    if kind in ("violation", "budget_hit"):
        what = "budget hit" if kind == "budget_hit" else node["violation"]
        return f"{when} [bold red]{what}[/] ({node['agent']}): {_short(node['detail'])}"
    if kind == "interrupted":
        detail = node.get("tool") or node.get("detail") or ""
        return f"{when} [yellow]waiting for {node['waits_for']}[/]: {_short(detail)}"
    if kind == "approval":
        reason = f" ({_short(node['reason'])})" if node.get("reason") else ""
        person_args = node.get("args")
        ran = (
            f", run with {_short(json.dumps(person_args, ensure_ascii=False), 60)}"
            if person_args
            else ""
        )
        return (
            f"{when} approval of {node['agent']}'s {node['tool']}: {node['decision']}{ran}{reason}"
        )
    if kind in ("model_retry", "model_error"):
        return f"{when} {model_call_markup(kind, node)}"
    if kind == "run_finished":
        return f"{when} [dim]run finished: {node['status']}[/]"
    if kind == "run_suspended":
        reason = f": {_short(node['reason'])}" if node.get("reason") else ""
        later = "[dim](to be continued from its checkpoint)[/]"
        return f"{when} [yellow]run suspended[/]{reason} {later}"
    if kind == "run_started":
        return f"{when} [dim]run started[/]"
    if kind == "cancel_requested":
        return f"{when} [yellow]cancel asked[/] by {_short(node['by'])} (via {node['via']})"
    return f"{when} [dim]{escape(str(kind))}[/]"


def _team_label(team: Mapping[str, Any]) -> str:
    """``docs-review v3 (sha256:0123456789ab)``: the team, its version and digest."""
    label = escape(str(team.get("name") or "?"))
    if team.get("version") is not None:
        label += f" v{team['version']}"
    digest = str(team.get("digest") or "")
    if digest:
        label += f" [dim]({escape(digest[:19])})[/]"
    if team.get("source"):
        label += f" [dim]from {escape(str(team['source']))}[/]"
    return label


def render_timeline(timeline: Mapping[str, Any]) -> Tree:
    """The timeline as a rich tree for the terminal: one line per route, visit, tool,
    handoff, violation, model call retry or failure and run mark, with its offset from the
    task's start."""
    start = datetime.fromisoformat(timeline["start"]) if timeline.get("start") else None
    total = timeline["usage"]["total"]
    duration = timeline.get("duration_s")
    header = (
        f"[bold]task {timeline['task_id']}[/] {timeline['status']}"
        + (f" · {duration:.2f} s" if duration is not None else "")
        + f" · {_tokens(total)} · {total['model_calls']} model calls"
        + f" · thread {timeline['thread_id']}"
    )
    kind = (timeline.get("topology") or {}).get("kind", "structured")
    if kind != "structured":
        header += f" · {kind}"
    team = timeline.get("team")
    if team:
        header += f"\n[dim]team[/] {_team_label(team)}"
    if timeline.get("stop_reason"):
        header += f"\n[yellow]stop reason:[/] {_short(timeline['stop_reason'])}"
    tree = Tree(header)

    def add(branch: Tree, nodes: list[Mapping[str, Any]]) -> None:
        for node in nodes:
            child = branch.add(_label(node, start))
            add(child, node.get("children", []))

    add(tree, timeline["children"])
    return tree
