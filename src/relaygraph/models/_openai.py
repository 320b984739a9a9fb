"""``openai:MODEL``: ``ChatOpenAI`` fitted to the server at hand, not only to OpenAI's.

Servers that speak Chat Completions differ in what they accept (docs/model-servers.md):
llama-cpp-python rejects ``response_format: json_schema`` and ``content: null``, vLLM without a
tool parser rejects ``tool_choice: "auto"``, Ollama ignores ``tool_choice``. The model built
here carries a spec's options (:class:`~relaygraph.models.OpenAIOptions`) into every request,
asks for structured output with the method that works (``auto`` finds it and remembers it per
server and model for the process), retries only what may pass (:mod:`._retry`), and turns
every failed call into a :class:`~relaygraph.models.ModelCallError` naming the role, the
model and the server's own words, reported as a ``model_error`` event.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Mapping,
)
from contextlib import aclosing, closing, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

import httpx2
import openai
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda, RunnableSequence
from langchain_core.runnables.config import ensure_config
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field, PrivateAttr

from relaygraph._calls import Call, Steps, run_async, run_sync
from relaygraph._deadline import seconds_left
from relaygraph.errors import ConfigError, ModelSpecError
from relaygraph.events import ModelRetryEvent, StructuredMethodEvent, event_sink
from relaygraph.models._errors import AnswerCut, ModelCallError, server_message
from relaygraph.models._options import (
    STRUCTURED_ENV,
    STRUCTURED_METHODS,
    OpenAIOptions,
    StructuredMethod,
)
from relaygraph.models._retry import (
    RetryingAsyncClient,
    RetryNote,
    RetryPolicy,
    TimeLimitReached,
    attempts_made,
    is_request_error,
    reporting_retries,
    shared_client,
    tls_context,
)
from relaygraph.models._stream import StreamAssembly, stream_messages

if TYPE_CHECKING:
    from langchain_core.callbacks import CallbackManagerForLLMRun
    from langchain_core.outputs import ChatGenerationChunk, ChatResult

    from relaygraph.models._spec import ModelSpec

__all__ = [
    "AUTO_ORDER",
    "RelaygraphChatOpenAI",
    "build_openai_model",
    "emit_event",
    "learned_structured_method",
]

log = logging.getLogger("relaygraph.models")

OPENAI_API = "https://api.openai.com/v1"
AUTO_ORDER: tuple[StructuredMethod, ...] = ("json_schema", "function_calling", "json_mode")
"""The methods ``auto`` tries, in order: the strictest first."""
_REQUEST_FIELDS: dict[str, tuple[str, ...]] = {
    "json_schema": ("response_format", "json_schema"),
    "json_mode": ("response_format", "json_object"),
    "function_calling": ("tool", "function"),
}
"""Words in a 5xx body that show the server refused this method's part of the request."""
_CALL_ERRORS: tuple[type[Exception], ...] = (openai.APIError, httpx2.HTTPError)
_UNPARSED_ANSWERS: tuple[type[Exception], ...] = (
    openai.LengthFinishReasonError,
    openai.ContentFilterFinishReasonError,
)
"""The SDK's structured-output parse gave up on an answer that came: an output problem
(like invalid JSON), not a failed call."""
_MALFORMED_ANSWERS: tuple[type[Exception], ...] = (
    IndexError,
    AttributeError,
    TypeError,
    KeyError,
    ValueError,
)
"""What the SDK and ChatOpenAI raise, bare, on a 200 whose body is no chat completion (no
``choices``, a null message, a body that is not JSON or is an HTML page, a stream without an
answer): the server failed the call as surely as with a 500, and is treated as such."""

_probing: ContextVar[StructuredMethod | None] = ContextVar("relaygraph_probing", default=None)
"""The structured method ``auto`` is trying: its rejection is expected, not reported."""

_learned: dict[tuple[str, str], StructuredMethod] = {}
_learned_lock = threading.Lock()

_STRUCTURED_CACHE_SIZE = 32
"""Structured-output runnables a model keeps, per schema and method: a supervisor asks for
its route schema at every call, and building the chain again cost about a millisecond."""


def learned_structured_method(base_url: str | None, model: str) -> StructuredMethod | None:
    """The structured method ``auto`` found for this server and model in this process."""
    with _learned_lock:
        return _learned.get((base_url or OPENAI_API, model))


def emit_event(event: Mapping[str, Any]) -> bool:
    """Send ``event`` to the running task's event stream; nothing outside a task.

    Returns:
        Whether a task's stream took it.
    """
    from langgraph.config import get_stream_writer

    try:
        writer = event_sink() or get_stream_writer()
    except (RuntimeError, KeyError):
        return False  # Not inside a graph run (a bare model call, `relaygraph doctor`).
    writer(event)
    return True


def rejects(method: StructuredMethod, error: ModelCallError) -> bool:
    """Whether ``error`` is the server refusing ``method``'s request (not a passing fault):
    a 400 or 422, or a 5xx whose body names the method's part of the request."""
    if error.status in (400, 422):
        return True
    if error.status is None or error.status < 500:
        return False
    detail = error.detail.lower()
    return any(word in detail for word in _REQUEST_FIELDS.get(method, ()))


def _schema_instruction(schema: Any) -> str:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        schema = schema.model_json_schema()
    return (
        "Reply with one JSON object, and nothing else, that matches this JSON schema:\n"
        + json.dumps(schema, separators=(",", ":"))
    )


def _with_instruction(messages: list[BaseMessage], instruction: str) -> list[BaseMessage]:
    """The schema goes into the system message: a second system message later in the
    conversation breaks some servers' chat templates."""
    if messages and isinstance(messages[0], SystemMessage):
        first = messages[0]
        return [SystemMessage(content=f"{first.text}\n\n{instruction}"), *messages[1:]]
    return [SystemMessage(content=instruction), *messages]


def _unparsed(exc: Exception) -> AnswerCut:
    if isinstance(exc, openai.LengthFinishReasonError):
        usage = exc.completion.usage
        reply = AIMessage(content="")
        if usage is not None:
            reply.usage_metadata = UsageMetadata(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
            )
        choice = exc.completion.choices[0] if exc.completion.choices else None
        if choice is not None and choice.message.content:
            reply.content = choice.message.content
        return _cut_answer("length", usage.completion_tokens if usage else None, reply)
    return _cut_answer("content_filter", None, None)


def _cut_answer(finish_reason: str, tokens: int | None, reply: AIMessage | None) -> AnswerCut:
    """A structured answer that stopped before its JSON was complete, as what it is."""
    if finish_reason == "length":
        return AnswerCut(
            "the answer reached the token limit before its JSON was complete"
            + (f" ({tokens} tokens)" if tokens else ""),
            reply,
        )
    return AnswerCut("the server's content filter stopped the answer", reply)


def _check_json_answer(result: ChatResult, kwargs: Mapping[str, Any]) -> ChatResult:
    """Refuse a cut answer to a request whose schema went as JSON (``create``, see
    ``_get_request_payload``), as the SDK's ``parse()`` does for the others."""
    if not isinstance(kwargs.get("response_format"), dict) or not result.generations:
        return result
    generation = result.generations[0]
    finish = (generation.generation_info or {}).get("finish_reason")
    if finish in ("length", "content_filter"):
        usage = (result.llm_output or {}).get("token_usage") or {}
        reply = getattr(generation, "message", None)
        raise _cut_answer(
            finish,
            usage.get("completion_tokens"),
            reply if isinstance(reply, AIMessage) else None,
        )
    return result


def _parsed(out: dict[str, Any]) -> Any:
    if out.get("parsing_error") is not None:
        raise out["parsing_error"]
    return out.get("parsed")


def _with_raw(model: Runnable[Any, Any], parser: Runnable[Any, Any], *, name: str) -> Any:
    """``{"raw", "parsed", "parsing_error"}``: what ChatOpenAI's ``include_raw=True`` chain
    answers (a parser's error goes into ``parsing_error``; a failed call raises), in one
    step. Its chain runs the model in a thread of a pool made for each call and wraps the
    parser in a fallback: work repeated at every supervisor turn for nothing the caller
    uses."""

    def steps(value: Any, config: RunnableConfig) -> Steps[dict[str, Any]]:
        raw = yield Call.invoke(model, value, config)
        try:
            parsed = yield Call.invoke(parser, raw, config)
        except Exception as exc:  # As ChatOpenAI's fallback: any parser error is reported.
            return {"raw": raw, "parsed": None, "parsing_error": exc}
        return {"raw": raw, "parsed": parsed, "parsing_error": None}

    return _Direct(steps, name=name)


class _Direct(Runnable[Any, Any]):
    """Steps (:mod:`relaygraph._calls`) as a runnable, called directly: their calls made
    on the thread under ``invoke``, awaited under ``ainvoke``.

    ``RunnableLambda`` inspects its function's signature (``inspect.signature``) and opens a
    callback run of its own at every call, every supervisor turn, for a step whose model
    call is traced by itself. The config goes to
    the functions unchanged, so the model's run keeps the caller's callbacks and parent.
    """

    def __init__(self, steps: Callable[[Any, RunnableConfig], Steps[Any]], *, name: str) -> None:
        self._steps, self.name = steps, name

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return run_sync(self._steps(input, ensure_config(config)))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await run_async(self._steps(input, ensure_config(config)))


def _structured_key(
    schema: Any, method: str, include_raw: bool, strict: bool | None, kwargs: Mapping[str, Any]
) -> tuple[Any, ...] | None:
    """What a cached structured-output runnable is kept under; None when the request
    cannot be keyed (keyword arguments, or a schema that is neither a class nor JSON)."""
    if kwargs:
        return None
    if isinstance(schema, type):
        return (schema, method, include_raw, strict)
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return (text, method, include_raw, strict)


class RelaygraphChatOpenAI(ChatOpenAI):
    """``ChatOpenAI`` with a spec's options: its structured method, request tweaks for
    servers other than OpenAI's, and failures as :class:`ModelCallError`.

    Built by :func:`build_openai_model` (``load_model("openai:...")``); the fields below
    come from the spec's options.
    """

    relaygraph_role: str = Field(default="", exclude=True)
    """Who calls the model (an agent, ``supervisor``, ``finalize``), for errors and events."""
    relaygraph_spec: str = Field(default="", exclude=True)
    structured_method: StructuredMethod | None = Field(default=None, exclude=True)
    """None: ``$RELAYGRAPH_OPENAI_STRUCTURED`` when the route is asked for, else ``auto``."""
    omit_parallel_tool_calls: bool = Field(default=False, exclude=True)
    empty_tool_call_content: bool = Field(default=False, exclude=True)
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_completion_tokens", exclude=True
    )
    _structured: dict[tuple[Any, ...], Runnable[Any, Any]] = PrivateAttr(default_factory=dict)

    # -- the request -------------------------------------------------------------------

    def _get_request_payload(
        self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "messages" not in payload:  # the Responses API: its own fields
            return payload
        if self.omit_parallel_tool_calls:
            payload.pop("parallel_tool_calls", None)
        if self.max_tokens_field == "max_tokens" and "max_completion_tokens" in payload:
            payload["max_tokens"] = payload.pop("max_completion_tokens")
        if self.empty_tool_call_content:
            for message in payload["messages"]:
                if message.get("role") == "assistant" and message.get("content") is None:
                    message["content"] = ""
        response_format = payload.get("response_format")
        if isinstance(response_format, dict) and not payload.get("stream"):
            # A schema given as JSON, not as a class (the route's, json_mode's): the SDK's
            # parse() has nothing to fill and only adds its own request and answer
            # handling to every call. Sent through create() instead, in the same
            # body; the parser checks the answer, and _check_json_answer a cut one.
            payload["extra_body"] = {
                **(payload.get("extra_body") or {}),
                "response_format": payload.pop("response_format"),
            }
        return payload

    # -- failures ----------------------------------------------------------------------

    def _failure(self, exc: Exception) -> ModelCallError:
        status: int | None = None
        refused = False
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            try:
                body: Any = exc.response.json()
            except ValueError:
                body = exc.response.text
            detail = server_message(body, exc.message)
            refused = status in (400, 422) or (
                status >= 500 and is_request_error(exc.response.text)
            )
        else:
            detail = self._no_answer(exc)
        error = ModelCallError(
            role=self.relaygraph_role or "model",
            model=self.relaygraph_spec or f"openai:{self.model_name}",
            status=status,
            detail=detail,
            attempts=attempts_made.get(),
            refused=refused,
        )
        probing = _probing.get()
        if probing is None or not rejects(probing, error):
            self._report(error)
        return error

    def _malformed(self, exc: Exception) -> ModelCallError:
        """A 200 that held no answer, as a failed call naming the server and what was wrong."""
        said = " ".join(str(exc).split())[:160]
        if isinstance(exc, json.JSONDecodeError):
            what = f"a body that is not JSON ({said})"
        elif isinstance(exc, IndexError):
            what = "no choices"
        elif isinstance(exc, (AttributeError, TypeError)) and "NoneType" in said:
            what = "a null message or field"
        elif "No generations found in stream" in said:
            what = "a stream without an answer"
        elif "Unexpected response type" in said:
            what = "a body that is not a chat completion (" + said.split("got ", 1)[-1] + ")"
        else:
            what = f"an answer that could not be read ({type(exc).__name__}: {said})"
        error = ModelCallError(
            role=self.relaygraph_role or "model",
            model=self.relaygraph_spec or f"openai:{self.model_name}",
            status=200,
            detail=f"the server at {self.openai_api_base or OPENAI_API} answered with {what}",
            attempts=attempts_made.get(),
        )
        self._report(error)
        return error

    def _no_answer(self, exc: Exception) -> str:
        """What went wrong when no answer came, from the transport's own error (the SDK and
        LangChain wrap it, once each)."""
        root: BaseException = exc
        while isinstance(root, openai.APIError) and root.__cause__ is not None:
            root = root.__cause__
        said = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
        if isinstance(root, TimeLimitReached) or seconds_left() == 0:
            return f"the task's time limit (max_seconds) ran out during the call ({said})"
        if isinstance(root, httpx2.TimeoutException) or isinstance(exc, openai.APITimeoutError):
            return f"the request timed out ({said})"
        if isinstance(root, httpx2.ConnectError):
            return f"could not reach {self.openai_api_base or OPENAI_API} ({said})"
        if isinstance(root, httpx2.TransportError):
            return f"the connection broke before the answer was complete ({said})"
        return said

    def _report(self, error: ModelCallError) -> None:
        # Said once: a task's stream carries the failure to whoever watches it (the CLI
        # prints its event), so the log repeats it only at INFO; outside a task, the log
        # is the only report beside the raised error.
        delivered = emit_event(error.to_event())
        log.log(logging.INFO if delivered else logging.WARNING, "%s", error)

    def _retried(self, note: RetryNote) -> None:
        """A retry of this model's call, reported by the HTTP client (which other models
        share) as a ``model_retry`` event of this model's role."""
        _report_retry(self.relaygraph_role, self.relaygraph_spec, note)

    # The HTTP client reports retries to the model whose call made them (reporting_retries).
    # A stream sends its request, and retries it, before its first chunk: the reporter is
    # set for that step only, never across a yield, where it would be the caller's.

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._call_failures(), reporting_retries(self._retried):
            result = super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        return self._answer(result, kwargs)

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        with self._call_failures(), reporting_retries(self._retried):
            result = await super()._agenerate(*args, **kwargs)
        return self._answer(result, kwargs)

    def _answer(self, result: ChatResult, kwargs: Mapping[str, Any]) -> ChatResult:
        """A whole answer's checks: it has a choice, and its JSON was not cut."""
        if not result.generations:  # `choices: []`: ChatOpenAI returns an empty result.
            raise self._malformed(IndexError("no choices"))
        return _check_json_answer(result, kwargs)

    @contextmanager
    def _call_failures(self) -> Iterator[None]:
        """The SDK's and the HTTP client's exceptions of a call, raised as what they mean
        to a run: an answer the SDK could not parse, a failed call, a malformed answer."""
        try:
            yield
        except _UNPARSED_ANSWERS as exc:
            raise _unparsed(exc) from exc
        except _CALL_ERRORS as exc:
            raise self._failure(exc) from exc
        except _MALFORMED_ANSWERS as exc:
            raise self._malformed(exc) from exc

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        with self._call_failures():
            # ChatOpenAI's stream methods are generators (typed as iterators).
            chunks = cast("Generator[ChatGenerationChunk]", super()._stream(*args, **kwargs))
            assembly = StreamAssembly()
            with closing(chunks):  # a stream left early ends its response at once
                with reporting_retries(self._retried):
                    first = next(chunks, None)
                if first is None:  # A 200 whose stream held no chunk: no answer came.
                    raise ValueError("No generations found in stream.")
                yield assembly.take(first)
                for chunk in chunks:
                    yield assembly.take(chunk)
            yield from self._stream_end(assembly, stream_messages(args, kwargs), kwargs)

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        with self._call_failures():
            chunks = cast("AsyncGenerator[ChatGenerationChunk]", super()._astream(*args, **kwargs))
            assembly = StreamAssembly()
            async with aclosing(chunks):
                with reporting_retries(self._retried):
                    first = await anext(chunks, None)
                if first is None:  # A 200 whose stream held no chunk: no answer came.
                    raise ValueError("No generations found in stream.")
                yield assembly.take(first)
                async for chunk in chunks:
                    yield assembly.take(chunk)
            for last in self._stream_end(assembly, stream_messages(args, kwargs), kwargs):
                yield last

    def _stream_end(
        self, assembly: StreamAssembly, messages: list[BaseMessage], kwargs: Mapping[str, Any]
    ) -> Iterator[ChatGenerationChunk]:
        """After a stream's last chunk: a stream that never said why it stopped is a failed
        call, and one that reported no usage gets its tokens estimated."""
        if assembly.finish_reason is None and not self._use_responses_api(
            {**kwargs, **self.model_kwargs}
        ):
            # The connection ended the answer, not the model: whatever came is a part of
            # it, which a run must not take for the whole (a report cut mid-sentence, a
            # tool call's arguments cut mid-JSON).
            error = ModelCallError(
                role=self.relaygraph_role or "model",
                model=self.relaygraph_spec or f"openai:{self.model_name}",
                status=200,
                detail=(
                    "the connection broke before the answer was complete: the stream from "
                    f"{self.openai_api_base or OPENAI_API} ended without a finish_reason"
                ),
                attempts=attempts_made.get(),
            )
            self._report(error)
            raise error
        estimate = assembly.estimated_usage(messages)
        if estimate is not None:
            yield estimate

    # -- structured output -------------------------------------------------------------

    def chosen_structured_method(self) -> StructuredMethod:
        """The spec's method, else ``$RELAYGRAPH_OPENAI_STRUCTURED``, else ``auto``.

        Raises:
            ConfigError: The environment variable names no method.
        """
        if self.structured_method is not None:
            return self.structured_method
        value = os.environ.get(STRUCTURED_ENV, "").strip() or "auto"
        if value not in STRUCTURED_METHODS:
            raise ConfigError(
                f"{STRUCTURED_ENV}={value!r} is not a structured-output method; "
                f"use one of {', '.join(STRUCTURED_METHODS)}"
            )
        return value

    def with_structured_output(
        self,
        schema: Any = None,
        *,
        method: StructuredMethod | None = None,
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, Any]:
        """Structured output by ``method``; when None, by the spec's method (see
        :meth:`chosen_structured_method`). ``json_mode`` puts the schema into the system
        message; ``auto`` tries :data:`AUTO_ORDER` and keeps the first the server takes.

        With ``include_raw``, returns ``{"raw", "parsed", "parsing_error"}`` as ChatOpenAI
        does (the raw reply of the method that answered).
        """
        chosen = method or self.chosen_structured_method()
        if chosen == "auto":
            # Once this process has learned the server's method, ``auto`` is that method.
            chosen = learned_structured_method(self.openai_api_base, self.model_name) or "auto"
        key = _structured_key(schema, chosen, include_raw, strict, kwargs)
        cached = self._structured.get(key) if key is not None else None
        if cached is not None:
            return cached
        if chosen == "auto":
            runnable = self._auto_structured(schema, strict=strict, **kwargs)
        else:
            runnable = self._structured_by(chosen, schema, strict=strict, **kwargs)
        if not include_raw:
            runnable = runnable | RunnableLambda(_parsed, name="structured_parsed")
        if key is not None:
            if len(self._structured) >= _STRUCTURED_CACHE_SIZE:
                self._structured.pop(next(iter(self._structured)), None)
            self._structured[key] = runnable
        return runnable

    def _structured_by(
        self, method: StructuredMethod, schema: Any, *, strict: bool | None, **kwargs: Any
    ) -> Runnable[Any, Any]:
        """``{"raw", "parsed", "parsing_error"}`` by ``method``: ChatOpenAI's model and
        parser for it, called one after the other (see :func:`_with_raw`)."""
        if method == "auto":
            raise ValueError("'auto' is no single method; use with_structured_output")
        if method != "json_mode":  # json_mode takes no `strict`
            kwargs = {"strict": strict, **kwargs}
        chain = super().with_structured_output(schema, method=method, include_raw=False, **kwargs)
        if not isinstance(chain, RunnableSequence):  # ChatOpenAI returns `llm | parser`
            raise TypeError(f"unexpected structured-output chain {type(chain).__name__}")
        steps = [*chain.middle, chain.last]
        model, parser = chain.first, steps[0] if len(steps) == 1 else RunnableSequence(*steps)
        if method == "json_mode":
            instruction = _schema_instruction(schema)

            def instructed(value: Any) -> list[BaseMessage]:
                return _with_instruction(self._convert_input(value).to_messages(), instruction)

            model = RunnableLambda(instructed, name="json_mode_schema") | model
        return _with_raw(model, parser, name=f"structured_{method}")

    def _auto_structured(self, schema: Any, *, strict: bool | None, **kwargs: Any) -> Any:
        key = (self.openai_api_base or OPENAI_API, self.model_name)
        built: dict[StructuredMethod, Runnable[Any, Any]] = {}

        def by(method: StructuredMethod) -> Runnable[Any, Any]:
            # Built when first used: once a method is learned, the others never are.
            if method not in built:
                built[method] = self._structured_by(method, schema, strict=strict, **kwargs)
            return built[method]

        def learned() -> StructuredMethod | None:
            # A method the server took once is not probed again: a 400 on it then is about
            # this request (a context too long, a message the server refuses), which every
            # other method would be refused too; it fails the call like any other error,
            # reported once, instead of costing two more requests that hide it.
            with _learned_lock:
                return _learned.get(key)

        def settle(method: StructuredMethod, rejected: dict[str, str]) -> None:
            with _learned_lock:
                before = _learned.get(key)
                _learned[key] = method
            if method == before or not rejected:
                return
            # Said once per process: only the call that found the method gets here.
            refused = "; ".join(f"{m}: {why}" for m, why in rejected.items())
            log.warning(
                "%s at %s refused %s; structured output uses %s from now on in this "
                "process (set it in the spec to skip the probe: ?structured=%s)",
                self.model_name,
                key[0],
                refused,
                method,
                method,
            )
            emit_event(
                StructuredMethodEvent(
                    type="structured_method",
                    role=self.relaygraph_role,
                    model=self.relaygraph_spec,
                    base_url=key[0],
                    method=method,
                    rejected=rejected,
                )
            )

        def give_up(error: ModelCallError) -> ModelCallError:
            self._report(error)
            return error

        def steps(value: Any, config: RunnableConfig) -> Steps[Any]:
            known = learned()
            if known is not None:
                return (yield Call.invoke(by(known), value, config))
            rejected: dict[str, str] = {}
            last: ModelCallError | None = None
            for method in AUTO_ORDER:
                token = _probing.set(method)
                try:
                    out = yield Call.invoke(by(method), value, config)
                except ModelCallError as exc:
                    if not rejects(method, exc):
                        raise
                    rejected[method], last = exc.reason, exc
                    continue
                finally:
                    _probing.reset(token)
                settle(method, rejected)
                return out
            assert last is not None
            raise give_up(last)

        return _Direct(steps, name="structured_auto")


def _report_retry(role: str, spec: str, note: RetryNote) -> None:
    log.info("model call of %r (%s) retried: %s", role, spec, note.error)
    emit_event(
        ModelRetryEvent(
            type="model_retry",
            role=role,
            model=spec,
            attempt=note.attempt,
            status=note.status,
            error=note.error,
            wait_seconds=round(note.wait_seconds, 3),
            retry_after=note.retry_after,
        )
    )


def _is_openai(base_url: str | None) -> bool:
    return base_url is None or urlsplit(base_url).hostname == "api.openai.com"


def build_openai_model(
    spec: ModelSpec, *, role: str, base_url: str | None = None
) -> RelaygraphChatOpenAI:
    """The chat model of an ``openai:`` or ``openai-responses:`` spec, for ``role``.

    Models of one server, timeout and retry policy share the process's sync HTTP client
    (:func:`~relaygraph.models._retry.shared_client`), so building one costs no TLS setup
    and no new connections; each has an async client of its own (bound to the event loop
    that uses it) on the process's TLS context.

    Args:
        spec: The parsed spec.
        role: Who calls the model, for its errors and events.
        base_url: The server; ``$OPENAI_BASE_URL`` (else OpenAI's) when None.

    Raises:
        ModelSpecError: Neither ``OPENAI_API_KEY`` nor a base URL is set.
    """
    api_key = os.environ.get("OPENAI_API_KEY")
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    if not api_key:
        if not base_url:
            raise ModelSpecError(
                str(spec),
                "OPENAI_API_KEY is not set; set it, or set OPENAI_BASE_URL to a local server "
                "that speaks the Chat Completions protocol (vLLM, Ollama, llama.cpp, LiteLLM)",
            )
        # Local OpenAI-compatible servers ignore the key, but the client insists on one.
        api_key = "relaygraph-no-key"
    options = spec.options or OpenAIOptions()
    timeout: Any = options.timeout if options.timeout is not None else openai.DEFAULT_TIMEOUT
    policy = RetryPolicy(max_retries=options.max_retries)
    return RelaygraphChatOpenAI(
        model=spec.name,
        api_key=api_key,  # type: ignore[arg-type]
        base_url=base_url,
        use_responses_api=spec.provider == "openai-responses",
        # Ask for usage in streamed replies too; budgets count tokens either way.
        stream_usage=True,
        timeout=timeout,
        # Retries happen in the HTTP client (relaygraph.models._retry), not in the SDK.
        max_retries=0,
        max_tokens=options.max_tokens,  # type: ignore[call-arg]
        default_headers=options.extra_headers or None,
        extra_body=options.extra_body or None,
        http_client=shared_client(base_url=base_url or OPENAI_API, timeout=timeout, policy=policy),
        http_async_client=RetryingAsyncClient(policy=policy, timeout=timeout, verify=tls_context()),
        relaygraph_role=role,
        relaygraph_spec=str(spec),
        structured_method=options.structured,
        omit_parallel_tool_calls=options.parallel_tool_calls == "omit",
        empty_tool_call_content=options.tool_call_content == "empty",
        max_tokens_field="max_completion_tokens" if _is_openai(base_url) else "max_tokens",
    )
