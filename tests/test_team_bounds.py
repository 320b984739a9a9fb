"""A project's team definition has bounds (agents, tools per agent, nesting), each a setting;
past one, ``PUT /v1/teams`` answers 422 naming the bound and the value, never 500. Building
a team costs time linear in its size."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from relaygraph.runner import RunnerSettings
from relaygraph.team import TeamBounds, TeamFileError, check_bounds, parse_team, read_toml
from relaygraph.team._bounds import nesting_depth

from .test_registered_teams import serving

BOUNDS = TeamBounds(max_agents=32, max_tools_per_agent=64, max_depth=8)


def agents(count: int, **table: Any) -> dict[str, Any]:
    return {
        f"a{i}": {"description": f"agent {i}", "prompt": "You help.", **table} for i in range(count)
    }


def test_the_settings_defaults_are_the_documented_bounds() -> None:
    settings = RunnerSettings()
    assert (
        settings.team_max_agents,
        settings.team_max_tools_per_agent,
        settings.team_max_depth,
    ) == (32, 64, 8)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "teams.md").read_text("utf-8")
    for name, value in (
        ("RELAYGRAPH_TEAM_MAX_AGENTS", 32),
        ("RELAYGRAPH_TEAM_MAX_TOOLS_PER_AGENT", 64),
        ("RELAYGRAPH_TEAM_MAX_DEPTH", 8),
    ):
        assert f"`{name}` | {value} |" in docs, name


def test_nesting_depth_counts_levels_without_recursion() -> None:
    assert nesting_depth("x") == 0
    assert nesting_depth({"a": [1]}) == 2
    deep: Any = 1
    for _ in range(100_000):  # Far past the interpreter's recursion limit.
        deep = [deep]
    assert nesting_depth(deep) == 100_000
    assert nesting_depth(deep, stop_past=8) == 9


def test_a_team_file_within_the_bounds_passes() -> None:
    data = {
        "agents": agents(32, tools=["read_doc"]),
        "policy": {"agents": {"a0": {"tools": ["read_doc"], "approval": ["read_doc"]}}},
    }
    check_bounds(data, BOUNDS, field="definition")
    assert nesting_depth(data) == 5


@pytest.mark.parametrize(
    ("data", "bound", "key"),
    [
        ({"agents": agents(33)}, "the team has 33 agents; the bound is 32", "agents"),
        (
            {"agents": agents(1, tools=[f"t{i}" for i in range(65)])},
            "agent 'a0' has 65 tools; the bound is 64 per agent",
            "tools",
        ),
        (
            {"agents": agents(1), "policy": {"x": [[[[[[[[1]]]]]]]]}},
            "nests tables and arrays 9 levels deep (or more); the bound is 8",
            None,
        ),
    ],
)
def test_a_definition_past_a_bound_is_refused_naming_it(
    data: dict[str, Any], bound: str, key: str | None
) -> None:
    with pytest.raises(TeamFileError, match=re.escape(bound)) as refused:
        check_bounds(data, BOUNDS, field="definition")
    assert refused.value.key == key


def test_toml_too_deep_for_the_parser_is_refused_not_raised() -> None:
    text = "x = " + "[" * 500 + "]" * 500
    with pytest.raises(TeamFileError, match=r"the bound is 8 levels \(RELAYGRAPH_TEAM_MAX_DEPTH\)"):
        read_toml(text, bounds=BOUNDS)
    with pytest.raises(TeamFileError, match=r"9 levels deep \(or more\)"):
        read_toml("x = " + "[" * 19 + "]" * 19, bounds=BOUNDS)


def test_building_a_team_makes_its_roster_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of building a team grows with its size, not faster: its roster (each agent's
    tools and peers) is made once, where the digest made it again for every agent (N^3 in
    all; 800 agents took 17 s of a server's CPU). Counted, not timed."""
    import relaygraph.team._team as team_module

    made: list[str] = []
    real = team_module.AgentPolicy

    def counting(**fields: Any) -> Any:
        made.append("x")
        return real(**fields)

    monkeypatch.setattr(team_module, "AgentPolicy", counting)
    for size in (8, 32):
        made.clear()
        team = parse_team({"agents": agents(size)}, base=Path("."))
        assert team.digest.startswith("sha256:")
        assert len(made) == size, size


# -- through the service ----------------------------------------------------------------------


async def test_big_and_deep_definitions_are_422_naming_the_bound(
    home: Path, tmp_path: Path
) -> None:
    async with serving(home, tmp_path) as api:
        key = api.key("flood")

        async def refused(**body: Any) -> dict[str, Any]:
            answer = await api.push(key, "big", **body)
            assert answer.status_code == 422, answer.text
            return answer.json()["error"]  # type: ignore[no-any-return]

        # 800 agents (27 KB of TOML): refused before anything is built.
        toml = "".join(f'[agents.a{i}]\ndescription = "d"\nprompt = "p"\n' for i in range(800))
        error = await refused(toml=toml)
        assert error["code"] == "invalid_team" and error["field"] == "toml.agents"
        assert "800 agents; the bound is 32 (RELAYGRAPH_TEAM_MAX_AGENTS)" in error["message"]
        error = await refused(definition={"agents": agents(33)})
        assert error["field"] == "definition.agents" and "33 agents" in error["message"]
        # 500 nested TOML arrays (1 KB): the parser's recursion is no 500.
        error = await refused(toml="x = " + "[" * 500 + "]" * 500)
        assert error["field"] == "toml" and "RELAYGRAPH_TEAM_MAX_DEPTH" in error["message"]
        # Nested deep, within the parser's stack: tables in TOML, arrays in JSON.
        error = await refused(toml="[" + ".".join(["t"] * 12) + "]\nx = 1\n")
        assert "levels deep (or more); the bound is 8" in error["message"]
        nested: Any = [1]
        for _ in range(12):
            nested = [nested]
        error = await refused(definition={"agents": agents(1), "policy": {"x": nested}})
        assert error["field"] == "definition"
        assert "the bound is 8 (RELAYGRAPH_TEAM_MAX_DEPTH)" in error["message"]
        # Too many tools for one agent, listed.
        tools = [f"rg_review_tools:t{i}" for i in range(65)]
        error = await refused(definition={"agents": agents(1, tools=tools)})
        assert error["field"] == "definition.agents.a0.tools"
        assert "65 tools; the bound is 64" in error["message"]
        # At the bound, the team is taken.
        taken = await api.push(key, "big", definition={"agents": agents(32)})
        assert taken.status_code == 201, taken.text


async def test_the_bounds_are_the_operators_settings(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGRAPH_TEAM_MAX_AGENTS", "2")
    async with serving(home, tmp_path) as api:
        key = api.key("small")
        answer = await api.push(key, "three", definition={"agents": agents(3)})
        assert answer.status_code == 422
        assert "3 agents; the bound is 2" in answer.json()["error"]["message"]
        assert (await api.push(key, "two", definition={"agents": agents(2)})).status_code == 201
