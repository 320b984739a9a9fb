"""The task service's settings, from ``RELAYGRAPH_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import fnmatch
import math
import os
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr
from pydantic_settings import SettingsConfigDict

from relaygraph.errors import ConfigError, ModelNotAllowed
from relaygraph.models import DEFAULT_MODEL, load_model, parse_model_spec
from relaygraph.models.scripted import ScriptFolder, load_script
from relaygraph.runner import RunnerSettings, read_settings

BROKER_URL_ENV = "RELAYGRAPH_BROKER_URL"
"""Set, ``serve`` runs the worker mode: it publishes tasks to this broker and runs none."""

_FLAGS = {
    "default_model": "--model",
    "workers": "--workers",
    "processes": "--processes",
    "policy_file": "--policy",
    "scripts_dir": "--scripts",
    "unsafe_sandbox": "--unsafe-sandbox",
    "team_files": "--team",
    "mcp_file": "--mcp",
}


WORKERS_PER_PROCESS = 1000
"""``serve``'s default spread: one process for every this many tasks in flight (see
:func:`default_processes`)."""
DEFAULT_PROCESSES_MAX = 16
"""The most processes ``serve`` starts unless told (``--processes`` sets any number)."""
DEFAULT_WORKERS = 100
"""``serve``'s tasks in flight unless told (``--workers``)."""
MAX_WORKERS = 10_000


def default_processes(workers: int) -> int:
    """The processes ``relaygraph serve`` spreads ``workers`` (tasks in flight) over when
    neither ``--processes`` nor ``RELAYGRAPH_PROCESSES`` says: one per
    :data:`WORKERS_PER_PROCESS`, at most :data:`DEFAULT_PROCESSES_MAX` (the default
    :data:`DEFAULT_WORKERS`: the server's own process alone).

    A process runs its tasks on one event loop, where a task waiting for its model holds no
    thread: one process holds hundreds of tasks in flight, and its CPU (one core, the
    interpreter's) is what bounds it. More processes use more cores
    (benchmarks/RESULTS.md has the measurements)."""
    return max(1, min(math.ceil(workers / WORKERS_PER_PROCESS), DEFAULT_PROCESSES_MAX))


class ServiceSettings(RunnerSettings):
    """How ``relaygraph serve`` runs. Every field is also ``RELAYGRAPH_<FIELD>`` in the env.

    The fields a worker needs as well (models and teams allowed, the data directory, the
    ledger, the attempt limit) are :class:`~relaygraph.runner.RunnerSettings`'.
    """

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_", extra="ignore", frozen=True)

    default_model: str = DEFAULT_MODEL
    """The model of tasks that name none (``serve --model``)."""
    workers: int = Field(default=DEFAULT_WORKERS, ge=1, le=MAX_WORKERS)
    """Tasks in flight at once on this server (in all its processes together): each runs on
    its process's event loop and holds no thread while it waits for its model, so this is
    bounded by memory and CPU, not by threads (docs/deploy.md, sizing)."""
    processes: int = Field(default=1, ge=1, le=64)
    """The processes the workers are spread over (``serve --processes``): the server's own
    and ``processes - 1`` task processes on the same ledger. Every graph of one process
    runs on one event loop in one Python interpreter; more processes let a server use more
    cores. At most ``workers``. 1 for an app made from these settings in a caller's
    process (``create_app``); ``relaygraph serve`` (:func:`load_settings`) spreads its
    workers by :func:`default_processes` unless told."""
    lease_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    """How long a running task's lease lasts unrenewed: when a server dies, another server
    on the same ledger continues its tasks after this long (a server that stops cleanly
    lets go at once)."""
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413."""
    project_max_streams: int = Field(default=100, ge=1, le=100_000)
    """Event streams a project may hold open on this server at once; one more gets 429
    ``quota_exceeded`` (``relaygraph.api._streams``)."""
    _default_script_as_given: str | None = PrivateAttr(default=None)
    """The operator's scripted default model as ``--model`` spelled it (made absolute
    without touching the disk, see :func:`_script_spelling`), before :func:`load_settings`
    resolved it: a request may name the default by that spelling too."""

    def request_model(self, spec: str) -> str:
        """The model spec to record for a task whose request names ``spec``.

        The server's default model is always allowed, by the spec as the operator wrote it
        or as the server records it (for a script: the same path, relative to the server's
        working directory or absolute). A ``scripted:NAME`` spec names a
        file of :attr:`scripts_dir` by its name alone and is recorded with that file's
        path; any other spec must match :attr:`allowed_models`. Nothing here opens a file
        that the request chose outside the scripts folder.

        Raises:
            ModelNotAllowed: The spec is valid but not allowed on this server.
            ConfigError: The spec is invalid, or its script is malformed.
        """
        parsed = parse_model_spec(spec)
        if spec.strip() == self.default_model or self._names_default_script(
            parsed.provider, parsed.name
        ):
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

    def _names_default_script(self, provider: str, name: str) -> bool:
        """Whether a ``scripted`` spec's path is the default model's script. Compared as
        spellings made absolute (:func:`_script_spelling`): the request's path is never
        looked up on the disk, so naming it opens and probes nothing."""
        if provider != "scripted":
            return False
        default = parse_model_spec(self.default_model)
        if default.provider != "scripted":
            return False
        known = {_script_spelling(default.name), self._default_script_as_given}
        return _script_spelling(name) in known


def _script_spelling(name: str) -> str:
    """A script's path made absolute against the working directory, lexically (no
    symlink is followed, nothing on the disk is read)."""
    return os.path.abspath(os.path.expanduser(name))


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
    settings = read_settings(ServiceSettings, overrides, role="server", flags=_FLAGS)

    told = "processes" in overrides or os.environ.get("RELAYGRAPH_PROCESSES")
    # In the worker mode the server runs no tasks: its workers setting is not used.
    if not told and not os.environ.get(BROKER_URL_ENV):
        settings = settings.model_copy(update={"processes": default_processes(settings.workers)})
    default = parse_model_spec(settings.default_model)
    if default.provider == "scripted":
        # The operator's own script, named by any path: kept absolute, so the tasks' record
        # does not depend on the server's working directory.
        path = Path(default.name).expanduser().resolve()
        settings = settings.model_copy(update={"default_model": f"scripted:{path}"})
        settings._default_script_as_given = _script_spelling(default.name)
    if settings.processes > settings.workers:
        raise ConfigError(
            f"bad server setting: RELAYGRAPH_PROCESSES / --processes {settings.processes} is "
            f"more than the workers ({settings.workers}): every process runs at least one"
        )
    if settings.scripts_dir is not None and not settings.scripts_dir.is_dir():
        raise ConfigError(
            f"bad server setting: RELAYGRAPH_SCRIPTS_DIR / --scripts {str(settings.scripts_dir)!r} "
            "is not a folder"
        )
    return settings
