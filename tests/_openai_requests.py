"""The Chat Completions double's checks of a request, as the real API makes them: its
messages, tools and response format, each refused with an OpenAI-style error body
(tests/openai_server.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_VALID_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


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


def _forced_function(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name")
        return name if isinstance(name, str) else None
    return None


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
