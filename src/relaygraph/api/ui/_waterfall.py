"""The task's latency waterfall: the supervisor's and finalize's turns, the agent visits, the
tool calls and the waits for a person on one time axis, from the same records as the trace.

A visit, a tool call and a wait have their start and end in the ledger's events (the
timeline's nodes and :func:`~relaygraph.api.ui._audit.audit_of`'s waits). The supervisor and
finalize have no start event: each of their turns is reported by a ``usage`` event when it
ends, with the seconds it took, so their bar ends there and is that long.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.api.ui._audit import PersonWait
from relaygraph.store import Event

WIDTH = 1000
"""The drawing's width in its own units (the page scales it)."""
LABEL_W = 190
ROW_H = 22
AXIS_H = 26
TICKS = 5

BarKind = Literal["supervisor", "finalize", "agent", "tool", "wait"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Bar:
    kind: BarKind
    label: str
    start_s: float
    """Seconds after the task started."""
    end_s: float
    seq: int | None
    """The timeline node it stands for (the page links to it); None for a turn or a wait."""

    @property
    def seconds(self) -> float:
        return round(self.end_s - self.start_s, 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Waterfall:
    bars: tuple[Bar, ...]
    total_s: float
    """The axis' length: the task's duration, or until its last bar while it runs."""

    @property
    def height(self) -> int:
        return AXIS_H + ROW_H * len(self.bars) + 6

    def x(self, seconds: float) -> float:
        """Where ``seconds`` after the start is drawn."""
        span = WIDTH - LABEL_W - 10
        return LABEL_W + (span * seconds / self.total_s if self.total_s > 0 else 0)

    @property
    def ticks(self) -> tuple[float, ...]:
        return tuple(self.total_s * i / TICKS for i in range(TICKS + 1))

    @property
    def label_w(self) -> int:
        return LABEL_W


def waterfall(
    timeline: dict[str, Any], events: Iterable[Event], waits: Sequence[PersonWait]
) -> Waterfall:
    """The task's bars in the order they started."""
    if not timeline.get("start"):
        return Waterfall(bars=(), total_s=0.0)
    start = datetime.fromisoformat(timeline["start"])

    def offset(moment: datetime | str | None) -> float | None:
        if moment is None:
            return None
        at = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
        return max(0.0, (at - start).total_seconds())

    bars: list[Bar] = []
    for event in events:
        usage = event.data.get("usage") if event.type == "usage" else None
        role = usage.get("agent") if isinstance(usage, dict) else None
        if role in (SUPERVISOR, FINALIZE) and isinstance(usage, dict):
            end = offset(event.created_at) or 0.0
            took = float(usage.get("seconds") or 0.0)
            kind: BarKind = "supervisor" if role == SUPERVISOR else "finalize"
            bars.append(
                Bar(kind=kind, label=str(role), start_s=max(0.0, end - took), end_s=end, seq=None)
            )
    for node in timeline.get("children", []):
        if node.get("kind") != "agent":
            continue
        visit_start = offset(node.get("start")) or 0.0
        ends = [offset(node.get("end"))]
        for child in node.get("children", []):
            if child.get("kind") != "tool":
                continue
            tool_start = offset(child.get("start")) or visit_start
            tool_end = offset(child.get("end"))
            ends.append(tool_end or tool_start)
            if tool_end is not None:
                bars.append(
                    Bar(
                        kind="tool",
                        label=f"{node.get('agent')} · {child.get('tool')}",
                        start_s=tool_start,
                        end_s=tool_end,
                        seq=child.get("seq"),
                    )
                )
        # A visit its run stopped in has no end event: its bar reaches its last call.
        visit_end = ends[0] if ends[0] is not None else max([visit_start, *filter(None, ends)])
        bars.append(
            Bar(
                kind="agent",
                label=str(node.get("agent")),
                start_s=visit_start,
                end_s=visit_end,
                seq=node.get("seq"),
            )
        )
    for wait in waits:
        wait_start = offset(wait.start) or 0.0
        wait_end = offset(wait.end) if wait.end is not None else None
        bars.append(
            Bar(
                kind="wait",
                label=f"waiting for a person: {wait.what}"[:60],
                start_s=wait_start,
                end_s=wait_end if wait_end is not None else wait_start,
                seq=None,
            )
        )
    order = {"supervisor": 0, "agent": 1, "tool": 2, "wait": 3, "finalize": 4}
    bars.sort(key=lambda b: (b.start_s, order[b.kind]))
    total = timeline.get("duration_s") or max([0.0, *(b.end_s for b in bars)])
    return Waterfall(bars=tuple(bars), total_s=float(total))
