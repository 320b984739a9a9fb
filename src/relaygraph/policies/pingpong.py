"""Ping-pong and repetition: work bouncing between two agents, the same task sent twice,
the same tool call made twice. Pure functions over the task's record."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PingPong", "bounces", "detect_ping_pong", "normalize_call", "normalize_task"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PingPong:
    """Two agents passing work back and forth, or one agent sent the same task again."""

    agents: tuple[str, ...]
    bounces: int
    detail: str

    @property
    def stop_reason(self) -> str:
        return f"ping_pong: {self.detail}"


def bounces(sequence: Sequence[str]) -> tuple[tuple[str, str] | None, int]:
    """The pair at the end of ``sequence`` that alternates, and how often work came back.

    ``A, B`` is a pass, not a bounce; ``A, B, A`` is one bounce; ``A, B, A, B`` two.
    """
    if len(sequence) < 2 or sequence[-1] == sequence[-2]:
        return None, 0
    a, b = sequence[-2], sequence[-1]
    length = 2
    # Walking back from the end the run reads b, a, b, a, ...: an even number of elements
    # already taken means the next one back must be ``b``.
    while length < len(sequence) and sequence[-length - 1] == (b if length % 2 == 0 else a):
        length += 1
    return (a, b), length - 2


def normalize_task(task: str) -> str:
    return " ".join(task.casefold().split())


def detect_ping_pong(
    visited: Sequence[str],
    candidate: str,
    *,
    max_bounces: int,
    task: str | None = None,
    earlier_tasks: Sequence[tuple[str, str]] = (),
) -> PingPong | None:
    """Whether sending ``candidate`` next would be a ping-pong.

    Args:
        visited: The agents that ran for this request, in order.
        candidate: The agent about to receive the work.
        max_bounces: Bounces allowed between the same pair before it counts.
        task: The task ``candidate`` would get (checked against ``earlier_tasks``).
        earlier_tasks: ``(agent, task)`` of the routes already taken for this request.
    """
    if task is not None:
        wanted = normalize_task(task)
        if any(a == candidate and normalize_task(t) == wanted for a, t in earlier_tasks):
            return PingPong(
                agents=(candidate,),
                bounces=0,
                detail=f"{candidate!r} was already sent the same task: {task!r}",
            )
    pair, count = bounces([*visited, candidate])
    if pair is not None and count > max_bounces:
        return PingPong(
            agents=pair,
            bounces=count,
            detail=f"{pair[0]} and {pair[1]} passed the work back and forth {count} times "
            f"(max_bounces = {max_bounces})",
        )
    return None


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        # Only the whitespace around a value: inside one it can matter ("a  b" written to a
        # file, indentation or a string literal in code), so those calls are different.
        return value.strip()
    if isinstance(value, Mapping):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalize(v) for v in value]
    return value


def normalize_call(name: str, args: Mapping[str, Any]) -> str:
    """A key equal for calls of the same tool with the same arguments, whatever the key order
    or the whitespace around string arguments."""
    return f"{name}:{json.dumps(_normalize(args), sort_keys=True, ensure_ascii=False)}"
