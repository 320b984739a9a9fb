"""Every mistake in a team file is a TeamFileError that says where it is as fields (the
table and the key), not only in its message: the HTTP API names the body field from them."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from relaygraph.errors import ConfigError
from relaygraph.team import TeamFileError, TeamTrust, load_team, parse_team

# What a tenant's registered team may reference: no local files, one module, MCP servers on
# one host at its default port and port 1.
TENANT = TeamTrust(local_files=False, modules=("json",), mcp_hosts=("127.0.0.1", "127.0.0.1:1"))


def definition(**reviewer: Any) -> dict[str, Any]:
    """A one-agent team; a key given None is left out of the reviewer's table."""
    table = {"description": "checks a draft", "prompt": "You review.", **reviewer}
    return {"agents": {"reviewer": {k: v for k, v in table.items() if v is not None}}}


def top(**keys: Any) -> dict[str, Any]:
    return {**definition(), **keys}


def http_mcp(**table: Any) -> dict[str, Any]:
    return {"lint": {"url": "http://127.0.0.1/mcp", **table}}


CASES: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    # The file's schema (pydantic): the first error's location.
    ("unknown top-level key", top(colour="blue"), None, "colour"),
    ("no agents", {"agents": {}}, None, "agents"),
    ("agents missing", {}, None, "agents"),
    ("an agent that is no table", {"agents": {"reviewer": 5}}, "agents.reviewer", None),
    ("unknown agent key", definition(colour="blue"), "agents.reviewer", "colour"),
    ("tools not a list", definition(tools="search_docs"), "agents.reviewer", "tools"),
    ("a tool not a string", definition(tools=[5]), "agents.reviewer", "tools.0"),
    ("kb neither list nor string", definition(kb=5), "agents.reviewer", "kb"),
    ("policy neither file nor table", top(policy=5), None, "policy"),
    ("a bad team name", top(name="no space"), None, "name"),
    ("an mcp env value", top(mcp=http_mcp(env={"TOKEN": 1})), "mcp.lint", "env.TOKEN"),
    ("an mcp timeout", top(mcp=http_mcp(timeout_seconds=0)), "mcp.lint", "timeout_seconds"),
    ("an empty mcp command", top(mcp={"lint": {"command": []}}), "mcp.lint", "command"),
    ("unknown supervisor key", top(supervisor={"colour": 1}), "supervisor", "colour"),
    # [agents.NAME]
    ("an unknown built-in agent", definition(use="builtin:nope"), "agents.reviewer", "use"),
    ("use of no agent", definition(use="nope"), "agents.reviewer", "use"),
    ("a cycle of use", {"agents": {"a": {"use": "b"}, "b": {"use": "a"}}}, "agents.b", "use"),
    ("description missing", definition(description=None), "agents.reviewer", "description"),
    ("prompt missing", definition(prompt=None), "agents.reviewer", "prompt"),
    ("kb on a tenant's team", definition(kb=["/etc"]), "agents.reviewer", "kb"),
    ("a bad agent name", {"agents": {"no space": {"description": "d", "prompt": "p"}}},
     "agents.no space", None),
    ("a handoff to itself", definition(handoffs=["reviewer"]), "agents.reviewer", "handoffs"),
    ("a handoff to no agent", definition(handoffs=["nobody"]), "agents.reviewer", "handoffs"),
    # [agents.NAME] tools: each kind of reference.
    ("an empty tool", definition(tools=[""]), "agents.reviewer", "tools"),
    ("a bad mcp reference", definition(tools=["mcp:lint"]), "agents.reviewer", "tools"),
    ("a bad function name", definition(tools=["json:1x"]), "agents.reviewer", "tools"),
    ("neither file nor module", definition(tools=["a/b:c"]), "agents.reviewer", "tools"),
    ("no reference at all", definition(tools=["a b"]), "agents.reviewer", "tools"),
    ("an unknown built-in tool", definition(tools=["nope"]), "agents.reviewer", "tools"),
    ("an mcp server not defined", definition(tools=["mcp:lint/x"]), "agents.reviewer", "tools"),
    ("a file on a tenant's team", definition(tools=["./t.py:f"]), "agents.reviewer", "tools"),
    ("a module not allowed", definition(tools=["os.path:join"]), "agents.reviewer", "tools"),
    ("a module without it", definition(tools=["json:nope"]), "agents.reviewer", "tools"),
    # [mcp.NAME]
    ("both command and url", top(mcp=http_mcp(command=["x"])), "mcp.lint", None),
    ("neither command nor url", top(mcp={"lint": {}}), "mcp.lint", None),
    ("a command on a tenant's team", top(mcp={"lint": {"command": ["python", "l.py"]}}),
     "mcp.lint", "command"),
    ("a url not http", top(mcp={"lint": {"url": "ftp://x"}}), "mcp.lint", "url"),
    ("a host not allowed", top(mcp={"lint": {"url": "http://10.0.0.5/mcp"}}), "mcp.lint", "url"),
    ("a bad server name", top(mcp={"li-nt": {"url": "http://127.0.0.1/mcp"}}), "mcp.li-nt", None),
    # The top level and [policy].
    ("a policy file on a tenant's team", top(policy="/etc/policy.toml"), None, "policy"),
    ("an unknown topology", top(topology="nope"), None, "topology"),
    ("start_agent outside swarm", top(start_agent="reviewer"), None, "start_agent"),
    ("output_mode outside supervisor-tools", top(output_mode="text"), None, "output_mode"),
    ("a bad model", top(model="acme:big"), None, "model"),
    ("a policy over no such agent", top(policy={"agents": {"coder": {"tools": []}}}),
     "policy", None),
    ("an unknown policy key", top(policy={"colour": 1}), "policy", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "table", "key"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_mistake_says_its_table_and_key(
    tmp_path: Path, data: dict[str, Any], table: str | None, key: str | None
) -> None:
    with pytest.raises(TeamFileError) as raised:
        parse_team({"name": "t", **data}, base=tmp_path, trust=TENANT)
    assert (raised.value.table, raised.value.key) == (table, key), str(raised.value)
    # The message names the place too, and it is a ConfigError like any configuration mistake.
    assert str(raised.value).startswith("team definition: ")
    assert isinstance(raised.value, ConfigError)


def test_an_mcp_server_that_does_not_start_is_the_tools_key(tmp_path: Path) -> None:
    data = {
        **definition(tools=["mcp:lint/check"]),
        "mcp": {"lint": {"url": "http://127.0.0.1:1/mcp", "timeout_seconds": 5}},
    }
    with pytest.raises(TeamFileError) as raised:
        parse_team(data, base=tmp_path, trust=TENANT)
    assert (raised.value.table, raised.value.key) == ("agents.reviewer", "tools")
    assert str(raised.value).startswith(
        "team definition: [agents.reviewer] tools: 'mcp:lint/check': MCP server 'lint' "
    )


def test_a_file_that_cannot_be_read_is_the_file_as_a_whole(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("name = ", encoding="utf-8")
    for path, said in [
        (tmp_path / "missing.toml", "does not exist"),
        (tmp_path / "bad.toml", "is not valid TOML"),
    ]:
        with pytest.raises(TeamFileError, match=said) as raised:
            load_team(path)
        assert (raised.value.table, raised.value.key) == (None, None)


def test_a_file_names_itself_and_the_place(tmp_path: Path) -> None:
    (tmp_path / "team.toml").write_text(
        '[agents.reviewer]\ndescription = "d"\nprompt = "p"\ntools = ["./tools.py:nope"]\n'
        "[mcp.lint]\ncommand = []\n",
        encoding="utf-8",
    )
    with pytest.raises(TeamFileError) as raised:
        load_team(tmp_path / "team.toml")
    assert str(raised.value).startswith(f"team file {str(tmp_path / 'team.toml')!r}: ")
    assert (raised.value.table, raised.value.key) == ("mcp.lint", "command")


def test_the_place_survives_pickling() -> None:
    error = TeamFileError("team definition: [mcp.lint] url = 'x': ...", table="mcp.lint", key="url")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.table, copy.key) == (
        TeamFileError,
        str(error),
        "mcp.lint",
        "url",
    )


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1/mcp", True),  # a bare host: its scheme's default port
        ("http://127.0.0.1:80/mcp", True),
        ("http://127.0.0.1:1/mcp", True),  # host:port
        ("http://127.0.0.1:5432/mcp", False),  # the ledger's port on an allowed host
        ("http://127.0.0.1:6379/mcp", False),
        ("https://127.0.0.1/mcp", True),  # https's default port
        ("https://127.0.0.1:80/mcp", False),  # a bare host allows https on 443 only
        ("http://127.0.0.1:0/mcp", False),
        ("http://localhost/mcp", False),  # another name of the host is another host
        ("http://10.0.0.5:1/mcp", False),
    ],
)
def test_an_mcp_server_is_allowed_by_host_and_port(url: str, allowed: bool) -> None:
    """A tenant's MCP server must be where the operator allows: a host alone allows its
    default port, never every port (on loopback those are PostgreSQL's, Redis's, ...)."""
    from urllib.parse import urlsplit

    from relaygraph.team._file import _endpoint_allowed

    parts = urlsplit(url)
    port = parts.port if parts.port is not None else 443 if parts.scheme == "https" else 80
    assert parts.hostname is not None
    assert _endpoint_allowed(parts.hostname, port, parts.scheme, TENANT.mcp_hosts or ()) is allowed


def test_an_mcp_url_on_a_port_the_server_does_not_allow_is_refused(tmp_path: Path) -> None:
    data = top(mcp={"lint": {"url": "http://127.0.0.1:5432/mcp"}})
    with pytest.raises(TeamFileError) as raised:
        parse_team(data, base=tmp_path, trust=TENANT)
    assert (raised.value.table, raised.value.key) == ("mcp.lint", "url")
    assert "host '127.0.0.1' port 5432 is not allowed on this server" in str(raised.value)
    assert "127.0.0.1, 127.0.0.1:1" in str(raised.value)


@pytest.mark.parametrize(
    ("entry", "good"),
    [
        ("mcp.internal", True),
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("[::1]", True),
        ("127.0.0.1:0", False),
        ("127.0.0.1:70000", False),
        ("http://mcp.internal", False),
        ("mcp.internal/mcp", False),
    ],
)
def test_the_mcp_allowlist_takes_hosts_and_host_ports(entry: str, good: bool) -> None:
    from pydantic import ValidationError

    from relaygraph.runner import RunnerSettings

    if good:
        assert RunnerSettings(mcp_allowed_hosts=[entry]).mcp_allowed_hosts == [entry]
    else:
        with pytest.raises(ValidationError, match="is not a host or host:port"):
            RunnerSettings(mcp_allowed_hosts=[entry])


# Tool contracts (issue 43): each tool's JSON schema is built with the team, and a tool whose
# arguments the model could not be told of is refused there, naming agent, tool, parameter
# and fix, not at the first model call.


class Plain:
    """A class with no JSON schema."""


def takes_a_plain_class(draft: Plain) -> str:
    """Check a draft."""
    return ""


def untyped(draft, k: int = 3):  # type: ignore[no-untyped-def]
    """Check a draft."""
    return ""


def star_args(*drafts: str) -> str:
    """Check drafts."""
    return ""


def star_kwargs(draft: str, **options: str) -> str:
    """Check a draft."""
    return ""


async def async_untyped(draft):  # type: ignore[no-untyped-def]
    """Check a draft."""
    return ""


CONTRACTS = [
    (takes_a_plain_class, "parameter 'draft' has type Plain, which has no JSON schema",
     "give it a type the model can write"),
    (untyped, "parameter 'draft' has no type", "annotate it (for example draft: str)"),
    (star_args, "takes *drafts", "give the tool an explicit args_schema"),
    (star_kwargs, "takes **options", "list the arguments as typed parameters"),
    (async_untyped, "parameter 'draft' has no type", "annotate it"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("function", "what", "fix"), CONTRACTS, ids=[c[0].__name__ for c in CONTRACTS]
)
def test_a_tool_contract_is_checked_when_the_team_is_built(
    function: Any, what: str, fix: str
) -> None:
    from relaygraph.agents import Agent
    from relaygraph.team import Team

    agent = Agent(name="reviewer", description="d", prompt="p", tools=[function])
    with pytest.raises(ConfigError) as raised:
        Team(agents=[agent])
    message = str(raised.value)
    assert message.startswith(f"agent 'reviewer': tool '{function.__name__}': "), message
    assert what in message and fix in message


def test_a_schema_given_explicitly_is_taken_as_it_is() -> None:
    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel

    from relaygraph.agents import Agent
    from relaygraph.team import Team

    class Drafts(BaseModel):
        drafts: list[str]

    given = StructuredTool.from_function(
        star_args, name="check", description="Check drafts.", args_schema=Drafts
    )
    team = Team(agents=[Agent(name="reviewer", description="d", prompt="p", tools=[given])])
    assert "drafts" in team.describe()["agents"][0]["tools"][0]["args"]["properties"]


def test_a_team_file_names_the_tools_key_of_a_bad_contract(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(
        'class Plain: ...\ndef check(draft: Plain) -> str:\n    """Check."""\n',
        encoding="utf-8",
    )
    (tmp_path / "team.toml").write_text(
        '[agents.reviewer]\ndescription = "d"\nprompt = "p"\ntools = ["./tools.py:check"]\n',
        encoding="utf-8",
    )
    with pytest.raises(TeamFileError) as raised:
        load_team(tmp_path / "team.toml")
    assert (raised.value.table, raised.value.key) == ("agents.reviewer", "tools")
    assert "tool 'check': parameter 'draft' has type Plain" in str(raised.value)
