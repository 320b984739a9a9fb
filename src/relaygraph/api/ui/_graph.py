"""The handoff graph: the agents as nodes, each transfer of work as a numbered edge.

Built from the ledger's record of a task: its handoffs (every transfer carried out, with
the tokens spent when the work moved) and its events (transfers a limit or the ping-pong
detector stopped, and which transfer tripped the detector). The layout is computed here,
in plain numbers, and drawn as SVG by the template: the supervisor on top, the agents in a
row below, routes coming down from the supervisor and direct handoffs as arcs under the row.
The row grows wider with the team (a node's box never overlaps the next), a name too long
for its box is cut (the template gives the whole name as the node's tooltip), and the
drawing is as tall as its deepest arc.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from relaygraph._names import SUPERVISOR
from relaygraph.events import is_carried_out, transfer_of
from relaygraph.handoffs import handoff_target
from relaygraph.store import Event, HandoffEntry

WIDTH = 760
"""The width of a team of up to five agents; a larger team's row is wider."""
NODE_W = 124
"""The boxes' least width; they grow, all alike, to fit the longest name up to NODE_W_MAX."""
NODE_W_MAX = 210
NODE_H = 36
NODE_GAP = 26
"""The least space between two agents' boxes in the row."""
TOP_Y = 46
ROW_Y = 190
MARGIN_X = 80
BOTTOM_PAD = 14
BADGE_R = 11
"""The radius of an edge's number badge (the template draws it)."""
LABEL_PAD = 12
"""Space kept free on each side of a node's name inside its box."""
ROUTE_SPREAD = 44
"""Sideways distance between two routes to the same agent."""
ARC_DEPTH = 50
ARC_STEP = 48
"""How much deeper each further arc between the same two agents bends."""
ARC_INSET = 9


@dataclass(frozen=True, kw_only=True, slots=True)
class Transfer:
    """One transfer of work, as the graph and its list show it."""

    number: int
    """Its place in the task's order of transfers, from 1."""
    kind: Literal["route", "direct"]
    source: str
    target: str
    task: str
    reason: str
    step: int | None
    tokens_so_far: int | None
    """Input plus output tokens the task had used when the work moved."""
    carried_out: bool
    """False when a limit or the ping-pong detector stopped it: no work moved."""
    ping_pong: str | None
    """What the ping-pong detector said, when this transfer tripped it."""
    event_seq: int
    refused: bool = False
    """A handoff the policy refused (the agent called a handoff tool it may not use)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    name: str
    label: str
    """The name as drawn: cut with "…" when the whole name would not fit in the box."""
    x: float
    y: float
    supervisor: bool
    ran: bool
    """Whether it worked or any work reached it (a node that did neither is drawn faded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Edge:
    transfer: Transfer
    path: str
    """The SVG path's ``d``."""
    label_x: float
    label_y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class HandoffGraph:
    width: int
    height: int
    node_width: int
    node_height: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]

    @property
    def wide(self) -> bool:
        """Wider than a team of five: the page puts the edge details below it."""
        return self.width > WIDTH


def transfers_of(handoffs: Sequence[HandoffEntry], events: Sequence[Event]) -> list[Transfer]:
    """Every transfer of the task in order: those carried out (from the ledger's handoffs)
    and those stopped (from the events), each ping-pong marked on the transfer it stopped
    or let through."""
    found: list[tuple[int, dict[str, object]]] = [
        (
            h.event_seq,
            {
                "kind": h.kind,
                "source": h.source,
                "target": h.target,
                "task": h.task,
                "reason": h.reason,
                "step": h.step,
                "tokens_so_far": h.tokens_so_far,
                "carried_out": True,
            },
        )
        for h in handoffs
    ]
    bounces: dict[int, str] = {}
    pending: dict[str, str] = {}
    for event in events:
        data = event.data
        if event.type == "violation" and data.get("kind") == "ping_pong":
            # The detector names the agent the work was about to go to; the transfer to
            # it that follows is the bounce.
            pending[str(data.get("agent"))] = str(data.get("detail") or "ping-pong")
            continue
        if event.type == "tool_result" and not data.get("ran", True):
            target = handoff_target(str(data.get("tool") or ""))
            if target is not None:  # A refused handoff: no transfer event, only its answer.
                found.append((event.seq, _refused(str(data.get("agent")), target, data)))
            continue
        transfer = transfer_of(event.data)
        if transfer is None:
            continue
        if transfer["target"] in pending:
            bounces[event.seq] = pending.pop(transfer["target"])
        if not is_carried_out(event.data):
            # Carried-out transfers are the ledger's handoff rows (above), made from the
            # same record; a stopped one is only in its event.
            stopped = event.data.get("tokens_so_far")
            found.append(
                (
                    event.seq,
                    {**transfer, "tokens_so_far": stopped, "carried_out": False},
                )
            )
    found.sort(key=lambda item: item[0])
    return [
        Transfer(
            number=n,
            kind="route" if fields["kind"] == "route" else "direct",
            source=str(fields["source"]),
            target=str(fields["target"]),
            task=str(fields["task"]),
            reason=str(fields["reason"]),
            step=_whole(fields["step"]),
            tokens_so_far=_whole(fields["tokens_so_far"]),
            carried_out=bool(fields["carried_out"]),
            ping_pong=bounces.get(seq),
            event_seq=seq,
            refused=bool(fields.get("refused")),
        )
        for n, (seq, fields) in enumerate(found, start=1)
    ]


def _refused(agent: str, target: str, data: dict[str, object]) -> dict[str, object]:
    return {
        "kind": "direct",
        "source": agent,
        "target": target,
        "task": "",
        "reason": str(data.get("preview") or "refused by the policy"),
        "step": None,
        "tokens_so_far": None,
        "carried_out": False,
        "refused": True,
    }


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def layout(
    roster: Sequence[str], transfers: Sequence[Transfer], ran: Iterable[str] = ()
) -> HandoffGraph:
    """Place the nodes and draw the edges.

    Args:
        roster: The team's agents, in the policy's order (each gets a node, used or not).
        transfers: The task's transfers, in order.
        ran: The agents that had a visit: in a swarm the first agent works without any
            transfer to it, and is drawn as having worked.
    """
    agents = [name for name in roster if name != SUPERVISOR]
    for t in transfers:
        for name in (t.source, t.target):
            if name != SUPERVISOR and name not in agents:
                agents.append(name)
    reached = {t.target for t in transfers if t.carried_out} | set(ran)
    with_supervisor = any(
        t.kind == "route" or SUPERVISOR in (t.source, t.target) for t in transfers
    )
    # Up to five agents share the usual width; each further one widens the row by a box
    # and a gap, so that boxes never overlap and the drawing keeps its scale.
    # The boxes are as wide as the longest name needs, within bounds, so that a team's
    # names are cut only where they would not fit even then.
    node_w = min(
        NODE_W_MAX,
        max([NODE_W, *(math.ceil(text_width(name)) + 2 * LABEL_PAD for name in agents)]),
    )
    margin = max(MARGIN_X, node_w / 2 + NODE_GAP / 2)
    step = node_w + NODE_GAP
    width = max(WIDTH, round(2 * margin + (len(agents) - 1) * step))
    nodes: dict[str, Node] = {}
    if with_supervisor or not transfers:
        nodes[SUPERVISOR] = _node(
            SUPERVISOR, width / 2, TOP_Y, supervisor=True, ran=True, node_w=node_w
        )
    span = width - 2 * margin
    for i, name in enumerate(agents):
        x = width / 2 if len(agents) == 1 else margin + i * span / (len(agents) - 1)
        nodes[name] = _node(name, x, ROW_Y, supervisor=False, ran=name in reached, node_w=node_w)

    same_route: dict[str, list[Transfer]] = {}
    same_pair: dict[frozenset[str], list[Transfer]] = {}
    for t in transfers:
        if t.source == SUPERVISOR:
            same_route.setdefault(t.target, []).append(t)
        else:
            same_pair.setdefault(frozenset((t.source, t.target)), []).append(t)
    edges = []
    for t in transfers:
        a, b = nodes[t.source], nodes[t.target]
        if t.source == SUPERVISOR:
            group = same_route[t.target]
            k = group.index(t) - (len(group) - 1) / 2
            start, end = (a.x, a.y + NODE_H / 2), (b.x, b.y - NODE_H / 2)
            mid = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
            control = (mid[0] + k * ROUTE_SPREAD, mid[1])
        elif t.target == SUPERVISOR:  # A swarm agent handing back to a supervisor: rare.
            start, end = (a.x, a.y - NODE_H / 2), (b.x, b.y + NODE_H / 2)
            control = ((start[0] + end[0]) / 2 - 30, (start[1] + end[1]) / 2)
        else:
            k = same_pair[frozenset((t.source, t.target))].index(t)
            # Each further arc between the same two agents leaves and arrives a little
            # further in, so that its arrowhead does not cover the others'.
            inward = ARC_INSET * min(k, 4) * (1 if b.x > a.x else -1)
            start = (a.x + inward, a.y + NODE_H / 2)
            end = (b.x - inward, b.y + NODE_H / 2)
            # Every further arc bends deeper, however many there are: a long ping-pong's
            # arcs never lie on one another (the drawing grows as deep as the last).
            control = ((a.x + b.x) / 2, a.y + NODE_H / 2 + ARC_DEPTH + k * ARC_STEP)
        path = "M{:.1f},{:.1f} Q{:.1f},{:.1f} {:.1f},{:.1f}".format(*start, *control, *end)
        # The quadratic curve's midpoint, where the number sits: for an arc under the row
        # (its ends level) also its lowest point.
        label = (
            0.25 * start[0] + 0.5 * control[0] + 0.25 * end[0],
            0.25 * start[1] + 0.5 * control[1] + 0.25 * end[1],
        )
        edges.append(Edge(transfer=t, path=path, label_x=label[0], label_y=label[1]))
    lowest = max([ROW_Y + NODE_H / 2, *(e.label_y + BADGE_R for e in edges)])
    return HandoffGraph(
        width=width,
        height=math.ceil(lowest + BOTTOM_PAD),
        node_width=node_w,
        node_height=NODE_H,
        nodes=tuple(nodes.values()),
        edges=tuple(edges),
    )


def _node(name: str, x: float, y: float, *, supervisor: bool, ran: bool, node_w: float) -> Node:
    return Node(
        name=name,
        label=fitted(name, node_w - 2 * LABEL_PAD),
        x=x,
        y=y,
        supervisor=supervisor,
        ran=ran,
    )


# Widths in pixels of the node font (14 px, bold, a system sans-serif), rounded up, so that
# a name is cut before it could leave its box; the browser test measures the real text.
_NARROW, _WIDE, _CAPITAL, _OTHER, _ELLIPSIS = 5.0, 13.5, 11.0, 9.0, 14.0


def _char_width(char: str) -> float:
    if char in "fijlrtI-.":
        return _NARROW
    if char in "mwMW":
        return _WIDE
    return _CAPITAL if char.isupper() else _OTHER


def text_width(text: str) -> float:
    """How wide ``text`` is drawn in a node, at most (an estimate that errs wide)."""
    return sum(_ELLIPSIS if char == "…" else _char_width(char) for char in text)


def fitted(name: str, room: float) -> str:
    """``name``, or as much of it as fits in ``room`` pixels followed by "…"."""
    if text_width(name) <= room:
        return name
    cut = name
    while cut and text_width(cut) + _ELLIPSIS > room:
        cut = cut[:-1]
    return cut + "…"
