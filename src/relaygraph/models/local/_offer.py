"""What the embedded model is offered at one decision: which tools, with which arguments
narrowed from the conversation, and whether (and from what) it may answer."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from relaygraph.models.local._grounding import (
    Passage,
    citations,
    keywords,
    rank_passages,
    source_passages,
)
from relaygraph.models.local._narrow import (
    FromResults,
    Keywords,
    OneOf,
    Quotes,
    ToolNarrowing,
)
from relaygraph.models.local._schema import (
    HANDOFF_PREFIX,
    answer_schema,
    args_schema,
    grammar_safe,
)
from relaygraph.models.local._team import TeamInput, picked, quotes_schema, render_quotes

__all__ = ["Call", "Conversation", "Offer", "OfferedTool", "offer"]

MAX_TOOL_RESULTS = 2
"""Tool results per conversation (since the last human message) before only an answer is
offered: a tiny model would otherwise call tools forever."""
MAX_PASSAGES = 4
"""Candidate sentences an answer chooses among: the best ranked."""
ANSWER_CHOICES = 1
"""Sentences the model chooses for an answer, added to the ones it always quotes
(``_team.ALWAYS_QUOTED``): an answer quotes two or three sentences, which finalize then
quotes whole without a model call (``_team.MAX_FINAL_QUOTES``)."""


def text_of(message: BaseMessage) -> str:
    return message.text if isinstance(message.content, list) else str(message.content)


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    """One tool call since the last human message, and its result when it has one."""

    tool: str
    args: Mapping[str, Any]
    result: str | None
    ok: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class Conversation:
    """The conversation as the decision reads it: the last human message (parsed in the
    team's formats) and the tool calls made since."""

    team: TeamInput
    calls: tuple[Call, ...]

    @classmethod
    def of(cls, messages: Sequence[BaseMessage]) -> Conversation:
        start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
        human = text_of(messages[start]) if start >= 0 else ""
        results = {m.tool_call_id: m for m in messages[start + 1 :] if isinstance(m, ToolMessage)}
        calls: list[Call] = []
        for message in messages[start + 1 :]:
            if not isinstance(message, AIMessage):
                continue
            for call in message.tool_calls:
                answered = results.get(call.get("id") or "")
                calls.append(
                    Call(
                        tool=call["name"],
                        args=call["args"],
                        result=text_of(answered) if answered is not None else None,
                        ok=answered is not None and answered.status != "error",
                    )
                )
        return cls(team=TeamInput.parse(human), calls=tuple(calls))

    @property
    def results(self) -> int:
        return sum(call.result is not None for call in self.calls)

    def used(self, tool: str, arg: str) -> list[Any]:
        return [c.args.get(arg) for c in self.calls if c.tool == tool]


@dataclass(frozen=True, kw_only=True, slots=True)
class OfferedTool:
    """A tool as offered: the grammar of its arguments, and how the model's choice of a
    quoted text becomes the argument's value."""

    spec: Mapping[str, Any]
    args: dict[str, Any]
    choices: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """Narrowed arguments and their values, to show the model."""
    quotes: Mapping[str, Sequence[Passage]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def arguments(self, generated: Mapping[str, Any]) -> dict[str, Any]:
        """The tool's arguments from the generated ones: a quote argument's chosen sentences
        become its text, with their citations."""
        out = dict(generated)
        for arg, passages in self.quotes.items():
            if arg in out:
                out[arg] = render_quotes(picked(passages, out[arg]))
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Offer:
    """The choices of one decision."""

    tools: tuple[OfferedTool, ...]
    answer: bool
    passages: tuple[Passage, ...] = ()
    """When not empty, an answer is made of these sentences, chosen by the model."""
    fixed_answer: str | None = None
    """When set, the only answer offered: the agent could read nothing to answer from."""
    exhausted: bool = False

    def answer_schema(self) -> dict[str, Any]:
        if self.fixed_answer is not None:
            return answer_schema(const=grammar_safe(self.fixed_answer))
        if self.passages:
            return {
                "type": "object",
                "properties": {
                    "action": {"const": "answer"},
                    "quotes": quotes_schema(self.passages, ANSWER_CHOICES),
                },
                "required": ["action", "quotes"],
            }
        return answer_schema()

    def schema(self) -> dict[str, Any]:
        """The decision's grammar: one alternative per tool, and the answer if offered."""
        calls = [
            {
                "type": "object",
                "properties": {
                    "action": {"const": "call"},
                    "tool": {"const": tool.name},
                    "args": tool.args,
                },
                "required": ["action", "tool", "args"],
            }
            for tool in self.tools
        ]
        answer = [self.answer_schema()] if self.answer or not calls else []
        return {"anyOf": [*calls, *answer]}

    def answer_text(self, decision: Mapping[str, Any]) -> str:
        if self.fixed_answer is not None:
            return self.fixed_answer
        if self.passages and "quotes" in decision:
            return render_quotes(picked(self.passages, decision["quotes"]))
        return str(decision.get("content") or "").strip()


def grounding(
    conversation: Conversation, narrowings: Mapping[str, ToolNarrowing]
) -> tuple[Passage, ...]:
    """The sentences an answer may quote: those of the documents read in this visit (results
    of ``sources`` tools), else the cited sentences of the input, best ranked first."""
    read: list[Passage] = []
    for call in conversation.calls:
        narrowing = narrowings.get(call.tool)
        if narrowing is None or not narrowing.sources or not call.ok or not call.result:
            continue
        ids = citations(call.result.split("\n", 1)[0])
        if ids:
            read += source_passages(call.result.split("\n", 1)[-1], ids[0])
    team = conversation.team
    pool = read or [p for _, p in team.cited()]
    return tuple(rank_passages(pool, team.focus, limit=MAX_PASSAGES))


def _narrow_arg(
    rule: Any, tool: str, arg: str, conversation: Conversation, passages: Sequence[Passage]
) -> tuple[dict[str, Any], list[Any]] | None:
    """The grammar of one narrowed argument and its values; None when none is left."""
    used = conversation.used(tool, arg)
    if isinstance(rule, Keywords):
        words = keywords(conversation.team.focus, limit=rule.max_words)
        queries = [" ".join(words)]
        if len(words) > 2:
            queries.append(" ".join(words[:2]))
        queries += words
        queries = [grammar_safe(q).strip() for q in queries]
        values = [q for q in dict.fromkeys(queries) if q and q not in used][: rule.queries]
    elif isinstance(rule, FromResults):
        pattern = re.compile(rule.match, re.M)
        seen = [
            match
            for call in conversation.calls
            if call.tool == rule.tool and call.ok and call.result
            for match in pattern.findall(call.result)
        ]
        fresh = [v for v in dict.fromkeys(seen) if v not in used and grammar_safe(v) == v]
        values = fresh[: rule.limit]
    elif isinstance(rule, OneOf):
        values = [v for v in rule.values if not isinstance(v, str) or grammar_safe(v) == v]
    else:
        if not passages:
            return None
        return quotes_schema(passages, rule.max_items), list(range(1, len(passages) + 1))
    if not values:
        return None
    return ({"const": values[0]} if len(values) == 1 else {"enum": values}), values


def offer_tool(
    spec: Mapping[str, Any],
    narrowing: ToolNarrowing | None,
    conversation: Conversation,
    passages: Sequence[Passage],
) -> OfferedTool | None:
    """The tool with its arguments narrowed, or None when it may not be offered now."""
    base = args_schema(spec)
    if narrowing is None:
        return OfferedTool(spec=spec, args=base)
    name = str(spec["name"])
    calls = sum(c.tool == name for c in conversation.calls)
    if narrowing.max_calls is not None and calls >= narrowing.max_calls:
        return None
    if narrowing.after and not any(c.tool in narrowing.after for c in conversation.calls):
        return None
    required = set(base.get("required", []))
    props: dict[str, Any] = {}
    choices: dict[str, list[Any]] = {}
    quotes: dict[str, Sequence[Passage]] = {}
    for arg, prop in (base.get("properties") or {}).items():
        rule = narrowing.args.get(arg)
        if rule is None:
            if arg in required:
                props[arg] = prop
            continue  # An optional argument nobody narrowed keeps its default.
        narrowed = _narrow_arg(rule, name, arg, conversation, passages)
        if narrowed is None:
            if isinstance(rule, Quotes):  # Nothing to quote: the model writes the text.
                props[arg] = prop
                continue
            return None
        props[arg], choices[arg] = narrowed
        if isinstance(rule, Quotes):
            quotes[arg] = passages
    args = {"type": "object", "properties": props, "required": list(props)}
    return OfferedTool(spec=spec, args=args, choices=choices, quotes=quotes)


def offer(
    tools: Sequence[Mapping[str, Any]],
    narrowings: Mapping[str, ToolNarrowing],
    tool_choice: Any,
    conversation: Conversation,
) -> Offer:
    """The choices of the next decision.

    The rules, in order: after :data:`MAX_TOOL_RESULTS` tool results only an answer; a tool
    named by ``tool_choice`` is the only choice; a tool whose arguments narrow to nothing is
    not offered, nor a tool whose results another offered tool has yet to use; the first
    decision of a conversation, and every decision of an agent with a ``sources`` tool
    until it read one, is one of its work tools; an agent holding sentences to quote
    answers from them (or calls a work tool), rather than hand the work on.
    """
    passages = grounding(conversation, narrowings)
    has_sources = any(n.sources for name, n in narrowings.items())
    read = any(c.ok and narrowings.get(c.tool, ToolNarrowing()).sources for c in conversation.calls)
    fixed = None
    if has_sources and not read and not passages:
        searched = [
            str(v) for n in narrowings for v in conversation.used(n, "query") if v is not None
        ]
        fixed = "I found no document in the knowledge base that answers this" + (
            f" (searched for: {'; '.join(searched)})." if searched else "."
        )
    answer_only = Offer(tools=(), answer=True, passages=passages, fixed_answer=fixed)
    if conversation.results >= MAX_TOOL_RESULTS:
        return Offer(tools=(), answer=True, passages=passages, fixed_answer=fixed, exhausted=True)
    if isinstance(tool_choice, dict):  # {"type": "function", "function": {"name": ...}}
        tool_choice = tool_choice.get("function", {}).get("name")
    if tool_choice == "none":
        return answer_only
    offered = [
        o
        for spec in tools
        if (o := offer_tool(spec, narrowings.get(str(spec["name"])), conversation, passages))
    ]
    if tool_choice not in (None, "auto", "any", "required"):
        named = [o for o in offered if o.name == tool_choice]
        if not named:  # Forced by the caller: offered even where narrowing leaves nothing.
            named = [
                OfferedTool(spec=s, args=args_schema(s)) for s in tools if s["name"] == tool_choice
            ]
        return Offer(tools=tuple(named), answer=False)
    feeding = {
        rule.tool
        for o in offered
        for rule in narrowings.get(o.name, ToolNarrowing()).args.values()
        if isinstance(rule, FromResults)
    }
    offered = [o for o in offered if o.name not in feeding]
    if tool_choice in ("any", "required"):
        return Offer(tools=tuple(offered), answer=not offered)
    work = [o for o in offered if not o.name.startswith(HANDOFF_PREFIX)]
    if work and (conversation.results == 0 or (has_sources and not read)):
        # A model this small answers from nothing rather than look things up.
        return Offer(tools=tuple(work), answer=False, passages=passages)
    if passages:
        # What it quotes goes back to the team as its result; a handoff would carry only
        # the model's own words.
        return Offer(tools=tuple(work), answer=True, passages=passages)
    return Offer(tools=tuple(offered), answer=True, fixed_answer=fixed)
