"""The task service's settings, from ``RELAYGRAPH_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from relaygraph.errors import ConfigError, ModelNotAllowed
from relaygraph.models import DEFAULT_MODEL, load_model, parse_model_spec
from relaygraph.models.scripted import ScriptFolder, load_script

_FLAGS = {
    "default_model": "--model",
    "workers": "--workers",
    "policy_file": "--policy",
    "scripts_dir": "--scripts",
    "unsafe_sandbox": "--unsafe-sandbox",
    "team_files": "--team",
}
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_HOST = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]")


class ServiceSettings(BaseSettings):
    """How ``relaygraph serve`` runs. Every field is also ``RELAYGRAPH_<FIELD>`` in the env."""

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_", extra="ignore", frozen=True)

    default_model: str = DEFAULT_MODEL
    """The model of tasks that name none (``serve --model``)."""
    allowed_models: list[str] = Field(default_factory=lambda: ["openai:*", "local:smollm2"])
    """Model specs a request may name; ``*`` matches anything (``openai:*``)."""
    scripts_dir: Path | None = None
    """The folder whose scripts requests may name as ``scripted:NAME.json`` (``serve
    --scripts``); None (the default): requests may name no scripted model."""
    workers: int = Field(default=2, ge=1, le=64)
    """Tasks that run at once in the server process."""
    lease_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    """How long a running task's lease lasts unrenewed: when a server dies, another server
    on the same ledger continues its tasks after this long (a server that stops cleanly
    lets go at once)."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """How many times a task is started whose runner died each time before it is failed
    (a task that crashes its server must not take down every server that picks it up)."""
    unsafe_sandbox: bool = False
    """Run tenants' ``run_python`` code even where the host offers no filesystem isolation
    (no bubblewrap): the code can then read and write the server's files."""
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413."""
    policy_file: Path | None = None
    """The built-in team's base policy (``serve --policy``); a request's policy may only
    tighten it."""
    team_files: list[Path] = Field(default_factory=list)
    """Team files the operator loads at start (``serve --team FILE``, repeatable): every
    project may run them by name. Only these may use stdio MCP servers, ``./file.py`` tools
    and knowledge-base folders; a project's registered teams may not."""
    tool_modules: list[str] = Field(default_factory=list)
    """Python modules (each with its submodules) that a project's registered team may take
    tools from (``package.module:function``); none by default."""
    mcp_allowed_hosts: list[str] = Field(default_factory=list)
    """Hosts of the MCP servers over HTTP that a project's registered team may use; none by
    default."""
    database_url: str | None = None
    """The ledger (else ``$RELAYGRAPH_DATABASE_URL``, else SQLite in the data directory)."""
    home: Path | None = None
    """The data directory (else ``$RELAYGRAPH_HOME`` or ``~/.relaygraph``)."""

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
        for host in value:
            if not _HOST.fullmatch(host):
                raise ValueError(f"{host!r} is not a host name (no scheme, port or path)")
        return value

    def request_model(self, spec: str) -> str:
        """The model spec to record for a task whose request names ``spec``.

        The server's default model is always allowed. A ``scripted:NAME`` spec names a
        file of :attr:`scripts_dir` by its name alone and is recorded with that file's
        path; any other spec must match :attr:`allowed_models`. Nothing here opens a file
        that the request chose outside the scripts folder.

        Raises:
            ModelNotAllowed: The spec is valid but not allowed on this server.
            ConfigError: The spec is invalid, or its script is malformed.
        """
        parsed = parse_model_spec(spec)
        if spec.strip() == self.default_model:
            return self.default_model
        if parsed.provider == "scripted":
            if self.scripts_dir is None:
                raise ModelNotAllowed(spec, "this server takes no scripted models")
            file = ScriptFolder(path=self.scripts_dir).resolve(parsed.name)
            load_script(file)  # A broken script is refused now, not when the task runs.
            return f"scripted:{file}"
        if not any(fnmatch.fnmatchcase(spec, pattern) for pattern in self.allowed_models):
            raise ModelNotAllowed(spec, f"allowed: {', '.join(self.allowed_models)}")
        _check_request_options(spec, parsed.options)
        if parsed.provider != "local":
            # An OpenAI model with no key is refused now rather than failing the task
            # later. (The embedded model is not loaded here: that takes seconds.)
            load_model(parsed, agent="check")
        return str(parsed)


MAX_REQUEST_TIMEOUT_SECONDS = 300.0
MAX_REQUEST_RETRIES = 3


def _check_request_options(spec: str, options: Any) -> None:
    """A tenant's ``openai:`` options may tune how its own calls are made, not what the
    server sends on its behalf: extra headers and body fields reach the operator's gateway
    (a LiteLLM team header would bill another team), and long timeouts with many retries
    hold a worker for hours.

    Raises:
        ModelNotAllowed: A ``header.*`` or ``body.*`` option, or a timeout or retry count
            above the server's caps.
    """
    if options is None:
        return
    if options.headers or options.body:
        raise ModelNotAllowed(
            spec, "a request may not set header.* or body.* options (the operator's may)"
        )
    if options.timeout is not None and options.timeout > MAX_REQUEST_TIMEOUT_SECONDS:
        raise ModelNotAllowed(
            spec, f"timeout={options.timeout:g} is above {MAX_REQUEST_TIMEOUT_SECONDS:g} s"
        )
    if options.max_retries > MAX_REQUEST_RETRIES:
        raise ModelNotAllowed(
            spec, f"max_retries={options.max_retries} is above {MAX_REQUEST_RETRIES}"
        )


def load_settings(**overrides: Any) -> ServiceSettings:
    """The server's settings: ``overrides`` (the ``serve`` flags) over the environment.

    Raises:
        ConfigError: A setting is invalid; the message names its variable (and flag) and
            the value.
    """
    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            where = f"RELAYGRAPH_{field.upper()}"
            if field in _FLAGS:
                where += f" / {_FLAGS[field]}"
            problems.append(f"{where} {error['input']!r}: {error['msg']}")
        raise ConfigError("bad server setting: " + "; ".join(problems)) from None
    except SettingsError as exc:
        # pydantic-settings reads list settings as JSON and names only the field.
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        name = f"RELAYGRAPH_{field.upper()}"
        raise ConfigError(
            f"bad server setting: {name} {os.environ.get(name)!r} is not valid JSON; "
            f"""a list is written as '["openai:*", "local:smollm2"]'"""
        ) from None
    default = parse_model_spec(settings.default_model)
    if default.provider == "scripted":
        # The operator's own script, named by any path: kept absolute, so the tasks' record
        # does not depend on the server's working directory.
        path = Path(default.name).expanduser().resolve()
        settings = settings.model_copy(update={"default_model": f"scripted:{path}"})
    if settings.scripts_dir is not None and not settings.scripts_dir.is_dir():
        raise ConfigError(
            f"bad server setting: RELAYGRAPH_SCRIPTS_DIR / --scripts {str(settings.scripts_dir)!r} "
            "is not a folder"
        )
    return settings
