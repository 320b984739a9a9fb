"""The settings that every process running the service's tasks reads, from ``RELAYGRAPH_*``
environment variables (pydantic-settings): an API server (``relaygraph serve``, whose
``ServiceSettings`` extend these) checks requests with them, a worker (``relaygraph
worker``) builds the tasks' teams with them. Set them alike for both roles."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from relaygraph.backends.workspace import WorkspaceQuota
from relaygraph.errors import ConfigError
from relaygraph.runner._model_calls import ModelCallRecording
from relaygraph.store import Quotas

__all__ = ["RunnerSettings", "load_runner_settings", "read_settings"]

S = TypeVar("S", bound=BaseSettings)

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ENDPOINT = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
_LIST_EXAMPLE = """'["openai:*", "local:smollm2"]'"""


class RunnerSettings(BaseSettings):
    """What a process that runs (or accepts) the service's tasks needs to know: which
    models and teams tasks may use, where the data lives, and the attempt limit. Every
    field is also ``RELAYGRAPH_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_", extra="ignore", frozen=True)

    allowed_models: list[str] = Field(default_factory=lambda: ["openai:*", "local:smollm2"])
    """Model specs a request may name; ``*`` matches anything (``openai:*``)."""
    scripts_dir: Path | None = None
    """The folder whose scripts requests may name as ``scripted:NAME.json`` (``serve
    --scripts``); None (the default): requests may name no scripted model."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """How many times a task is started whose runner died each time before it is failed
    (a task that crashes its server must not take down every server that picks it up)."""
    unsafe_sandbox: bool = False
    """Run tenants' ``run_python`` code even where the host offers no filesystem isolation
    (no bubblewrap): the code can then read and write the server's files."""
    policy_file: Path | None = None
    """The built-in team's base policy (``serve --policy``), and the ceiling of every
    task's: a project's registered team runs under the tighter of its own and this, key by
    key, and a request's policy may only tighten. None: the default policy is both."""
    team_files: list[Path] = Field(default_factory=list)
    """Team files the operator loads at start (``serve --team FILE``, repeatable): every
    project may run them by name. Only these may use stdio MCP servers, ``./file.py`` tools
    and knowledge-base folders; a project's registered teams may not."""
    mcp_file: Path | None = None
    """A file of ``[mcp.NAME]`` tables, as in a team file (``serve --mcp FILE``): MCP
    servers the operator offers to projects, whose registered teams use them as
    ``mcp:NAME/...`` without declaring them. Each project gets its own session with each."""
    tool_modules: list[str] = Field(default_factory=list)
    """Python modules (each with its submodules) that a project's registered team may take
    tools from (``package.module:function``); none by default."""
    mcp_allowed_hosts: list[str] = Field(default_factory=list)
    """Where the MCP servers over HTTP that a project's registered team may use are: each
    ``host:port``, or a bare ``host`` for its URL scheme's default port (80, 443) only;
    none by default."""
    team_max_agents: int = Field(default=32, ge=1, le=1000)
    """Agents a project's registered team may have (``PUT /v1/teams``: 422 past it)."""
    team_max_tools_per_agent: int = Field(default=64, ge=1, le=10_000)
    """Tools one agent of a registered team may have, an MCP server's ``*`` expanded."""
    team_max_depth: int = Field(default=8, ge=4, le=30)
    """Levels of tables and arrays a registered team's definition may nest, itself the
    first (a team file's deepest keys, ``[policy.agents.NAME] tools``, are 5). At most 30:
    a request body nests 32 levels at most."""
    database_url: str | None = None
    """The ledger (else ``$RELAYGRAPH_DATABASE_URL``, else SQLite in the data directory)."""
    home: Path | None = None
    """The data directory (else ``$RELAYGRAPH_HOME`` or ``~/.relaygraph``)."""
    workspace_max_mb: int = Field(default=1024, ge=1, le=1024 * 1024)
    """What a task's workspace and artifacts may hold together, in MiB, enforced while its
    programs run (docs/sandbox.md, *The workspace quota*)."""
    workspace_max_files: int = Field(default=10_000, ge=1, le=10_000_000)
    """Files and folders a task's workspace and artifacts may hold together."""

    retention_days: float | None = Field(default=None, gt=0)
    """Delete the workspaces of tasks that ended more than this many days ago (the server,
    hourly; ``relaygraph gc`` on demand). None (the default): kept for ever."""
    retention_artifacts: bool = False
    """With ``retention_days``: delete those tasks' artifacts too."""

    model_call_messages: bool = True
    """Keep the messages each model call saw and its reply in the ledger (the task page's
    *Model calls*); false keeps only each call's model, tokens, cost and latency, for
    prompts that hold what the ledger must not keep."""
    model_call_max_chars: int = Field(default=4000, ge=0, le=1_000_000)
    """Characters kept of each message of a model call; a longer one is cut, and its
    record says so."""

    def model_call_recording(self) -> ModelCallRecording:
        """How much of each model call the ledger keeps, as the runner records it."""
        return ModelCallRecording(
            messages=self.model_call_messages, max_chars=self.model_call_max_chars
        )

    def workspace_quota(self) -> WorkspaceQuota:
        """The quota of every task's files, as the tools enforce it."""
        return WorkspaceQuota(max_mb=self.workspace_max_mb, max_files=self.workspace_max_files)

    project_max_running: int | None = Field(default=None, ge=1)
    """A project's tasks running at once, in the whole service; None (the default): no
    limit but the workers, shared fairly (a free worker takes the next task of the project
    with the fewest running). Past it, a project's tasks stay queued and the free worker
    serves another project. ``relaygraph projects quota`` sets one project's own."""
    project_max_queued: int | None = Field(default=1000, ge=1)
    """A project's tasks waiting (``queued``); a submission past it gets 429
    ``quota_exceeded`` with ``Retry-After``. None: no limit."""
    project_daily_cost_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """A project's spend per UTC day in USD (from the policy's price table); None (the
    default): none. Past it a submission gets 429 ``budget_exhausted``, and a running
    task stops ``degraded`` before its next model call."""

    @property
    def quotas(self) -> Quotas:
        """The server's quotas of every project (each project's own override them)."""
        return Quotas(
            max_running=self.project_max_running,
            max_queued=self.project_max_queued,
            daily_cost_usd=self.project_daily_cost_usd,
        )

    @field_validator("tool_modules")
    @classmethod
    def _modules(cls, value: list[str]) -> list[str]:
        for module in value:
            if not _MODULE.fullmatch(module):
                raise ValueError(f"{module!r} is not a module name (package.module)")
        return value

    @field_validator("mcp_allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for entry in value:
            found = _ENDPOINT.fullmatch(entry)
            port = found and found["port"]
            if not found or (port is not None and not 0 < int(port) < 65536):
                raise ValueError(
                    f"{entry!r} is not a host or host:port (no scheme or path; "
                    "an IPv6 address in brackets)"
                )
        return value


def read_settings(
    settings: type[S],
    overrides: Mapping[str, Any],
    *,
    role: str,
    flags: Mapping[str, str] | None = None,
    list_example: str = _LIST_EXAMPLE,
) -> S:
    """``settings`` read from the environment, ``overrides`` (command-line flags) over it.

    Args:
        settings: The settings class.
        overrides: Values given on the command line, by field name.
        role: Whose settings they are, for the message (``server``, ``worker``).
        flags: The command-line flag of each field that has one, named beside its variable.
        list_example: How a list setting is written, for a value that is not JSON.

    Raises:
        ConfigError: A setting is invalid; the message names its variable (and flag) and
            the value.
    """
    try:
        return settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            where = f"RELAYGRAPH_{field.upper()}"
            if flags and field in flags:
                where += f" / {flags[field]}"
            problems.append(f"{where} {error['input']!r}: {error['msg']}")
        raise ConfigError(f"bad {role} setting: " + "; ".join(problems)) from None
    except SettingsError as exc:
        # pydantic-settings reads list settings as JSON and names only the field.
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        name = f"RELAYGRAPH_{field.upper()}"
        raise ConfigError(
            f"bad {role} setting: {name} {os.environ.get(name)!r} is not valid JSON; "
            f"a list is written as {list_example}"
        ) from None


def load_runner_settings(**overrides: Any) -> RunnerSettings:
    """A worker's runner settings: ``overrides`` over the environment.

    Raises:
        ConfigError: A setting is invalid (``bad worker setting: ...``, naming its variable).
    """
    return read_settings(RunnerSettings, overrides, role="worker")
