"""Registered teams in the task service: a project pushes a team file (``PUT /v1/teams``),
its tasks name it, the ledger and the trace say which version ran; what a project's team
may reference is the operator's choice. In process (httpx.ASGITransport), and once against
a real ``relaygraph serve`` on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from rich.console import Console

from relaygraph.api import ServiceSettings, create_app
from relaygraph.errors import ConfigError
from relaygraph.store import Ledger
from relaygraph.tracing import build_timeline, render_timeline

from ._scripts import COUNTED_BY_THE_REVIEWER, call, one_visit, say
from ._service import ENDED, ServiceClient, auth, in_process
from .conftest import EXAMPLE_RELAY, REPO

TOOLS_MODULE = "rg_review_tools"
TEAM_TOML = """\
name = "what-the-file-calls-it"
description = "Research, then review"

[agents.researcher]
use = "builtin:researcher"

[agents.reviewer]
description = "checks a draft and counts its words"
prompt = "You are the reviewer. Count the words of the draft with word_count, list problems."
tools = ["read_doc", "rg_review_tools:word_count"]
handoffs = ["researcher"]

[policy.team]
max_tokens = 50000
"""
REVIEW_SCRIPT = {
    "supervisor": [
        {"route": {"next": "researcher", "task": "Find the checkpoint docs", "reason": "facts"}},
        {
            "route": {
                "next": "reviewer",
                "task": "Review: checkpoints are written after every step",
                "reason": "a draft exists",
            }
        },
        {"route": {"next": "FINISH", "task": "", "reason": "reviewed"}},
    ],
    "researcher": [
        {"tool_calls": [{"name": "search_docs", "args": {"query": "checkpoint"}}]},
        {"content": "Checkpoints are written after every super-step."},
    ],
    "reviewer": [
        {
            "tool_calls": [
                {"name": "word_count", "args": {"text": "checkpoints are written after every step"}}
            ]
        },
        {"content": "6 words; no problems."},
    ],
    "finalize": [{"content": "Checkpoints are written after every step. Reviewed: 6 words."}],
}


@pytest.fixture(autouse=True)
def _review_script(scripts: Path) -> None:
    """The reviewer's script in the server's scripts folder, beside ``relay.json``."""
    (scripts / "review.json").write_text(json.dumps(REVIEW_SCRIPT), encoding="utf-8")


def definition(**agents_changes: Any) -> dict[str, Any]:
    """The team file's content as JSON, with changes to its reviewer (or other tables)."""
    reviewer = {
        "description": "checks a draft and counts its words",
        "prompt": "You are the reviewer.",
        "tools": ["read_doc", f"{TOOLS_MODULE}:word_count"],
    }
    data: dict[str, Any] = {
        "agents": {"researcher": {"use": "builtin:researcher"}, "reviewer": reviewer}
    }
    for key, value in agents_changes.items():
        if key in reviewer or key == "model":
            reviewer[key] = value
        else:
            data[key] = value
    return data


@pytest.fixture
def tools_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module of tools, which the operator allows (RELAYGRAPH_TOOL_MODULES)."""
    folder = tmp_path / "site"
    (folder / TOOLS_MODULE).mkdir(parents=True)
    (folder / TOOLS_MODULE / "__init__.py").write_text(
        'def word_count(text: str) -> int:\n    """Count the words of a text."""\n'
        "    return len(text.split())\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(folder))
    return folder


class Api(ServiceClient):
    def __init__(
        self, client: httpx.AsyncClient, app: Any, home: Path, ledger_url: str | None = None
    ) -> None:
        super().__init__(client, ledger_url or f"sqlite:///{home / 'ledger.sqlite'}", ends=ENDED)
        self.app, self.home = app, home

    async def push(self, key: str, name: str, **body: Any) -> httpx.Response:
        return await self.client.put(f"/v1/teams/{name}", json=body, headers=auth(key))


@asynccontextmanager
async def serving(home: Path, scripts: Path, **settings: Any) -> AsyncIterator[Api]:
    app = create_app(
        ServiceSettings(
            default_model=f"scripted:{EXAMPLE_RELAY}",
            scripts_dir=scripts,
            home=home,
            tool_modules=settings.pop("tool_modules", [TOOLS_MODULE]),
            **settings,
        )
    )
    async with in_process(app) as client:
        yield Api(client, app, home, settings.get("database_url"))


@pytest.fixture
async def api(home: Path, scripts: Path, tools_module: Path) -> AsyncIterator[Api]:
    async with serving(home, scripts) as running:
        yield running


async def test_a_pushed_team_runs_a_task_with_its_own_agent(api: Api) -> None:
    key = api.key("acme")
    pushed = await api.push(key, "docs-review", toml=TEAM_TOML)
    assert pushed.status_code == 201, pushed.text
    version = pushed.json()
    assert (version["name"], version["version"], version["origin"]) == ("docs-review", 1, "project")
    assert version["agents"] == ["researcher", "reviewer"] and version["created"] is True
    assert version["digest"].startswith("sha256:")

    made = await api.submit(
        key, input="Review the checkpoint docs", team="docs-review", model="scripted:review.json"
    )
    assert made.status_code == 202, made.text
    task = await api.wait(made.json()["id"], key)
    assert task["status"] == "succeeded", task
    assert "6 words" in task["answer"]
    shown = {"name": "docs-review", "version": 1, "digest": version["digest"]}
    assert task["team"] == shown
    assert task["models"]["reviewer"].endswith("review.json")

    with Ledger(api.ledger_url) as ledger:
        project = ledger.authenticate(key)
        assert project is not None
        stored = ledger.get_task(task["id"], project_id=project.id)
        assert stored is not None and stored.team == {**shown, "source": None}
        # The custom agent ran with its custom tool.
        calls = [(c.agent, c.tool, c.result_preview) for c in ledger.tool_calls(task["id"])]
        assert ("reviewer", "word_count", "6") in calls
        handoffs = [(h.source, h.target) for h in ledger.handoffs(task["id"])]
        assert ("supervisor", "reviewer") in handoffs
        # The task ran under the team's policy (its own limit), as the ledger keeps it.
        assert stored.policy is not None and stored.policy["team"]["max_tokens"] == 50000
        assert set(stored.policy["agents"]) == {"researcher", "reviewer"}
        timeline = build_timeline(ledger, task["id"], project_id=project.id)
    assert timeline["team"] == {**shown, "source": None}
    console = Console(record=True, width=200)
    console.print(render_timeline(timeline))
    assert f"team docs-review v1 ({version['digest'][:19]})" in console.export_text()

    trace = (await api.client.get(f"/v1/tasks/{task['id']}/trace", headers=auth(key))).json()
    assert trace["team"] == shown
    agents = [node["agent"] for node in trace["children"] if node["kind"] == "agent"]
    assert agents == ["researcher", "reviewer"]
    # The server builds a version once: every task of it runs the same team (its MCP
    # sessions and compiled graph reused).
    teams = api.app.state.teams
    assert (
        teams.choose(project.id, "docs-review", None).team
        is teams.choose(project.id, "docs-review", 1).team
    )


async def test_a_worker_builds_the_pushed_team_from_the_ledger_and_runs_it(
    url: str, home: Path, scripts: Path, tools_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker (or another server process) builds a registered team from its definition in
    the ledger: the agents come back in the order pushed, so it is the team the server built
    and the task recorded, same digest. Agents named researcher, writer, reviewer are the
    case: PostgreSQL's jsonb orders keys by length (writer, reviewer, researcher), which made
    another digest, and the worker failed every such task as changed since it started."""
    from relaygraph.runner import Intake, RunnerSettings, ServiceTeams, TaskRequest, submit_task
    from relaygraph.worker import close_worker_runtime, run_ledger_task

    pushed_order = ["researcher", "writer", "reviewer"]
    body = definition()
    body["agents"] = {
        "researcher": body["agents"]["researcher"],
        "writer": {"use": "builtin:writer"},
        "reviewer": body["agents"]["reviewer"],
    }
    async with serving(home, scripts, database_url=url) as api:
        key = api.key("acme")
        pushed = await api.push(key, "docs-review", definition=body)
        assert pushed.status_code == 201, pushed.text
        version = pushed.json()
        assert version["agents"] == pushed_order
        shown = await api.client.get("/v1/teams/docs-review/versions/1", headers=auth(key))
        assert list(shown.json()["definition"]["agents"]) == pushed_order
        with Ledger(url) as ledger:
            project = ledger.authenticate(key)
            assert project is not None
            # What the server records of a task on the team: the team it built from the push.
            chosen = api.app.state.teams.choose(project.id, "docs-review", None)
            assert chosen.team.digest == version["digest"]
            task = submit_task(
                TaskRequest(
                    input="Review the checkpoint docs",
                    team=chosen.team,
                    team_version=chosen.version,
                    trust_team=False,
                    policy=chosen.policy,
                    project_id=project.id,
                    model=f"scripted:{scripts / 'review.json'}",
                ),
                Intake(ledger=ledger),
            ).task

    with Ledger(url) as ledger:
        rebuilt = ServiceTeams(
            ledger=ledger, settings=RunnerSettings(tool_modules=[TOOLS_MODULE]), home=home
        ).resolve(task)
        assert list(rebuilt.agent_names) == pushed_order
        assert rebuilt.digest == version["digest"]

        monkeypatch.setenv("RELAYGRAPH_DATABASE_URL", url)
        monkeypatch.setenv("RELAYGRAPH_TOOL_MODULES", json.dumps([TOOLS_MODULE]))
        monkeypatch.setenv("RELAYGRAPH_UNSAFE_SANDBOX", "true")
        dispatch = ledger.queue_for_workers(task.id)
        try:
            run_ledger_task(task.id, dispatch)
        finally:
            close_worker_runtime()
        ran = ledger.get_task(task.id, project_id=project.id)
        assert ran is not None and ran.status == "succeeded", ran and ran.stop_reason
        assert ran.team == {**chosen.record, "source": None}
        assert "6 words" in (ran.answer or "")


async def test_the_shipped_registrable_team_pushes_and_runs(home: Path, scripts: Path) -> None:
    """examples/teams/docs-review-service.toml, which docs/teams.md and docs/api.md push: a
    project may register it (built-in tools, an inline policy; no program, no file of the
    server), and a task runs it on the script made for it, as the docs say."""
    toml = (REPO / "examples" / "teams" / "docs-review-service.toml").read_text(encoding="utf-8")
    async with serving(home, REPO / "examples" / "scripts", tool_modules=[]) as api:
        key = api.key("acme")
        pushed = await api.push(key, "docs-review", toml=toml)
        assert pushed.status_code == 201, pushed.text
        assert pushed.json()["agents"] == ["researcher", "writer", "reviewer"]
        made = await api.submit(
            key,
            input="Review the handoff docs",
            team="docs-review",
            model="scripted:docs-review-service.json",
        )
        assert made.status_code == 202, made.text
        task = await api.wait(made.json()["id"], key)
        assert task["status"] == "succeeded", task
        assert "Reviewed: no problems found." in task["answer"]


async def test_a_script_for_other_roles_is_refused_at_submission(api: Api) -> None:
    """relay.json has turns for the coder and the writer, which this team lacks: the task
    would fail at the run's first call; the submission answers 422 naming the roles (it was
    accepted, 202, and the task failed)."""
    key = api.key("acme")
    assert (await api.push(key, "docs-review", toml=TEAM_TOML)).status_code == 201
    for body, field in [
        ({"model": "scripted:relay.json"}, "model"),
        (
            {"model": "scripted:review.json", "agent_models": {"reviewer": "scripted:relay.json"}},
            "agent_models.reviewer",
        ),
        ({}, "model"),  # The server's default model, relay.json too.
    ]:
        made = await api.submit(key, input="x", team="docs-review", **body)
        assert made.status_code == 422, (body, made.text)
        error = made.json()["error"]
        assert (error["code"], error["field"]) == ("invalid_model", field), body
        assert "'coder', 'writer', which is no role of team 'docs-review'" in error["message"]
        assert "supervisor, researcher, reviewer, finalize" in error["message"]
        assert str(api.home) not in error["message"]
    # The script made for the team's roles is accepted.
    made = await api.submit(key, input="x", team="docs-review", model="scripted:review.json")
    assert made.status_code == 202, made.text


async def test_a_changed_team_is_the_next_version_and_tasks_pick_one(api: Api) -> None:
    key = api.key("acme")
    first = (await api.push(key, "docs-review", toml=TEAM_TOML)).json()
    again = await api.push(key, "docs-review", toml=TEAM_TOML)
    assert again.status_code == 200  # Unchanged: the same version.
    assert again.json()["version"] == 1 and again.json()["created"] is False
    changed_toml = TEAM_TOML.replace("list problems.", "list every problem.")
    changed = await api.push(key, "docs-review", toml=changed_toml)
    assert changed.status_code == 201 and changed.json()["version"] == 2
    assert changed.json()["digest"] != first["digest"]

    old = await api.submit(
        key, input="x", team="docs-review", version=1, model="scripted:review.json"
    )
    new = await api.submit(key, input="x", team="docs-review", model="scripted:review.json")
    assert old.json()["team"] == {"name": "docs-review", "version": 1, "digest": first["digest"]}
    assert new.json()["team"]["version"] == 2
    assert (await api.wait(old.json()["id"], key))["status"] == "succeeded"
    assert (await api.wait(new.json()["id"], key))["status"] == "succeeded"

    history = (await api.client.get("/v1/teams/docs-review", headers=auth(key))).json()
    assert [v["version"] for v in history["versions"]] == [1, 2]
    assert history["latest"]["version"] == 2 and history["origin"] == "project"
    one = (await api.client.get("/v1/teams/docs-review/versions/1", headers=auth(key))).json()
    # The definition as registered: its name is the one tasks use.
    assert one["definition"]["name"] == "docs-review"
    assert one["definition"]["agents"]["reviewer"]["prompt"].endswith("list problems.")
    listed = (await api.client.get("/v1/teams", headers=auth(key))).json()["teams"]
    assert [(t["name"], t["version"], t["origin"]) for t in listed] == [
        ("default", None, "builtin"),
        ("docs-review", 2, "project"),
    ]
    for path, field in [
        ("/v1/teams/docs-review/versions/3", "version"),
        ("/v1/teams/docs-review/versions/x", "version"),
        ("/v1/teams/nope", "name"),
    ]:
        missing = await api.client.get(path, headers=auth(key))
        assert missing.status_code == 404, path
        assert missing.json()["error"]["code"] == "team_not_found"
        assert missing.json()["error"]["field"] == field
    absent = await api.submit(key, input="x", team="docs-review", version=3)
    assert absent.status_code == 404 and absent.json()["error"]["field"] == "version"


async def test_another_projects_team_is_not_found(api: Api) -> None:
    a, b = api.key("a-project"), api.key("b-project")
    assert (await api.push(a, "docs-review", toml=TEAM_TOML)).status_code == 201
    refused = await api.submit(b, input="x", team="docs-review")
    assert refused.status_code == 404
    assert refused.json()["error"] == {
        "code": "team_not_found",
        "message": "no team 'docs-review'",
        "field": "team",
    }
    for path in ("/v1/teams/docs-review", "/v1/teams/docs-review/versions/1"):
        assert (await api.client.get(path, headers=auth(b))).status_code == 404
    assert [
        t["name"] for t in (await api.client.get("/v1/teams", headers=auth(b))).json()["teams"]
    ] == ["default"]
    # B's names are its own: its first push of the same name is its version 1.
    theirs = await api.push(b, "docs-review", definition=definition(prompt="B's reviewer."))
    assert theirs.status_code == 201 and theirs.json()["version"] == 1
    changed = await api.push(a, "docs-review", definition=definition(prompt="A's reviewer."))
    assert changed.json()["version"] == 2


@pytest.mark.parametrize(
    ("changes", "code", "field", "named"),
    [
        (
            {"tools": ["./tools.py:word_count"]},
            "invalid_team",
            "definition.agents.reviewer.tools",
            "'./tools.py:word_count': a registered team may name no files of the server",
        ),
        (
            {"tools": ["os.path:join"]},
            "invalid_team",
            "definition.agents.reviewer.tools",
            "module 'os.path' is not allowed on this server (RELAYGRAPH_TOOL_MODULES: "
            f"{TOOLS_MODULE})",
        ),
        (
            {"tools": ["mcp:lint/*"], "mcp": {"lint": {"command": ["python", "lint.py"]}}},
            "invalid_team",
            "definition.mcp.lint.command",
            "a registered team may start no programs on the server",
        ),
        (
            {"tools": ["mcp:lint/*"], "mcp": {"lint": {"url": "http://10.0.0.5:9000/mcp"}}},
            "invalid_team",
            "definition.mcp.lint.url",
            "host '10.0.0.5' port 9000 is not allowed on this server "
            "(RELAYGRAPH_MCP_ALLOWED_HOSTS: 127.0.0.1;",
        ),
        (  # An allowed host's other ports: on loopback, the ledger's, Redis's, RabbitMQ's.
            {"tools": ["mcp:lint/*"], "mcp": {"lint": {"url": "http://127.0.0.1:5432/mcp"}}},
            "invalid_team",
            "definition.mcp.lint.url",
            "host '127.0.0.1' port 5432 is not allowed on this server",
        ),
        (
            {"agents": {"researcher": {"use": "builtin:researcher", "kb": ["/etc"]}}},
            "invalid_team",
            "definition.agents.researcher.kb",
            "a registered team may name no folders of the server",
        ),
        (
            {"policy": "/etc/relaygraph/policy.toml"},
            "invalid_team",
            "definition.policy",
            "policy = '/etc/relaygraph/policy.toml': name no file",
        ),
        (
            {"model": "scripted:/etc/passwd"},
            "model_not_allowed",
            "definition.agents.reviewer.model",
            "model 'scripted:/etc/passwd' is not allowed on this server",
        ),
        (
            {"model": "acme:big"},
            "invalid_model",
            "definition.agents.reviewer.model",
            "'acme:big'",
        ),
    ],
)
async def test_each_reference_the_server_does_not_allow_is_refused(
    home: Path,
    scripts: Path,
    tools_module: Path,
    changes: dict[str, Any],
    code: str,
    field: str,
    named: str,
) -> None:
    async with serving(home, scripts, mcp_allowed_hosts=["127.0.0.1"]) as api:
        key = api.key("acme")
        data = definition(**changes)
        if "agents" in changes:  # A researcher table of its own, with the usual reviewer.
            data["agents"] = {**definition()["agents"], **changes["agents"]}
        refused = await api.push(key, "docs-review", definition=data)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"]) == (code, field), error
        assert named in error["message"]
        assert (await api.client.get("/v1/teams/docs-review", headers=auth(key))).status_code == 404


async def test_an_mcp_server_over_http_on_an_allowed_host_is_used(
    home: Path, scripts: Path, tools_module: Path
) -> None:
    from relaygraph.team._mcp import close_mcp_servers

    from .test_mcp_tools import HttpServer

    running = HttpServer()
    try:
        endpoint = urlsplit(running.url).netloc  # 127.0.0.1:<its port>
        async with serving(home, scripts, mcp_allowed_hosts=[endpoint]) as api:
            key = api.key("acme")
            data = definition(tools=["mcp:docs/search"], mcp={"docs": {"url": running.url}})
            pushed = await api.push(key, "with-mcp", definition=data)
            assert pushed.status_code == 201, pushed.text
            with Ledger(api.ledger_url) as ledger:
                project = ledger.authenticate(key)
            assert project is not None
            team = api.app.state.teams.choose(project.id, "with-mcp", None).team
            assert team.agent("reviewer").tool_names == ("docs_search",)
            assert pushed.json()["digest"] == team.digest
    finally:
        close_mcp_servers()
        running.stop()


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (
            {"definition": {**definition(), "colour": "blue"}},
            422,
            "invalid_team",
            "definition.colour",
        ),
        (
            {"definition": definition(description=None)},
            422,
            "invalid_team",
            "definition.agents.reviewer.description",
        ),
        ({"toml": "name = "}, 422, "invalid_team", "toml"),
        ({"toml": TEAM_TOML, "definition": definition()}, 422, "invalid_request", "body"),
        ({}, 422, "invalid_request", "body"),
    ],
)
async def test_a_bad_team_is_refused_naming_the_key(
    api: Api, body: dict[str, Any], status: int, code: str, field: str
) -> None:
    key = api.key("acme")
    refused = await api.push(key, "docs-review", **body)
    assert refused.status_code == status, refused.text
    assert (refused.json()["error"]["code"], refused.json()["error"]["field"]) == (code, field)


async def test_names_are_checked_and_the_servers_own_are_taken(api: Api) -> None:
    key = api.key("acme")
    bad = await api.push(key, "no space", toml=TEAM_TOML)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "name"
    taken = await api.push(key, "default", toml=TEAM_TOML)
    assert taken.status_code == 409
    assert (taken.json()["error"]["code"], taken.json()["error"]["field"]) == (
        "team_name_taken",
        "name",
    )
    versioned = await api.submit(key, input="x", team="default", version=2)
    assert versioned.status_code == 422 and versioned.json()["error"]["field"] == "version"


async def test_a_request_policy_only_tightens_the_chosen_teams(api: Api) -> None:
    key = api.key("acme")
    assert (await api.push(key, "docs-review", toml=TEAM_TOML)).status_code == 201
    base = {"input": "x", "team": "docs-review", "model": "scripted:review.json"}
    narrower = await api.submit(
        key, **base, policy={"agents": {"reviewer": {"tools": ["word_count"]}}}
    )
    assert narrower.status_code == 202, narrower.text
    await api.wait(narrower.json()["id"], key)
    cases = [
        ({"policy": {"team": {"max_tokens": 60000}}}, "policy_loosens", "policy"),
        ({"policy": {"agents": {"coder": {"tools": []}}}}, "invalid_policy", "policy"),
        (
            {"agent_models": {"coder": "scripted:review.json"}},
            "invalid_model",
            "agent_models.coder",
        ),
        ({"topology": "swarm", "start_agent": "coder"}, "invalid_topology", "start_agent"),
    ]
    for extra, code, field in cases:
        refused = await api.submit(key, **{**base, **extra})
        assert refused.status_code == 422, (extra, refused.text)
        assert (refused.json()["error"]["code"], refused.json()["error"]["field"]) == (code, field)
    # The team's own roles take their own models, and the request's.
    per_role = await api.submit(key, **base, agent_models={"reviewer": "scripted:review.json"})
    assert per_role.status_code == 202, per_role.text
    assert set(per_role.json()["models"]) == {"supervisor", "researcher", "reviewer", "finalize"}
    await api.wait(per_role.json()["id"], key)


async def test_an_approval_of_a_custom_tool_is_checked_against_its_arguments(
    api: Api, scripts: Path
) -> None:
    key = api.key("acme")
    assert (await api.push(key, "docs-review", toml=TEAM_TOML)).status_code == 201
    script = COUNTED_BY_THE_REVIEWER
    (scripts / "approve.json").write_text(json.dumps(script), encoding="utf-8")
    made = await api.submit(
        key,
        input="x",
        team="docs-review",
        model="scripted:approve.json",
        policy={"agents": {"reviewer": {"approval": ["word_count"]}}},
    )
    assert made.status_code == 202, made.text
    paused = await api.wait(made.json()["id"], key)
    assert paused["status"] == "interrupted", paused
    path = f"/v1/tasks/{paused['id']}/approvals"
    (approval,) = (await api.client.get(path, headers=auth(key))).json()["approvals"]
    assert (approval["agent"], approval["tool"]) == ("reviewer", "word_count")
    decide = f"{path}/{approval['id']}"
    wrong = await api.client.post(
        decide, json={"decision": "edit", "args": {"words": 2}}, headers=auth(key)
    )
    assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "args"
    assert "'words'" in wrong.json()["error"]["message"]
    edited = await api.client.post(
        decide, json={"decision": "edit", "args": {"text": "a b"}}, headers=auth(key)
    )
    assert edited.status_code == 202, edited.text
    done = await api.wait(paused["id"], key)
    assert done["status"] == "succeeded", done
    with Ledger(api.ledger_url) as ledger:
        calls = [(c.tool, c.result_preview) for c in ledger.tool_calls(paused["id"])]
    assert ("word_count", "2") in calls


async def test_the_operators_team_files_serve_every_project(
    home: Path, scripts: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "operator"
    folder.mkdir()
    (folder / "tools.py").write_text(
        'def word_count(text: str) -> int:\n    """Count the words of a text."""\n'
        "    return len(text.split())\n",
        encoding="utf-8",
    )
    file = folder / "docs-review.toml"
    file.write_text(
        TEAM_TOML.replace('name = "what-the-file-calls-it"', 'name = "house-review"').replace(
            "rg_review_tools:word_count", "./tools.py:word_count"
        ),
        encoding="utf-8",
    )
    async with serving(home, scripts, team_files=[file], tool_modules=[]) as api:
        key = api.key("acme")
        listed = (await api.client.get("/v1/teams", headers=auth(key))).json()["teams"]
        assert [(t["name"], t["origin"]) for t in listed] == [
            ("default", "builtin"),
            ("house-review", "server"),
        ]
        made = await api.submit(key, input="x", team="house-review", model="scripted:review.json")
        assert made.status_code == 202, made.text
        task = await api.wait(made.json()["id"], key)
        assert task["status"] == "succeeded", task
        assert task["team"]["name"] == "house-review" and task["team"]["version"] is None
        # A project sees no path of the server's; the ledger keeps it for the operator.
        assert str(file) not in json.dumps(task)
        with Ledger(api.ledger_url) as ledger:
            project = ledger.authenticate(key)
            assert project is not None
            stored = ledger.get_task(task["id"], project_id=project.id)
            assert stored is not None and stored.team is not None
            assert stored.team["source"] == str(file.resolve())
        taken = await api.push(key, "house-review", toml=TEAM_TOML)
        assert taken.status_code == 409
        versioned = await api.submit(key, input="x", team="house-review", version=1)
        assert versioned.status_code == 422


async def test_a_project_keeps_its_team_when_the_operator_loads_one_of_that_name(
    home: Path, scripts: Path, tools_module: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(home, scripts) as api:
        acme = api.key("acme")
        pushed = await api.push(acme, "house-review", toml=TEAM_TOML)
        assert pushed.status_code == 201, pushed.text
        beta = api.key("beta")
    # Later the operator loads a team file of that name.
    file = tmp_path / "house-review.toml"
    file.write_text(
        TEAM_TOML.replace('name = "what-the-file-calls-it"', 'name = "house-review"').replace(
            'description = "Research, then review"', 'description = "The house review"'
        ),
        encoding="utf-8",
    )
    with caplog.at_level("WARNING", logger="relaygraph.api._teams"):
        async with serving(home, scripts, team_files=[file]) as api:
            warned = [r.getMessage() for r in caplog.records]
            assert any("'acme'" in m and "'house-review'" in m for m in warned), warned
            assert not any("'beta'" in m for m in warned)

            def listed(body: dict[str, Any]) -> list[tuple[str, str, str]]:
                return [(t["name"], t["origin"], t["description"]) for t in body["teams"]]

            # For acme the name is its own team in every answer ...
            mine = (await api.client.get("/v1/teams", headers=auth(acme))).json()
            assert listed(mine)[1:] == [("house-review", "project", "Research, then review")]
            history = (await api.client.get("/v1/teams/house-review", headers=auth(acme))).json()
            assert history["origin"] == "project" and len(history["versions"]) == 1
            made = await api.submit(
                acme, input="x", team="house-review", version=1, model="scripted:review.json"
            )
            assert made.status_code == 202, made.text
            task = await api.wait(made.json()["id"], acme)
            assert task["status"] == "succeeded", task
            assert (
                task["team"]["version"] == 1 and task["team"]["digest"] == pushed.json()["digest"]
            )
            again = await api.push(acme, "house-review", toml=TEAM_TOML + "\n# v2\n")
            assert again.status_code in (200, 201), again.text
            # ... and for every other project it is the operator's, which it may not take.
            theirs = (await api.client.get("/v1/teams", headers=auth(beta))).json()
            assert listed(theirs)[1:] == [("house-review", "server", "The house review")]
            taken = await api.push(beta, "house-review", toml=TEAM_TOML)
            assert taken.status_code == 409
            assert taken.json()["error"]["code"] == "team_name_taken"
            made = await api.submit(
                beta, input="x", team="house-review", model="scripted:review.json"
            )
            assert made.status_code == 202, made.text
            task = await api.wait(made.json()["id"], beta)
            assert task["team"]["version"] is None


def test_a_worker_resolves_a_projects_team_of_a_server_teams_name(
    home: Path, tools_module: Path, tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from relaygraph.runner import RunnerSettings, ServiceTeams
    from relaygraph.team import parse_team

    file = tmp_path / "house-review.toml"
    file.write_text(TEAM_TOML.replace("what-the-file-calls-it", "house-review"), encoding="utf-8")
    settings = RunnerSettings(home=home, team_files=[file], tool_modules=[TOOLS_MODULE])
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        project, _ = ledger.create_project("acme")
        teams = ServiceTeams(ledger=ledger, settings=settings, home=home)
        own = {**definition(), "name": "house-review"}
        built = parse_team(own, base=home, trust=teams.trust)
        ledger.register_team(project.id, "house-review", definition=own, digest=built.digest)

        def task(version: int | None) -> Any:
            record = {"name": "house-review", "version": version}
            return SimpleNamespace(id="t-1", project_id=project.id, team=record)

        assert teams.resolve(task(1)).digest == built.digest
        assert teams.resolve(task(None)) is teams.server_teams["house-review"]
        # The project's team runs under the operator's ceiling, the server's under its own.
        assert teams.policy_for(task(1), built.resolved_policy) == teams.capped(
            built.resolved_policy
        )


COUNTER_SERVER = """
import uuid

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("counter")
SESSION = uuid.uuid4().hex  # a stdio server is one process per session


@mcp.tool()
def session_id() -> str:
    \"\"\"This session's id.\"\"\"
    return SESSION


mcp.run()
"""
COUNTER_TEAM = """\
[agents.asker]
description = "asks the MCP server which session it is in"
prompt = "You ask."
tools = ["mcp:counter/session_id"]
"""


async def test_the_operators_mcp_servers_serve_each_project_in_its_own_session(
    home: Path, scripts: Path, tmp_path: Path
) -> None:
    from relaygraph.team import close_mcp_servers

    folder = tmp_path / "operator"
    folder.mkdir()
    (folder / "counter_server.py").write_text(COUNTER_SERVER, encoding="utf-8")
    mcp_file = folder / "mcp.toml"
    mcp_file.write_text(
        '[mcp.counter]\ncommand = ["python", "counter_server.py"]\n', encoding="utf-8"
    )
    script = one_visit(
        "asker",
        "ask",
        "its job",
        call("counter_session_id"),
        say("Asked."),
        finished="asked",
        final="Done.",
    )
    (scripts / "counter.json").write_text(json.dumps(script), encoding="utf-8")

    async def session_of(api: Api, key: str) -> str:
        made = await api.submit(key, input="x", team="asker", model="scripted:counter.json")
        assert made.status_code == 202, made.text
        task = await api.wait(made.json()["id"], key)
        assert task["status"] == "succeeded", task
        with Ledger(api.ledger_url) as ledger:
            (call,) = ledger.tool_calls(task["id"])
        assert call.tool == "counter_session_id" and call.result_preview
        return call.result_preview

    try:
        async with serving(home, scripts, mcp_file=mcp_file) as api:
            acme, beta = api.key("acme"), api.key("beta")
            for key in (acme, beta):
                pushed = await api.push(key, "asker", toml=COUNTER_TEAM)
                assert pushed.status_code == 201, pushed.text
            first = await session_of(api, acme)
            assert await session_of(api, beta) != first  # a session of beta's own
            assert await session_of(api, acme) == first  # acme's is kept for its tasks
            # A project may still start no program of its own, even under an offered name.
            declared = COUNTER_TEAM + '[mcp.counter]\ncommand = ["python", "x.py"]\n'
            refused = await api.push(acme, "other", toml=declared)
            assert refused.status_code == 422
            assert refused.json()["error"]["field"] == "toml.mcp.counter"
            assert "offers an MCP server of this name" in refused.json()["error"]["message"]
        # Without the setting, the name means nothing to a project's team.
        async with serving(home, scripts) as api:
            refused = await api.push(api.key("gamma"), "asker", toml=COUNTER_TEAM)
            assert refused.status_code == 422
            assert "the server offers no MCP server of that name" in refused.text
    finally:
        close_mcp_servers()


def test_a_bad_mcp_file_stops_the_server_at_start(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "mcp.toml"
    bad.write_text('[mcp.counter]\ncommand = ["x"]\nurl = "http://h/mcp"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="give exactly one of command"):
        create_app(ServiceSettings(home=home, mcp_file=bad))
    with pytest.raises(ConfigError, match="does not exist"):
        create_app(ServiceSettings(home=home, mcp_file=tmp_path / "missing.toml"))


def test_a_bad_server_team_file_stops_the_server_at_start(
    home: Path, tmp_path: Path, tools_module: Path
) -> None:
    default = tmp_path / "default.toml"
    default.write_text('name = "default"\n' + TEAM_TOML.split("\n", 1)[1], encoding="utf-8")
    with pytest.raises(ConfigError, match="the built-in team's name"):
        create_app(ServiceSettings(home=home, team_files=[default]))
    with pytest.raises(ConfigError, match="does not exist"):
        create_app(ServiceSettings(home=home, team_files=[tmp_path / "missing.toml"]))


# Against a real server process


def test_push_and_run_against_a_real_server(
    home: Path, scripts: Path, tools_module: Path, tmp_path: Path
) -> None:
    from relaygraph.client import Client

    from ._service import free_port
    from .test_server import Server, _env, create_project

    file = tmp_path / "docs-review.toml"
    file.write_text(TEAM_TOML, encoding="utf-8")
    env = {
        **_env(home),
        "PYTHONPATH": str(tools_module),
        "RELAYGRAPH_TOOL_MODULES": json.dumps([TOOLS_MODULE]),
    }
    model = f"scripted:{EXAMPLE_RELAY}"
    server = Server(home, model, free_port(), tmp_path / "serve.log", scripts, env=env)
    server.wait_ready()
    try:
        key = create_project(home, "acme")
        push = subprocess.run(
            [
                sys.executable,
                "-m",
                "relaygraph.cli",
                "teams",
                "push",
                str(file),
                "--name",
                "docs-review",
                "--url",
                server.url,
                "--json",
            ],
            env={**env, "RELAYGRAPH_API_KEY": key},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert push.returncode == 0, push.stderr
        version = json.loads(push.stdout)
        assert (version["name"], version["version"]) == ("docs-review", 1)
        with Client(server.url, key) as client:
            task = client.submit(
                "Review the checkpoint docs", team="docs-review", model="scripted:review.json"
            )
            done = client.wait(task["id"], timeout=60)
            assert done["status"] == "succeeded", done
            assert done["team"] == {
                "name": "docs-review",
                "version": 1,
                "digest": version["digest"],
            }
            assert [v["version"] for v in client.team("docs-review")["versions"]] == [1]
        # A file the server refuses: exit 2 and the reason, naming the key.
        bad = tmp_path / "bad.toml"
        bad.write_text(
            TEAM_TOML.replace("rg_review_tools:word_count", "./tools.py:word_count"),
            encoding="utf-8",
        )
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "relaygraph.cli",
                "teams",
                "push",
                str(bad),
                "--url",
                server.url,
                "--key",
                key,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert "422 invalid_team [toml.agents.reviewer.tools]" in refused.stderr
    finally:
        server.stop()
