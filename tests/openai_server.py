"""A local OpenAI Chat Completions server that plays relaygraph scripts, for tests.

Tests that must exercise the real ``langchain_openai.ChatOpenAI`` client (and the ``openai`` SDK
under it) point it at this server instead of the internet::

    with serve_script({"researcher": [{"content": "hi"}]}) as server:
        model = ChatOpenAI(model="script-researcher", base_url=server.base_url, api_key="test")
        assert model.invoke("hello").content == "hi"
        assert server.requests[0]["messages"][0]["content"] == "hello"

The script has the format of :mod:`relaygraph.models.scripted` (turns are validated with its
``ScriptTurn``): keys are script keys (agent names, ``supervisor``, ``finalize``) and values are
lists of turns, each ``{"content": ...}``, ``{"tool_calls": [...]}`` or ``{"route": {...}}`` with
an optional ``usage``. The request's ``model`` picks the key: ``script-<key>`` plays ``<key>``;
a ``key_from`` function picks it from the request's body instead (the task text in its messages,
say), so that many concurrent conversations can share one model name, as a service's tasks do.
Each key has its own cursor that advances by one per answered request; a rejected request does
not advance it.

Like the real API, the server answers with HTTP errors (OpenAI-style error bodies) where a client
or script bug would make the real API fail, so tests catch it:

* 400 for an assistant message whose ``tool_calls`` are not answered by the ``tool`` messages
  that follow it (and for a ``tool`` message answering no call),
* 400 for a ``route`` turn when the request has no ``response_format``, and for a ``tool_calls``
  turn naming a tool that is not among the request's ``tools`` (or contradicting
  ``tool_choice`` / ``parallel_tool_calls``),
* 400 when the key's script has run out, naming the key and the turn number,
* 404 ``model_not_found`` for a model that is not ``script-<key>`` of a key in the script
  (or, with ``key_from``, for a key it picked that the script does not have),
* 401 without an ``Authorization: Bearer ...`` header (any key is accepted).

A ``content`` turn answers a structured-output request verbatim, so a script can play malformed
structured output; ``route`` turns are sent unvalidated against the request's JSON schema, as
content for ``response_format`` (``json_schema`` or ``json_object``) and as a call of the named
function for a ``tool_choice`` that names one (structured output by function calling).

**Profiles** (:class:`ServerProfile`) make the server behave as another server does, from that
server's own code, docs and issue trackers: :data:`LLAMA_CPP_PYTHON` (500 on ``json_schema``
and on ``content: null``, no usage in streams, a streamed tool call's name and id repeated in
every chunk), :data:`LITELLM_LLAMA_CPP_PYTHON` (the LiteLLM proxy in front of it, which drops
``content: null`` beside tool calls, so the backend fails with a 500 naming no field),
:data:`VLLM_NO_TOOL_PARSER` (400 on
``tool_choice: "auto"``, which vLLM implies whenever tools are sent), :data:`OLLAMA` (ignores
``tool_choice``) and :data:`STRICT_FIELDS` (400 on ``parallel_tool_calls``).

**Faults** (:class:`Faults`) are injected before a request is answered, at a chosen rate or
in a given sequence: 429 with ``Retry-After``, 500, 503, a timeout (the server stalls and
hangs up), a truncated answer (half a body, or half a stream, the connection dropped), a
stream that ends cleanly halfway without a ``finish_reason``, and tool calls whose arguments
are cut. A faulted request does not advance the script (``broken_arguments`` plays its
turn), and every request is logged with its arrival time and body digest
(:attr:`FakeOpenAI.log`), so a test can check when a retried request came back.

A **delay** (``delay_seconds``) makes every answered request take that long, as a model that
takes time to answer: requests are answered on threads of their own, so concurrent requests
wait side by side, as they do on a real server (the throughput benchmark,
``benchmarks/bench_service.py``, measures the task service against it).
Usage comes from the turn, else it is estimated exactly as ``ScriptedChatModel`` does (about
four characters per token of the request's message texts and of the output). An answer longer
than the request's ``max_tokens`` (or ``max_completion_tokens``) is cut there, with
``finish_reason: "length"``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from relaygraph.errors import ConfigError
from relaygraph.models.scripted import ScriptTurn, estimate_tokens, load_script, parse_turns

__all__ = [
    "LITELLM_LLAMA_CPP_PYTHON",
    "LLAMA_CPP_PYTHON",
    "MODEL_PREFIX",
    "OLLAMA",
    "OPENAI",
    "PROFILES",
    "STRICT_FIELDS",
    "VLLM_NO_TOOL_PARSER",
    "FakeOpenAI",
    "Faults",
    "ServerProfile",
    "serve_script",
]

MODEL_PREFIX = "script-"
"""A request for model ``script-<key>`` is answered by the script's ``<key>`` turns."""

_FINGERPRINT = "fp_relaygraph"
_FRAGMENT = 8
"""Characters per streamed tool-call argument fragment."""
_VALID_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


@dataclass(frozen=True, kw_only=True)
class ServerProfile:
    """What a Chat Completions server accepts, where servers differ."""

    name: str
    json_schema: bool = True
    """False: ``response_format: json_schema`` is answered 500 (llama-cpp-python's words)."""
    null_tool_call_content: bool = True
    """False: an assistant message with tool calls and ``content: null`` is answered 500."""
    auto_tool_choice: bool = True
    """False: ``tool_choice: "auto"`` (implied when tools are sent without a choice) is
    answered 400, as vLLM does when started without ``--tool-call-parser``."""
    honours_tool_choice: bool = True
    """False: ``tool_choice`` is accepted and ignored (Ollama): a script turn that
    contradicts it is played anyway."""
    parallel_tool_calls_field: bool = True
    """False: a request carrying ``parallel_tool_calls`` is answered 400 (an unknown field)."""
    stream_usage: bool = True
    """False: ``stream_options.include_usage`` is ignored: a stream carries no usage."""
    tools: bool = True
    """False: a request with ``tools`` is answered 400, as Ollama does for a model without
    tool support."""
    litellm: bool = False
    """True: the server is the LiteLLM proxy in front of this profile's backend: answers carry
    its ``x-litellm-version`` header, and it drops ``content: null`` from an assistant
    message with tool calls before the backend sees it; a backend that refuses the message
    then is answered as LiteLLM wraps a backend's failure, a 500 that names no field."""
    repeats_tool_call_fields: bool = False
    """True: every chunk of a streamed tool call repeats its ``id``, ``type`` and ``name``
    (and the legacy ``function_call`` with the name) beside its argument fragment, as
    llama-cpp-python's ``_convert_completion_to_chat_function`` streams them."""


OPENAI = ServerProfile(name="openai")
LLAMA_CPP_PYTHON = ServerProfile(
    name="llama-cpp-python",
    json_schema=False,
    null_tool_call_content=False,
    stream_usage=False,
    repeats_tool_call_fields=True,
)
LITELLM_LLAMA_CPP_PYTHON = ServerProfile(
    name="litellm-llama-cpp-python",
    json_schema=False,
    null_tool_call_content=False,
    stream_usage=False,
    repeats_tool_call_fields=True,
    litellm=True,
)
VLLM_NO_TOOL_PARSER = ServerProfile(name="vllm-no-tool-parser", auto_tool_choice=False)
OLLAMA = ServerProfile(name="ollama", honours_tool_choice=False)
STRICT_FIELDS = ServerProfile(name="strict-fields", parallel_tool_calls_field=False)
PROFILES = {
    p.name: p
    for p in (
        OPENAI,
        LLAMA_CPP_PYTHON,
        LITELLM_LLAMA_CPP_PYTHON,
        VLLM_NO_TOOL_PARSER,
        OLLAMA,
        STRICT_FIELDS,
    )
}

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

KeyFrom = Callable[[dict[str, Any]], str | None]
"""Picks the script key of a request from its JSON body; None: the model's key."""


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


class _APIError(Exception):
    """An error answered to the client as an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {
            "error": {"message": message, "type": type_, "param": param, "code": code}
        }


def _bad_request(message: str, param: str | None = None, code: str | None = None) -> _APIError:
    return _APIError(400, message, param=param, code=code)


def _parse_script(script: dict[str, Any] | Path | str) -> dict[str, list[ScriptTurn]]:
    if isinstance(script, str | Path):
        return dict(load_script(script).turns)
    if not isinstance(script, dict):
        raise TypeError(f"a script is a dict or a path to a JSON file, not {type(script)!r}")
    try:
        return parse_turns(script, source="script")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


_estimate_tokens = estimate_tokens


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _pieces(text: str) -> list[str]:
    """Split content into word-sized stream deltas (whitespace kept, so they join back)."""
    return re.findall(r"\S+\s*|\s+", text)


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    """Reject malformed conversations the way the real API does."""
    if not isinstance(messages, list) or not messages:
        raise _bad_request(
            f"{json.dumps(messages)} is too short - 'messages'"
            if isinstance(messages, list)
            else "Missing required parameter: 'messages'.",
            "messages",
        )
    pending: dict[str, None] = {}  # unanswered tool-call ids, in order
    pending_at = -1  # index of the assistant message that made them
    after_tool_calls = False  # the previous message was a tool-call turn or its answer
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad_request(
                f"Invalid type for 'messages[{i}]': expected an object, but got "
                f"{type(message).__name__} instead.",
                f"messages[{i}]",
            )
        role = message.get("role")
        if role not in _VALID_ROLES:
            supported = ", ".join(f"'{r}'" for r in _VALID_ROLES)
            raise _bad_request(
                f"Invalid value: {role!r}. Supported values are: {supported}.",
                f"messages[{i}].role",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not after_tool_calls:
                raise _bad_request(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            if call_id not in pending:
                raise _bad_request(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            del pending[call_id]
            continue
        if pending:
            break
        after_tool_calls = False
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            pending = {str(c.get("id")) if isinstance(c, dict) else "": None for c in calls}
            pending_at, after_tool_calls = i, True
    if pending:
        raise _bad_request(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            f"messages.[{pending_at}].role",
        )
    return messages


def _tool_names(tools: Any) -> list[str] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad_request("Invalid type for 'tools': expected an array.", "tools")
    names = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in ("function", "custom"):
            raise _bad_request(
                f"Invalid value for 'tools[{i}].type': expected 'function' or 'custom'.",
                f"tools[{i}].type",
            )
        spec = tool.get(tool["type"])
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not name:
            raise _bad_request(
                f"Missing required parameter: 'tools[{i}].{tool['type']}.name'.",
                f"tools[{i}].{tool['type']}.name",
            )
        names.append(name)
    return names


def _structured(response_format: Any) -> bool:
    """Whether the request asks for JSON output (``json_schema`` or ``json_object``)."""
    if response_format is None:
        return False
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise _bad_request(
            f"Invalid value: {kind!r}. Supported values are: 'text', 'json_object' and "
            "'json_schema'.",
            "response_format.type",
        )
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad_request(
                "Missing required parameter: 'response_format.json_schema'.",
                "response_format.json_schema",
            )
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise _bad_request(
                "Missing required parameter: 'response_format.json_schema.name'.",
                "response_format.json_schema.name",
            )
    return kind != "text"


def _llama_cpp_validation(loc: str, message: str, value: Any) -> _APIError:
    """A request llama-cpp-python's server refuses: its pydantic error, answered 500."""
    text = (
        f"1 validation error:\n  {{'type': 'literal_error', 'loc': {loc}, 'msg': "
        f'"{message}", \'input\': {value!r}}}\n\n  File "llama_cpp/server/app.py", line 376, '
        "in create_chat_completion\n    POST /v1/chat/completions"
    )
    return _APIError(500, text, type_="internal_server_error")


def _check_profile(profile: ServerProfile, body: dict[str, Any]) -> None:
    """Refuse what ``profile``'s server refuses, in its own words."""
    response_format = body.get("response_format")
    if (
        not profile.json_schema
        and isinstance(response_format, dict)
        and response_format.get("type") == "json_schema"
    ):
        raise _llama_cpp_validation(
            "('body', 'response_format', 'type')",
            "Input should be 'text' or 'json_object'",
            "json_schema",
        )
    if not profile.null_tool_call_content:
        for i, message in enumerate(body["messages"]):
            if message.get("role") == "assistant" and message.get("content", None) is None:
                if profile.litellm:
                    raise _APIError(
                        500,
                        "litellm.InternalServerError: InternalServerError: OpenAIException - "
                        "Internal Server Error",
                        type_="None",
                    )
                raise _llama_cpp_validation(
                    f"('body', 'messages', {i}, 'ChatCompletionRequestAssistantMessage', "
                    "'content')",
                    "Input should be a valid string",
                    None,
                )
    if (
        not profile.auto_tool_choice
        and body.get("tools")
        and body.get("tool_choice", "auto") == "auto"
    ):
        message = (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
        raise _APIError(
            400,
            message,
            body={
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        )
    if not profile.tools and body.get("tools"):
        raise _bad_request(f"registry.ollama.ai/library/{body.get('model')} does not support tools")
    if not profile.parallel_tool_calls_field and "parallel_tool_calls" in body:
        raise _bad_request(
            "Unrecognized request argument supplied: parallel_tool_calls", "parallel_tool_calls"
        )


def _forced_function(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name")
        return name if isinstance(name, str) else None
    return None


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class FakeOpenAI:
    """A Chat Completions server on ``127.0.0.1`` playing a script (see the module docstring).

    Attributes:
        base_url: The client's base URL, ``http://127.0.0.1:<port>/v1``.
        requests: Every JSON body posted to ``/v1/chat/completions``, in arrival order
            (rejected ones included).
        log: One entry per request: ``at`` (monotonic seconds), ``digest`` (of the body),
            ``model``, ``fault`` (its kind, or None), ``status`` (of the answer, None for a
            fault) and ``usage`` (the answer's usage block, for a 200).
        profile: Which server it plays.
        faults: The faults it injects, if any.
        delay_seconds: How long it takes to answer a request (not a faulted one), in
            seconds; 0 by default.
        key_from: Picks each request's script key from its body (None, or where it
            returns None: ``script-<key>`` of the request's model).
    """

    def __init__(
        self,
        script: dict[str, Any] | Path | str,
        *,
        profile: ServerProfile = OPENAI,
        faults: Faults | None = None,
        delay_seconds: float = 0.0,
        key_from: KeyFrom | None = None,
    ) -> None:
        if delay_seconds < 0:
            raise ValueError(f"delay_seconds must be 0 or more, not {delay_seconds!r}")
        self.profile = profile
        self.faults = faults
        self.delay_seconds = delay_seconds
        self.key_from = key_from
        self.log: list[dict[str, Any]] = []
        self._turns = _parse_script(script)
        self._cursors = dict.fromkeys(self._turns, 0)
        self._lock = threading.Lock()
        self._calls = 0
        self._completions = 0
        self.requests: list[dict[str, Any]] = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler, self)
        host, port = self._httpd.server_address[:2]
        self.base_url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-openai-{port}",
            daemon=True,
        )
        self._closed = False
        self._thread.start()

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and drop open connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.drop_connections()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    @property
    def models(self) -> list[str]:
        """The model names served: ``script-<key>`` per script key."""
        return [MODEL_PREFIX + key for key in self._turns]

    def remaining(self) -> dict[str, int]:
        """Turns not yet played, per script key."""
        with self._lock:
            return {key: len(t) - self._cursors[key] for key, t in self._turns.items()}

    # -- request handling (called from handler threads) --------------------------------

    def _record(self, body: dict[str, Any]) -> dict[str, Any]:
        """Record a request; returns its log entry, whose ``fault`` is the fault to inject
        into its answer, if any (the handler adds ``status`` and ``usage``)."""
        with self._lock:
            self.requests.append(body)
            fault = self.faults.draw(body.get("model")) if self.faults is not None else None
            entry = {
                "at": time.monotonic(),
                "digest": _digest(body),
                "model": body.get("model"),
                "fault": fault,
                "status": None,
                "usage": None,
            }
            self.log.append(entry)
            return entry

    @property
    def injected(self) -> list[dict[str, Any]]:
        """The log's faulted requests."""
        with self._lock:
            return [entry for entry in self.log if entry["fault"]]

    def _key_of(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad_request(
                "you must provide a model parameter", "model", code="missing_required_parameter"
            )
        picked = self.key_from(body) if self.key_from is not None else None
        if picked is not None:
            if picked not in self._turns:
                raise _APIError(
                    404,
                    f"The script has no key {picked!r} (picked from the request for model "
                    f"`{model}`).",
                    code="model_not_found",
                )
            return picked
        key = model.removeprefix(MODEL_PREFIX)
        if not model.startswith(MODEL_PREFIX) or key not in self._turns:
            raise _APIError(
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                code="model_not_found",
            )
        return key

    def _answer(
        self, body: dict[str, Any], *, advance: bool = True
    ) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """Answer one chat-completions body: ``(completion, stream chunks or None)``; with
        ``advance`` False, the key's cursor stays on the turn (a faulted answer)."""
        messages = _check_messages(body.get("messages"))
        tools = _tool_names(body.get("tools"))
        structured = _structured(body.get("response_format"))
        _check_profile(self.profile, body)
        key = self._key_of(body)
        with self._lock:
            index = self._cursors[key]
            turns = self._turns[key]
            if index >= len(turns):
                raise _bad_request(
                    f"script {key!r}, turn {index + 1}: the script has only {len(turns)} "
                    "turn(s): it ran out",
                    code="script_exhausted",
                )
            turn = turns[index]
            _check_turn(key, index + 1, turn, body, tools, structured, self.profile)
            if advance:
                self._cursors[key] = index + 1
            calls = []
            forced = _forced_function(body)
            if turn.route is not None and forced is not None and not structured:
                # Structured output by function calling: the route is the call's arguments.
                self._calls += 1
                calls.append((f"call_{self._calls}", forced, turn.route))
            for call in turn.tool_calls or []:
                call_id = call.id
                if not call_id:
                    self._calls += 1
                    call_id = f"call_{self._calls}"
                calls.append((call_id, call.name, call.args))
            self._completions += 1
            completion_id = f"chatcmpl-relaygraph{self._completions}"

        content: str | None = turn.content
        if turn.route is not None and not calls:
            content = json.dumps(turn.route)
        if turn.usage is not None:
            prompt, completion = turn.usage.input_tokens, turn.usage.output_tokens
        else:  # the ScriptedChatModel estimate
            out_text = (turn.content or "") + json.dumps(turn.route or [a for *_, a in calls])
            prompt = _estimate_tokens("\n".join(_message_text(m) for m in messages))
            completion = _estimate_tokens(out_text)
        finish = "tool_calls" if calls else "stop"
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if not calls and isinstance(limit, int) and completion > limit:
            # The answer stops at the token limit, as a model's does (~4 characters a token).
            content, completion, finish = (content or "")[: limit * 4], limit, "length"
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        tool_calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for call_id, name, args in calls
        ]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if calls else (content or ""),
            "refusal": None,
            "annotations": [],
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        head = {
            "id": completion_id,
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": _FINGERPRINT,
            "service_tier": "default",
        }
        completion_body = {
            **head,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage,
        }
        if not body.get("stream"):
            return completion_body, None
        options = body.get("stream_options")
        include_usage = (
            self.profile.stream_usage
            and isinstance(options, dict)
            and bool(options.get("include_usage"))
        )
        chunks = (_llama_cpp_chunks if self.profile.repeats_tool_call_fields else _chunks)(
            head, message, finish, usage, include_usage
        )
        return completion_body, chunks


def _check_turn(
    key: str,
    number: int,
    turn: ScriptTurn,
    body: dict[str, Any],
    tools: list[str] | None,
    structured: bool,
    profile: ServerProfile = OPENAI,
) -> None:
    """Reject a request the script's turn cannot answer as the real model would."""
    where = f"script {key!r}, turn {number}"
    tool_choice = body.get("tool_choice")
    if turn.kind == "route" and not structured and _forced_function(body) is None:
        raise _bad_request(
            f"{where} is a 'route' turn (structured output), but the request has no "
            "'response_format' and no 'tool_choice' naming a function",
            "response_format",
        )
    if turn.kind == "route" or not profile.honours_tool_choice:
        return
    if turn.kind != "tool_calls":
        forced = None
        if isinstance(tool_choice, dict):
            forced = tool_choice.get("function", {}).get("name")
        elif tool_choice == "required":
            forced = "a tool"
        if forced:
            raise _bad_request(
                f"{where} is a {turn.kind!r} turn, but the request's 'tool_choice' requires "
                f"calling {forced}",
                "tool_choice",
            )
        return
    calls = turn.tool_calls or []
    for call in calls:
        if not tools:
            raise _bad_request(
                f"{where} calls tool {call.name!r}, but the request has no 'tools'", "tools"
            )
        if call.name not in tools:
            raise _bad_request(
                f"{where} calls tool {call.name!r}, which is not among the request's tools: "
                f"{', '.join(tools)}",
                "tools",
            )
    if tool_choice == "none":
        raise _bad_request(
            f"{where} calls tools, but the request's 'tool_choice' is 'none'", "tool_choice"
        )
    if isinstance(tool_choice, dict):
        forced = tool_choice.get("function", {}).get("name")
        others = sorted({c.name for c in calls} - {forced})
        if forced and others:
            raise _bad_request(
                f"{where} calls {', '.join(others)}, but the request's 'tool_choice' forces "
                f"{forced!r}",
                "tool_choice",
            )
    if body.get("parallel_tool_calls") is False and len(calls) > 1:
        raise _bad_request(
            f"{where} makes {len(calls)} tool calls, but the request sets "
            "'parallel_tool_calls' to false",
            "parallel_tool_calls",
        )


def _chunks(
    head: dict[str, Any],
    message: dict[str, Any],
    finish: str,
    usage: dict[str, int],
    include_usage: bool,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer, as OpenAI sends them."""
    base = {**head, "object": "chat.completion.chunk"}
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**base, "choices": [choice]}

    chunks = []
    calls = message.get("tool_calls") or []
    if calls:
        for i, call in enumerate(calls):
            header = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            delta: dict[str, Any] = {"tool_calls": [header]}
            if i == 0:
                delta = {"role": "assistant", "content": None, **delta, "refusal": None}
            chunks.append(chunk(delta))
            arguments = call["function"]["arguments"]
            for start in range(0, len(arguments), _FRAGMENT):
                fragment = arguments[start : start + _FRAGMENT]
                chunks.append(
                    chunk({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]})
                )
    else:
        chunks.append(chunk({"role": "assistant", "content": "", "refusal": None}))
        chunks.extend(chunk({"content": piece}) for piece in _pieces(message["content"]) if piece)
    chunks.append(chunk({}, finish))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def _llama_cpp_chunks(
    head: dict[str, Any],
    message: dict[str, Any],
    finish: str,
    usage: dict[str, int],
    include_usage: bool,
) -> list[dict[str, Any]]:
    """A streamed answer as llama-cpp-python sends it: a tool call's every chunk repeats
    its id, type and name, and a legacy ``function_call`` beside it; other answers as
    OpenAI's (:func:`_chunks`)."""
    calls = message.get("tool_calls") or []
    if not calls:
        return _chunks(head, message, finish, usage, include_usage)
    base = {**head, "object": "chat.completion.chunk"}
    empty = {"role": None, "content": None, "function_call": None, "tool_calls": None}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None, "delta": delta}
        return {**base, "choices": [choice]}

    chunks = [chunk({**empty, "role": "assistant"})]
    for i, call in enumerate(calls):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        for start in range(0, len(arguments), _FRAGMENT):
            fragment = arguments[start : start + _FRAGMENT]
            function = {"name": name, "arguments": fragment}
            tool_call = {"index": i, "id": call["id"], "type": "function", "function": function}
            chunks.append(chunk({**empty, "function_call": function, "tool_calls": [tool_call]}))
    chunks.append(chunk(empty, finish))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def _unfinished(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first half of a stream's chunks, none carrying a finish_reason or usage."""
    answer = [c for c in chunks if c["choices"] and not c["choices"][0]["finish_reason"]]
    return answer[: max(1, len(answer) // 2)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, app: FakeOpenAI) -> None:
        self.app = app
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def track(self, connection: socket.socket, *, add: bool) -> None:
        with self._connections_lock:
            if add:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def drop_connections(self) -> None:
        """End keep-alive connections so their handler threads exit."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "relaygraph-fake-openai/1"
    timeout = 30  # idle keep-alive connections end after this many seconds
    # An answer goes out in two writes (the head, then the body). With Nagle's algorithm
    # the body waits for the ACK of the head, which a keep-alive client delays by up to
    # 40 ms: every call would take that much longer than its delay.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def handle(self) -> None:
        with suppress(ConnectionResetError, BrokenPipeError):  # the client hung up
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    # -- plumbing ----------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _proxy_headers(self) -> None:
        if self.server.app.profile.litellm:
            self.send_header("x-litellm-version", "1.74.0")

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_{id(payload):x}")
        self._proxy_headers()
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._proxy_headers()
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
        events.append(b"data: [DONE]\n\n")
        for event in events:
            self.wfile.write(f"{len(event):X}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        with suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _inject(self, fault: str, body: dict[str, Any]) -> None:
        """Answer with ``fault`` instead of the script's turn (which stays unplayed)."""
        faults = self.server.app.faults
        assert faults is not None
        if fault == "429":
            err = _APIError(
                429,
                f"Rate limit reached for requests. Please try again in {faults.retry_after:g}s.",
                type_="requests",
                code="rate_limit_exceeded",
            )
            self._send_json(429, err.body, {"Retry-After": f"{faults.retry_after:g}"})
        elif fault == "500":
            err = _APIError(
                500,
                "The server had an error while processing your request. Sorry about that!",
                type_="server_error",
            )
            self._send_json(500, err.body)
        elif fault == "503":
            err = _APIError(
                503,
                "The engine is currently overloaded, please try again later.",
                type_="server_error",
            )
            self._send_json(503, err.body)
        elif fault == "timeout":
            time.sleep(faults.stall_seconds)
            self._hang_up()
        elif fault in ("empty_choices", "null_message"):
            choices = (
                []
                if fault == "empty_choices"
                else [{"index": 0, "message": None, "finish_reason": "stop", "logprobs": None}]
            )
            answer = {
                "id": "chatcmpl-malformed",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": choices,
                "usage": {"prompt_tokens": 11, "completion_tokens": 0, "total_tokens": 11},
            }
            self._send_json(200, answer)
        elif fault in ("not_json", "html"):
            page = (
                b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                if fault == "html"
                else b"upstream said: ok"
            )
            kind = "text/html" if fault == "html" else "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(page)
        elif body.get("stream"):  # truncated: half a stream, no end
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            head = {
                "id": "chatcmpl-cut",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Half an"}}],
            }
            event = f"data: {json.dumps(head)}\n\n".encode()
            with suppress(OSError):
                self.wfile.write(f"{len(event):X}\r\n".encode() + event + b"\r\n")
            self._hang_up()
        else:  # truncated: half a body
            data = json.dumps({"id": "chatcmpl-cut", "object": "chat.completion"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) * 2))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(data)
            self._hang_up()

    def _authorized(self) -> bool:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and token.strip():
            return True
        self._send_json(
            401,
            _APIError(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            ).body,
        )
        return False

    def _not_found(self, method: str) -> None:
        err = _APIError(404, f"Invalid URL ({method} {urlsplit(self.path).path})")
        self._send_json(404, err.body)

    # -- endpoints ---------------------------------------------------------------------

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if not path.startswith("/v1/models"):
            self._not_found("GET")
            return
        if not self._authorized():
            return
        app = self.server.app
        models = [
            {"id": name, "object": "model", "created": 0, "owned_by": "relaygraph"}
            for name in app.models
        ]
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": models})
            return
        wanted = path.removeprefix("/v1/models/")
        for model in models:
            if model["id"] == wanted:
                self._send_json(200, model)
                return
        err = _APIError(
            404,
            f"The model `{wanted}` does not exist or you do not have access to it.",
            code="model_not_found",
        )
        self._send_json(404, err.body)

    def do_POST(self) -> None:
        raw = self._read_body()
        if urlsplit(self.path).path.rstrip("/") != "/v1/chat/completions":
            self._not_found("POST")
            return
        if not self._authorized():
            return
        app = self.server.app
        entry: dict[str, Any] | None = None
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise _bad_request(
                    "We could not parse the JSON body of your request. (HINT: This likely "
                    "means you aren't using your HTTP library correctly. The OpenAI API "
                    "expects a JSON payload, but what was sent was not valid JSON.)"
                ) from None
            if not isinstance(body, dict):
                raise _bad_request("The request body must be a JSON object.")
            entry = app._record(body)
            if entry["fault"] == "unfinished_stream" and body.get("stream"):
                completion, chunks = app._answer(body, advance=False)
                assert chunks is not None
                self._send_stream(_unfinished(chunks))
                return
            if entry["fault"] == "broken_arguments" and not body.get("stream"):
                completion, _ = app._answer(body)
                for call in completion["choices"][0]["message"].get("tool_calls") or []:
                    arguments = call["function"]["arguments"]
                    call["function"]["arguments"] = arguments[: len(arguments) // 2]
                self._send_json(200, completion)
                return
            if entry["fault"] not in (None, *ANSWER_FAULT_KINDS):
                self._inject(entry["fault"], body)
                return
            if app.delay_seconds:
                time.sleep(app.delay_seconds)  # The model thinks; other requests go on.
            completion, chunks = app._answer(body)
            entry["status"], entry["usage"] = 200, completion["usage"]
        except _APIError as err:
            if entry is not None:
                entry["status"] = err.status
            self._send_json(err.status, err.body)
            return
        except Exception as exc:  # a server bug: fail the test at once, without retries
            bug = _APIError(500, f"fake OpenAI server error: {exc!r}", type_="server_error")
            self._send_json(500, bug.body, {"x-should-retry": "false"})
            return
        try:
            if chunks is None:
                self._send_json(200, completion)
            else:
                self._send_stream(chunks)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up early
            self.close_connection = True


@contextmanager
def serve_script(
    script: dict[str, Any] | Path | str,
    *,
    profile: ServerProfile = OPENAI,
    faults: Faults | None = None,
    delay_seconds: float = 0.0,
    key_from: KeyFrom | None = None,
) -> Iterator[FakeOpenAI]:
    """Serve ``script`` on a local port for the duration of the ``with`` block, as
    ``profile``'s server would, with ``faults`` injected, each answer ``delay_seconds``
    late and each request's script key picked by ``key_from`` (default: its model)."""
    server = FakeOpenAI(
        script, profile=profile, faults=faults, delay_seconds=delay_seconds, key_from=key_from
    )
    try:
        yield server
    finally:
        server.close()


@contextmanager
def script_servers(
    script: dict[str, Any], setenv: Callable[[str, str], None]
) -> Iterator[Callable[..., FakeOpenAI]]:
    """A starter of servers of ``script`` (each with its own faults and options) for a
    test's ``openai:`` models: the newest started is ``OPENAI_BASE_URL`` (through
    ``setenv``, a ``monkeypatch.setenv``); all are closed when the block ends."""
    with ExitStack() as stack:

        def start(faults: Faults | None = None, **kwargs: Any) -> FakeOpenAI:
            server = stack.enter_context(serve_script(script, faults=faults, **kwargs))
            setenv("OPENAI_BASE_URL", server.base_url)
            return server

        yield start


def quick_retries(monkeypatch: Any) -> None:
    """For a retry test: backoff without Retry-After shrinks to 10 ms (a server's
    Retry-After is kept), and no proxy from the environment stands between the model and
    the local server."""
    from relaygraph.models._retry import RetryPolicy

    monkeypatch.setattr(RetryPolicy, "backoff", lambda self, attempt: 0.01)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
