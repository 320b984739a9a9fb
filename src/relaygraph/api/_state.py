"""What the API's routers share: the settings, the teams, the bearer-key dependency, and the
ledger and the task workers, which open when the app starts and close when it stops."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from anyio import to_thread
from fastapi import FastAPI

from relaygraph.api._auth import project_auth
from relaygraph.api._settings import ServiceSettings
from relaygraph.api._teams import TeamRegistry
from relaygraph.api._workers import TaskWorkers
from relaygraph.runner import ModelRules
from relaygraph.store import DATABASE_URL_ENV, Ledger, Project

__all__ = ["ServiceState"]


class ServiceState:
    """The task service's shared state, one per app.

    Args:
        settings: The service settings.
        home: The data directory.
        start_workers: Pick up unfinished tasks at start-up.

    Raises:
        ConfigError: A server team file is bad (the server does not start).
    """

    def __init__(self, settings: ServiceSettings, *, home: Path, start_workers: bool) -> None:
        self.settings = settings
        self.home = home
        self.start_workers = start_workers
        # The teams tasks run: the built-in one, the operator's team files (read now: a bad
        # one stops the server from starting) and the projects' registered teams.
        self.teams = TeamRegistry(ledger=self.ledger, settings=settings, home=home)
        self.model_rules = ModelRules(default=settings.default_model, allow=settings.request_model)
        """What a request may name as a model: the server's allowlist and scripts folder."""
        self.project_of: Callable[..., Project] = project_auth(self.ledger)
        """The dependency that answers a request's project from its bearer key."""
        self._ledger: Ledger | None = None
        self._workers: TaskWorkers | None = None

    def ledger(self) -> Ledger:
        """The server's ledger (open while the app runs)."""
        if self._ledger is None:
            raise RuntimeError("the task service has not started: its ledger is not open")
        return self._ledger

    def workers(self) -> TaskWorkers:
        """The server's task workers (running while the app runs)."""
        if self._workers is None:
            raise RuntimeError("the task service has not started: it has no workers")
        return self._workers

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Open the ledger (migrations run), start the workers and pick up unfinished tasks;
        at the end, stop the workers, then close the ledger."""
        url = self.settings.database_url
        if url is None and not os.environ.get(DATABASE_URL_ENV):
            url = f"sqlite:///{self.home / 'ledger.sqlite'}"
        ledger = Ledger(url)
        await to_thread.run_sync(ledger.upgrade)
        workers = TaskWorkers(
            ledger,
            home=self.home,
            workers=self.settings.workers,
            lease_seconds=self.settings.lease_seconds,
            max_attempts=self.settings.max_attempts,
            sandbox_isolation_required=not self.settings.unsafe_sandbox,
            teams=self.teams.resolve,
        )
        self._ledger, self._workers = ledger, workers
        if self.start_workers:
            await to_thread.run_sync(workers.recover)
            workers.sweep()
        try:
            yield
        finally:
            # Running tasks stop at their next step boundary and stay `running`, for the
            # next start to continue; the ledger closes after their last writes.
            await to_thread.run_sync(lambda: workers.shutdown(wait=True))
            ledger.close()
