"""The faults the Chat Completions double injects before it answers a request: which
requests fail, and how (tests/openai_server.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

RETRIED_FAULT_KINDS = ("429", "500", "503", "timeout", "truncated")
"""The faults a client's retries may get past: an error status, no answer, a cut body."""
FAULT_KINDS = (
    *RETRIED_FAULT_KINDS,
    "empty_choices",
    "null_message",
    "not_json",
    "html",
)
"""How a faulted request is answered. The last four are 200s whose body is no answer, as
gateways and half-compatible servers send them: ``choices: []``, ``message: null``, a body that
is not JSON, an HTML error page."""
ANSWER_FAULT_KINDS = ("unfinished_stream", "broken_arguments")
"""Faults that send the script's answer altered, drawn at random only when named in
``Faults.kinds``. ``unfinished_stream`` streams the first half of the answer and ends
cleanly (``[DONE]``) with no chunk carrying a ``finish_reason``, as a proxy that loses its
upstream mid-answer may (the turn stays unplayed; a request that does not stream is answered
as usual). ``broken_arguments`` plays a tool-call turn with each call's arguments cut in
half, not JSON, as a model stopped mid-call writes them (the turn is played)."""


@dataclass(kw_only=True)
class Faults:
    """Which requests fail, and how.

    The first requests take the faults of ``sequence`` in order (None: answered); after it,
    each request fails with probability ``rate``, with a kind drawn from ``kinds``. Only
    requests for ``models`` are faulted, when given.
    """

    rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS
    sequence: list[str | None] = field(default_factory=list)
    retry_after: float = 1.0
    """The ``Retry-After`` of a 429, in seconds."""
    stall_seconds: float = 3.0
    """How long a ``timeout`` fault holds the request before hanging up (set it above the
    client's timeout)."""
    models: frozenset[str] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        known = (*FAULT_KINDS, *ANSWER_FAULT_KINDS)
        unknown = sorted({*self.kinds, *(k for k in self.sequence if k)} - set(known))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {known}")
        self._random = random.Random(self.seed)

    def draw(self, model: Any) -> str | None:
        if self.models is not None and model not in self.models:
            return None
        if self.sequence:
            return self.sequence.pop(0)
        if self.rate and self._random.random() < self.rate:
            return self._random.choice(self.kinds)
        return None
