"""Grounding without a model: keywords of a request, sentences of a document ranked for a
task, cited sentences, and the check that a docs question was answered from the docs."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from relaygraph.backends.kb import sample_corpus_path
from relaygraph.models.local._grounding import (
    answer_kinds,
    asks_about_docs,
    citations,
    cited_passages,
    keywords,
    rank_passages,
    source_passages,
    ungrounded_reason,
)

CHECKPOINTS = (sample_corpus_path() / "checkpoints.md").read_text(encoding="utf-8")


def test_keywords_are_the_requests_content_words() -> None:
    assert keywords("What do the docs say about checkpoint durability? Write a short report.") == [
        "checkpoint",
        "durability",
    ]
    assert keywords("According to the docs, which durability mode is the default?") == [
        "durability",
        "mode",
        "default",
    ]
    assert keywords("the a of", limit=3) == []


def test_document_sentences_keep_their_sections_and_skip_code() -> None:
    passages = source_passages(CHECKPOINTS, "checkpoints")
    texts = [p.text for p in passages]
    assert all(p.source == "checkpoints" for p in passages)
    assert "Checkpoints are grouped into threads." in texts
    assert not any(t.startswith("#") or "```" in t for t in texts)
    lead = next(p for p in passages if p.text.startswith("The `durability` argument"))
    # A sentence that introduces a list is offered with the list's items after it.
    assert '`"async"` (the default)' in lead.text and lead.heading == "Durability modes"


def test_ranking_puts_the_sentence_that_answers_first() -> None:
    passages = source_passages(CHECKPOINTS, "checkpoints")
    best = rank_passages(passages, "Which checkpointer is meant for tests?", limit=2)
    assert best[0].text.startswith("`InMemorySaver` keeps checkpoints in the process")
    durability = rank_passages(passages, "What do the docs say about checkpoint durability?")
    assert durability[0].text.startswith("The `durability` argument of `invoke`")
    assert len({p.text for p in durability}) == len(durability) == 4


def test_cited_sentences_are_attributed_to_the_id_after_them() -> None:
    text = (
        "- researcher (task: t): Checkpoints are grouped into threads. "
        "Nodes must be idempotent in practice. [checkpoints] See also the tracing guide. "
        "[tracing]\n[truncated]"
    )
    cited = cited_passages(text)
    assert [(p.text, p.source) for p in cited] == [
        ("- researcher (task: t): Checkpoints are grouped into threads.", "checkpoints"),
        ("Nodes must be idempotent in practice.", "checkpoints"),
        ("See also the tracing guide.", "tracing"),
    ]
    assert citations(text) == ["checkpoints", "tracing"]


def test_a_docs_question_must_be_answered_citing_what_a_tool_showed() -> None:
    request = "What do the docs say about checkpoint durability?"
    read = [
        HumanMessage("task"),
        AIMessage(content="", tool_calls=[{"name": "read_doc", "args": {}, "id": "c1"}]),
        ToolMessage("[checkpoints] Checkpoints and durability\n\ntext", tool_call_id="c1"),
    ]
    assert asks_about_docs(request)
    assert ungrounded_reason(request, "Durability is chosen per run. [checkpoints]", read) is None
    assert ungrounded_reason(request, "Durability is a matter of choice.", read) == (
        "ungrounded: the request asks about the docs, but the answer cites no document"
    )
    assert ungrounded_reason(request, None, read) is not None
    assert ungrounded_reason(request, "It is so. [budgets]", read) == (
        "ungrounded: the answer cites [budgets], which no tool result of this run showed"
    )
    # An id in an error result is no grounding.
    refused = [ToolMessage("Error: no document [budgets]", tool_call_id="c2", status="error")]
    assert ungrounded_reason(request, "It is so. [budgets]", refused) is not None


def test_a_request_that_does_not_name_the_docs_is_not_checked_for_a_citation() -> None:
    assert not asks_about_docs("How many checkpoints does a 40-step run write?")
    assert not asks_about_docs("Summarize this document.\n--- document ---\nCheckpoints are...")
    assert ungrounded_reason("Compute 2 + 2.", "4", []) is None


def test_a_plain_question_answered_citing_a_document_no_tool_showed_is_ungrounded() -> None:
    question = "How long does the canary stage last?"
    assert not asks_about_docs(question)
    searched = [
        HumanMessage("task"),
        AIMessage(content="", tool_calls=[{"name": "search_docs", "args": {}, "id": "c1"}]),
        ToolMessage("[deploy-canary] Canary stage (score 2.1)", tool_call_id="c1"),
    ]
    assert ungrounded_reason(question, "It lasts 20 minutes. [deploy-canary]", searched) is None
    assert ungrounded_reason(question, "It lasts 20 minutes. [canary]", searched) == (
        "ungrounded: the answer cites [canary], which no tool result of this run showed"
    )
    # No tool ran at all (the coder answered from nothing), yet the answer names a source.
    assert ungrounded_reason(question, "It lasts 20 minutes. [canary]", []) is not None
    # A computed list is no citation.
    assert ungrounded_reason("What is 6 * 7 in a list?", "[42]", []) is None


# Issue 45: answers that generalize. The documents below are written for these tests, not
# taken from the sample corpus the ranking was first built on.

RUNBOOK = """# Deploying the ledger service

The ledger is deployed with Conveyor, the release tool. A deploy has two stages: canary and
full rollout.

## The canary stage

The canary stage sends 10 percent of traffic to the new version. It lasts 45 minutes, during
which the error rates are compared.

## Starting a deploy

To start one, run:

```bash
conveyor deploy ledger --ref release/main
```

Deploys need a green build.
"""


def test_a_sentence_that_introduces_a_code_block_keeps_the_block() -> None:
    passages = source_passages(RUNBOOK, "deploys")
    (lead,) = [p for p in passages if p.text.startswith("To start one, run:")]
    assert lead.text == "To start one, run: `conveyor deploy ledger --ref release/main`"
    best = rank_passages(passages, "Which command starts a deploy of the ledger?", limit=1)
    assert best == [lead]


def test_the_sentence_that_holds_the_kind_of_answer_asked_for_wins() -> None:
    passages = source_passages(RUNBOOK, "deploys")
    # "How long" asks for a duration: the sentence that gives one, though it says "it" where
    # the others name the canary stage, is the best match.
    (best,) = rank_passages(passages, "How long does the canary stage last?", limit=1)
    assert "45 minutes" in best.text
    (best,) = rank_passages(passages, "How much traffic goes to the canary?", limit=1)
    assert "10 percent" in best.text


def test_answer_kinds_follow_the_question_words() -> None:
    assert answer_kinds("Tell me about the canary") == []
    (duration,) = answer_kinds("How often are passwords rotated?")
    assert duration.search("every 90 days") and not duration.search("by a scheduled job")
    (name,) = answer_kinds("Which variable switches tracing on?")
    assert name.search("set `TRACE_ON=1`") and not name.search("set it in the shell")
