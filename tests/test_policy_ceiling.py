"""The operator's policy (``serve --policy``, else the default policy) is a ceiling for every
task: ``meet`` and ``loosenings`` as pure functions, then the attack through the service: a
project registers a team whose policy lifts every budget, and its task must still stop at
the operator's caps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaygraph.policies import (
    TeamPolicy,
    loosenings,
    meet,
    parse_policy,
    policy_ceiling,
    policy_to_mapping,
    stored_policy,
)
from relaygraph.runner import Intake, RunnerSettings, ServiceTeams, TaskRequest, submit_task
from relaygraph.store import Ledger
from relaygraph.team import default_team, parse_team

from ._scripts import call, route, say
from ._service import FINISHED
from .test_registered_teams import serving

BUILTIN = default_team()


def builtin_policy(data: dict[str, Any], source: str = "ops.toml") -> TeamPolicy:
    return parse_policy(data, roster=BUILTIN.roster, source=source)


def ceiling_of(data: dict[str, Any]) -> Any:
    return policy_ceiling(builtin_policy(data), roster=BUILTIN.roster)


def team_policy(agents: dict[str, tuple[str, ...]], data: dict[str, Any]) -> TeamPolicy:
    """A policy over a team of ``agents`` (name: tools), every other agent a peer."""
    from relaygraph.policies import AgentPolicy

    roster = {
        name: AgentPolicy(tools=tools, handoffs=tuple(n for n in agents if n != name))
        for name, tools in agents.items()
    }
    return parse_policy(data, roster=roster, source="team")


# -- meet and loosenings, pure ------------------------------------------------------------------

OPS = {
    "team": {"max_seconds": 20, "max_agent_runs": 6, "on_exhausted": "fail"},
    "ping_pong": {"max_bounces": 1, "on_detect": "human"},
    "agents": {
        "coder": {
            "max_tool_calls": 3,
            "tools": ["write_file", "read_file"],
            "approval": ["write_file"],
        },
        "researcher": {"max_model_calls": 4},
    },
    "prices": {"gpt-4o": {"input": 2.5, "output": 10}},
}


def test_meet_takes_the_tighter_of_each_key() -> None:
    ceiling = ceiling_of(OPS)
    loose = team_policy(
        {"coder": ("run_python", "write_file", "word_count"), "helper": ("read_file",)},
        {
            "team": {"max_seconds": 1e9, "max_agent_runs": 50, "max_cost_usd": 1e9},
            "ping_pong": {"max_bounces": 9, "on_detect": "supervisor"},
            "agents": {
                "coder": {"max_tool_calls": 1_000_000, "max_model_calls": 2},
                "helper": {"max_tool_calls": 500, "max_model_calls": 100},
            },
            "prices": {"gpt-4o": {"input": 0, "output": 0}, "own-model": {"input": 1, "output": 1}},
        },
    )
    met = meet(loose, ceiling)
    assert met.team.max_seconds == 20 and met.team.max_agent_runs == 6
    # The default team cost budget is the ceiling's: 1e9 is no budget at all.
    assert met.team.max_cost_usd == ceiling.policy.team.max_cost_usd
    assert met.team.on_exhausted == "fail"
    assert (met.ping_pong.max_bounces, met.ping_pong.on_detect) == (1, "human")
    coder = met.agents["coder"]
    # The same name: the operator's coder's limits; its own tighter limit stays.
    assert coder.limits.max_tool_calls == 3 and coder.limits.max_model_calls == 2
    # A built-in tool the operator's coder may not use is taken away; a tool of the team's
    # own (word_count) is the team's to give; the operator's approval is added.
    assert coder.tools == ("write_file", "word_count")
    assert coder.approval == ("write_file",)
    # An agent the operator's policy does not name gets the tightest limit of any of its
    # agents: a new name lifts nothing.
    helper = met.agents["helper"]
    assert helper.limits.max_tool_calls == 3 and helper.limits.max_model_calls == 4
    # No team prices a model below the operator; its own models keep their prices.
    assert met.prices["gpt-4o"].input == 2.5 and met.prices["own-model"].input == 1
    assert met.source == "team under ops.toml"
    assert loosenings(met, ceiling, whose="the operator's") == []


def test_loosenings_name_each_key_and_both_values() -> None:
    ceiling = ceiling_of(OPS)
    loose = team_policy(
        {"coder": ("run_python", "write_file")},
        {
            "team": {"max_seconds": 1e9},
            "agents": {"coder": {"max_tool_calls": 1_000_000, "max_seconds": None}},
            "prices": {"gpt-4o": {"input": 0, "output": 0}},
        },
    )
    found = {item.key: str(item) for item in loosenings(loose, ceiling, whose="the operator's")}
    assert found["team.max_seconds"] == "team.max_seconds = 1000000000 is above the operator's 20"
    assert found["agents.coder.max_tool_calls"] == (
        "agents.coder.max_tool_calls = 1000000 is above the operator's 3"
    )
    assert "adds ['run_python']" in found["agents.coder.tools"]
    assert "drops ['write_file']" in found["agents.coder.approval"]
    assert "is below the operator's (input 2.5, output 10" in found["prices.gpt-4o"]
    # A default counts as well (12 agent runs by default, above the operator's 6): what the
    # service refuses at registration is only what a definition writes (see below).
    assert found["team.max_agent_runs"] == "team.max_agent_runs = 12 is above the operator's 6"


def test_a_policy_within_the_ceiling_is_met_unchanged() -> None:
    ceiling = ceiling_of({"team": {"max_seconds": 20}})
    policy = builtin_policy({"team": {"max_seconds": 10}}, source="request")
    assert loosenings(policy, ceiling, whose="the operator's") == []
    assert meet(policy, ceiling) is policy


limits = st.one_of(st.none(), st.integers(min_value=1, max_value=50))
modes = st.sampled_from(["finalize", "fail"])
detects = st.sampled_from(["supervisor", "finalize", "human"])


@st.composite
def builtin_policies(draw: st.DrawFn) -> TeamPolicy:
    agents: dict[str, Any] = {}
    for name, agent in BUILTIN.roster.items():
        tools = draw(st.lists(st.sampled_from(agent.tools), unique=True))
        agents[name] = {
            "tools": tools,
            "approval": draw(st.lists(st.sampled_from(tools), unique=True)) if tools else [],
            "max_tool_calls": draw(limits),
            "max_seconds": draw(limits),
        }
    return builtin_policy(
        {
            "team": {
                "max_agent_runs": draw(st.integers(1, 30)),
                "max_seconds": draw(st.integers(1, 600)),
                "on_exhausted": draw(modes),
            },
            "ping_pong": {"max_bounces": draw(st.integers(1, 5)), "on_detect": draw(detects)},
            "agents": agents,
        }
    )


@settings(max_examples=60, deadline=None)
@given(builtin_policies(), builtin_policies())
def test_meet_is_within_both_and_only_loosenings_change_a_policy(
    policy: TeamPolicy, top: TeamPolicy
) -> None:
    ceiling = policy_ceiling(top, roster=BUILTIN.roster)
    met = meet(policy, ceiling)
    # Within the ceiling, and within the policy itself (its own ceiling).
    assert loosenings(met, ceiling, whose="x") == []
    assert loosenings(met, policy_ceiling(policy, roster=BUILTIN.roster), whose="x") == []
    # A policy the ceiling finds nothing to object to is left as it is.
    if not loosenings(policy, ceiling, whose="x"):
        assert met is policy
    # The met policy is a policy like any: a task records it, and its run reads it back.
    assert stored_policy(policy_to_mapping(met), source="t").agents.keys() == met.agents.keys()


# -- through the service -------------------------------------------------------------------------

LOOSE_OPS = """\
[team]
max_agent_runs = 30
[agents.coder]
max_tool_calls = 60
max_model_calls = 60
"""
TIGHT_OPS = """\
[team]
max_agent_runs = 1
[agents.coder]
max_tool_calls = 3
"""
GREEDY_TEAM = """\
[agents.coder]
description = "writes files"
prompt = "You write files."
tools = ["write_file"]

[policy.team]
max_agent_runs = 20

[policy.agents.coder]
max_tool_calls = 50
max_model_calls = 50
"""
FILES = "abcdef"
GREEDY_SCRIPT = {
    "supervisor": [
        route("coder", task="write six files"),
        route("coder", task="again"),
        route("FINISH"),
    ],
    "coder": [
        *(call("write_file", path=f"{name}.txt", content=name) for name in FILES),
        say("six files written"),
        say("nothing more"),
    ],
    "finalize": [say("done")],
}


@pytest.fixture
def ops(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name, text in (("loose", LOOSE_OPS), ("tight", TIGHT_OPS)):
        files[name] = tmp_path / f"{name}.toml"
        files[name].write_text(text, encoding="utf-8")
    (tmp_path / "scripts").mkdir(exist_ok=True)
    (tmp_path / "scripts" / "greedy.json").write_text(json.dumps(GREEDY_SCRIPT), encoding="utf-8")
    return files


def written(home: Path, task_id: str) -> set[str]:
    folder = home / "tasks" / task_id / "workspace"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


async def test_a_team_that_loosens_the_operators_policy_is_refused(
    home: Path, tmp_path: Path, ops: dict[str, Path]
) -> None:
    async with serving(home, tmp_path / "scripts", policy_file=ops["tight"]) as api:
        key = api.key("greedy")
        refused = await api.push(key, "greedy", toml=GREEDY_TEAM)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"]) == ("policy_loosens", "toml.policy")
        message = error["message"]
        assert "team.max_agent_runs = 20 is above the operator's 1" in message
        assert "agents.coder.max_tool_calls = 50 is above the operator's 3" in message
        assert str(ops["tight"]) in message
        # The same definition sent as JSON is refused the same way.
        import tomllib

        as_json = await api.push(key, "greedy", definition=tomllib.loads(GREEDY_TEAM))
        assert as_json.status_code == 422 and as_json.json()["error"]["field"] == (
            "definition.policy"
        )
        # A team that leaves its limits to the defaults is taken, and capped when it runs.
        plain = GREEDY_TEAM.split("[policy.team]")[0]
        assert (await api.push(key, "plain", toml=plain)).status_code == 201


async def test_a_ceiling_tightened_later_holds_for_teams_registered_before(
    home: Path, tmp_path: Path, ops: dict[str, Path]
) -> None:
    scripts = tmp_path / "scripts"
    async with serving(home, scripts, policy_file=ops["loose"]) as api:
        key = api.key("greedy")
        pushed = await api.push(key, "greedy", toml=GREEDY_TEAM)
        assert pushed.status_code == 201, pushed.text
        # Under the ceiling it was registered under, the team does all it asks.
        made = await api.submit(key, input="go", team="greedy", model="scripted:greedy.json")
        loose = await api.wait(made.json()["id"], key, FINISHED)
        assert loose["status"] == "succeeded", loose
        assert written(home, loose["id"]) == {f"{n}.txt" for n in FILES}

    # The operator restarts the server with a tighter --policy.
    async with serving(home, scripts, policy_file=ops["tight"]) as api:
        made = await api.submit(key, input="go", team="greedy", model="scripted:greedy.json")
        assert made.status_code == 202, made.text
        task = await api.wait(made.json()["id"], key, FINISHED)
        # It stopped at the operator's caps: 3 tool calls, 1 agent run; not `succeeded`.
        assert written(home, task["id"]) == {"a.txt", "b.txt", "c.txt"}
        assert task["status"] == "degraded", task
        with Ledger(api.ledger_url) as ledger:
            project = ledger.authenticate(key)
            assert project is not None
            stored = ledger.get_task(task["id"], project_id=project.id)
        assert stored is not None and stored.policy is not None
        assert stored.policy["team"]["max_agent_runs"] == 1
        assert stored.policy["agents"]["coder"]["max_tool_calls"] == 3
        assert stored.metadata["policy_source"].endswith(f"under {str(ops['tight'])!r}")
        # A request may tighten the capped policy further, never back up to the team's own.
        again = await api.submit(
            key,
            input="go",
            team="greedy",
            model="scripted:greedy.json",
            policy={"agents": {"coder": {"max_tool_calls": 10}}},
        )
        assert again.status_code == 422 and again.json()["error"]["code"] == "policy_loosens"


async def test_a_task_queued_under_a_looser_ceiling_runs_under_the_tighter(
    home: Path, tmp_path: Path, ops: dict[str, Path]
) -> None:
    """The ceiling is applied where a run resolves its policy (as a worker does, through
    ``ServiceTeams.policy_for``), not only when a task is submitted: a task recorded with
    the team's own policy before the restart still stops at the new caps."""
    scripts = tmp_path / "scripts"
    async with serving(home, scripts, policy_file=ops["loose"]) as api:
        key = api.key("greedy")
        assert (await api.push(key, "greedy", toml=GREEDY_TEAM)).status_code == 201
        registry = api.app.state.teams
    with Ledger(api.ledger_url) as ledger:
        project = ledger.authenticate(key)
        assert project is not None
        found = ledger.team_version(project.id, "greedy")
        assert found is not None
        team = registry.build("greedy", found.definition, project_id=project.id)
        # Recorded queued under the team's own policy, as a server that stopped before a
        # worker was free leaves it.
        queued = submit_task(
            TaskRequest(
                input="go",
                team=team,
                team_version=found.version,
                trust_team=False,
                policy=team.resolved_policy,
                project_id=project.id,
                model=f"scripted:{scripts / 'greedy.json'}",
            ),
            Intake(ledger=ledger),
        ).task
    assert queued.status == "queued" and queued.policy is not None
    assert queued.policy["agents"]["coder"]["max_tool_calls"] == 50

    async with serving(home, scripts, policy_file=ops["tight"]) as api:
        task = await api.wait(queued.id, key, FINISHED)
        assert written(home, task["id"]) == {"a.txt", "b.txt", "c.txt"}
        assert task["status"] == "degraded", task


def test_a_worker_resolves_the_same_ceiling(home: Path, ops: dict[str, Path]) -> None:
    """A worker's ``ServiceTeams`` (worker/_runtime.py) caps a task's recorded policy as the
    server's does; the server's own team files keep the policy the operator wrote."""
    teams = ServiceTeams(
        ledger=lambda: None,  # type: ignore[arg-type, return-value]
        settings=RunnerSettings(policy_file=ops["tight"], home=home),
        home=home,
    )
    team = parse_team(json_toml(GREEDY_TEAM), base=home)
    recorded = team.resolved_policy

    registered = type("Task", (), {"team": {"name": "greedy", "version": 1}})()
    capped = teams.policy_for(registered, recorded)
    assert capped.agents["coder"].limits.max_tool_calls == 3
    assert capped.team.max_agent_runs == 1
    builtin = type("Task", (), {"team": {"name": "default", "version": None}})()
    assert teams.policy_for(builtin, teams.ceiling.policy) is teams.ceiling.policy


def json_toml(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)
