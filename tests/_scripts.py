"""Scripts of the scripted model (``scripted:`` specs) built from named turns, not written
out as JSON in every test.

A script maps each role to the turns its model plays in order: a route of the structured
supervisor (:func:`route`), a tool call (:func:`call`) or a reply (:func:`say`).
:func:`one_visit` is the commonest whole script: the supervisor hands one agent one task.
"""

from __future__ import annotations

from typing import Any

from relaygraph.supervisor import FINISH

__all__ = [
    "COUNTED_BY_THE_REVIEWER",
    "REFUSED_RUN_PYTHON",
    "Turn",
    "call",
    "one_visit",
    "route",
    "say",
]

Turn = dict[str, Any]
"""One turn of a role's model in a script."""


def route(next: str, task: str = "do it", reason: str = "because") -> Turn:
    """The structured supervisor's route to ``next`` (``FINISH`` carries no task)."""
    return {"route": {"next": next, "task": task if next != FINISH else "", "reason": reason}}


def call(tool: str, /, **args: Any) -> Turn:
    """A turn calling ``tool`` with ``args``."""
    return {"tool_calls": [{"name": tool, "args": args}]}


def say(text: str) -> Turn:
    """A turn replying ``text``."""
    return {"content": text}


def one_visit(
    agent: str,
    task: str,
    reason: str,
    *turns: Turn,
    finished: str = "done",
    final: str | None = None,
) -> dict[str, list[Turn]]:
    """The script in which the supervisor routes ``task`` to ``agent`` (for ``reason``), the
    agent plays ``turns``, and the supervisor then finishes (for ``finished``); finalize,
    when ``final`` is given, answers it."""
    script = {"supervisor": [route(agent, task, reason), route(FINISH, reason=finished)]}
    script[agent] = list(turns)
    if final is not None:
        script["finalize"] = [say(final)]
    return script


COUNTED_BY_THE_REVIEWER = one_visit(
    "reviewer",
    "count",
    "a draft exists",
    call("word_count", text="x y z"),
    say("Counted."),
    finished="counted",
    final="Done.",
)
"""A reviewer (of a team that gives it a ``word_count`` tool) counts the words of a draft."""

REFUSED_RUN_PYTHON = one_visit(
    "researcher",
    "Look it up",
    "facts first",
    call("run_python", code="print(6 * 7)"),
    say("I may not run code here; the docs say a checkpoint follows each super-step."),
    finished="the researcher answered",
    final="A checkpoint is written after every super-step.",
)
"""The researcher calls ``run_python``, which it is not allowed: a refused tool (one
``tool_not_allowed`` violation), and the team still answers."""
