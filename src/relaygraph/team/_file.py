"""The team file (TOML): agents, their tools and MCP servers, policy, topology, model.

    name = "docs-review"
    model = "openai:gpt-4o-mini"
    topology = "structured"
    policy = "policy.toml"            # relative to this file; or an inline [policy] table

    [supervisor]
    prompt = "Prefer the reviewer before FINISH when a draft exists."

    [agents.researcher]
    use = "builtin:researcher"
    kb = ["./docs"]

    [agents.reviewer]
    description = "checks a draft against the docs"
    prompt = "You are the reviewer. ..."
    tools = ["search_docs", "./tools.py:word_count", "mcp:lint/*"]
    handoffs = ["writer"]

    [mcp.lint]
    command = ["python", "lint_server.py"]

Every mistake is reported before any model is called, naming the file, the table and the
key (docs/teams.md).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relaygraph.agents import Agent, to_tool, tool_name
from relaygraph.agents import builtin as _builtin
from relaygraph.errors import ConfigError, read_config_file
from relaygraph.team._errors import TeamFileError, located, location_of
from relaygraph.team._refs import ToolRef, allowed_module, parse_tool_ref, resolve_python_ref
from relaygraph.team._team import Team

__all__ = ["OPERATOR", "TeamTrust", "load_mcp_file", "load_team", "parse_team"]

if TYPE_CHECKING:
    from relaygraph.team._mcp import McpServer

_STRICT = ConfigDict(extra="forbid", strict=True)


class _AgentTable(BaseModel):
    model_config = _STRICT
    use: str | None = None
    description: str | None = None
    prompt: str | None = None
    model: str | None = None
    tools: list[str] | None = None
    handoffs: list[str] | None = None
    kb: list[str] | str | None = None


class _McpTable(BaseModel):
    model_config = _STRICT
    command: list[str] | None = Field(default=None, min_length=1)
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: float = Field(default=30.0, gt=0)


class _SupervisorTable(BaseModel):
    model_config = _STRICT
    prompt: str | None = None


class _McpFile(BaseModel):
    model_config = _STRICT
    mcp: dict[str, _McpTable] = Field(default_factory=dict)


class _TeamFile(BaseModel):
    model_config = _STRICT
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    model: str | None = None
    topology: str = "structured"
    start_agent: str | None = None
    output_mode: str | None = None
    policy: str | dict[str, Any] | None = None
    supervisor: _SupervisorTable = Field(default_factory=_SupervisorTable)
    agents: dict[str, _AgentTable] = Field(min_length=1)
    mcp: dict[str, _McpTable] = Field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamTrust:
    """What a team file may reference. The operator's own files may reference anything; a
    tenant's registered definition only what the server allows (a tenant must not make the
    server run a program or import a module of its choosing)."""

    local_files: bool = True
    """``./file.py`` tools, stdio MCP servers and ``kb`` folders (they run or read files on
    the machine)."""
    modules: tuple[str, ...] | None = None
    """Python modules tools may come from (a module and its submodules); None: any."""
    mcp_hosts: tuple[str, ...] | None = None
    """Where HTTP MCP servers may be: each ``host:port``, or a bare ``host`` on its URL
    scheme's default port (80 or 443) only; None: anywhere. A host alone never allows every
    port: on a loopback host those are the ledger's, Redis's and RabbitMQ's too."""
    mcp_servers: tuple[McpServer, ...] = ()
    """MCP servers the file may use as ``mcp:NAME/...`` without an ``[mcp.NAME]`` table of
    its own: those the operator offers (``serve --mcp``), whatever ``local_files`` says."""


OPERATOR = TeamTrust()
"""Everything allowed: a file the person running relaygraph wrote."""


def load_team(path: str | Path, *, trust: TeamTrust = OPERATOR) -> Team:
    """Read and build a team file.

    Raises:
        TeamFileError: The file is missing, is not TOML, or anything in it is wrong; the
            message names the file, the table and the key, and so do the error's fields.
    """
    file, text = read_config_file(path, "team file", error=TeamFileError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TeamFileError(f"team file {str(file)!r} is not valid TOML: {exc}") from None
    return parse_team(data, base=file.resolve().parent, source=file.resolve(), trust=trust)


def load_mcp_file(path: str | Path) -> tuple[McpServer, ...]:
    """The MCP servers of a file of ``[mcp.NAME]`` tables, as in a team file (``serve
    --mcp``): the operator's own, so they may run programs (relative to the file's folder).

    Raises:
        TeamFileError: The file is missing, is not TOML, has other keys, or a table is
            wrong; the message names the file and the table.
    """
    file = Path(path).expanduser().resolve()
    where = f"MCP file {str(file)!r}"
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TeamFileError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TeamFileError(f"{where} cannot be read: {exc}") from None
    try:
        parsed = _McpFile.model_validate(data)
    except ValidationError as exc:
        table, key = location_of(exc.errors()[0]["loc"], data)
        raise TeamFileError(f"{where}: " + "; ".join(_explain(exc)), table=table, key=key) from None
    if not parsed.mcp:
        raise TeamFileError(f"{where}: no [mcp.NAME] table")
    return tuple(
        _mcp_server(name, table, file.parent, OPERATOR, where) for name, table in parsed.mcp.items()
    )


def parse_team(
    data: Mapping[str, Any],
    *,
    base: Path,
    source: Path | None = None,
    trust: TeamTrust = OPERATOR,
) -> Team:
    """Build a team from a team file's content.

    Args:
        data: The parsed TOML.
        base: The folder relative paths are read from (the team file's).
        source: The file, for messages and the task record.
        trust: What the file may reference.

    Raises:
        TeamFileError: As :func:`load_team`.
    """
    where = f"team file {str(source)!r}" if source else "team definition"
    try:
        return _parse_team(data, base=base, source=source, trust=trust, where=where)
    except TeamFileError:
        raise
    except ConfigError as exc:  # From a part that knows no team file (a Team's own checks).
        message = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
        raise TeamFileError(message) from None


def _parse_team(
    data: Mapping[str, Any], *, base: Path, source: Path | None, trust: TeamTrust, where: str
) -> Team:
    try:
        parsed = _TeamFile.model_validate(data)
    except ValidationError as exc:
        table, key = location_of(exc.errors()[0]["loc"], data)
        message = f"{where}: " + "; ".join(_explain(exc))
        raise TeamFileError(message, table=table, key=key) from None
    servers = {server.name: server for server in trust.mcp_servers}
    for name, mcp_table in parsed.mcp.items():
        if name in servers:
            raise TeamFileError(
                f"{where}: [mcp.{name}]: the server offers an MCP server of this name; use it "
                f"as mcp:{name}/... without a table, or name yours otherwise",
                table=f"mcp.{name}",
            )
        servers[name] = _mcp_server(name, mcp_table, base, trust, where)
    tables = parsed.agents
    files: dict[str, str] = {}
    agents = [_agent(name, tables, base, trust, servers, files, where, chain=()) for name in tables]
    policy: Any = parsed.policy
    if isinstance(policy, str):
        if not trust.local_files:
            raise TeamFileError(
                f"{where}: policy = {policy!r}: name no file; give a [policy] table", key="policy"
            )
        from relaygraph.policies import read_policy_file

        with located(where, key="policy"):
            policy = read_policy_file(base / policy)
        files[parsed.policy] = _digest_json(policy)  # type: ignore[index]
    topology = _topology(parsed, where)
    if parsed.model is not None:
        from relaygraph.models import parse_model_spec

        with located(where, key="model"):
            parse_model_spec(parsed.model)
    team = partial(
        Team,
        agents=tuple(agents),
        name=parsed.name or (source.stem if source else "team"),
        description=parsed.description,
        topology=topology,
        model=parsed.model,
        supervisor_prompt=parsed.supervisor.prompt,
        source=source,
        definition={**dict(data), "_files": files},
    )
    try:
        return team(policy=policy)
    except ConfigError as exc:
        message = f"{where}: {exc}"
    # The team's own checks name no table: find the one that failed by asking each part.
    # Handoffs are checked first, agent by agent, as the team does.
    names = set(parsed.agents)
    for agent in agents:
        if any(peer == agent.name or peer not in names for peer in agent.handoffs or ()):
            own = parsed.agents[agent.name].handoffs is not None  # Not one of its use's.
            table = f"agents.{agent.name}" if own else None
            raise TeamFileError(message, table=table, key="handoffs" if own else None)
    # The policy is checked last: if the team builds without it, the mistake is the policy's.
    if policy is None:
        raise TeamFileError(message)
    try:
        team(policy=None)
    except ConfigError:
        raise TeamFileError(message) from None
    if isinstance(parsed.policy, str):
        raise TeamFileError(message, key="policy")
    raise TeamFileError(message, table="policy")


def _topology(parsed: _TeamFile, where: str) -> Any:
    """The file's topology; each option checked on its own, so a mistake names its key."""
    from relaygraph.topology import Topology

    with located(where, key="topology"):
        Topology.parse(parsed.topology)
    with located(where, key="start_agent"):
        Topology.parse(parsed.topology, start_agent=parsed.start_agent)
    with located(where, key="output_mode"):
        topology = Topology.parse(
            parsed.topology, start_agent=parsed.start_agent, output_mode=parsed.output_mode
        )
    return topology


def _agent(
    name: str,
    tables: Mapping[str, _AgentTable],
    base: Path,
    trust: TeamTrust,
    servers: Mapping[str, Any],
    files: dict[str, str],
    where: str,
    *,
    chain: tuple[str, ...],
) -> Agent:
    """The agent ``name`` of the file, its ``use`` chain followed (a cycle is an error)."""
    table_name = f"agents.{name}"
    at = f"{where}: [{table_name}]"
    if name in chain:
        raise TeamFileError(
            f"{where}: a cycle of use: {' -> '.join((*chain, name))}",
            table=f"agents.{chain[-1]}",
            key="use",
        )
    table = tables[name]
    start: Agent | None = None
    if table.use is not None:
        if table.use.startswith("builtin:"):
            factory = _builtin.AGENT_FACTORIES.get(table.use.removeprefix("builtin:"))
            if factory is None:
                raise TeamFileError(
                    f"{at} use = {table.use!r}: no such built-in agent "
                    f"(builtin:{', builtin:'.join(_builtin.AGENT_FACTORIES)})",
                    table=table_name,
                    key="use",
                )
            start = factory()
        elif table.use in tables:
            start = _agent(
                table.use, tables, base, trust, servers, files, where, chain=(*chain, name)
            )
        else:
            raise TeamFileError(
                f"{at} use = {table.use!r}: neither builtin:<agent> nor an agent of this file",
                table=table_name,
                key="use",
            )
    changes: dict[str, Any] = {"name": name}
    for key in ("description", "prompt", "model", "handoffs"):
        value = getattr(table, key)
        if value is not None:
            changes[key] = value
    if start is None:
        for key in ("description", "prompt"):
            if key not in changes:
                raise TeamFileError(
                    f"{at} {key}: required key is missing (or give use = ...)",
                    table=table_name,
                    key=key,
                )
    if table.kb is not None:
        if not trust.local_files:
            raise TeamFileError(
                f"{at} kb: a registered team may name no folders of the server",
                table=table_name,
                key="kb",
            )
        folders = [table.kb] if isinstance(table.kb, str) else table.kb
        changes["kb"] = tuple((base / f).resolve() for f in folders)
        for folder in changes["kb"]:
            if not folder.is_dir():
                raise TeamFileError(
                    f"{at} kb: {str(folder)!r} is not a folder", table=table_name, key="kb"
                )
    if table.tools is not None:
        tools: list[Any] = []
        origins: dict[str, str] = {}
        for text in table.tools:
            ref = parse_tool_ref(text, where=f"{at} tools", table=table_name)
            # An MCP server's own errors (it did not start, it lists no such tool) name no
            # team file, agent or reference: they are this key's, and this reference's.
            with located(f"{at} tools: {ref.text!r}", table=table_name, key="tools"):
                resolved = _resolve(ref, base, trust, servers, files, f"{at} tools", table_name)
                # A tool's contract too (its arguments' JSON schema), here where the key
                # that named it is known; the team checks it again, naming no key.
                for made, _ in resolved:
                    if not isinstance(made, str):
                        to_tool(made, {}, where=f"[{table_name}] tools")
            for made, origin in resolved:
                tools.append(made)
                origins[tool_name(made)] = origin
        changes["tools"] = tuple(tools)
        changes["origins"] = origins
    try:
        return replace(start, **changes) if start is not None else Agent(**changes)
    except ConfigError as exc:
        raise TeamFileError(f"{at}: {exc}", table=table_name) from None


def _resolve(
    ref: ToolRef,
    base: Path,
    trust: TeamTrust,
    servers: Mapping[str, Any],
    files: dict[str, str],
    where: str,
    table: str,
) -> list[tuple[Any, str]]:
    if ref.kind == "builtin":
        if ref.target not in _builtin.tools():
            raise TeamFileError(
                f"{where}: unknown tool {ref.text!r}; "
                f"built-in tools: {', '.join(_builtin.tools())}",
                table=table,
                key="tools",
            )
        return [(ref.target, "builtin")]
    if ref.kind == "mcp":
        server = servers.get(ref.target)
        if server is None:
            known = ", ".join(servers) or "none"
            raise TeamFileError(
                f"{where}: {ref.text!r}: no [mcp.{ref.target}] table, and the server offers "
                f"no MCP server of that name (servers: {known})",
                table=table,
                key="tools",
            )
        from relaygraph.team._mcp import mcp_tools

        names = None if ref.attribute == "*" else [ref.attribute or ""]
        return [(t, f"mcp:{ref.target}") for t in mcp_tools(server, names)]
    if ref.kind == "file" and not trust.local_files:
        raise TeamFileError(
            f"{where}: {ref.text!r}: a registered team may name no files of the server",
            table=table,
            key="tools",
        )
    if (
        ref.kind == "module"
        and trust.modules is not None
        and not allowed_module(ref.target, trust.modules)
    ):
        raise TeamFileError(
            f"{where}: {ref.text!r}: module {ref.target!r} is not allowed on this server "
            f"(RELAYGRAPH_TOOL_MODULES: {', '.join(trust.modules) or 'none'})",
            table=table,
            key="tools",
        )
    found, digest = resolve_python_ref(ref, base=base, where=where, table=table)
    if digest is not None:
        files[ref.target] = digest
    return [(found, ref.text)]


def _mcp_server(name: str, table: _McpTable, base: Path, trust: TeamTrust, where: str) -> Any:
    from relaygraph.team._mcp import McpServer, interpreter_for

    table_name = f"mcp.{name}"
    at = f"{where}: [{table_name}]"
    if (table.command is None) == (table.url is None):
        raise TeamFileError(
            f"{at}: give exactly one of command (stdio) or url (streamable HTTP)",
            table=table_name,
        )
    if table.command is not None:
        if not trust.local_files:
            raise TeamFileError(
                f"{at} command: a registered team may start no programs on the server; "
                "use an MCP server over HTTP",
                table=table_name,
                key="command",
            )
        command = [interpreter_for(table.command[0]), *table.command[1:]]
        with located(where, table=table_name):  # The server's own checks (its name).
            return McpServer(
                name=name,
                command=tuple(command),
                cwd=base,
                env=table.env,
                timeout_seconds=table.timeout_seconds,
            )
    url = table.url or ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TeamFileError(
            f"{at} url = {url!r}: an http:// or https:// URL", table=table_name, key="url"
        )
    try:
        port = _DEFAULT_PORTS[parts.scheme] if parts.port is None else parts.port
    except ValueError as exc:  # Out of range, or no number.
        raise TeamFileError(f"{at} url = {url!r}: {exc}", table=table_name, key="url") from None
    if trust.mcp_hosts is not None and not _endpoint_allowed(
        parts.hostname, port, parts.scheme, trust.mcp_hosts
    ):
        raise TeamFileError(
            f"{at} url = {url!r}: host {parts.hostname!r} port {port} is not allowed on this "
            f"server (RELAYGRAPH_MCP_ALLOWED_HOSTS: {', '.join(trust.mcp_hosts) or 'none'}; "
            "a host without a port allows its default port only)",
            table=table_name,
            key="url",
        )
    with located(where, table=table_name):
        return McpServer(
            name=name, url=url, headers=table.headers, timeout_seconds=table.timeout_seconds
        )


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _endpoint_allowed(host: str, port: int, scheme: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``allowed`` (``host:port`` or bare ``host`` entries) holds ``host:port``."""
    for entry in allowed:
        named = urlsplit(f"//{entry}")
        try:
            entry_port = _DEFAULT_PORTS[scheme] if named.port is None else named.port
        except ValueError:
            continue  # Not an endpoint (the settings check them before they get here).
        if named.hostname == host and entry_port == port:
            return True
    return False


def _explain(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "missing":
            problems.append(f"{loc}: required key is missing")
        elif err["type"] == "extra_forbidden":
            problems.append(f"{loc}: unknown key")
        else:
            problems.append(f"{loc} = {err.get('input')!r}: {err['msg']}")
    return problems


def _digest_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
