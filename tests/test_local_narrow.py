"""How the embedded model's tool arguments are narrowed from the conversation, without the
model: a stand-in engine records each grammar and decodes the first value it allows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from relaygraph.agents.tools import BUILTIN_TOOLS
from relaygraph.errors import ConfigError
from relaygraph.handoffs import create_handoff_tool
from relaygraph.models.local import (
    NARROW_KEY,
    FromResults,
    Keywords,
    LocalChatModel,
    OneOf,
    ToolNarrowing,
    narrowed,
    single_value,
)
from relaygraph.models.local import _chat as local_module
from relaygraph.models.local._engine import Completion

CORPUS_DOC = (
    "[checkpoints] Checkpoints and durability\n\n# Checkpoints and durability\n\n"
    "## Durability modes\n\nThe `durability` argument of `invoke` and `stream` chooses when "
    "checkpoints are written:\n\n"
    '- `"exit"`: state is saved only when the run ends.\n'
    '- `"async"` (the default): each checkpoint is written in the background.\n\n'
    "## Checkpointers\n\n`InMemorySaver` keeps checkpoints in the process and is meant for "
    "tests. Keep state small: every checkpoint stores the full state.\n"
)
SEARCH_RESULT = (
    "[checkpoints] Checkpoints and durability: the durability argument…\n"
    "[interrupts] Human-in-the-loop interrupts: When durability is important…\n"
    "[tracing] Tracing agents: traces and checkpoints…"
)
REQUEST = "What do the docs say about checkpoint durability?"


def _first_value(schema: Any) -> Any:
    """The first JSON value a (grammar) schema allows: what the stand-in decodes."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _first_value(schema["anyOf"][0])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _first_value(props[k]) for k in schema.get("required", props)}
    if kind == "array":
        return [_first_value(schema["items"])] * max(1, schema.get("minItems", 1))
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return "text"


class StandInEngine:
    """Plays the loaded model: records every grammar it is given, decodes its first value."""

    def __init__(self) -> None:
        self.schemas: list[dict[str, Any] | None] = []
        self.prompts: list[str] = []

    def tokenize(self, prompt: str) -> list[int]:
        self.last_prompt = prompt
        return list(range(len(prompt.split())))

    def complete(self, tokens: list[int], *, schema: dict[str, Any] | None) -> Any:
        self.schemas.append(schema)
        self.prompts.append(self.last_prompt)
        text = json.dumps(_first_value(schema)) if schema else "free text"
        return Completion(
            text=text, prompt_tokens=len(tokens), completion_tokens=3, finish_reason="stop"
        )


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInEngine]:
    stand_in = StandInEngine()
    monkeypatch.setattr(local_module, "_ENGINES", {"smollm2": stand_in})
    yield stand_in


def _agent_input(task: str = "Find what the docs say about checkpoint durability.") -> HumanMessage:
    return HumanMessage(f"Task: {task}\n\nRequest: {REQUEST}")


def _round(name: str, args: dict[str, Any], result: str, n: int) -> list[BaseMessage]:
    call_id = f"call_{n}"
    return [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}]),
        ToolMessage(result, tool_call_id=call_id, name=name),
    ]


def _researcher_tools() -> list[BaseTool]:
    return [
        BUILTIN_TOOLS["search_docs"],
        BUILTIN_TOOLS["read_doc"],
        create_handoff_tool("writer", source="researcher"),
    ]


def _offered(schema: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The tools a decision grammar offers, with their argument grammars."""
    assert schema is not None
    return {
        alt["properties"]["tool"]["const"]: alt["properties"]["args"]
        for alt in schema["anyOf"]
        if "tool" in alt["properties"]
    }


def _answers(schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert schema is not None
    return [a for a in schema["anyOf"] if a["properties"]["action"] == {"const": "answer"}]


def test_read_doc_is_offered_only_the_ids_a_search_in_this_visit_returned(
    engine: StandInEngine,
) -> None:
    model = LocalChatModel().bind_tools(_researcher_tools())
    first = [_agent_input()]
    searching = model.invoke(first)
    # Before any search there is no id to read: only the search is offered, with the one
    # query the built-in declaration offers, so no model decodes it.
    assert searching.tool_calls[0]["name"] == "search_docs"
    assert searching.response_metadata["finish_reason"] == "forced"
    assert not engine.schemas

    searched = [
        *first,
        *_round("search_docs", {"query": "checkpoint durability"}, SEARCH_RESULT, 1),
    ]
    decoded = len(engine.schemas)
    message = model.invoke(searched)
    # The search's best hit, the one id the built-in declaration offers: the search is not
    # offered again while its results are unread, and nothing else (no answer, no handoff)
    # before a document was read, so the read is forced and no model decodes it.
    assert message.tool_calls[0]["args"] == {"doc_id": "checkpoints"}
    assert message.response_metadata["finish_reason"] == "forced"
    assert len(engine.schemas) == decoded


def test_ids_from_another_visit_or_an_error_are_never_offered(engine: StandInEngine) -> None:
    model = LocalChatModel().bind_tools(_researcher_tools())
    earlier_visit = _round("search_docs", {"query": "tracing"}, "[tracing] Tracing agents", 1)
    failed = _round("search_docs", {"query": "checkpoint"}, "[budgets] Budgets", 2)
    failed[1].status = "error"  # type: ignore[attr-defined]
    message = model.invoke([*earlier_visit, _agent_input(), *failed])
    # Ids before the human message (another visit) and in an error result do not count: the
    # search again, with the best query not used yet, and nothing else.
    assert message.tool_calls[0]["name"] == "search_docs"
    assert message.tool_calls[0]["args"] == {"query": "checkpoint durability"}
    assert not engine.schemas


def test_a_read_id_is_not_offered_again_and_the_limit_holds(engine: StandInEngine) -> None:
    many = "\n".join(f"[doc-{i}] Title {i}: text" for i in range(6))
    conversation = [_agent_input(), *_round("search_docs", {"query": "x"}, many, 1)]
    conversation += _round("read_doc", {"doc_id": "doc-0"}, "[doc-0] Title 0\n\nShort.", 2)
    narrowing = ToolNarrowing.from_metadata(
        BUILTIN_TOOLS["read_doc"].metadata[NARROW_KEY], tool="read_doc"
    )
    from relaygraph.models.local._offer import Conversation, offer_tool

    spec = {
        "name": "read_doc",
        "parameters": {
            "type": "object",
            "properties": {"doc_id": {"type": "string"}},
            "required": ["doc_id"],
        },
    }
    offered = offer_tool(spec, narrowing, Conversation.of(conversation), ())
    assert offered is not None
    # doc-0 was read; the first of the rest is offered (the declared limit).
    assert offered.args["properties"]["doc_id"] == {"const": "doc-1"}
    wider = ToolNarrowing.from_metadata(
        {"args": {"doc_id": {"from_tool": "search_docs", "limit": 2}}}, tool="read_doc"
    )
    offered = offer_tool(spec, wider, Conversation.of(conversation), ())
    assert offered is not None
    assert offered.args["properties"]["doc_id"] == {"enum": ["doc-1", "doc-2"]}


def test_the_search_query_is_a_few_of_the_requests_own_words(engine: StandInEngine) -> None:
    request = "According to the docs, which durability mode is the default? Write a short report."
    human = HumanMessage(
        f"Task: Find what the docs say about durability mode default.\n\nRequest: {request}"
    )
    # The built-in search offers the query that holds the most of the request's words, and
    # only it: the call is forced.
    built_in = LocalChatModel().bind_tools(_researcher_tools()).invoke([human])
    assert built_in.tool_calls[0]["args"] == {"query": "durability mode default"}
    assert built_in.response_metadata["finish_reason"] == "forced"
    assert not engine.schemas
    # A tool declaring {"keywords": 4} (as a user's own does) is offered a choice of queries.
    search = narrowed(
        BUILTIN_TOOLS["search_docs"].model_copy(),
        ToolNarrowing(args={"query": Keywords(max_words=4)}),
    )
    message = LocalChatModel().bind_tools([search, *_researcher_tools()[1:]]).invoke([human])
    queries = _offered(engine.schemas[-1])["search_docs"]["properties"]["query"]["enum"]
    assert queries[0] == "durability mode default"
    words = set(re.findall(r"\w+", request.lower()))
    for query in queries:
        assert 1 <= len(query.split()) <= 4
        assert set(query.split()) <= words
        assert not {"docs", "according", "which", "write", "report", "the"} & set(query.split())
    # The tool's optional k is not in the grammar: its default holds.
    assert message.tool_calls[0]["args"] == {"query": "durability mode default"}


def test_after_reading_the_answer_quotes_the_document_with_its_id(engine: StandInEngine) -> None:
    conversation = [
        _agent_input(),
        *_round("search_docs", {"query": "checkpoint durability"}, SEARCH_RESULT, 1),
        *_round("read_doc", {"doc_id": "checkpoints"}, CORPUS_DOC, 2),
    ]
    message = LocalChatModel().bind_tools(_researcher_tools()).invoke(conversation)
    (answer,) = _answers(engine.schemas[-1])
    # Sentences of the document, the best match for the task first, one chosen by number
    # to add to the two best; no free text.
    assert answer["properties"]["quotes"] == {
        "type": "array",
        "items": {"enum": [1, 2, 3, 4]},
        "minItems": 1,
        "maxItems": 1,
    }
    listed = engine.prompts[-1].split("Sentences from the documents, best match first:\n")[1]
    assert listed.startswith("1. The `durability` argument of `invoke`")
    assert "content" not in answer["properties"]
    assert isinstance(message.content, str)
    assert message.content.endswith("[checkpoints]")
    assert '`"async"` (the default)' in message.content  # the source's own text, quotes kept
    # The document itself is not repeated in the prompt: its sentences are listed instead.
    assert (
        "Result of tool read_doc: [checkpoints] Checkpoints and durability (read;"
        in (engine.prompts[-1])
    )
    assert "InMemorySaver` keeps" not in engine.prompts[-1].split("Sentences from")[0]
    # Nor are the search's hits, once the document it found was read: only their ids.
    assert (
        "Result of tool search_docs: [checkpoints] [interrupts] [tracing]" in (engine.prompts[-1])
    )
    assert "Human-in-the-loop interrupts" not in engine.prompts[-1]


def test_nothing_found_is_said_without_inventing(engine: StandInEngine) -> None:
    conversation = [_agent_input(task="Find what the docs say about zebras.")]
    for n, query in enumerate(["checkpoint durability", "checkpoint"]):
        conversation += _round("search_docs", {"query": query}, f"No documents match {query!r}.", n)
    message = LocalChatModel().bind_tools(_researcher_tools()).invoke(conversation)
    assert message.content.startswith("I found no document in the knowledge base")
    assert "checkpoint durability; checkpoint" in message.content
    assert message.response_metadata["finish_reason"] == "forced"


@tool
def find_tickets(query: str) -> str:
    """Find support tickets; each line starts with #<number>."""
    return "#12 printer on fire\n#40 VPN drops"


@tool
def open_ticket(ticket_id: str, verbose: bool = False) -> str:
    """Open one ticket by its number."""
    return f"ticket {ticket_id}"


@tool
def set_priority(ticket_id: str, priority: str) -> str:
    """Set a ticket's priority."""
    return "ok"


def test_a_custom_tool_declares_its_own_narrowing(engine: StandInEngine) -> None:
    opener = narrowed(
        open_ticket.model_copy(),
        ToolNarrowing(args={"ticket_id": FromResults(tool="find_tickets", match=r"^#(\d+)")}),
    )
    prioritiser = set_priority.model_copy()
    # The plain-data form, as a tool module that imports nothing of relaygraph writes it.
    prioritiser.metadata = {
        NARROW_KEY: {
            "args": {
                "priority": {"one_of": ["low", "high"]},
                "ticket_id": {"from_tool": "find_tickets", "match": r"^#(\d+)"},
            }
        }
    }
    finder = narrowed(
        find_tickets.model_copy(), ToolNarrowing(args={"query": Keywords(max_words=2)})
    )
    model = LocalChatModel().bind_tools([finder, opener, prioritiser])
    human = HumanMessage("Which ticket is about the printer fire?")
    model.invoke([human])
    assert _offered(engine.schemas[-1]) == {
        "find_tickets": {
            "type": "object",
            "properties": {"query": {"enum": ["ticket printer", "ticket", "printer"]}},
            "required": ["query"],
        }
    }
    model.invoke(
        [
            human,
            *_round("find_tickets", {"query": "printer"}, find_tickets.invoke({"query": "x"}), 1),
        ]
    )
    offered = _offered(engine.schemas[-1])
    assert offered["open_ticket"]["properties"] == {"ticket_id": {"enum": ["12", "40"]}}
    assert offered["set_priority"]["properties"] == {
        "ticket_id": {"enum": ["12", "40"]},
        "priority": {"enum": ["low", "high"]},
    }
    assert "find_tickets" not in offered  # its results are still unused


def test_without_narrowing_a_tool_keeps_its_own_schema(engine: StandInEngine) -> None:
    LocalChatModel().bind_tools([open_ticket]).invoke([HumanMessage("Open ticket 12.")])
    args = _offered(engine.schemas[-1])["open_ticket"]
    assert set(args["properties"]) == {"ticket_id", "verbose"}
    assert args["properties"]["ticket_id"]["maxLength"] > 0


def test_a_keywords_rule_offering_one_query_keeps_it_in_its_plain_data() -> None:
    rule = ToolNarrowing(args={"query": Keywords(max_words=4, queries=1)})
    assert rule.to_metadata() == {"args": {"query": {"keywords": 4, "queries": 1}}}
    assert ToolNarrowing.from_metadata(rule.to_metadata(), tool="search_docs") == rule
    # A rule that does not say keeps offering the usual choice of queries.
    plain = ToolNarrowing.from_metadata({"args": {"query": {"keywords": 2}}}, tool="find")
    assert plain.to_metadata() == {"args": {"query": {"keywords": 2}}}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"args": {"ticket": {"keywords": 3}}}, "narrows 'ticket', which it does not take"),
        ({"args": {"ticket_id": {"from": "x"}}}, "no known rule"),
        ({"args": {"ticket_id": {"keywords": 0}}}, "expected a positive integer, got 0"),
        (
            {"args": {"ticket_id": {"keywords": 2, "queries": "one"}}},
            "['queries']: expected a positive integer, got 'one'",
        ),
        ({"args": {"ticket_id": {"from_tool": "x", "match": "#\\d+"}}}, "needs a group"),
        ({"args": {"ticket_id": {"one_of": []}}}, "must be a non-empty list"),
        ({"limit": 3}, "unknown key(s) 'limit'"),
        ({"after": "find_tickets"}, "must be a list of tool names"),
    ],
)
def test_a_malformed_narrowing_is_a_config_error_naming_the_tool(
    metadata: dict[str, Any], message: str
) -> None:
    bad = open_ticket.model_copy()
    bad.metadata = {NARROW_KEY: metadata}
    with pytest.raises(ConfigError) as info:
        LocalChatModel().bind_tools([bad])
    assert "tool 'open_ticket'" in str(info.value)
    assert message in str(info.value)


def test_typed_and_plain_forms_are_the_same_declaration() -> None:
    declared = ToolNarrowing(
        args={
            "q": Keywords(max_words=3),
            "id": FromResults(tool="s", limit=2),
            "k": OneOf(values=(5,)),
        },
        sources=True,
        max_calls=1,
        after=("s",),
    )
    assert ToolNarrowing.from_metadata(declared.to_metadata(), tool="t") == declared


def test_a_choice_with_one_option_is_not_decoded(engine: StandInEngine) -> None:
    schema = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "action": {"const": "call"},
                    "tool": {"const": "read_doc"},
                    "args": {
                        "type": "object",
                        "properties": {"doc_id": {"enum": ["only"]}},
                        "required": ["doc_id"],
                    },
                },
                "required": ["action", "tool", "args"],
            }
        ]
    }
    assert single_value(schema) == {
        "action": "call",
        "tool": "read_doc",
        "args": {"doc_id": "only"},
    }
    assert single_value({"type": "string"}) is NotImplemented
    assert single_value({"type": "object", "properties": {"a": {"const": 1}}}) is NotImplemented

    conversation = [_agent_input(), *_round("search_docs", {"query": "q"}, "[only] The one doc", 1)]
    message = LocalChatModel().bind_tools(_researcher_tools()).invoke(conversation)
    assert engine.schemas == []  # the engine was never asked
    assert message.tool_calls[0]["args"] == {"doc_id": "only"}
    assert message.usage_metadata == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


def test_the_builtin_deliverable_quotes_the_cited_results(engine: StandInEngine) -> None:
    human = HumanMessage(
        "Task: Write a short report on checkpoint durability.\n\n"
        f"Request: {REQUEST} Write a short report.\n\nResults so far:\n"
        "- researcher: Checkpoints are written after each super-step. "
        "The durability argument chooses when checkpoints are written. [checkpoints]"
    )
    tools = [BUILTIN_TOOLS["save_artifact"], BUILTIN_TOOLS["list_artifacts"]]
    message = LocalChatModel().bind_tools(tools).invoke([human])
    offered = _offered(engine.schemas[-1])
    # Listing artifacts comes only after saving; the name is fixed; the content quotes.
    assert set(offered) == {"save_artifact"}
    assert offered["save_artifact"]["properties"]["name"] == {"const": "report.md"}
    call = message.tool_calls[0]
    assert call["args"]["name"] == "report.md"
    assert call["args"]["content"].endswith("[checkpoints]")


def test_grammar_safe_values_compile() -> None:
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    from relaygraph.models.local._schema import grammar_safe

    # llama-cpp-python's converter escapes a JSON value's quotes but not its backslashes:
    # a request quoted into a route's task, or a query word, must not break the grammar.
    values = [
        '`"async"` (the default): a \\ backslash',
        "Caf\u00e9 \u2014 \u00d7 \u2026 and a\ttab",
    ]
    safe = [grammar_safe(v) for v in values]
    assert safe == ["`'async'` (the default): a / backslash", "Cafe   ... and a tab"]
    schema = {"type": "object", "properties": {"q": {"enum": safe}}, "required": ["q"]}
    grammar = llama_grammar.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    assert grammar is not None
