"""The task service's settings, from ``RELAYGRAPH_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from relaygraph.errors import ConfigError
from relaygraph.models import DEFAULT_MODEL

_FLAGS = {"default_model": "--model", "workers": "--workers", "policy_file": "--policy"}


class ServiceSettings(BaseSettings):
    """How ``relaygraph serve`` runs. Every field is also ``RELAYGRAPH_<FIELD>`` in the env."""

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_", extra="ignore", frozen=True)

    default_model: str = DEFAULT_MODEL
    """The model of tasks that name none (``serve --model``)."""
    allowed_models: list[str] = Field(default_factory=lambda: ["openai:*", "local:smollm2"])
    """Model specs a request may name; ``*`` matches anything (``openai:*``)."""
    allow_scripted: bool = False
    """Let requests name ``scripted:`` specs (they read a file on the server)."""
    workers: int = Field(default=2, ge=1, le=64)
    """Tasks that run at once in the server process."""
    lease_seconds: float = Field(default=30.0, ge=1.0, le=3600.0)
    """How long a running task's lease lasts unrenewed: when a server dies, another server
    on the same ledger continues its tasks after this long (a server that stops cleanly
    lets go at once)."""
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413."""
    policy_file: Path | None = None
    """The teams' base policy; a request's policy may only tighten it."""
    database_url: str | None = None
    """The ledger (else ``$RELAYGRAPH_DATABASE_URL``, else SQLite in the data directory)."""
    home: Path | None = None
    """The data directory (else ``$RELAYGRAPH_HOME`` or ``~/.relaygraph``)."""

    def model_allowed(self, spec: str) -> bool:
        if spec == self.default_model:
            return True
        if spec.startswith("scripted:"):
            return self.allow_scripted or self.default_model.startswith("scripted:")
        return any(fnmatch.fnmatchcase(spec, pattern) for pattern in self.allowed_models)


def load_settings(**overrides: Any) -> ServiceSettings:
    """The server's settings: ``overrides`` (the ``serve`` flags) over the environment.

    Raises:
        ConfigError: A setting is invalid; the message names its variable (and flag) and
            the value.
    """
    try:
        return ServiceSettings(**overrides)
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
