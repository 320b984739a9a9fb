"""The policy file loader: the documented example parses field by field, defaults are safe,
and every mistake is refused before anything runs with a message naming the key and value."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.policies import (
    LIMIT_NAMES,
    AgentLimits,
    AgentPolicy,
    PingPongPolicy,
    Price,
    TeamLimits,
    TeamPolicy,
)
from relaygraph.team import default_team
from tests.builtin_team import default_policy, load_policy, parse_policy

DEFAULT_TOOLS = {name: entry.tools for name, entry in default_team().roster.items()}

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "policies"
DOCS = REPO / "docs" / "policies.md"

ISSUE_EXAMPLE = """
[team]
max_agent_runs = 12        # agent visits, whether routed by the supervisor or handed off directly
max_tokens = 200000        # input + output, all agents and the supervisor
max_cost_usd = 1.00
max_seconds = 300
on_exhausted = "finalize"  # "finalize": answer from what exists, status "degraded" | "fail"

[ping_pong]
max_bounces = 2            # the same pair of agents passing work back and forth more than this
on_detect = "finalize"     # "finalize" | "supervisor" (tell it, and bar that pair) | "human"

[agents.researcher]
tools = ["search_docs", "read_doc"]
handoffs = ["writer"]      # peers it may hand work to directly
max_model_calls = 6
max_tool_calls = 10
max_tokens = 40000
max_cost_usd = 0.20
max_seconds = 60

[agents.coder]
tools = ["run_python", "write_file", "read_file"]
approval = ["run_python"]  # tools that wait for a person's approval before they run

[prices."gpt-4o-mini"]     # USD per million tokens, for cost budgets
input = 0.15
output = 0.60
"""

TEAM_LIMITS = ("max_agent_runs", "max_tokens", "max_cost_usd", "max_seconds")


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(text: str) -> str:
    """The message of the ConfigError that parsing ``text`` raises."""
    with pytest.raises(ConfigError) as info:
        parse_policy(tomllib.loads(text), source="'p.toml'")
    message = str(info.value)
    assert message.startswith("policy 'p.toml': "), message
    return message


# --- what a good file gives ------------------------------------------------------------


def test_issue_example_parses_to_every_expected_value(tmp_path: Path) -> None:
    path = write(tmp_path, ISSUE_EXAMPLE)
    policy = load_policy(path)

    assert isinstance(policy, TeamPolicy)
    assert policy.source == repr(str(path))
    assert policy.team == TeamLimits(
        max_agent_runs=12,
        max_tokens=200_000,
        max_cost_usd=1.0,
        max_seconds=300.0,
        on_exhausted="finalize",
    )
    assert policy.ping_pong == PingPongPolicy(max_bounces=2, on_detect="finalize")
    assert list(policy.agents) == ["researcher", "coder", "writer"]
    assert policy.agents["researcher"] == AgentPolicy(
        tools=("search_docs", "read_doc"),
        handoffs=("writer",),
        approval=(),
        limits=AgentLimits(
            max_model_calls=6,
            max_tool_calls=10,
            max_tokens=40_000,
            max_cost_usd=0.20,
            max_seconds=60.0,
        ),
    )
    # Keys the coder's section leaves out take the defaults.
    assert policy.agents["coder"] == AgentPolicy(
        tools=("run_python", "write_file", "read_file"),
        handoffs=("researcher", "writer"),
        approval=("run_python",),
        limits=AgentLimits(),
    )
    assert policy.agents["coder"].limits == AgentLimits(
        max_model_calls=10,
        max_tool_calls=20,
        max_tokens=None,
        max_cost_usd=None,
        max_seconds=None,
    )
    # The writer is not named at all.
    assert policy.agents["writer"] == default_policy().agents["writer"]
    assert dict(policy.prices) == {"gpt-4o-mini": Price(input=0.15, output=0.60)}
    assert policy.price_of("gpt-4o-mini") == Price(input=0.15, output=0.60)
    assert policy.price_of("openai:gpt-4o-mini") == Price(input=0.15, output=0.60)
    assert policy.price_of("gpt-4o") is None
    assert policy.agent("coder") is policy.agents["coder"]


def test_values_are_frozen_and_of_the_declared_types(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, ISSUE_EXAMPLE))
    assert isinstance(policy.agents, MappingProxyType)
    assert isinstance(policy.prices, MappingProxyType)
    assert isinstance(policy.agents["researcher"].tools, tuple)
    assert isinstance(policy.agents["researcher"].handoffs, tuple)
    assert isinstance(policy.agents["coder"].approval, tuple)
    # Integers written for float keys become floats; integer keys stay integers.
    assert type(policy.team.max_seconds) is float
    assert type(policy.agents["researcher"].limits.max_seconds) is float
    assert type(policy.team.max_tokens) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.team.max_tokens = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.agents["writer"] = policy.agents["coder"]  # type: ignore[index]


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, ""))
    assert dataclasses.replace(policy, source=None) == default_policy()
    assert policy.team == TeamLimits()
    assert policy.team.max_agent_runs == 12
    assert policy.team.max_tokens == 200_000
    assert policy.team.max_cost_usd == 1.0
    assert policy.team.max_seconds == 300
    assert policy.team.on_exhausted == "finalize"
    assert policy.ping_pong == PingPongPolicy(max_bounces=2, on_detect="finalize")
    assert dict(policy.prices) == {}
    for name, tools in DEFAULT_TOOLS.items():
        agent = policy.agents[name]
        assert agent.tools == tools
        assert agent.approval == ()
        assert agent.limits == AgentLimits(max_model_calls=10, max_tool_calls=20)


def test_empty_sections_give_the_defaults() -> None:
    data = tomllib.loads("[team]\n[ping_pong]\n[agents.coder]\n[prices]\n")
    policy = parse_policy(data)
    assert dataclasses.replace(policy, source=None) == default_policy()
    assert policy.source == "<policy>"


def test_defaults_have_concrete_limits_not_placeholders() -> None:
    # Every default is a real number (or None for "no limit"), never a descriptor or object.
    policy = parse_policy({})
    for value in dataclasses.astuple(policy.team)[:4]:
        assert type(value) in (int, float)
    for agent in policy.agents.values():
        for value in dataclasses.astuple(agent.limits):
            assert value is None or type(value) in (int, float)


def test_agents_not_named_keep_their_default_tools_and_peers() -> None:
    policy = parse_policy(tomllib.loads('[agents.researcher]\ntools = ["read_doc"]\n'))
    assert policy.agents["researcher"].tools == ("read_doc",)
    assert policy.agents["researcher"].handoffs == ("coder", "writer")
    assert policy.agents["coder"].tools == DEFAULT_TOOLS["coder"]
    assert policy.agents["coder"].handoffs == ("researcher", "writer")
    assert policy.agents["writer"].tools == DEFAULT_TOOLS["writer"]
    # The built-in writer is the last stage: it hands off to no peer.
    assert policy.agents["writer"].handoffs == ()


def test_a_team_of_some_agents_hands_off_only_within_the_team() -> None:
    from relaygraph.agents import builtin
    from relaygraph.policies import parse_policy as parse_over
    from relaygraph.team import Team

    two = Team(agents=[builtin.researcher(), builtin.writer()]).roster
    policy = parse_over({}, roster=two)
    assert list(policy.agents) == ["researcher", "writer"]
    assert policy.agents["researcher"].handoffs == ("writer",)
    assert policy.agents["writer"].handoffs == ()
    # An agent whose handoffs are not given hands off to every other agent of its team.
    back = Team(agents=[builtin.researcher(), builtin.writer(handoffs=None)]).roster
    assert parse_over({}, roster=back).agents["writer"].handoffs == ("researcher",)
    with pytest.raises(ConfigError) as refused:
        parse_over({"agents": {"researcher": {"handoffs": ["coder"]}}}, roster=two)
    assert "agents.researcher.handoffs" in str(refused.value) and '"coder"' in str(refused.value)
    with pytest.raises(ConfigError, match=r'agents\.coder: unknown agent "coder"'):
        parse_over({"agents": {"coder": {}}}, roster=two)


def test_a_policy_may_give_an_agent_any_tool_of_its_team() -> None:
    from relaygraph.agents import Agent, builtin
    from relaygraph.policies import parse_policy as parse_over
    from relaygraph.team import Team

    def lint(code: str) -> str:
        """Lint Python code."""
        return "ok"

    linter = Agent(name="linter", description="lints", prompt="You lint.", tools=[lint])
    team = Team(agents=[builtin.coder(), linter])
    data = {"agents": {"coder": {"tools": ["lint"]}}}
    policy = parse_over(data, roster=team.roster)
    assert policy.agents["coder"].tools == ("lint",)
    message = refused_with(data)  # The built-in team has no tool "lint".
    assert 'agents.coder.tools: unknown tool "lint"' in message


def test_empty_lists_are_allowed_no_tools_and_no_handoffs() -> None:
    policy = parse_policy(tomllib.loads("[agents.writer]\ntools = []\nhandoffs = []\n"))
    assert policy.agents["writer"].tools == ()
    assert policy.agents["writer"].handoffs == ()


def test_repeated_names_in_a_list_count_once() -> None:
    text = '[agents.coder]\ntools = ["read_file", "read_file"]\nhandoffs = ["writer", "writer"]\n'
    policy = parse_policy(tomllib.loads(text))
    assert policy.agents["coder"].tools == ("read_file",)
    assert policy.agents["coder"].handoffs == ("writer",)


@pytest.mark.parametrize(
    ("text", "get", "expected"),
    [
        ("[team]\nmax_cost_usd = 1", lambda p: p.team.max_cost_usd, 1.0),
        ("[team]\nmax_seconds = 300", lambda p: p.team.max_seconds, 300.0),
        ("[agents.coder]\nmax_cost_usd = 2", lambda p: p.agents["coder"].limits.max_cost_usd, 2.0),
        ("[agents.coder]\nmax_seconds = 9", lambda p: p.agents["coder"].limits.max_seconds, 9.0),
        ('[prices."m"]\ninput = 1\noutput = 0', lambda p: p.prices["m"], Price(input=1, output=0)),
    ],
)
def test_integers_are_accepted_for_float_keys(text: str, get: object, expected: object) -> None:
    policy = parse_policy(tomllib.loads(text))
    value = get(policy)  # type: ignore[operator]
    assert value == expected
    if isinstance(value, Price):
        assert type(value.input) is float and type(value.output) is float
    else:
        assert type(value) is float


@pytest.mark.parametrize("on_exhausted", ["finalize", "fail"])
def test_every_on_exhausted_value_is_accepted(on_exhausted: str) -> None:
    policy = parse_policy({"team": {"on_exhausted": on_exhausted}})
    assert policy.team.on_exhausted == on_exhausted


@pytest.mark.parametrize("on_detect", ["finalize", "supervisor", "human"])
def test_every_on_detect_value_is_accepted(on_detect: str) -> None:
    policy = parse_policy({"ping_pong": {"on_detect": on_detect}})
    assert policy.ping_pong.on_detect == on_detect


def test_a_free_model_may_have_a_zero_price() -> None:
    policy = parse_policy({"prices": {"local:smollm2": {"input": 0, "output": 0.0}}})
    assert policy.price_of("local:smollm2") == Price(input=0.0, output=0.0)


def test_recursion_limit_follows_max_agent_runs() -> None:
    policy = parse_policy({"team": {"max_agent_runs": 3}})
    assert policy.max_agent_runs == 3
    assert policy.recursion_limit > 2 * 3


def test_a_tilde_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "[team]\nmax_agent_runs = 4\n")
    assert load_policy("~/p.toml").team.max_agent_runs == 4


# --- what a wrong file gives -----------------------------------------------------------


def refused_with(data: Mapping[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_policy(data, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("budget = 5", "budget = 5: unknown key (known keys here: team, ping_pong, agents,"),
        (
            "[team]\nmax_runs = 3",
            "team.max_runs = 3: unknown key (known keys here: max_agent_runs,",
        ),
        ('[ping_pong]\nbounces = "x"', 'ping_pong.bounces = "x": unknown key (known keys here:'),
        (
            "[agents.coder]\nmax_calls = 4",
            "agents.coder.max_calls = 4: unknown key (known keys here: tools, handoffs,",
        ),
        (
            '[prices."gpt-4o-mini"]\ninput = 1\noutput = 2\ncached = 0.5',
            "prices.gpt-4o-mini.cached = 0.5: unknown key (known keys here: input, output)",
        ),
        ("[team.limits]\nmax = 1", "team.limits = {max = 1}: unknown key"),
    ],
)
def test_unknown_keys_are_refused_naming_key_and_value(text: str, expected: str) -> None:
    assert expected in refused(text)


def test_unknown_agent_is_refused() -> None:
    message = refused('[agents.reviewer]\ntools = ["read_doc"]')
    assert 'agents.reviewer: unknown agent "reviewer" (known: researcher, coder, writer)' in message


def test_unknown_tool_is_refused() -> None:
    message = refused('[agents.researcher]\ntools = ["search_docs", "web_search"]')
    assert 'agents.researcher.tools: unknown tool "web_search"' in message
    assert "search_docs" in message  # the known tools are listed


def test_handoff_to_unknown_agent_is_refused() -> None:
    message = refused('[agents.researcher]\nhandoffs = ["reviewer"]')
    assert 'agents.researcher.handoffs: unknown agent "reviewer"' in message
    assert "peers: coder, writer" in message


def test_handoff_to_itself_is_refused() -> None:
    message = refused('[agents.writer]\nhandoffs = ["writer"]')
    assert 'agents.writer.handoffs: "writer" cannot hand off to itself' in message


def test_approval_of_a_tool_the_agent_does_not_have_is_refused() -> None:
    message = refused('[agents.researcher]\napproval = ["run_python"]')
    assert 'agents.researcher.approval: "run_python" is not among researcher\'s tools' in message
    assert "search_docs, read_doc" in message
    # The agent's own narrowed tool list counts, not its defaults.
    message = refused('[agents.coder]\ntools = ["read_file"]\napproval = ["run_python"]')
    assert 'agents.coder.approval: "run_python" is not among coder\'s tools (read_file)' in message
    message = refused('[agents.coder]\ntools = []\napproval = ["run_python"]')
    assert "not among coder's tools (none)" in message


def agent_limit_cases() -> list[object]:
    return [
        pytest.param(f"agents.coder.{key}", value, id=f"agents.coder.{key}={value}")
        for key in LIMIT_NAMES
        for value in (0, -1)
    ]


def team_limit_cases() -> list[object]:
    keys = [f"team.{key}" for key in TEAM_LIMITS] + ["ping_pong.max_bounces"]
    return [pytest.param(key, value, id=f"{key}={value}") for key in keys for value in (0, -3)]


@pytest.mark.parametrize(("key", "value"), team_limit_cases() + agent_limit_cases())
def test_zero_and_negative_limits_are_refused(key: str, value: int) -> None:
    *tables, name = key.split(".")
    text = f"[{'.'.join(tables)}]\n{name} = {value}\n"
    message = refused(text)
    assert f"{key} = {value}: Input should be greater than 0" in message


@pytest.mark.parametrize("key", ["max_cost_usd", "max_seconds"])
def test_zero_and_negative_float_limits_are_refused(key: str) -> None:
    assert f"team.{key} = 0.0: Input should be greater than 0" in refused(f"[team]\n{key} = 0.0")
    message = refused(f"[agents.writer]\n{key} = -0.5")
    assert f"agents.writer.{key} = -0.5: Input should be greater than 0" in message


def test_every_limit_name_is_a_key_of_an_agent_section() -> None:
    # The parametrized cases above cover every agent limit the policy has.
    assert set(LIMIT_NAMES) == {f.name for f in dataclasses.fields(AgentLimits)}
    assert set(TEAM_LIMITS) | {"on_exhausted"} == {f.name for f in dataclasses.fields(TeamLimits)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[team]\nmax_tokens = "5"', 'team.max_tokens = "5": Input should be a valid integer'),
        (
            '[team]\nmax_cost_usd = "cheap"',
            'team.max_cost_usd = "cheap": Input should be a valid number',
        ),
        ("[team]\nmax_agent_runs = true", "team.max_agent_runs = true: Input should be a valid"),
        ("[team]\nmax_seconds = false", "team.max_seconds = false: Input should be a valid number"),
        ("[team]\nmax_agent_runs = 2.5", "team.max_agent_runs = 2.5: Input should be a valid"),
        ("[team]\nmax_tokens = 1000.0", "team.max_tokens = 1000.0: Input should be a valid"),
        ('[ping_pong]\nmax_bounces = "2"', 'ping_pong.max_bounces = "2": Input should be a valid'),
        ("[agents.coder]\nmax_tool_calls = true", "agents.coder.max_tool_calls = true: Input"),
        ('[agents.coder]\nmax_seconds = "60"', 'agents.coder.max_seconds = "60": Input should'),
        ("[agents.coder]\ntools = 5", "agents.coder.tools = 5: Input should be a valid list"),
        (
            '[agents.coder]\ntools = "run_python"',
            'agents.coder.tools = "run_python": Input should be a valid list',
        ),
        ("[agents.coder]\nhandoffs = 1", "agents.coder.handoffs = 1: Input should be a valid list"),
        (
            "[agents.coder]\napproval = true",
            "agents.coder.approval = true: Input should be a valid",
        ),
        ('[agents.coder]\ntools = ["read_file", 3]', "agents.coder.tools.1 = 3: Input should be a"),
        ('[prices."m"]\ninput = "0.15"\noutput = 1', 'prices.m.input = "0.15": Input should be a'),
        ("[team]\non_exhausted = 1", "team.on_exhausted = 1: Input should be 'finalize' or 'fail'"),
    ],
)
def test_wrong_types_are_refused_naming_key_and_value(text: str, expected: str) -> None:
    assert expected in refused(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team = 5", "team = 5: should be a table"),
        ('ping_pong = "off"', 'ping_pong = "off": should be a table'),
        ("agents = [1]", "agents = [1]: should be a table"),
        ("[agents]\ncoder = 5", "agents.coder = 5: should be a table"),
        ('[prices]\n"gpt-4o-mini" = 0.15', "prices.gpt-4o-mini = 0.15: should be a table"),
    ],
)
def test_a_value_where_a_table_belongs_is_refused(text: str, expected: str) -> None:
    message = refused(text)
    assert expected in message
    assert "_Agent" not in message and "_Team" not in message  # no internal class names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[team]\non_exhausted = "degrade"',
            "team.on_exhausted = \"degrade\": Input should be 'finalize' or 'fail'",
        ),
        (
            '[ping_pong]\non_detect = "ignore"',
            "ping_pong.on_detect = \"ignore\": Input should be 'finalize', 'supervisor' or 'human'",
        ),
        ('[team]\non_exhausted = "FINALIZE"', 'team.on_exhausted = "FINALIZE": Input should be'),
    ],
)
def test_bad_enum_values_are_refused(text: str, expected: str) -> None:
    assert expected in refused(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[prices."m"]\ninput = -0.15\noutput = 0.6', "prices.m.input = -0.15: Input should be"),
        ('[prices."m"]\ninput = 0.15\noutput = -1', "prices.m.output = -1: Input should be"),
    ],
)
def test_negative_price_is_refused(text: str, expected: str) -> None:
    message = refused(text)
    assert expected in message
    assert "greater than or equal to 0" in message


def test_price_without_output_is_refused() -> None:
    message = refused('[prices."gpt-4o-mini"]\ninput = 0.15')
    assert "prices.gpt-4o-mini.output: required key is missing" in message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[team]\nmax_seconds = inf", "team.max_seconds = inf"),
        ("[team]\nmax_cost_usd = nan", "team.max_cost_usd = nan"),
        ('[prices."m"]\ninput = inf\noutput = 0', "prices.m.input = inf"),
    ],
)
def test_infinite_and_nan_numbers_are_refused(text: str, key: str) -> None:
    message = refused(text)
    assert key in message
    assert "finite number" in message


def test_toml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[team]\nmax_tokens = 100\nmax_seconds = \n", name="broken.toml")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    message = str(info.value)
    assert str(path) in message
    assert "is not valid TOML" in message
    assert "line 3" in message


def test_duplicate_key_is_a_toml_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[team]\nmax_tokens = 1\nmax_tokens = 2\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_policy(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert str(info.value) == f"policy file {str(path)!r} does not exist"


def test_a_folder_is_not_a_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_policy(tmp_path)


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[team]\non_exhausted = "fin\xe9"\n')
    with pytest.raises(ConfigError, match="cannot be read"):
        load_policy(path)


def test_message_from_a_file_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[agents.coder]\nmax_tool_calls = 0\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert str(info.value) == (
        f"policy {str(path)!r}: agents.coder.max_tool_calls = 0: Input should be greater than 0"
    )


def test_several_problems_are_all_reported(tmp_path: Path) -> None:
    text = """
    colour = "blue"

    [team]
    max_tokens = 0
    on_exhausted = "explode"

    [ping_pong]
    max_bounces = "2"

    [agents.coder]
    max_tool_calls = -1
    tools = ["run_python", "launch_rockets"]
    approval = ["read_doc"]
    handoffs = ["coder", "reviewer"]

    [agents.reviewer]
    tools = ["read_doc"]

    [prices."gpt-4o-mini"]
    input = -1
    """
    with pytest.raises(ConfigError) as info:
        load_policy(write(tmp_path, text))
    message = str(info.value)
    for expected in [
        'colour = "blue": unknown key',
        "team.max_tokens = 0: Input should be greater than 0",
        'team.on_exhausted = "explode": Input should be',
        'ping_pong.max_bounces = "2": Input should be a valid integer',
        "agents.coder.max_tool_calls = -1: Input should be greater than 0",
        'agents.coder.tools: unknown tool "launch_rockets"',
        'agents.coder.approval: "read_doc" is not among coder\'s tools',
        'agents.coder.handoffs: "coder" cannot hand off to itself',
        'agents.coder.handoffs: unknown agent "reviewer"',
        'agents.reviewer: unknown agent "reviewer"',
        "prices.gpt-4o-mini.input = -1: Input should be greater than or equal to 0",
        "prices.gpt-4o-mini.output: required key is missing",
    ]:
        assert expected in message, f"{expected!r} not in {message!r}"
    assert message.count("; ") == 11


def test_name_checks_do_not_crash_on_badly_typed_sections() -> None:
    # Validation reports the types; the name checks skip what they cannot read.
    message = refused_with({"agents": {"coder": {"tools": 5, "approval": ["run_python"]}}})
    assert "agents.coder.tools = 5: Input should be a valid list" in message
    assert "approval" not in message
    message = refused_with({"agents": {"coder": {"handoffs": [1, "writer"]}}})
    assert "agents.coder.handoffs.0 = 1: Input should be a valid string" in message


# --- the example files and the docs ----------------------------------------------------


@pytest.mark.parametrize("name", ["default.toml", "tight.toml"])
def test_example_policy_files_load(name: str) -> None:
    policy = load_policy(EXAMPLES / name)
    assert policy.source == repr(str(EXAMPLES / name))
    assert list(policy.agents) == list(DEFAULT_TOOLS)


def test_default_toml_equals_the_code_defaults() -> None:
    policy = load_policy(EXAMPLES / "default.toml")
    assert dataclasses.replace(policy, source=None) == default_policy()


def test_default_toml_shows_every_key() -> None:
    """Every key the loader accepts is written in default.toml (commented out when its
    default is "no limit"), so the documented defaults cannot drift from the code."""
    text = (EXAMPLES / "default.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    shown_team = set(data["team"])
    assert shown_team == {f.name for f in dataclasses.fields(TeamLimits)}
    assert set(data["ping_pong"]) == {f.name for f in dataclasses.fields(PingPongPolicy)}
    assert set(data["agents"]) == set(DEFAULT_TOOLS)
    agent_keys = {"tools", "handoffs", "approval", *LIMIT_NAMES}
    for name, section in data["agents"].items():
        unset = agent_keys - set(section)
        for key in unset:
            # Only limits without a default may be left out, and they are shown commented.
            assert getattr(AgentLimits(), key) is None, f"agents.{name}.{key}"
            assert re.search(rf"^# {key} = ", text, re.MULTILINE), key
    for key in ("[prices.", "input = ", "output = "):
        assert key in text


def test_tight_toml_is_tight() -> None:
    policy = load_policy(EXAMPLES / "tight.toml")
    default = default_policy()
    assert policy.team.max_agent_runs < default.team.max_agent_runs
    assert policy.team.max_tokens is not None and default.team.max_tokens is not None
    assert policy.team.max_tokens < default.team.max_tokens
    assert policy.team.max_cost_usd is not None and default.team.max_cost_usd is not None
    assert policy.team.max_cost_usd < default.team.max_cost_usd
    assert policy.agents["researcher"].handoffs == ("writer",)
    assert "run_python" in policy.agents["coder"].approval
    assert policy.price_of("gpt-4o-mini") == Price(input=0.15, output=0.60)
    for agent in policy.agents.values():
        for limit in LIMIT_NAMES:
            assert getattr(agent.limits, limit) is not None


def test_docs_name_every_key_and_default() -> None:
    text = DOCS.read_text(encoding="utf-8")
    keys = {f.name for f in dataclasses.fields(TeamLimits)}
    keys |= {f.name for f in dataclasses.fields(PingPongPolicy)}
    keys |= {"tools", "handoffs", "approval", "input", "output", *LIMIT_NAMES}
    for key in keys:
        assert f"`{key}`" in text, key
    for value in ('"finalize"', '"fail"', '"supervisor"', '"human"'):
        assert value in text, value
    # Defaults written in the docs' tables match the code.
    team, agent, ping = TeamLimits(), AgentLimits(), PingPongPolicy()
    for section, key, default in [
        ("team", "max_agent_runs", team.max_agent_runs),
        ("team", "max_tokens", team.max_tokens),
        ("team", "max_cost_usd", team.max_cost_usd),
        ("team", "max_seconds", team.max_seconds),
        ("ping_pong", "max_bounces", ping.max_bounces),
        ("agents.NAME", "max_model_calls", agent.max_model_calls),
        ("agents.NAME", "max_tool_calls", agent.max_tool_calls),
    ]:
        row = re.search(
            rf"^\| `\[{re.escape(section)}\]` \| `{key}` \|[^|]*\| `([^`]*)` \|", text, re.M
        )
        assert row, (section, key)
        assert float(row.group(1).replace("_", "")) == default, (section, key)


def test_a_tightening_policy_may_not_soften_what_happens_at_a_limit() -> None:
    from relaygraph.policies import tighten
    from tests.builtin_team import parse_policy

    base = parse_policy(
        {"team": {"on_exhausted": "fail"}, "ping_pong": {"on_detect": "human"}}, source="team"
    )
    with pytest.raises(ConfigError) as refused:
        tighten(base, {"ping_pong": {"on_detect": "finalize"}}, source="request")
    assert "ping_pong.on_detect = 'finalize' is less strict than the team's 'human'" in str(
        refused.value
    )
    with pytest.raises(
        ConfigError, match=re.escape("team.on_exhausted = 'finalize' is less strict")
    ):
        tighten(base, {"team": {"on_exhausted": "finalize"}}, source="request")
    # The same or a stricter choice is a tightening.
    mild = parse_policy({"ping_pong": {"on_detect": "supervisor"}}, source="team")
    assert tighten(mild, {"ping_pong": {"on_detect": "human"}}).ping_pong.on_detect == "human"
    assert tighten(base, {"team": {"on_exhausted": "fail"}}).team.on_exhausted == "fail"
