"""Teams of your own (issue 14): agents and tools in Python or a team file, run end to end.

Every test runs on the scripted model: the script's keys are the team's roles, so a script
for a team with a ``reviewer`` has ``reviewer`` turns.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from relaygraph.agents import Agent, builtin
from relaygraph.errors import ConfigError
from relaygraph.runner import run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.team import Team, default_team, load_team
from relaygraph.topology import Topology

from ._scripts import call, say

REPO = Path(__file__).resolve().parents[1]
COUNTED: list[str] = []


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text to count.
    """
    COUNTED.append(text)
    return len(text.split())


def reviewer(**changes: Any) -> Agent:
    values: dict[str, Any] = {
        "name": "reviewer",
        "description": "checks a draft and lists concrete problems",
        "prompt": "You are the reviewer.",
        "tools": [word_count, "read_doc"],
        "handoffs": ["writer"],
        **changes,
    }
    return Agent(**values)


def four() -> Team:
    return Team(
        agents=[builtin.researcher(), builtin.coder(), builtin.writer(), reviewer()],
        name="docs-review",
    )


def route(next: str) -> dict[str, Any]:
    return {"route": {"next": next, "task": f"{next}: do it", "reason": "because"}}


SCRIPTS: dict[str, dict[str, Any]] = {
    "structured": {
        "supervisor": [route("reviewer"), route("FINISH")],
        "reviewer": [call("word_count", text="one two three"), say("3 words, fine")],
        "finalize": [say("reviewed: 3 words")],
    },
    "swarm": {
        "researcher": [call("transfer_to_reviewer", task="count the words", reason="review")],
        "reviewer": [call("word_count", text="one two three"), say("3 words, fine")],
    },
    "supervisor-tools": {
        "supervisor": [
            call("transfer_to_reviewer", task="count the words", reason="review"),
            say("reviewed: 3 words"),
        ],
        "reviewer": [call("word_count", text="one two three"), say("3 words, fine")],
    },
}


@pytest.mark.parametrize("kind", list(SCRIPTS))
def test_a_team_with_an_agent_and_a_python_tool_of_its_own_runs_in_each_topology(
    home: Path, script: Any, kind: str
) -> None:
    COUNTED.clear()
    team = four()
    result = run_task(
        "Review the draft", team=team, model=script(SCRIPTS[kind]), topology=Topology.parse(kind)
    )
    assert result.status == "succeeded", result.stop_reason
    assert "reviewer" in result.agents_run
    assert COUNTED == ["one two three"]  # The tool really ran, once.
    assert result.usage["reviewer"]["tool_calls"] == 1
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        task = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None and task.team is not None
        assert task.team["name"] == "docs-review" and task.team["digest"] == team.digest
        calls = [c for c in ledger.tool_calls(result.task_id) if c.tool == "word_count"]
        assert [c.agent for c in calls] == ["reviewer"]
    finally:
        ledger.close()


def test_team_run_is_run_task_with_the_team(home: Path, script: Any) -> None:
    COUNTED.clear()
    result = run_task("Review", team=four(), model=script(SCRIPTS["structured"]))
    assert result.status == "succeeded" and COUNTED == ["one two three"]


def test_team_compile_is_a_plain_langgraph_graph(home: Path, script: Any) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.agents import TaskContext

    COUNTED.clear()
    graph = four().compile(model=script(SCRIPTS["structured"]), checkpointer=InMemorySaver())
    assert "reviewer" in graph.get_graph().nodes
    context = TaskContext.for_task(home, task_id="t", thread_id="th")
    state = graph.invoke(
        {"request": "Review"}, {"configurable": {"thread_id": "th"}}, context=context
    )
    assert state["status"] == "succeeded" and COUNTED == ["one two three"]


def test_a_policy_narrows_a_custom_tool_and_a_refused_call_never_runs(
    home: Path, script: Any
) -> None:
    COUNTED.clear()
    team = Team(
        agents=[builtin.researcher(), builtin.writer(), reviewer()],
        policy={"agents": {"reviewer": {"tools": ["read_doc"]}}},
    )
    result = run_task("Review", team=team, model=script(SCRIPTS["structured"]))
    assert COUNTED == []
    assert ("reviewer", "tool_not_allowed") in {(v["agent"], v["kind"]) for v in result.violations}


def test_budgets_hold_for_a_custom_tool(home: Path, script: Any) -> None:
    COUNTED.clear()
    turns = {
        "supervisor": [route("reviewer"), route("FINISH")],
        "reviewer": [
            call("word_count", text="a"),
            call("word_count", text="a b"),
            say("done"),
        ],
        "finalize": [say("done")],
    }
    team = Team(
        agents=[builtin.writer(), reviewer()],
        policy={"agents": {"reviewer": {"max_tool_calls": 1}}},
    )
    result = run_task("Review", team=team, model=script(turns))
    assert COUNTED == ["a"]
    assert ("reviewer", "budget") in {(v["agent"], v["kind"]) for v in result.violations}


INNER: dict[str, Any] = {}


def ask_subteam(question: str) -> str:
    """Ask a team of its own, run as a plain LangGraph graph, and say what it reported.

    Args:
        question: What to ask.
    """
    from langgraph.checkpoint.memory import InMemorySaver

    from relaygraph.agents import TaskContext

    graph = Team(agents=[builtin.researcher(), builtin.writer()]).compile(
        model=INNER["model"], checkpointer=InMemorySaver()
    )
    context = TaskContext.for_task(INNER["home"], task_id="inner", thread_id="inner")
    seen = [
        event["type"]
        for event in graph.stream(
            {"request": question},
            {"configurable": {"thread_id": "inner"}},
            context=context,
            stream_mode="custom",
        )
    ]
    INNER["seen"] = seen
    return f"the subteam reported {len(seen)} events"


def ask_subtask(question: str) -> str:
    """Ask a team of its own, run as a task of its own, and say what it answered.

    Args:
        question: What to ask.
    """
    inner = run_task(
        question,
        team=Team(agents=[builtin.researcher(), builtin.writer()]),
        model=INNER["model"],
        home=INNER["home"],
    )
    INNER["task_id"] = inner.task_id
    return inner.answer or inner.status


@pytest.mark.parametrize("stream_tokens", [False, True])
@pytest.mark.parametrize("tool", [ask_subteam, ask_subtask])
def test_a_team_run_inside_a_tool_keeps_its_events_out_of_the_tasks_ledger(
    home: Path, script: Any, stream_tokens: bool, tool: Any
) -> None:
    """A tool may run a team of its own: streamed as a plain LangGraph graph, its events
    are that stream's; run as a task (``run_task``), they are that task's. Never the outer
    task's: in its ledger they would be routes, handoffs and usage the task never made,
    counted against its budgets."""
    INNER.clear()
    INNER["home"] = home
    INNER["model"] = script(
        {
            "supervisor": [route("researcher"), route("FINISH")],
            "researcher": [say("inner finding")],
            "finalize": [say("inner answer")],
        }
    )
    team = Team(agents=[builtin.writer(), reviewer(tools=[tool])])
    turns = {
        "supervisor": [route("reviewer"), route("FINISH")],
        "reviewer": [call(tool.__name__, question="what is known?"), say("asked")],
        "finalize": [say("done")],
    }
    result = run_task("Review", team=team, model=script(turns), stream_tokens=stream_tokens)
    assert result.status == "succeeded", result.stop_reason
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        # The inner team's events are where it ran them: its stream, or its own task ...
        if tool is ask_subteam:
            assert "route" in INNER["seen"] and "final" in INNER["seen"]
        else:
            inner = ledger.events_after(INNER["task_id"])
            assert [e.data.get("next") for e in inner if e.type == "route"] == [
                "researcher",
                "FINISH",
            ]
        # ... and the outer task's ledger has none of them.
        events = ledger.events_after(result.task_id)
        routes = [e.data.get("next") for e in events if e.type == "route"]
        assert routes == ["reviewer", "FINISH"]
        assert [e.type for e in events].count("final") == 1
        used = {u.agent for u in ledger.usage(result.task_id)}
        assert "researcher" not in used and used >= {"supervisor", "reviewer"}
    finally:
        ledger.close()


def report_progress(text: str) -> str:
    """Report progress on LangGraph's stream, as a tool may.

    Args:
        text: What to report.
    """
    from langgraph.config import get_stream_writer

    get_stream_writer()({"progress": text})
    return "reported"


@pytest.mark.parametrize("stream_tokens", [False, True])
def test_what_a_tool_writes_on_langgraphs_stream_is_not_the_tasks_event(
    home: Path, script: Any, stream_tokens: bool
) -> None:
    """A tool's own writes on LangGraph's stream (progress) are not events of the team: the
    task runs on with or without tokens streamed (the ledger refused them, and with tokens
    the task failed), and its ledger holds only the team's events."""
    team = Team(agents=[builtin.writer(), reviewer(tools=[report_progress])])
    turns = {
        "supervisor": [route("reviewer"), route("FINISH")],
        "reviewer": [call("report_progress", text="half way"), say("done")],
        "finalize": [say("done")],
    }
    events: list[dict[str, Any]] = []
    result = run_task(
        "Review",
        team=team,
        model=script(turns),
        stream_tokens=stream_tokens,
        on_event=events.append,
    )
    assert result.status == "succeeded", result.stop_reason
    assert all("progress" not in event for event in events)
    assert ("report_progress", "success") in {
        (e.get("tool"), e.get("status")) for e in events if e["type"] == "tool_result"
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: reviewer(name="supervisor"), "reserved"),
        (lambda: reviewer(name="finalize"), "reserved"),
        (lambda: reviewer(name="FINISH"), "reserved"),
        (lambda: reviewer(name="has space"), "must be letters"),
        (lambda: reviewer(description=""), "description is missing"),
        (lambda: reviewer(prompt="  "), "prompt is missing"),
        (lambda: reviewer(tools=[word_count, word_count]), "'word_count' given twice"),
        (lambda: Team(agents=[builtin.writer(), builtin.writer()]), "two agents are named"),
        (lambda: Team(agents=[reviewer(handoffs=["editor"]), builtin.writer()]), "'editor'"),
        (lambda: Team(agents=[reviewer(handoffs=["reviewer"]), builtin.writer()]), "itself"),
        (lambda: Team(agents=[]), "has no agents"),
        (lambda: Team(agents=[reviewer(tools=["nope"]), builtin.writer()]), "unknown tool 'nope'"),
    ],
)
def test_names_are_checked_when_the_team_is_built(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_one_tool_name_for_two_tools_is_refused() -> None:
    def other_count(text: str) -> int:
        """Count differently."""
        return 0

    other_count.__name__ = "word_count"
    with pytest.raises(ConfigError, match="means two different tools"):
        Team(
            agents=[
                reviewer(handoffs=None),
                Agent(name="b", description="d", prompt="p", tools=[other_count]),
            ]
        )


def test_a_function_without_a_docstring_is_no_tool() -> None:
    def bare(text: str) -> str:
        return text

    with pytest.raises(ConfigError, match="has no docstring"):
        Team(agents=[reviewer(tools=[bare], handoffs=None)])


def test_the_default_team_is_built_through_the_public_api() -> None:
    team = default_team()
    assert team.agent_names == ("researcher", "coder", "writer")
    assert Team.default() is team
    assert team.digest == Team(agents=builtin.agents(), name="default").digest
    assert dict(team.roster["coder"].__class__.__dict__) is not None
    assert team.roster["coder"].tools == ("run_python", "write_file", "read_file")


# The team file


def write_team(folder: Path, text: str, **files: str) -> Path:
    for name, content in files.items():
        (folder / name).write_text(content, encoding="utf-8")
    path = folder / "team.toml"
    path.write_text(text, encoding="utf-8")
    return path


TOOLS_PY = 'def shout(text: str) -> str:\n    """Shout a text."""\n    return text.upper()\n'


def test_a_team_file_with_a_python_tool_runs(home: Path, tmp_path: Path, script: Any) -> None:
    path = write_team(
        tmp_path,
        """
name = "shouters"
[agents.writer]
use = "builtin:writer"
[agents.shouter]
description = "shouts"
prompt = "You shout."
tools = ["./tools.py:shout"]
""",
        **{"tools.py": TOOLS_PY},
    )
    team = load_team(path)
    assert team.agent_names == ("writer", "shouter")
    turns = {
        "supervisor": [route("shouter"), route("FINISH")],
        "shouter": [call("shout", text="hi"), say("HI")],
        "finalize": [say("HI")],
    }
    result = run_task("Shout", team=path, model=script(turns))
    assert result.status == "succeeded"
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        calls = ledger.tool_calls(result.task_id)
        assert [c.tool for c in calls] == ["shout"] and "HI" in (calls[0].result_preview or "")
        task = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None and task.team is not None
        assert task.team["source"] == str(path.resolve()) and task.team["name"] == "shouters"
    finally:
        ledger.close()
    described = team.describe()
    shouter = next(a for a in described["agents"] if a["name"] == "shouter")
    [shout] = shouter["tools"]
    assert {k: shout[k] for k in ("name", "origin", "description", "removed_by_policy")} == {
        "name": "shout",
        "origin": "./tools.py:shout",
        "description": "Shout a text.",
        "removed_by_policy": False,
    }
    assert shout["args"]["properties"] == {"text": {"title": "Text", "type": "string"}}


@pytest.mark.parametrize(
    ("text", "files", "message"),
    [
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ncolour='red'\n",
            {},
            "agents.a.colour: unknown key",
        ),
        ("nme = 'x'\n[agents.a]\ndescription='d'\nprompt='p'\n", {}, "nme: unknown key"),
        ("[agents.a]\nprompt='p'\n", {}, r"\[agents.a\] description: required key is missing"),
        ("[agents.a]\ndescription='d'\n", {}, r"\[agents.a\] prompt: required key is missing"),
        (
            "[agents.a]\nuse='b'\n[agents.b]\nuse='a'\n",
            {},
            "a cycle of use: a -> b -> a",
        ),
        (
            "[agents.a]\nuse='builtin:poet'\n",
            {},
            "no such built-in agent",
        ),
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ntools=['./tools.py:shout']\n",
            {"tools.py": "import no_such_module_xyz\n"},
            "fails to import: ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ntools=['./missing.py:shout']\n",
            {},
            "tool file './missing.py' does not exist",
        ),
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ntools=['./tools.py:whisper']\n",
            {"tools.py": TOOLS_PY},
            "has no 'whisper'",
        ),
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ntools=['no_such_pkg_xyz.mod:f']\n",
            {},
            "module 'no_such_pkg_xyz.mod' cannot be imported",
        ),
        (
            "[agents.a]\ndescription='d'\nprompt='p'\ntools=['mcp:lint/check']\n",
            {},
            r"no \[mcp.lint\] table",
        ),
        ("[agents.a]\ndescription='d'\nprompt='p'\ntools=['a b']\n", {}, "is not a tool reference"),
        ("[agents.supervisor]\ndescription='d'\nprompt='p'\n", {}, "reserved"),
        ("topology = 'ring'\n[agents.a]\ndescription='d'\nprompt='p'\n", {}, "ring"),
        ("agents = 3\n", {}, "agents"),
        ("[agents.a\n", {}, "is not valid TOML"),
        (
            "policy = 'nope.toml'\n[agents.a]\ndescription='d'\nprompt='p'\n",
            {},
            "policy file .* does not exist",
        ),
        (
            "[policy.agents.a]\ntools=['run_python']\n[agents.a]\ndescription='d'\nprompt='p'\n",
            {},
            'unknown tool "run_python"',
        ),
        (
            "[mcp.lint]\ncommand=['x']\nurl='http://h/mcp'\n[agents.a]\ndescription='d'\nprompt='p'\n",
            {},
            "exactly one of command",
        ),
        (
            "[mcp.lint]\nurl='ftp://h/mcp'\n[agents.a]\ndescription='d'\nprompt='p'\n",
            {},
            "an http:// or https:// URL",
        ),
    ],
)
def test_a_bad_team_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, files: dict[str, str], message: str
) -> None:
    path = write_team(tmp_path, text, **files)
    with pytest.raises(ConfigError, match=message) as refused:
        load_team(path)
    assert str(path) in str(refused.value) or "team file" in str(refused.value)


def test_teams_check_prints_the_team(tmp_path: Path, home: Path) -> None:
    path = write_team(
        tmp_path,
        "name = 'shouters'\n[agents.shouter]\ndescription='shouts'\nprompt='You shout.'\n"
        "tools=['./tools.py:shout', 'search_docs']\n",
        **{"tools.py": TOOLS_PY},
    )
    done = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "teams", "check", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    tools = {t["name"]: t["origin"] for t in described["agents"][0]["tools"]}
    assert tools == {"shout": "./tools.py:shout", "search_docs": "builtin"}
    # In text: each tool's arguments, and the tools the policy removes, marked.
    narrowed = write_team(
        tmp_path,
        "name = 'shouters'\n[agents.shouter]\ndescription='shouts'\nprompt='You shout.'\n"
        "tools=['./tools.py:shout', 'search_docs']\n"
        "[policy.agents.shouter]\ntools=['shout']\n",
        **{"tools.py": TOOLS_PY},
    )
    done = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "teams", "check", str(narrowed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "tool shout(text: string)  (./tools.py:shout)\n" in done.stdout
    assert (
        "tool search_docs(query: string, k?: integer)  (builtin)  [removed by the policy]"
        in done.stdout
    )
    bad = write_team(tmp_path, "[agents.a]\nprompt='p'\n")
    done = subprocess.run(
        [sys.executable, "-m", "relaygraph.cli", "teams", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "description: required key is missing" in done.stderr


def test_the_example_team_file_runs_with_its_mcp_server(home: Path) -> None:
    """examples/teams/docs-review.toml as the README runs it: a reviewer with a Python tool
    and the tools of a stdio MCP server, on the scripted model."""
    team = load_team(REPO / "examples" / "teams" / "docs-review.toml")
    described = {a["name"]: a for a in team.describe()["agents"]}
    origins = {t["name"]: t["origin"] for t in described["reviewer"]["tools"]}
    assert origins == {
        "read_doc": "builtin",
        "word_count": "./tools.py:word_count",
        "lint_check": "mcp:lint",
    }
    spec = f"scripted:{REPO / 'examples' / 'scripts' / 'docs-review.json'}"
    result = run_task("Review the handoff docs", team=team, model=spec)
    assert result.status == "succeeded", result.stop_reason
    assert result.agents_run == ["researcher", "writer", "reviewer"]
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        calls = {c.tool: c for c in ledger.tool_calls(result.task_id)}
        assert "no problems found" in (calls["lint_check"].result_preview or "")
        assert calls["word_count"].result_preview == "12"
        task = ledger.get_task(result.task_id, project_id=LOCAL_PROJECT_ID)
        assert task is not None and task.team == team.record()
    finally:
        ledger.close()


def test_a_refused_mcp_call_never_reaches_the_server(
    home: Path, tmp_path: Path, script: Any
) -> None:
    server = tmp_path / "lint_server.py"
    calls_file = tmp_path / "calls.txt"
    server.write_text(
        "from mcp.server.fastmcp import FastMCP\n"
        "server = FastMCP('lint')\n"
        "@server.tool()\n"
        "def check(text: str) -> str:\n"
        "    '''Lint a text.'''\n"
        f"    open({str(calls_file)!r}, 'a').write(text + '\\n')\n"
        "    return 'ok'\n"
        "server.run()\n",
        encoding="utf-8",
    )
    path = write_team(
        tmp_path,
        f"""
[agents.writer]
use = "builtin:writer"
[agents.linter]
description = "lints"
prompt = "You lint."
tools = ["mcp:lint/check"]
[mcp.lint]
command = ["python", "{server.name}"]
[policy.agents.linter]
max_tool_calls = 1
""",
    )
    turns = {
        "supervisor": [route("linter"), route("FINISH")],
        "linter": [call("lint_check", text="first"), call("lint_check", text="second"), say("ok")],
        "finalize": [say("done")],
    }
    result = run_task("Lint", team=path, model=script(turns))
    assert calls_file.read_text().splitlines() == ["first"]  # The second was refused.
    assert ("linter", "budget") in {(v["agent"], v["kind"]) for v in result.violations}


MCP_SCRIPTS: dict[str, dict[str, Any]] = {
    "structured": {
        "supervisor": [route("reviewer"), route("FINISH")],
        "reviewer": [
            {
                "tool_calls": [
                    {"name": "word_count", "args": {"text": "a b"}},
                    {"name": "lint_check", "args": {"text": "a a"}},
                ]
            },
            say("2 words; doubled word"),
        ],
        "finalize": [say("reviewed")],
    },
    "swarm": {
        "researcher": [call("transfer_to_reviewer", task="review", reason="draft")],
        "reviewer": [
            {
                "tool_calls": [
                    {"name": "word_count", "args": {"text": "a b"}},
                    {"name": "lint_check", "args": {"text": "a a"}},
                ]
            },
            say("2 words; doubled word"),
        ],
    },
    "supervisor-tools": {
        "supervisor": [call("transfer_to_reviewer", task="review", reason="draft"), say("ok")],
        "reviewer": [
            {
                "tool_calls": [
                    {"name": "word_count", "args": {"text": "a b"}},
                    {"name": "lint_check", "args": {"text": "a a"}},
                ]
            },
            say("2 words; doubled word"),
        ],
    },
}


@pytest.mark.parametrize("kind", list(MCP_SCRIPTS))
def test_four_agents_with_a_python_tool_and_an_mcp_server_run_in_each_topology(
    home: Path, script: Any, kind: str
) -> None:
    team = load_team(REPO / "examples" / "teams" / "docs-review.toml")
    team = Team(
        agents=(*team.agents, builtin.coder()),
        name="docs-review-4",
        policy={"agents": {"reviewer": {"max_tool_calls": 4}}},
    )
    result = run_task(
        "Review", team=team, model=script(MCP_SCRIPTS[kind]), topology=Topology.parse(kind)
    )
    assert result.status == "succeeded", result.stop_reason
    assert "reviewer" in result.agents_run
    ledger = Ledger(f"sqlite:///{home / 'ledger.sqlite'}")
    try:
        calls = {c.tool: c for c in ledger.tool_calls(result.task_id)}
        assert calls["word_count"].result_preview == "2"
        assert "doubled word 'a'" in (calls["lint_check"].result_preview or "")
    finally:
        ledger.close()


def test_the_mcp_example_builds_a_team_in_python_and_runs_it(home: Path) -> None:
    import runpy

    from relaygraph.team import close_mcp_servers

    example = runpy.run_path(str(REPO / "examples" / "mcp" / "mcp_team.py"))
    team: Team = example["team"]
    try:
        assert list(team.tools) == [
            "save_artifact",
            "list_artifacts",
            "words_count",
            "words_longest",
        ]
        (reviewer_shown,) = [a for a in team.describe()["agents"] if a["name"] == "reviewer"]
        assert {t["name"]: t["origin"] for t in reviewer_shown["tools"]} == {
            "words_count": "mcp:words",
            "words_longest": "mcp:words",
        }
        script = REPO / "examples" / "scripts" / "mcp-team.json"
        result = run_task("Review", team=team, model=f"scripted:{script}")
        assert result.status == "succeeded", result.stop_reason
        with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
            calls = {c.tool: c.result_preview for c in ledger.tool_calls(result.task_id)}
        # The server answered: the scripted model cannot have made these up.
        assert calls == {"words_count": "6", "words_longest": "checkpoints"}
    finally:
        close_mcp_servers()
