"""The prompts the embedded model reads: the conversation in SmolLM2's chat template, and
the instruction that describes the choices of the decision it makes."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from relaygraph.models.local._grounding import citations
from relaygraph.models.local._offer import Offer, OfferedTool, text_of
from relaygraph.models.local._schema import grammar_safe
from relaygraph.models.local._team import numbered

__all__ = [
    "MESSAGE_CHARS",
    "chat_messages",
    "decision_instruction",
    "render",
    "schema_instruction",
    "with_instruction",
]

MESSAGE_CHARS = 2000
"""Longest message text put in a prompt; longer texts keep their start and end."""
CHOICE_CHARS = 160
"""Longest rendering of one offered value in the instruction."""


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    # The start says what a text is and the end often holds its conclusion: keep both.
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


def render_call(name: str, args: Mapping[str, Any]) -> str:
    # The same JSON the model emits, so its own history shows it the format.
    return json.dumps({"action": "call", "tool": name, "args": args}, ensure_ascii=False)


def chat_messages(
    messages: Sequence[BaseMessage],
    *,
    compact: Collection[str] = (),
    ids_only: Collection[str] = (),
) -> list[tuple[str, str]]:
    """Langchain messages as (role, text) in the three roles SmolLM2 was trained on.

    Results of the tools in ``compact`` show only their first line: the sentences to quote
    from them are listed in the instruction, and a whole document would cost seconds of
    prompt evaluation for nothing. Results of the tools in ``ids_only`` (a search, once the
    document it found was read) show only the ``[doc_id]`` they listed, for the same reason:
    prompt evaluation is most of a decision's time on a model this small on a CPU.
    """
    names: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            out.append(("system", clip(text_of(message))))
        elif isinstance(message, AIMessage):
            parts = [clip(text_of(message))] if text_of(message).strip() else []
            for call in message.tool_calls:
                names[call.get("id") or ""] = call["name"]
                parts.append(render_call(call["name"], call["args"]))
            out.append(("assistant", "\n".join(parts)))
        elif isinstance(message, ToolMessage):
            # The chat template has no tool role: a tool result reads as a user turn.
            name = message.name or names.get(message.tool_call_id, "tool")
            kind = "Error from" if message.status == "error" else "Result of"
            text = text_of(message)
            if name in compact and message.status != "error":
                text = text.split("\n", 1)[0] + " (read; its sentences are listed below)"
            elif name in ids_only and message.status != "error" and citations(text):
                text = " ".join(f"[{doc}]" for doc in citations(text))
            out.append(("user", f"{kind} tool {name}: {clip(text)}"))
        else:
            out.append(("user", clip(text_of(message))))
    return out


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= CHOICE_CHARS else text[: CHOICE_CHARS - 4] + '..."'


def _describe_tool(tool: OfferedTool) -> str:
    spec = tool.spec
    params = spec.get("parameters") or {}
    required = set(params.get("required", []))
    args = ", ".join(
        arg if arg in required else f"{arg}?" for arg in tool.args.get("properties", {})
    )
    description = " ".join(str(spec.get("description") or "").split())[:200]
    line = f"- {spec['name']}({args}): {description}"
    for arg, values in tool.choices.items():
        if arg in tool.quotes:
            line += f"\n  {arg}: a list of the numbers of the sentences below"
        else:
            shown = [_show(v) for v in values]
            if len(shown) > 1:
                shown[0] += " (best match)"  # Offered values come best first.
            line += f"\n  {arg}: one of {', '.join(shown)}"
    return line


def decision_instruction(choices: Offer) -> str:
    """What the model is told it may do at this decision."""
    if choices.fixed_answer is not None:
        answer = json.dumps({"action": "answer", "content": grammar_safe(choices.fixed_answer)})
    elif choices.passages:
        answer = (
            '{"action": "answer", "quotes": [<the numbers of the sentences below that answer '
            "the task>]}"
        )
    else:
        answer = '{"action": "answer", "content": <your reply to the user, as a string>}'
    sentences = ""
    if choices.passages:
        sentences = (
            f"\n\nSentences from the documents, best match first:\n{numbered(choices.passages)}"
        )
    if not choices.tools:
        note = "You already have the tool results you need. " if choices.exhausted else ""
        return f"{note}Reply with one JSON object: {answer}.{sentences}"
    listing = "\n".join(_describe_tool(t) for t in choices.tools)
    answer_part = f" To reply to the user: {answer}." if choices.answer else ""
    return (
        f"Tools you can call:\n{listing}\n\n"
        "Reply with one JSON object. To call a tool: "
        '{"action": "call", "tool": <tool name>, "args": <the tool\'s arguments>}.'
        f"{answer_part} Call a tool when you need facts or work you do not have yet; answer "
        f"when the results so far are enough.{sentences}"
    )


def schema_instruction(schema: Mapping[str, Any], shown: Mapping[str, Any] | None = None) -> str:
    """The fields of a structured output; ``shown`` narrows what a field's values are."""
    lines = []
    for field, spec in schema.get("properties", {}).items():
        narrowed = (shown or {}).get(field) or spec
        if "const" in narrowed:
            kind = _show(narrowed["const"])
        elif "enum" in narrowed:
            kind = "one of " + ", ".join(_show(v) for v in narrowed["enum"])
        else:
            kind = str(spec.get("type", "value"))
        description = " ".join(str(spec.get("description") or "").split())[:160]
        lines.append(f"- {field} ({kind}){': ' + description if description else ''}")
    fields = "\n".join(lines) or "- (any JSON object)"
    return f"Reply with one JSON object with these fields:\n{fields}"


def with_instruction(chat: list[tuple[str, str]], instruction: str) -> list[tuple[str, str]]:
    # Appended to the first system message (or a new one): a tiny model follows the system
    # turn best, and a stable instruction keeps the prompt prefix cacheable.
    if chat and chat[0][0] == "system":
        return [("system", f"{chat[0][1]}\n\n{instruction}"), *chat[1:]]
    return [("system", instruction), *chat]


def render(chat: Sequence[tuple[str, str]]) -> str:
    # SmolLM2's chat template (ChatML); its tokens <|im_start|>/<|im_end|> are BOS/EOS.
    turns = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in chat)
    return f"{turns}<|im_start|>assistant\n"
