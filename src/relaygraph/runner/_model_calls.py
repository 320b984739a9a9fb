"""The record of each model call of a run: one callback handler that sees them all.

Every model call of a run, whatever node makes it (an agent's model, the supervisor's route,
finalize's answer, a tool-calling supervisor), goes through LangChain's callbacks of the
graph call's config; :class:`ModelCallRecorder` is one of them. When a call ends it sends a
``model_call`` event (:func:`relaygraph.events.model_call_event`) with the messages the
model saw, its reply, and the call's usage record, computed by
:func:`~relaygraph.policies.middleware.replies_usage` like every other usage figure. The
ledger stores that record beside the visit's (``store/_usage.py``), so the Budgets card
moves with each call while a visit runs, and the visit's own record replaces the calls'
when it lands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from relaygraph.events import ModelCallMessage, Usage, event_sink, model_call_event
from relaygraph.policies import TeamPolicy
from relaygraph.policies.middleware import replies_usage, usage_estimated

__all__ = ["ModelCallRecorder", "ModelCallRecording"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCallRecording:
    """How much of each model call the ledger keeps (``RELAYGRAPH_MODEL_CALL_*``)."""

    messages: bool = True
    """Keep the messages and the reply; False keeps only the call's model and usage (for
    prompts that hold what the ledger must not)."""
    max_chars: int = 4000
    """Characters kept of each message's text; the event says when one was cut."""
    max_messages: int = 50
    """Messages kept of one call, the latest ones; the event says when some were left out."""


class ModelCallRecorder(BaseCallbackHandler):
    """Sends a ``model_call`` event for each chat model call of the run it is given to.

    Runs inline (``run_inline``): the event must go to the run's sink, which the run's
    context holds, in the order the calls end.
    """

    run_inline = True
    raise_error = False

    def __init__(self, policy: TeamPolicy, recording: ModelCallRecording | None = None) -> None:
        self.policy = policy
        self.recording = recording or ModelCallRecording()
        self._started: dict[UUID, tuple[float, list[BaseMessage], str]] = {}
        # Calls of parallel nodes start and end on several threads.
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        ns = str((metadata or {}).get("langgraph_checkpoint_ns") or "")
        visit = ns.split("|", 1)[0]
        if not visit:  # A model called outside the team graph's nodes: no visit to bill.
            return
        with self._lock:
            self._started[run_id] = (time.monotonic(), list(messages[0] if messages else []), visit)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            started = self._started.pop(run_id, None)
        if started is None:
            return
        began, seen, visit = started
        generation = response.generations[0][0] if response.generations else None
        if not isinstance(generation, ChatGeneration):
            return
        reply = generation.message
        role = visit.split(":", 1)[0]
        totals = replies_usage([reply], self.policy, seconds=time.monotonic() - began)
        usage = Usage(
            id=f"{visit}#{run_id}",
            agent=role,
            turn=0,
            model_calls=totals.model_calls,
            tool_calls=0,
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            cost_usd=totals.cost_usd,
            seconds=totals.seconds,
            estimated=usage_estimated([reply]),
        )
        kept, truncated = self._kept(seen)
        answer = self._message(reply) if self.recording.messages else None
        event = model_call_event(
            role,
            visit=visit,
            model=str(reply.response_metadata.get("model_name", "")),
            messages=kept,
            reply=answer[0] if answer else None,
            usage=usage,
            truncated=truncated or bool(answer and answer[1]),
            redacted=not self.recording.messages,
        )
        sink = event_sink()
        if sink is None:
            from langgraph.config import get_stream_writer

            try:
                sink = get_stream_writer()
            except RuntimeError:  # Outside a graph's run: nowhere to send it.
                return
        sink(event)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._started.pop(run_id, None)

    def _kept(self, seen: Sequence[BaseMessage]) -> tuple[list[ModelCallMessage], bool]:
        if not self.recording.messages:
            return [], False
        left_out = max(0, len(seen) - self.recording.max_messages)
        kept = [self._message(m) for m in seen[left_out:]]
        return [m for m, _ in kept], left_out > 0 or any(cut for _, cut in kept)

    def _message(self, message: BaseMessage) -> tuple[ModelCallMessage, bool]:
        text = message.text if isinstance(message.content, list) else str(message.content)
        limit = self.recording.max_chars
        kept = ModelCallMessage(role=message.type, content=text[:limit])
        if isinstance(message, AIMessage) and message.tool_calls:
            kept["tool_calls"] = [
                {"name": call["name"], "args": call["args"]} for call in message.tool_calls
            ]
        return kept, len(text) > limit
