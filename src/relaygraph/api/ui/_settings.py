"""The dashboard's settings, from ``RELAYGRAPH_UI_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DashboardSettings(BaseSettings):
    """How ``/ui`` behaves. Every field is also ``RELAYGRAPH_UI_<FIELD>`` in the env."""

    model_config = SettingsConfigDict(env_prefix="RELAYGRAPH_UI_", extra="ignore", frozen=True)

    idle_minutes: float = Field(default=30.0, gt=0, le=7 * 24 * 60)
    """A signed-in session unused this long ends (automatic refreshes do not count)."""
    show_evals: bool = False
    """Whether signed-in projects see the eval runs in the ledger. Eval runs belong to no
    project (the operator records them with ``relaygraph eval``), so every project would
    see every run: off unless the operator turns it on, on a server whose projects may all
    see them."""
    refresh_seconds: float = Field(default=3.0, ge=0.5, le=300)
    """How often the task list refreshes itself while some of its tasks run."""
