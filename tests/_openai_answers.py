"""The Chat Completions double's answers: a script's turns, checked against the request
that asked for them, as a completion or as the chunks of a stream (tests/openai_server.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from relaygraph.errors import ConfigError
from relaygraph.models.scripted import ScriptTurn, estimate_tokens, load_script, parse_turns

from ._openai_profiles import OPENAI, ServerProfile
from ._openai_requests import _bad_request, _forced_function

Json = dict[str, Any]
"""A JSON object of the protocol: a request, a message, an answer or a chunk."""

MODEL_PREFIX = "script-"
"""A request for model ``script-<key>`` is answered by the script's ``<key>`` turns."""

_FINGERPRINT = "fp_relaygraph"
_FRAGMENT = 8
"""Characters per streamed tool-call argument fragment."""


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


def _pieces(text: str) -> list[str]:
    """Split content into word-sized stream deltas (whitespace kept, so they join back)."""
    return re.findall(r"\S+\s*|\s+", text)


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
    head: Json, message: Json, finish: str, usage: dict[str, int], include_usage: bool
) -> list[Json]:
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
    head: Json, message: Json, finish: str, usage: dict[str, int], include_usage: bool
) -> list[Json]:
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
