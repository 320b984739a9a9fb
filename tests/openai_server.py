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

This module is the server (:class:`FakeOpenAI`) and its starters; the rest is split by
concern: ``tests/_openai_routes.py`` is its HTTP side, ``_openai_requests.py`` its checks of
a request, ``_openai_answers.py`` the script's answers, ``_openai_profiles.py`` the servers it
plays and ``_openai_faults.py`` the faults it injects. Import all of it from here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ._openai_answers import (
    _FINGERPRINT,
    MODEL_PREFIX,
    _check_turn,
    _chunks,
    _estimate_tokens,
    _llama_cpp_chunks,
    _parse_script,
)
from ._openai_faults import ANSWER_FAULT_KINDS, FAULT_KINDS, RETRIED_FAULT_KINDS, Faults
from ._openai_profiles import (
    LITELLM_LLAMA_CPP_PYTHON,
    LLAMA_CPP_PYTHON,
    OLLAMA,
    OPENAI,
    PROFILES,
    STRICT_FIELDS,
    VLLM_NO_TOOL_PARSER,
    ServerProfile,
    _check_profile,
)
from ._openai_requests import (
    _APIError,
    _bad_request,
    _check_messages,
    _digest,
    _forced_function,
    _message_text,
    _structured,
    _tool_names,
)
from ._openai_routes import _Handler, _Server

__all__ = [
    "ANSWER_FAULT_KINDS",
    "FAULT_KINDS",
    "LITELLM_LLAMA_CPP_PYTHON",
    "LLAMA_CPP_PYTHON",
    "MODEL_PREFIX",
    "OLLAMA",
    "OPENAI",
    "PROFILES",
    "RETRIED_FAULT_KINDS",
    "STRICT_FIELDS",
    "VLLM_NO_TOOL_PARSER",
    "FakeOpenAI",
    "Faults",
    "ServerProfile",
    "quick_retries",
    "script_servers",
    "serve_script",
]

KeyFrom = Callable[[dict[str, Any]], str | None]
"""Picks the script key of a request from its JSON body; None: the model's key."""


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
