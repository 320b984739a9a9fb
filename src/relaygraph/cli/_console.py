"""Human-readable progress on stderr and the result on stdout, with rich."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from relaygraph._names import FINISH
from relaygraph.events import is_carried_out
from relaygraph.runner import RunResult
from relaygraph.tracing import model_call_markup

_ARGS_CHARS = 120
# How a visit that did not simply finish ended (events.VisitEnded), said after its figures.
_ENDED_NOTES = {
    "budget": " [yellow]— its budget ran out[/]",
    "model_error": " [red]— its model call failed[/]",
}


def _args(args: Any) -> str:
    text = json.dumps(args, ensure_ascii=False)
    return text if len(text) <= _ARGS_CHARS else text[:_ARGS_CHARS] + "…"


def _whole(value: Any) -> str:
    """A field's text as markup, uncut (the timeline shortens it)."""
    return escape(str(value))


class ProgressPrinter:
    """Prints each team event as it happens, on stderr, so stdout stays clean."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)

    def __call__(self, event: dict[str, Any]) -> None:
        kind, say = event.get("type"), self.console.print
        if kind == "run_started":
            models = sorted(set(event["models"].values()))
            say(
                f"[bold]relaygraph[/] task {event['task_id']} · thread {event['thread_id']} "
                f"· model {escape(', '.join(models))}"
            )
        elif kind == "route":
            note = " [yellow](repaired)[/]" if event.get("repaired") else ""
            if not is_carried_out(event):
                note += " [yellow](not carried out)[/]"
            if event.get("fallback"):
                say(
                    f"[yellow]supervisor output invalid twice ({escape(str(event['error']))});"
                    " finishing with what exists[/]"
                )
            elif event["next"] == FINISH:
                say(f"[bold cyan]supervisor[/] → FINISH: {escape(event['reason'])}{note}")
            else:
                say(
                    f"[bold cyan]supervisor[/] → [bold]{event['next']}[/]: "
                    f"{escape(event['task'])} [dim]({escape(event['reason'])})[/]{note}"
                )
        elif kind == "agent_started":
            say(f"  [bold green]{event['agent']}[/] is working")
        elif kind == "tool_call":
            say(
                f"    {event['agent']} calls [magenta]{event['tool']}[/]"
                f"({escape(_args(event['args']))})"
            )
        elif kind == "tool_result" and event.get("status") == "error":
            say(f"    [red]{event['tool']} refused:[/] {escape(event['preview'])}")
        elif kind == "handoff":
            stopped = "" if is_carried_out(event) else " [yellow](not carried out)[/]"
            say(
                f"  [bold green]{event['source']}[/] hands off to [bold]{event['target']}[/]: "
                f"{escape(event['task'])} [dim]({escape(event['reason'] or 'no reason given')})[/]"
                f"{stopped}"
            )
        elif kind == "agent_finished":
            usage = event["usage"]
            say(
                f"  [green]{event['agent']}[/] done ({usage['model_calls']} model calls, "
                f"{usage['tool_calls']} tool calls)" + _ENDED_NOTES.get(event["ended"], "")
            )
        elif kind == "violation":
            say(f"    [bold red]{event['kind']}[/] ({event['agent']}): {escape(event['detail'])}")
        elif kind == "approval":
            edited = event.get("args")
            say(
                f"    approval for {event['agent']}'s {event['tool']}: [bold]{event['decision']}[/]"
                + (f", run as {event['tool']}({escape(_args(edited))})" if edited else "")
                + (f" ({escape(event['reason'])})" if event.get("reason") else "")
            )
        elif kind == "interrupted":
            if event.get("waits_for") == "approval":
                say(
                    f"[bold yellow]waiting for approval:[/] {event['agent']} wants to run "
                    f"[magenta]{event['tool']}[/]({escape(_args(event['args']))})"
                )
            else:
                say(f"[bold yellow]waiting for a decision:[/] {escape(str(event.get('detail')))}")
        elif kind in ("model_retry", "model_error"):
            say(f"    {model_call_markup(kind, event, text=_whole)}")
        elif kind == "structured_method":
            say(
                f"    {escape(str(event.get('model')))} answers structured output with "
                f"[bold]{event.get('method')}[/] (refused: "
                f"{', '.join(event.get('rejected') or []) or 'none'})"
            )
        elif kind == "run_finished" and event["status"] not in ("succeeded",):
            say(f"[yellow]status {event['status']}[/]: {escape(str(event['stop_reason']))}")


def print_result(result: RunResult) -> None:
    """The answer and artifacts on stdout."""
    out = Console(highlight=False)
    if result.answer:
        out.print(escape(result.answer))
    if result.artifacts:
        out.print(f"\nArtifacts ({result.task_id}): " + ", ".join(result.artifacts))
    if result.status == "interrupted":
        out.print(
            f"Task {result.task_id} is waiting: {escape(str(result.stop_reason))}\n"
            f"Continue with: relaygraph resume {result.task_id} --approve | --reject "
            "[--reason TEXT] | --edit ARGS_JSON"
        )
        return
    if result.violations:
        out.print(
            "\nViolations: "
            + "; ".join(
                f"{v['kind']} ({v['agent']}): {escape(v['detail'])}" for v in result.violations
            )
        )
    kind = result.topology.get("kind", "structured")
    again = f"--thread {result.thread_id}" + (f" --topology {kind}" if kind != "structured" else "")
    out.print(
        f"\n[dim]status {result.status} · thread {result.thread_id} (continue with {again})[/]"
    )
