"""What the embedded model reads in the team's prompts and the team decisions it narrows:
the supervisor's route by keyword hints, and finalize's quoted answer. No model runs: the
prompts are the supervisor's own (``relaygraph.supervisor._prompts``), so a change of their
format that the local provider would misread fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from relaygraph.agents import Agent, builtin
from relaygraph.handoffs import Assignment
from relaygraph.models.local import LocalChatModel
from relaygraph.models.local._schema import bounded, single_value
from relaygraph.models.local._team import (
    FinalAnswer,
    TeamInput,
    final_answer,
    intents,
    narrow_route,
    picked,
)
from relaygraph.supervisor import _prompts
from relaygraph.supervisor._route import FINISH, route_model

AGENTS = builtin.agents()
NAMES = tuple(a.name for a in AGENTS)
DURABILITY = "The `durability` argument chooses when checkpoints are written."


def _visit(agent: str, output: str, n: int) -> dict[str, Any]:
    return {
        "id": f"v{n}",
        "agent": agent,
        "turn": 1,
        "task": "a task",
        "source": "supervisor",
        "output": output,
        "ended": "finished",
        "tools": [],
        "messages": [],
    }


def _state(request: str, *visits: tuple[str, str], stop: str | None = None) -> Any:
    return {
        "request": request,
        "turn": 1,
        "messages": [],
        "visits": [_visit(agent, output, n) for n, (agent, output) in enumerate(visits)],
        "stop_reason": stop,
    }


def _route(
    request: str, *visits: tuple[str, str], agents: tuple[Agent, ...] = AGENTS
) -> dict[str, Any] | None:
    """The route the hints leave, as the supervisor would ask for it; None: the model's."""
    names = tuple(a.name for a in agents)
    schema = bounded(
        route_model(names, may_finish=bool(visits)).model_json_schema(), string_cap=200
    )
    narrowed = narrow_route(
        schema,
        _prompts.supervisor_prompt(agents),
        _prompts.supervisor_input(_state(request, *visits), []),
    )
    if narrowed is None:
        return None
    value = single_value(narrowed)
    return None if value is NotImplemented else value


def test_a_docs_question_goes_to_the_researcher_with_a_short_task() -> None:
    request = "What do the docs say about checkpoint durability? Please answer in detail."
    route = _route(request)
    assert route == {
        "next": "researcher",
        "task": "Find what the docs say about checkpoint durability.",
        "reason": "The request asks what the docs say.",
    }
    # Then, with the researcher's result in, the team finishes.
    done = _route(request, ("researcher", f"{DURABILITY} [checkpoints]"))
    assert done is not None and done["next"] == FINISH


def test_a_how_many_question_asks_the_documents_first_and_computes_only_without_them() -> None:
    request = "How many checkpoints does a 40-step run write?"
    first = _route(request)
    assert first is not None and first["next"] == "researcher"
    answered = _route(request, ("researcher", f"{DURABILITY} [checkpoints]"))
    assert answered is not None and answered["next"] == FINISH
    unanswered = _route(request, ("researcher", "I found no document that answers this."))
    assert unanswered is not None and unanswered["next"] == "coder"


def test_a_computation_goes_to_the_coder() -> None:
    for request in (
        "Compute how many checkpoints a 40-step run writes.",
        "Compute 17 * 23 and explain it.",
        "Write Python code that prints the first ten primes.",
    ):
        route = _route(request)
        assert route is not None and route["next"] == "coder", request
        assert route["task"].startswith("Compute with Python and print the result: ")
        assert len(route["task"]) < len("Compute with Python and print the result: ") + 161


def test_a_report_ends_with_the_writer() -> None:
    request = "What do the docs say about checkpoint durability? Write a short report."
    assert _route(request)["next"] == "researcher"  # type: ignore[index]
    then = _route(request, ("researcher", f"{DURABILITY} [checkpoints]"))
    assert then is not None and then["next"] == "writer"
    assert then["task"] == (
        "Write a short report on checkpoint durability from the results, citing doc ids."
    )
    assert request not in then["task"]
    last = _route(
        request,
        ("researcher", f"{DURABILITY} [checkpoints]"),
        ("writer", f"{DURABILITY} [checkpoints]"),
    )
    assert last is not None and last["next"] == FINISH

    # With nothing to report on, the writer's task is the sentence that asks for writing.
    alone = _route("Thanks for the help. Write a two-line release note for relaygraph 0.1.")
    assert alone is not None and alone["next"] == "writer"
    assert alone["task"] == "Write a two-line release note for relaygraph 0.1."


def test_intents_in_the_order_the_work_is_done() -> None:
    assert intents("What do the docs say about X? Write a short report.") == ["docs", "write"]
    # A question with only "how many" to suggest a computation is asked of the documents
    # first (issue 45); an arithmetic expression or "compute" is a computation.
    assert intents("How many checkpoints does a 40-step run write?") == ["docs", "compute"]
    assert intents("Compute how many checkpoints a 40-step run writes.") == ["compute"]
    assert intents("What is 17 * 23?") == ["compute"]
    # An address or a version is not arithmetic.
    assert intents("Which private network do the services run in, 10.40.0.0/16?") == ["docs"]
    assert intents("Which environment variables does a sandboxed program get?")[0] == "docs"
    # "How many" in a question about the docs is a docs question, not a computation.
    assert intents("According to the docs, how many processes may a sandboxed run start?") == [
        "docs"
    ]
    assert intents("Which durability mode is the default?") == ["docs"]
    assert intents("According to the docs, which command runs the sandboxed code?") == ["docs"]
    assert intents("Run this Python code for me.") == ["compute"]
    assert intents("Hello there") == []


def test_without_a_hint_the_model_chooses_among_the_agents() -> None:
    schema = bounded(route_model(NAMES, may_finish=False).model_json_schema(), string_cap=200)
    human = _prompts.supervisor_input(_state("Hello there"), [])
    narrowed = narrow_route(schema, _prompts.supervisor_prompt(AGENTS), human)
    assert narrowed is not None
    assert narrowed["properties"]["next"] == {"enum": list(NAMES)}
    assert narrowed["properties"]["task"] == {"const": "Work on the request about hello."}


def test_custom_agents_are_matched_by_their_descriptions() -> None:
    team = (
        Agent(name="librarian", description="searches the docs and cites facts", prompt="p"),
        Agent(name="scribe", description="drafts the report deliverable", prompt="p"),
    )
    request = "According to the docs, what is a supervisor? Write a short report."
    assert _route(request, agents=team)["next"] == "librarian"  # type: ignore[index]
    then = _route(request, ("librarian", "A supervisor routes. [supervisors]"), agents=team)
    assert then is not None and then["next"] == "scribe"


def test_an_agent_that_may_not_work_now_is_skipped() -> None:
    # The supervisor leaves a barred or spent agent out of the choices; the hint follows.
    schema = bounded(
        route_model(("coder", "writer"), may_finish=True).model_json_schema(), string_cap=200
    )
    human = _prompts.supervisor_input(
        _state("What do the docs say about X? Write a report.", ("researcher", "no luck")),
        ["researcher (out of budget)"],
    )
    narrowed = narrow_route(schema, _prompts.supervisor_prompt(AGENTS), human)
    assert narrowed is not None and single_value(narrowed)["next"] == "writer"


def test_a_schema_that_is_not_a_route_is_left_alone() -> None:
    schema = {"type": "object", "properties": {"done": {"type": "boolean"}}}
    assert narrow_route(schema, "", "Request: x\n\nResults so far: none yet.") is None


def test_team_prompts_parse() -> None:
    request = "What do the docs say about checkpoint durability?"
    state = _state(request, ("researcher", f"{DURABILITY} [checkpoints]"), stop="budget:x")
    assignment = Assignment(
        agent="writer", task="Write it up.", reason="why", source="supervisor", kind="route"
    )
    agent = TeamInput.parse(_prompts.agent_input(state, assignment))
    assert (agent.request, agent.task) == (request, "Write it up.")
    assert agent.results == (("researcher", f"{DURABILITY} [checkpoints]"),)
    direct = Assignment(
        agent="writer", task="Write it up.", reason="why", source="researcher", kind="direct"
    )
    handed = TeamInput.parse(_prompts.agent_input(state, direct))
    assert (handed.request, handed.task, handed.results) == (request, "Write it up.", agent.results)
    # A thread checkpointed before the markers changed resumes with its message as it was.
    older = TeamInput.parse(
        "Your task (from supervisor): Write it up.\n\n"
        f"The user's request: {request}\n\nResults so far:\n- researcher (task: t): Found."
    )
    assert (older.request, older.task, older.results) == (
        request,
        "Write it up.",
        (("researcher", "Found."),),
    )
    final = TeamInput.parse(_prompts.finalize_input(state))
    assert final.request == request and final.stopped == "budget:x"
    assert final.results == agent.results
    plain = TeamInput.parse("Just a question?")
    assert (plain.request, plain.task, plain.in_team) == (
        "Just a question?",
        "Just a question?",
        False,
    )


def test_finalize_quotes_the_cited_results_and_says_where_they_came_from() -> None:
    request = "What do the docs say about checkpoint durability?"
    state = _state(
        request,
        ("researcher", f"{DURABILITY} Checkpoints are grouped into threads. [checkpoints]"),
        ("writer", "Saved report.md."),
    )
    model = LocalChatModel()
    reply = model.invoke(
        [SystemMessage(_prompts.FINALIZE_PROMPT), HumanMessage(_prompts.finalize_input(state))]
    )
    assert reply.text == (
        f"{DURABILITY} Checkpoints are grouped into threads. [checkpoints]\n\n"
        "Source: [checkpoints] found by the researcher, in the knowledge base."
    )
    assert reply.response_metadata["finish_reason"] == "forced"  # no model was needed


def test_a_long_researcher_result_clipped_before_the_writers_keeps_its_citation() -> None:
    request = "What do the docs say about checkpoint durability?"
    long_part = "Checkpoints are grouped into threads by their thread id. " * 8
    researcher = f"{long_part}{DURABILITY} [checkpoints]"
    assert len(researcher) > _prompts.MAX_EARLIER_RESULT_CHARS
    state = _state(request, ("researcher", researcher), ("writer", f"{DURABILITY} [checkpoints]"))
    shown = _prompts.finalize_input(state)
    # The cut takes the researcher's [checkpoints]; the note of the cut text keeps it.
    assert "- researcher (task: a task): Checkpoints are grouped" in shown
    assert "[...] (the cut text cites [checkpoints])" in shown
    reply = LocalChatModel().invoke([SystemMessage(_prompts.FINALIZE_PROMPT), HumanMessage(shown)])
    assert reply.text == (
        f"{DURABILITY} [checkpoints]\n\n"
        "Source: [checkpoints] found by the researcher, in the knowledge base."
    )
    # The sentence the cut went through is not quoted as if it were whole.
    assert reply.response_metadata["finish_reason"] == "forced"


def test_finalize_with_more_candidates_lets_the_model_add_to_the_best_in_document_order() -> None:
    output = " ".join(
        f"Checkpoint fact number {i} is about durability. [checkpoints]" for i in range(5)
    )
    answer = final_answer(
        _prompts.finalize_input(
            _state("What do the docs say about durability?", ("researcher", output))
        )
    )
    assert isinstance(answer, FinalAnswer) and answer.schema is not None
    assert answer.schema["properties"]["quotes"]["maxItems"] == 3
    assert answer.schema["properties"]["quotes"]["items"] == {"enum": [1, 2, 3, 4]}
    # The two best ranked sentences stay, the chosen one joins them, in the source's order.
    kept = [answer.candidates[i][1] for i in (0, 1, 3)]
    in_order = " ".join(p.text for p in sorted(kept, key=lambda p: p.position))
    rendered = answer.render(json.dumps({"quotes": [4]}))
    assert rendered.startswith(f"{in_order} [checkpoints]")


@pytest.mark.parametrize(
    ("visits", "stop", "expected"),
    [
        (
            [("coder", "exit 0\nstdout:\n41")],
            None,
            "No agent cited a document it read for this, so there is no answer from the "
            "knowledge base.\n\nAgents that worked: coder.",
        ),
        (
            [],
            "no agent left: x",
            "The team produced no result for this request.\n\n"
            "The team stopped early: no agent left: x",
        ),
    ],
)
def test_finalize_without_citations_restates_and_never_invents(
    visits: list[tuple[str, str]], stop: str | None, expected: str
) -> None:
    answer = final_answer(_prompts.finalize_input(_state("Count things.", *visits, stop=stop)))
    assert answer is not None and answer.schema is None
    assert answer.render() == expected


def test_a_plain_chat_is_not_taken_for_finalize() -> None:
    assert final_answer("Hello! How are you?") is None


def test_a_list_item_is_quoted_once_inside_its_lead_in() -> None:
    from relaygraph.backends.kb import sample_corpus_path
    from relaygraph.models.local._grounding import rank_passages, source_passages

    text = (sample_corpus_path() / "checkpoints.md").read_text(encoding="utf-8")
    ranked = rank_passages(
        source_passages(text, "checkpoints"), "Which durability mode is the default?"
    )
    quoted = picked(ranked, [1])
    lead = next(p for p in quoted if p.text.startswith("The `durability` argument"))
    assert '`"async"` (the default)' in lead.text
    assert not any(p.text.startswith('`"async"`') for p in quoted)
