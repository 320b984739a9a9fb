"""A model call that failed at the server or on the way there, told in one line."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from langchain_core.exceptions import OutputParserException

from relaygraph.errors import RunError
from relaygraph.events import ModelErrorEvent

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage

__all__ = ["AnswerCut", "ModelCallError", "server_message"]

_MAX_MESSAGE = 300
# A FastAPI/pydantic validation error as llama-cpp-python's server words it:
# {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "Input ..."}
_PYDANTIC_ERROR = re.compile(
    r"'loc': \((?P<loc>[^)]*)\), 'msg': (?P<q>['\"])(?P<msg>.*?)(?P=q)", re.DOTALL
)


def server_message(body: Any, fallback: str = "") -> str:
    """The server's own words from an error body, short and on one line.

    OpenAI-style bodies (``{"error": {"message": ...}}`` or the inner object) give their
    ``message``; a validation error listing pydantic errors (llama-cpp-python answers 500
    with one) gives ``field.path: msg`` for each, without the traceback that follows.
    """
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if not isinstance(message, str):
            message = body.get("detail") if isinstance(body.get("detail"), str) else None
        text = message if isinstance(message, str) else fallback
    elif isinstance(body, str):
        text = body
    else:
        text = fallback
    found: list[tuple[str, str]] = []
    for match in _PYDANTIC_ERROR.finditer(text):
        parts = [p.strip(" '\"") for p in match["loc"].split(",")]
        found.append((".".join(p for p in parts if p and p != "body"), match["msg"]))
    if found:
        # A message is checked against each member of a union (system, user, assistant...
        # messages): the members it is not fail on their role or a field it lacks. What is
        # left is the error that matters.
        telling = [
            (where, msg)
            for where, msg in found
            if not (where.endswith(".role") or msg == "Field required")
        ]
        lines = [f"{where}: {msg}" if where else msg for where, msg in telling or found]
        text = "; ".join(dict.fromkeys(lines))
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


class ModelCallError(RunError):
    """A model call failed: the server answered an error, or it could not be reached.

    Attributes:
        role: Who called (an agent, ``supervisor``, ``finalize``).
        model: The model spec.
        status: The HTTP status, or None when no answer came (a timeout, a refused or
            dropped connection, a stream cut short).
        detail: The server's message, or what went wrong on the way.
        attempts: How many times the call was made (retries included).
        refused: The server refused the request itself (a 400 or 422, or a 5xx reporting a
            validation error of the request): sent again, it fails again; another form of
            it (an option) may pass.
    """

    def __init__(
        self,
        *,
        role: str,
        model: str,
        status: int | None,
        detail: str,
        attempts: int = 1,
        refused: bool = False,
    ) -> None:
        self.role = role
        self.model = model
        self.status = status
        self.detail = detail
        self.attempts = attempts
        self.refused = refused
        super().__init__(f"model call of {role!r} ({model}) failed: {self.reason}")

    @property
    def reason(self) -> str:
        """What failed, for a stop reason: ``HTTP 500: ...`` and the attempts made."""
        head = f"HTTP {self.status}: " if self.status is not None else ""
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{head}{self.detail}{tries}"

    def to_event(self) -> ModelErrorEvent:
        """The ``model_error`` event that reports it."""
        return ModelErrorEvent(
            type="model_error",
            role=self.role,
            model=self.model,
            status=self.status,
            error=self.detail,
            attempts=self.attempts,
        )


class AnswerCut(OutputParserException):
    """A structured answer that stopped before its JSON was complete (the token limit, or the
    server's content filter).

    Attributes:
        reply: What the server answered, with the usage it reported: the tokens were spent
            (and must be counted against budgets) although the answer cannot be used. None
            when the server's answer held no message at all.
    """

    def __init__(self, message: str, reply: AIMessage | None) -> None:
        super().__init__(message)
        self.reply = reply
