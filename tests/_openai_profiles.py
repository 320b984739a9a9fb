"""The servers the Chat Completions double can play (``ServerProfile``), each from that
server's own code, docs and issue trackers, and the checks of a request that each one
refuses (tests/openai_server.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ._openai_requests import _APIError, _bad_request


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
LITELLM_LLAMA_CPP_PYTHON = replace(LLAMA_CPP_PYTHON, name="litellm-llama-cpp-python", litellm=True)
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
