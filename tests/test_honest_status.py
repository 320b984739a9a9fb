"""A run that did no real work is not ``succeeded`` (issue 15: honest status)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from relaygraph.policies import AgentPolicy
from relaygraph.runner import run_task
from relaygraph.topology import Topology

from .openai_server import FakeOpenAI, Faults, quick_retries, serve_script

Script = Any


def test_a_tool_supervisor_that_answers_itself_is_degraded(home: Path, script: Script) -> None:
    """LangGraph's tool-calling supervisor may answer without giving anyone work: the task
    then ran no agent, and says so instead of ``succeeded``."""
    spec = script({"supervisor": [{"content": "Checkpoints are written at every step."}]})
    result = run_task(
        "When are checkpoints written?", model=spec, topology=Topology.parse("supervisor-tools")
    )
    assert result.agents_run == []
    assert result.status == "degraded"
    assert result.stop_reason == "no agent ran: the team answered without doing any work"
    assert result.answer


def researched_then(answer: str) -> dict[str, Any]:
    """The script in which the tool-calling supervisor hands the researcher the question,
    the researcher searches the docs and replies, and the supervisor then answers ``answer``."""
    return {
        "supervisor": [
            {
                "tool_calls": [
                    {"name": "transfer_to_researcher", "args": {"task": "find", "reason": "facts"}}
                ]
            },
            {"content": answer},
        ],
        "researcher": [
            {"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]},
            {"content": "found it"},
        ],
    }


def test_a_run_where_an_agent_worked_still_succeeds(home: Path, script: Script) -> None:
    spec = script(researched_then("done"))
    result = run_task("When?", model=spec, topology=Topology.parse("supervisor-tools"))
    assert result.agents_run == ["researcher"]
    assert result.status == "succeeded", result.stop_reason


def test_a_blank_answer_is_degraded(home: Path, script: Script) -> None:
    spec = script(researched_then("   "))
    result = run_task("When?", model=spec, topology=Topology.parse("supervisor-tools"))
    assert result.agents_run == ["researcher"]
    assert result.status == "degraded"
    assert result.stop_reason == "no answer: the team's final answer is empty"


def test_on_the_embedded_model_a_docs_answer_without_a_citation_is_degraded() -> None:
    from langchain_core.messages import ToolMessage

    from relaygraph.runner._summary import honest_status

    summary = {"agents_run": ["researcher"]}
    read = [ToolMessage(content="[checkpoints] Checkpoints\n\nDurability...", tool_call_id="1")]
    request = "What do the docs say about checkpoint durability?"
    cited = "Checkpoints are written at each step. [checkpoints]"
    assert honest_status("succeeded", None, summary, cited, request=request,
                         transcripts=read, grounding=True) == ("succeeded", None)  # fmt: skip
    status, why = honest_status(
        "succeeded", None, summary, "Durability is a choice.", request=request,
        transcripts=read, grounding=True,
    )  # fmt: skip
    assert status == "degraded" and why is not None and why.startswith("ungrounded:")
    # Other models are not held to it (yet): the same answer stays succeeded.
    assert honest_status(
        "succeeded", None, summary, "Durability is a choice.", request=request, transcripts=read
    ) == ("succeeded", None)


# Non-answers and failed calls over HTTP, in every topology (issue 42): the real
# ChatOpenAI client against the Chat Completions double, with its faults.

LONG = "Checkpoints are written after every super-step of the graph. " * 8
RESEARCH = [{"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]}]
TRANSFER = {
    "tool_calls": [
        {"name": "transfer_to_researcher", "args": {"task": "find it", "reason": "facts"}}
    ]
}
FINISHED = {"route": {"next": "FINISH", "task": "", "reason": "answered"}}
ROUTED = {"route": {"next": "researcher", "task": "find it", "reason": "facts"}}
AGENTS = ("researcher", "coder", "writer")


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeOpenAI]]:
    quick_retries(monkeypatch)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    @contextmanager
    def start(script: dict[str, Any], faults: Faults | None = None) -> Iterator[FakeOpenAI]:
        with serve_script(script, faults=faults) as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            yield server

    yield start  # type: ignore[misc]


def _models(topology: str, **options: str) -> dict[str, str]:
    roles = Topology.parse(topology).roles(AGENTS)
    return {r: f"openai:script-{r}?max_retries=0{options.get(r, '')}" for r in roles}


@pytest.mark.parametrize(
    ("topology", "script", "cut"),
    [
        pytest.param(
            "structured",
            {"supervisor": [ROUTED, FINISHED], "researcher": [*RESEARCH, {"content": LONG}]},
            "researcher",
            id="structured-last-reply",
        ),
        pytest.param(
            "swarm",
            {"researcher": [*RESEARCH, {"content": LONG}]},
            "researcher",
            id="swarm",
        ),
        pytest.param(
            "supervisor-tools",
            {
                "supervisor": [TRANSFER, {"content": LONG}],
                "researcher": [*RESEARCH, {"content": "ok"}],
            },
            "supervisor",
            id="supervisor-tools",
        ),
    ],
)  # fmt: skip
def test_an_answer_cut_at_the_token_limit_is_degraded(
    home: Path, serve: Any, topology: str, script: dict[str, Any], cut: str
) -> None:
    with serve(script):
        result = run_task(
            "When are checkpoints written?",
            agent_models=_models(topology, **{cut: "&max_tokens=8"}),
            topology=Topology.parse(topology),
        )
    assert result.agents_run[:1] == ["researcher"]
    assert result.status == "degraded", result.stop_reason
    assert (result.stop_reason or "").startswith("truncated: "), result.stop_reason
    assert "'length'" in (result.stop_reason or "")


@pytest.mark.parametrize(
    ("topology", "script", "broken"),
    [
        pytest.param(
            "swarm", {"researcher": [*RESEARCH, {"content": "unused"}]}, "researcher", id="swarm"
        ),
        pytest.param(
            "supervisor-tools",
            {"supervisor": [TRANSFER, TRANSFER], "researcher": [*RESEARCH, {"content": "found"}]},
            "supervisor",
            id="supervisor-tools",
        ),
    ],
)  # fmt: skip
def test_a_reply_that_is_a_broken_tool_call_is_no_answer(
    home: Path, serve: Any, topology: str, script: dict[str, Any], broken: str
) -> None:
    """A model stopped mid-call writes arguments that are not JSON: the call cannot run,
    the reply has no text, and the task is not ``succeeded`` with "The team produced no
    result." (a swarm) or the last agent's result taken for the supervisor's answer."""
    # The swarm's researcher breaks its first call; the tool supervisor its second.
    sequence: list[str | None] = ["broken_arguments"] if broken == "researcher" else [None]
    if broken == "supervisor":
        sequence.append("broken_arguments")
    faults = Faults(sequence=sequence, kinds=(), models=frozenset({f"script-{broken}"}))
    with serve(script, faults):
        result = run_task(
            "When are checkpoints written?",
            agent_models=_models(topology),
            topology=Topology.parse(topology),
        )
    assert result.status == "degraded", (result.stop_reason, result.answer)
    assert result.stop_reason == (
        f"no answer: {broken}'s last reply was a call of "
        f"'{'search_docs' if broken == 'researcher' else 'transfer_to_researcher'}' "
        "whose arguments are not JSON"
    )


@pytest.mark.parametrize("citations", ["auto", "required"])
def test_citations_are_checked_on_any_model_where_the_policy_requires_them(
    home: Path, serve: Any, tmp_path: Path, citations: str
) -> None:
    """``finalize.citations = "required"`` holds a docs question's answer on an ``openai:``
    model to a citation, as ``auto`` does on the embedded model only."""
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[finalize]\ncitations = "{citations}"\n', encoding="utf-8")
    script = {"researcher": [*RESEARCH, {"content": "They are written at every step."}]}
    with serve(script):
        result = run_task(
            "What do the docs say about when checkpoints are written?",
            agent_models=_models("swarm"),
            topology=Topology.parse("swarm"),
            policy=policy,
        )
    if citations == "auto":
        assert result.status == "succeeded", result.stop_reason
    else:
        assert result.status == "degraded"
        assert result.stop_reason == (
            "ungrounded: the request asks about the docs, but the answer cites no document"
        )


def test_a_policy_may_require_citations_but_not_drop_them() -> None:
    from relaygraph.errors import ConfigError
    from relaygraph.policies import default_policy, tighten

    roster = {"researcher": AgentPolicy(tools=("search_docs",), handoffs=())}
    base = default_policy(roster)
    required = tighten(base, {"finalize": {"citations": "required"}})
    assert required.finalize.citations == "required"
    with pytest.raises(ConfigError, match=r"finalize\.citations = 'auto' is less strict"):
        tighten(required, {"finalize": {"citations": "auto"}})


def _relaygraph_run(home: Path, topology: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RELAYGRAPH_HOME": str(home), "COLUMNS": "400"}
    specs = [
        a for role, spec in _models(topology).items() for a in ("--agent-model", f"{role}={spec}")
    ]
    return subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "run", "When are checkpoints written?",
         "--topology", topology, *specs, *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("topology", "script"),
    [
        pytest.param("structured", {"supervisor": [ROUTED, FINISHED]}, id="structured"),
        pytest.param(
            "swarm",
            {"researcher": [{"tool_calls": [{"name": "transfer_to_writer", "args": {
                "task": "write it", "reason": "a report"}}]}]},
            id="swarm",
        ),
        pytest.param("supervisor-tools", {"supervisor": [TRANSFER]}, id="supervisor-tools"),
    ],
)  # fmt: skip
def test_a_failed_agent_call_that_leaves_no_answer_fails_the_run_said_once(
    home: Path, serve: Any, topology: str, script: dict[str, Any]
) -> None:
    """An agent's model call fails (the server answers 500 to every try) and no agent's
    work is left to answer from: ``relaygraph run`` ends ``failed`` with exit code 1, not
    ``degraded`` with exit 0 and the failure's text as the answer, and prints the failure
    once on stderr (its event), not a second time through the log."""
    failing = "writer" if topology == "swarm" else "researcher"
    script = {**script, failing: [{"content": "never played"}]}
    faults = Faults(sequence=["500"] * 9, kinds=(), models=frozenset({f"script-{failing}"}))
    with serve(script, faults):
        proc = _relaygraph_run(home, topology, "--json")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "failed"
    assert result["answer"] is None
    assert result["stop_reason"].startswith(f"model_error: {failing}: HTTP 500: ")
    # The event's line ("model call failed (researcher, spec): ..."), and no log line
    # ("model call of 'researcher' (spec) failed: ...") beside it.
    said = [
        line
        for line in proc.stderr.splitlines()
        if "model call failed (" in line or "model call of " in line
    ]
    assert len(said) == 1, proc.stderr
    assert f"model call failed ({failing}, " in said[0]


def test_on_the_embedded_model_an_answer_that_cites_nothing_is_degraded_whoever_ran(
    home: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: a plain question routed to the coder, whose reply is a small model's broken
    code output, is not ``succeeded`` and its error text is not the answer."""
    from relaygraph.models.local import _chat as local_module

    from .test_local_narrow import StandInEngine

    monkeypatch.setattr(local_module, "_ENGINES", {"smollm2": StandInEngine()})
    garbage = "1.0.2 (Python 3.7, 64-bit) </SyntaxError> TypeError: unsupported operand"
    spec = script(
        {
            "supervisor": [
                {"route": {"next": "coder", "task": "find the version", "reason": "code"}},
                FINISHED,
            ],
            "coder": [{"content": garbage}],
        }
    )
    result = run_task(
        "Which version of the tool is installed?",
        model=spec,
        agent_models={"finalize": "local:smollm2"},
    )
    assert result.agents_run == ["coder"]
    assert result.status == "degraded"
    assert result.stop_reason is not None
    assert result.stop_reason.startswith("no answer: no agent cited a document it read")
    assert result.answer is not None
    assert "TypeError" not in result.answer and "SyntaxError" not in result.answer
    assert "Agents that worked: coder." in result.answer


def test_the_embedded_models_answer_without_a_citation_is_a_non_answer() -> None:
    from relaygraph.models.local._team import no_cited_answer
    from relaygraph.supervisor import non_answer

    answer = no_cited_answer([("researcher", "I found no document (searched for: canary).")])
    assert "Searched the knowledge base for: canary." in answer
    why = non_answer(answer)
    assert why is not None and why.startswith("no answer: no agent cited a document it read")
