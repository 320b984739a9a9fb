"""A streamed Chat Completions answer, assembled as the server meant it.

Servers stream differently from OpenAI in ways that LangChain's chunk merging does not
expect (docs/model-servers.md):

* llama-cpp-python repeats a tool call's ``id``, ``type`` and ``name`` (and the legacy
  ``function_call.name``) in every chunk beside each argument fragment; joined, the name
  becomes ``RouteRouteRoute…`` and no tool of that name exists.
* llama-cpp-python, and gateways in front of servers that do not know
  ``stream_options.include_usage``, send no usage in a stream: the call would count 0 tokens.
* A stream can end cleanly (``[DONE]``, or the body's end) without any chunk carrying a
  ``finish_reason``: the answer stopped where the connection did, not where the model did.

:class:`StreamAssembly` watches the chunks of one stream and fixes or reports each case.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.outputs import ChatGenerationChunk

from relaygraph._names import USAGE_ESTIMATED_KEY
from relaygraph.models.scripted import estimate_tokens

__all__ = ["StreamAssembly", "stream_messages"]


class StreamAssembly:
    """What one stream has sent so far, to keep repeated fields out of the joined answer,
    and to say at its end whether it finished and what it cost."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._ids: dict[int, str] = {}
        self._function_name = ""
        self._text: list[str] = []
        self.finish_reason: str | None = None
        self.usage_seen = False

    def take(self, chunk: ChatGenerationChunk) -> ChatGenerationChunk:
        """``chunk`` as it should be joined: a tool call's name or id that repeats what its
        index already has is dropped (LangChain would append it again)."""
        finish = (chunk.generation_info or {}).get("finish_reason")
        if finish:
            self.finish_reason = finish
        message = chunk.message
        if not isinstance(message, AIMessageChunk):
            return chunk
        if message.usage_metadata:
            self.usage_seen = True
        self._text.append(message.text)
        repeated = False
        calls: list[ToolCallChunk] = []
        for call in message.tool_call_chunks:
            index = call.get("index")
            name, call_id = call.get("name"), call.get("id")
            if index is not None:
                if name and self._names.get(index) == name:
                    call, repeated = {**call, "name": None}, True
                elif name:
                    self._names[index] = self._names.get(index, "") + name
                if call_id and self._ids.get(index) == call_id:
                    call, repeated = {**call, "id": None}, True
                elif call_id:
                    self._ids[index] = call_id
            calls.append(call)
            self._text.append((call.get("name") or "") + (call.get("args") or ""))
        additional = message.additional_kwargs
        function_call = additional.get("function_call")
        if isinstance(function_call, dict) and function_call.get("name"):
            if function_call["name"] == self._function_name:
                function_call = {**function_call, "name": None}
                additional, repeated = {**additional, "function_call": function_call}, True
            else:
                self._function_name += function_call["name"]
        if not repeated:
            return chunk
        # A new message, not a copy: the chunk's parsed tool_calls are made from its
        # tool_call_chunks when it is built.
        fixed = AIMessageChunk(
            content=message.content,
            additional_kwargs=additional,
            response_metadata=message.response_metadata,
            name=message.name,
            id=message.id,
            usage_metadata=message.usage_metadata,
            tool_call_chunks=calls,
            chunk_position=message.chunk_position,
        )
        return ChatGenerationChunk(message=fixed, generation_info=chunk.generation_info)

    def estimated_usage(self, messages: Sequence[BaseMessage]) -> ChatGenerationChunk | None:
        """A last chunk carrying the stream's tokens, estimated, when the server reported
        none; None when it did. Counted as relaygraph's scripted model counts (about four
        characters a token): tiktoken would fetch its vocabulary from the internet."""
        if self.usage_seen:
            return None
        input_tokens = estimate_tokens("\n".join(m.text for m in messages))
        output_tokens = estimate_tokens("".join(self._text))
        usage = UsageMetadata(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
        )
        message = AIMessageChunk(
            content="", usage_metadata=usage, response_metadata={USAGE_ESTIMATED_KEY: True}
        )
        return ChatGenerationChunk(message=message)


def stream_messages(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[BaseMessage]:
    """The messages a ``_stream(messages, stop, run_manager, **kwargs)`` call was given."""
    messages = args[0] if args else kwargs.get("messages", [])
    return list(messages)
