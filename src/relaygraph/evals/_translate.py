"""Play a structured team's script in the other topologies, so one golden set compares all three.

A golden case's script is written for the structured team: ``supervisor`` routes, each
agent's turns, ``finalize``'s answer. The same conversation in the other topologies:

- ``supervisor-tools``: each route becomes a ``transfer_to_<agent>`` tool call with the same
  task and reason; ``FINISH`` becomes the supervisor's final message, with finalize's answer.
  A route's plan (``then``) becomes one such call per planned step, in order.
- ``swarm``: there is no supervisor. The first route names the starting agent; where the
  supervisor routed from one agent to the next, the agent's last turn of that visit becomes a
  ``transfer_to_<next>`` call with the route's task; the last agent ends with finalize's
  answer. A visit is simulated as the team runs it: an agent's turns up to its first answer
  (or its direct handoff, whose target's visit follows).

Turns that are not routes (a supervisor script testing repair) are kept as they are, and
whatever the simulation cannot place (a script cut short by a budget) stays unchanged: the
run then shows how that topology handles it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaygraph._names import FINALIZE, FINISH, HANDOFF_PREFIX, SUPERVISOR

Turns = dict[str, list[dict[str, Any]]]


def _route(turn: dict[str, Any]) -> dict[str, Any] | None:
    route = turn.get("route")
    return route if isinstance(route, dict) and isinstance(route.get("next"), str) else None


def one_route_per_turn(supervisor: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The supervisor's turns with each plan (a route's ``then``) played as routes of their
    own, one per step with the planning route's reason: the other topologies' supervisors
    (and the swarm's agents) have no plans."""
    played: list[dict[str, Any]] = []
    for turn in supervisor:
        route = _route(turn)
        steps = route.get("then") if route is not None else None
        if route is None or not isinstance(steps, list) or not steps:
            played.append(turn)
            continue
        played.append({**turn, "route": {k: v for k, v in route.items() if k != "then"}})
        for step in steps:
            agent, _, task = str(step).partition(":")
            played.append(
                {
                    "route": {
                        "next": agent.strip(),
                        "task": task.strip(),
                        "reason": route.get("reason", ""),
                    }
                }
            )
    return played


def _with_usage(turn: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return {**new, "usage": turn["usage"]} if "usage" in turn else new


def _answers(turns: Turns) -> list[str]:
    return [t["content"] for t in turns.get(FINALIZE, []) if isinstance(t.get("content"), str)]


def to_supervisor_tools(turns: Turns) -> Turns:
    out = {k: copy.deepcopy(v) for k, v in turns.items() if k != FINALIZE}
    answers = iter(_answers(turns))
    played = []
    for turn in one_route_per_turn(turns.get(SUPERVISOR, [])):
        route = _route(turn)
        if route is None:
            played.append(copy.deepcopy(turn))
        elif route["next"] == FINISH:
            answer = next(answers, route.get("reason") or "Done.")
            played.append(_with_usage(turn, {"content": answer}))
        else:
            call = {
                "name": f"{HANDOFF_PREFIX}{route['next']}",
                "args": {"task": route.get("task", ""), "reason": route.get("reason", "")},
            }
            played.append(_with_usage(turn, {"tool_calls": [call]}))
    out[SUPERVISOR] = played
    return out


def _visit_end(turns: Turns, cursors: dict[str, int], agent: str) -> tuple[str, int] | None:
    """Play ``agent``'s visit (and the visits it hands off to); the agent and index of the
    turn that ended the chain with an answer, or None if the script runs out."""
    for _ in range(100):  # A chain of handoffs; bounded against a script that loops.
        own = turns.get(agent, [])
        while cursors.get(agent, 0) < len(own):
            index = cursors.get(agent, 0)
            cursors[agent] = index + 1
            turn = own[index]
            calls = turn.get("tool_calls") or []
            handoff = next(
                (c["name"] for c in calls if str(c.get("name", "")).startswith(HANDOFF_PREFIX)),
                None,
            )
            if handoff is not None:
                agent = handoff.removeprefix(HANDOFF_PREFIX)
                break
            if not calls:
                return agent, index
        else:
            return None
    return None


def to_swarm(turns: Turns, agents: Sequence[str] | None = None) -> tuple[Turns, str | None]:
    """The swarm's script, and the agent it starts with (the first route's).

    Routes to an agent the team does not have (a script testing the supervisor's repair)
    have no counterpart in a swarm and are left out: ``agents`` are the team's (None: any
    key of the script other than the supervisor and finalize).
    """
    out = {k: copy.deepcopy(v) for k, v in turns.items() if k not in (SUPERVISOR, FINALIZE)}
    supervisor = one_route_per_turn(turns.get(SUPERVISOR, []))
    routes = [r for t in supervisor if (r := _route(t)) is not None]
    known = set(agents) if agents is not None else set(out)
    targets = [r for r in routes if r["next"] in known]
    if not targets:
        return out, None
    answers = _answers(turns)
    cursors: dict[str, int] = {}
    for i, route in enumerate(targets):
        end = _visit_end(out, cursors, route["next"])
        if end is None:
            break
        agent, index = end
        turn = out[agent][index]
        if i + 1 < len(targets):
            following = targets[i + 1]
            call = {
                "name": f"{HANDOFF_PREFIX}{following['next']}",
                "args": {"task": following.get("task", ""), "reason": following.get("reason", "")},
            }
            out[agent][index] = _with_usage(turn, {"tool_calls": [call]})
        elif answers:
            out[agent][index] = _with_usage(turn, {"content": answers[0]})
    return out, targets[0]["next"]


def translate_script(
    path: Path, kind: str, folder: Path, agents: Sequence[str] | None = None
) -> tuple[Path, str | None]:
    """Write ``path``'s script as played in topology ``kind`` into ``folder``.

    Returns:
        The translated file, and the swarm's starting agent (None for other topologies).
    """
    turns: Turns = json.loads(path.read_text(encoding="utf-8"))
    start: str | None = None
    if kind == "swarm":
        turns, start = to_swarm(turns, agents)
    elif kind == "supervisor-tools":
        turns = to_supervisor_tools(turns)
    text = json.dumps(turns, indent=1, ensure_ascii=False)
    digest = hashlib.sha256(f"{path.resolve()}\n{kind}\n{text}".encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{path.stem}.{kind}.{digest}.json"
    if not target.exists():  # Named by content: concurrent runs write the same bytes.
        partial = folder / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    return target, start
