"""The task page's *Model calls*: each call's messages, reply, tokens, cost and latency,
read from its ``model_call`` event (the record the ledger's usage rows were made from)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relaygraph.store import Event


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallView:
    """One model call as the page shows it: the event's fields, as recorded."""

    seq: int
    """The event's place in the task's events (the timeline's order)."""
    at: datetime
    role: str
    model: str
    messages: tuple[dict[str, Any], ...]
    reply: dict[str, Any] | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    estimated: bool
    truncated: bool
    redacted: bool


def model_calls_of(events: Iterable[Event]) -> tuple[ModelCallView, ...]:
    """The task's model calls, in the order they ended."""
    calls = []
    for event in events:
        if event.type != "model_call":
            continue
        data = event.data
        usage = data.get("usage") or {}
        calls.append(
            ModelCallView(
                seq=event.seq,
                at=event.created_at,
                role=str(data.get("role") or ""),
                model=str(data.get("model") or ""),
                messages=tuple(m for m in data.get("messages") or [] if isinstance(m, dict)),
                reply=data.get("reply") if isinstance(data.get("reply"), dict) else None,
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
                cost_usd=float(usage.get("cost_usd", 0.0)),
                seconds=float(usage.get("seconds", 0.0)),
                estimated=bool(usage.get("estimated", False)),
                truncated=bool(data.get("truncated", False)),
                redacted=bool(data.get("redacted", False)),
            )
        )
    return tuple(calls)
