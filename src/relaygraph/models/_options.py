"""The options of an ``openai:`` model spec: ``openai:MODEL?name=value&name=value``.

One syntax for every option, written where the model is named (a ``--model`` flag, an
``--agent-model``, the API's ``model`` field, a policy), so that two roles may talk to two
servers' quirks in one run::

    openai:smollm2?structured=function_calling&tool_call_content=empty
    openai:gpt-4o-mini?timeout=30&max_retries=1&max_tokens=512
    openai:llama3?header.X-Api-Team=search&body.top_k=40&parallel_tool_calls=omit

Values are URL-decoded (``%26`` for ``&``). ``header.NAME`` and ``body.NAME`` may repeat
with different names; every other option is given at most once. An unknown option is an
error that names it, never ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args
from urllib.parse import quote, unquote

from relaygraph.errors import ModelSpecError

__all__ = [
    "STRUCTURED_ENV",
    "STRUCTURED_METHODS",
    "OpenAIOptions",
    "StructuredMethod",
    "parse_openai_options",
]

StructuredMethod = Literal["auto", "json_schema", "function_calling", "json_mode"]
STRUCTURED_METHODS: tuple[StructuredMethod, ...] = get_args(StructuredMethod)
STRUCTURED_ENV = "RELAYGRAPH_OPENAI_STRUCTURED"
"""The structured-output method of ``openai:`` models whose spec sets none."""

MAX_TIMEOUT_SECONDS = 3600.0
MAX_RETRIES = 10
_HEADER_PREFIX = "header."
_BODY_PREFIX = "body."
_SET_BY_CLIENT_HEADERS = frozenset(
    {"authorization", "content-type", "content-length", "host", "transfer-encoding"}
)
_SET_BY_RELAYGRAPH_BODY = {
    "model": "the spec's model name",
    "messages": "the conversation",
    "tools": "the agent's tools",
    "tool_choice": "the structured-output method",
    "response_format": "the structured-output method (option structured)",
    "functions": "the agent's tools",
    "function_call": "the agent's tools",
    "stream": "the run (streamed with stream_tokens)",
    "stream_options": "the run",
    "n": "relaygraph (one answer per call)",
    "max_tokens": "option max_tokens",
    "max_completion_tokens": "option max_tokens",
    "parallel_tool_calls": "option parallel_tool_calls",
}
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class OpenAIOptions:
    """How relaygraph talks to one Chat Completions server; every field has a spec option
    of the same name (``headers`` and ``body`` are ``header.NAME`` and ``body.NAME``)."""

    structured: StructuredMethod | None = None
    """How the supervisor's route is asked for: ``json_schema`` (``response_format`` with
    the schema), ``function_calling`` (a tool the model must call), ``json_mode``
    (``response_format: json_object``, the schema in the prompt) or ``auto`` (the first of
    these the server accepts, remembered per server and model). None: from
    ``$RELAYGRAPH_OPENAI_STRUCTURED``, else ``auto``."""
    timeout: float | None = None
    """Seconds one HTTP request may take (connect, write, each read); None: the client's
    default of 600 s."""
    max_retries: int = 2
    """Retries of a call that failed for a reason that may pass: a timeout, a dropped
    connection, 408, 409, 429 (after its ``Retry-After``), 5xx. Never a 4xx that would fail
    again, nor a 5xx whose body reports a validation error of the request."""
    max_tokens: int | None = None
    """Most tokens one answer may have (``max_tokens`` on a server given by
    ``OPENAI_BASE_URL``, ``max_completion_tokens`` on OpenAI's own)."""
    parallel_tool_calls: Literal["send", "omit"] = "send"
    """``omit`` never sends ``parallel_tool_calls`` (for servers that reject the field)."""
    tool_call_content: Literal["null", "empty"] = "null"
    """The ``content`` of an assistant message that carries tool calls: ``null`` as OpenAI
    sends it, or ``empty`` (``""``) for servers that require a string (llama-cpp-python)."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra HTTP headers (``header.X-Api-Team=search``), for gateways such as LiteLLM."""
    body: tuple[tuple[str, str], ...] = ()
    """Extra request-body fields (``body.top_k=40``), each value as written: JSON if it
    parses as JSON (numbers, booleans, objects), else a string."""

    @property
    def extra_headers(self) -> dict[str, str]:
        return dict(self.headers)

    @property
    def extra_body(self) -> dict[str, Any]:
        return {name: _json_or_text(text) for name, text in self.body}

    def to_query(self) -> str:
        """The options as written in a spec (``name=value&...``), defaults left out, in a
        fixed order: equal options give equal text."""
        parts: list[tuple[str, str]] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            if field.name == "headers":
                parts += [(f"{_HEADER_PREFIX}{k}", v) for k, v in value]
            elif field.name == "body":
                parts += [(f"{_BODY_PREFIX}{k}", v) for k, v in value]
            elif isinstance(value, float) and value.is_integer():
                parts.append((field.name, str(int(value))))
            else:
                parts.append((field.name, str(value)))
        return "&".join(f"{name}={quote(text, safe='')}" for name, text in parts)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _number(spec: str, name: str, text: str, *, integer: bool, low: float, high: float) -> Any:
    kind = "a whole number" if integer else "a number of seconds"
    try:
        value: float = int(text) if integer else float(text)
    except ValueError:
        raise ModelSpecError(spec, f"option {name!r} must be {kind}, got {text!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ModelSpecError(
            spec, f"option {name!r} must be between {low:g} and {high:g}, got {text!r}"
        )
    return value


def _choice(spec: str, name: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise ModelSpecError(
            spec, f"option {name!r} must be one of {', '.join(choices)}; got {text!r}"
        )
    return text


_SCALAR_OPTIONS = (
    "structured",
    "timeout",
    "max_retries",
    "max_tokens",
    "parallel_tool_calls",
    "tool_call_content",
)


def parse_openai_options(spec: str, query: str, *, responses_api: bool = False) -> OpenAIOptions:
    """Parse the part of an ``openai:`` spec after ``?``.

    Raises:
        ModelSpecError: An unknown option, one given twice, a malformed pair, or a value
            out of range; the message names the option.
    """
    values: dict[str, Any] = {}
    headers: dict[str, tuple[str, str]] = {}  # lower-cased name -> (name, value)
    body: dict[str, str] = {}
    if not query:
        raise ModelSpecError(spec, "nothing follows '?': drop it, or add name=value options")
    for pair in query.split("&"):
        raw_name, sep, raw_value = pair.partition("=")
        name, text = unquote(raw_name), unquote(raw_value)
        if not sep or not name:
            raise ModelSpecError(spec, f"option {pair!r} must be written name=value")
        if name.startswith(_HEADER_PREFIX):
            header = name.removeprefix(_HEADER_PREFIX)
            if not header or not set(header) <= _TOKEN_CHARS:
                raise ModelSpecError(spec, f"option {name!r}: {header!r} is no HTTP header name")
            if header.lower() in _SET_BY_CLIENT_HEADERS:
                raise ModelSpecError(
                    spec,
                    f"option {name!r}: the client sets {header} itself (the API key comes "
                    "from OPENAI_API_KEY)",
                )
            if header.lower() in headers:
                raise ModelSpecError(spec, f"option {name!r} is given twice")
            if "\r" in text or "\n" in text:
                raise ModelSpecError(spec, f"option {name!r}: a header value is one line")
            headers[header.lower()] = (header, text)
            continue
        if name.startswith(_BODY_PREFIX):
            field = name.removeprefix(_BODY_PREFIX)
            if not field:
                raise ModelSpecError(spec, f"option {name!r} names no body field")
            if field in _SET_BY_RELAYGRAPH_BODY:
                raise ModelSpecError(
                    spec, f"option {name!r}: {field!r} is set by {_SET_BY_RELAYGRAPH_BODY[field]}"
                )
            if field in body:
                raise ModelSpecError(spec, f"option {name!r} is given twice")
            body[field] = text
            continue
        if name not in _SCALAR_OPTIONS:
            known = ", ".join([*_SCALAR_OPTIONS, "header.NAME", "body.NAME"])
            raise ModelSpecError(spec, f"unknown option {name!r}; known options: {known}")
        if name in values:
            raise ModelSpecError(spec, f"option {name!r} is given twice")
        if name == "structured":
            values[name] = _choice(spec, name, text, STRUCTURED_METHODS)
        elif name == "timeout":
            values[name] = _number(
                spec, name, text, integer=False, low=0.001, high=MAX_TIMEOUT_SECONDS
            )
        elif name == "max_retries":
            values[name] = _number(spec, name, text, integer=True, low=0, high=MAX_RETRIES)
        elif name == "max_tokens":
            values[name] = _number(spec, name, text, integer=True, low=1, high=10_000_000)
        elif name == "parallel_tool_calls":
            values[name] = _choice(spec, name, text, ("send", "omit"))
        else:
            values[name] = _choice(spec, name, text, ("null", "empty"))
            if responses_api:
                raise ModelSpecError(
                    spec,
                    "option 'tool_call_content' is for Chat Completions (openai:), "
                    "not the Responses API",
                )
    return OpenAIOptions(
        **values,
        headers=tuple(sorted(headers.values(), key=lambda h: h[0].lower())),
        body=tuple(sorted(body.items())),
    )
