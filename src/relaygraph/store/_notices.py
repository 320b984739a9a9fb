"""Event notices: "task X has events up to seq N", the payload PostgreSQL ``NOTIFY`` carries.

The ledger sends one in the transaction that appends a task's events (so it leaves when they
commit, and never if they roll back); every API server listens for them to wake the task's
event streams (``relaygraph.worker.EventListener``). The notice is only a wake-up call: the
events are read from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_CHANNEL", "EventNotice"]

DEFAULT_CHANNEL = "relaygraph_events"
"""The channel notices go on unless told otherwise (``RELAYGRAPH_EVENTS_CHANNEL``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EventNotice:
    """The task ``task_id`` has events in the ledger up to sequence number ``seq``."""

    task_id: str
    seq: int | None
    """The task's last event; None when notices may have been lost (the listener
    reconnected): the subscriber must read the ledger to know."""

    def payload(self) -> str:
        """The notice as ``NOTIFY`` carries it: ``<task_id> <seq>``."""
        if self.seq is None:
            raise ValueError("a notice of lost notices is never sent")
        return f"{self.task_id} {self.seq}"

    @classmethod
    def from_payload(cls, payload: str) -> EventNotice | None:
        """The notice in ``payload``; None when it is not one (anything else on the channel)."""
        task_id, _, seq = payload.partition(" ")
        if not task_id or not seq.isdigit():
            return None
        return cls(task_id=task_id, seq=int(seq))
