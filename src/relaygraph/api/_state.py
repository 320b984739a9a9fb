"""What the API's routers share: the settings, the teams, the bearer-key dependency, and the
ledger and the task dispatch (the server's own workers, or RabbitMQ in the worker mode), which
open when the app starts and close when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from relaygraph.api._auth import project_auth
from relaygraph.api._dispatch import TaskDispatch
from relaygraph.api._errors import ErrorAnswer
from relaygraph.api._in_process import InProcessDispatch, WorkersLoad
from relaygraph.api._processes import TaskProcesses, shares
from relaygraph.api._settings import ServiceSettings
from relaygraph.api._streams import StreamGate
from relaygraph.api._teams import TeamRegistry
from relaygraph.errors import ConfigError
from relaygraph.runner import RETENTION_SWEEP_SECONDS, Intake, ModelRules, collect_garbage
from relaygraph.store import DATABASE_URL_ENV, Ledger, Project, database_url

if TYPE_CHECKING:
    from relaygraph.api._broker import BrokerDispatch
    from relaygraph.worker import EventListener, WorkerSettings

__all__ = ["ServiceState"]

SWEEP_SECONDS = 60.0
"""How often a worker-mode API server looks for tasks whose message was lost
(``BrokerDispatch.sweep_lost``; Celery is imported only in that mode)."""
LISTEN_START_SECONDS = 10.0
"""How long a starting server waits for its event listener before it serves without it
(its streams poll until the listener connects; ``/readyz`` says not ready meanwhile)."""

log = logging.getLogger("relaygraph.api")


class ServiceState:
    """The task service's shared state, one per app.

    Args:
        settings: The service settings.
        home: The data directory.
        start_workers: Pick up unfinished tasks at start-up (in the worker mode: publish
            again the tasks that waited ``queued`` too long).
        worker_settings: The worker mode's settings when it has a broker: the server then
            runs no tasks itself; it records them and publishes their ids. None: tasks run
            in the server process.

    Raises:
        ConfigError: A server team file is bad, or the worker mode's ledger is not
            PostgreSQL (the server does not start).
    """

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        home: Path,
        start_workers: bool,
        worker_settings: WorkerSettings | None = None,
    ) -> None:
        self.settings = settings
        self.home = home
        self.start_workers = start_workers
        self.worker_settings = worker_settings
        """The worker mode's settings; None when tasks run in this process."""
        self.sweep_seconds = SWEEP_SECONDS
        """How often the worker mode looks for tasks whose message was lost."""
        if worker_settings is not None and settings.processes > 1:
            raise ConfigError(
                f"bad server setting: RELAYGRAPH_PROCESSES / --processes {settings.processes}: "
                "in the worker mode (RELAYGRAPH_BROKER_URL is set) the server runs no tasks; "
                "start more `relaygraph worker` processes instead"
            )
        self._shared_url = None if worker_settings is None else _shared_ledger_url(settings)
        # The teams tasks run: the built-in one, the operator's team files (read now: a bad
        # one stops the server from starting) and the projects' registered teams.
        self.teams = TeamRegistry(ledger=self.ledger, settings=settings, home=home)
        self.model_rules = ModelRules(default=settings.default_model, allow=settings.request_model)
        """What a request may name as a model: the server's allowlist and scripts folder."""
        self.project_of: Callable[..., Project] = project_auth(self.ledger)
        """The dependency that answers a request's project from its bearer key."""
        self.streams = StreamGate(max_per_project=settings.project_max_streams)
        """The open event streams of each project, and the file descriptors kept free."""
        self.listener: EventListener | None = None
        """The worker mode's event notices (PostgreSQL LISTEN), while the app runs."""
        self._ledger: Ledger | None = None
        self._dispatch: TaskDispatch | None = None
        self._broker: BrokerDispatch | None = None
        self._workers: InProcessDispatch | None = None

    @property
    def worker_mode(self) -> bool:
        """Whether tasks run on ``relaygraph worker`` processes rather than in this one."""
        return self.worker_settings is not None

    def ledger(self) -> Ledger:
        """The server's ledger (open while the app runs)."""
        if self._ledger is None:
            raise RuntimeError("the task service has not started: its ledger is not open")
        return self._ledger

    def dispatch(self) -> TaskDispatch:
        """Where tasks go to run: the server's workers, or the broker (while the app runs)."""
        if self._dispatch is None:
            raise RuntimeError("the task service has not started: it cannot run tasks")
        return self._dispatch

    def intake(self) -> Intake:
        """Where the server records and starts the tasks submitted to it (while the app
        runs): its ledger, its model rules, its dispatch and its quotas."""
        return Intake(
            ledger=self.ledger(),
            model_rules=self.model_rules,
            enqueue=self.dispatch().enqueue,
            quotas=self.settings.quotas,
        )

    def workers_load(self) -> WorkersLoad | None:
        """What this process's workers hold now; None in the worker mode (or not started)."""
        return None if self._workers is None else self._workers.load()

    def broker(self) -> BrokerDispatch:
        """The worker mode's publisher (while the app runs).

        Raises:
            RuntimeError: Not in the worker mode, or not started.
        """
        if self._broker is None:
            raise RuntimeError("the task service has no broker (not in the worker mode)")
        return self._broker

    def lifespan(self, app: FastAPI) -> AbstractAsyncContextManager[None]:
        """Open the ledger (migrations run) and what runs the tasks; close them at the end."""
        return self._worker_mode() if self.worker_mode else self._in_process()

    @asynccontextmanager
    async def _in_process(self) -> AsyncIterator[None]:
        """Start the workers and pick up unfinished tasks; at the end, stop the workers,
        then close the ledger."""
        url = self.settings.database_url
        if url is None and not os.environ.get(DATABASE_URL_ENV):
            url = f"sqlite:///{self.home / 'ledger.sqlite'}"
        ledger = Ledger(url)
        await to_thread.run_sync(ledger.upgrade)
        await to_thread.run_sync(self.teams.warn_of_shadowed, ledger)
        spread = self.settings.processes > 1
        workers = InProcessDispatch(
            ledger,
            home=self.home,
            workers=shares(self.settings.workers, self.settings.processes)[0],
            lease_seconds=self.settings.lease_seconds,
            max_attempts=self.settings.max_attempts,
            sandbox_isolation_required=not self.settings.unsafe_sandbox,
            teams=self.teams.resolve,
            policies=self.teams.policy_for,
            # Always from the ledger, fairly: a pool's own queue would serve the projects
            # first in, first out, and one project's flood would hold every worker.
            pull=True,
            workspace_quota=self.settings.workspace_quota(),
            quotas=self.settings.quotas,
            model_calls=self.settings.model_call_recording(),
        )
        dispatch: InProcessDispatch | TaskProcesses = workers
        if spread:
            dispatch = TaskProcesses(
                workers, settings=self.settings, url=url or database_url(None), home=self.home
            )
        self._ledger, self._dispatch, self._workers = ledger, dispatch, workers
        retention = _start_retention(ledger, self.home, self.settings)
        if self.start_workers:
            if isinstance(dispatch, TaskProcesses):
                dispatch.start()
            workers.start_pulling()
            await to_thread.run_sync(workers.recover)
            workers.sweep()
        try:
            yield
        finally:
            # Running tasks stop at their next step boundary and stay `running`, for the
            # next start to continue; the ledger closes after their last writes.
            await _stop(retention)
            await to_thread.run_sync(lambda: dispatch.shutdown(wait=True))
            ledger.close()

    @asynccontextmanager
    async def _worker_mode(self) -> AsyncIterator[None]:
        """Run no tasks: open the publisher and the event listener, and publish again what
        waited ``queued`` too long; at the end, close them, then the ledger."""
        # Celery is the `workers` extra: imported only in the worker mode.
        from relaygraph.api._broker import BrokerDispatch
        from relaygraph.worker import EventListener, create_celery_app, libpq_url

        settings, url = self.worker_settings, self._shared_url
        assert settings is not None and url is not None
        # The API's own ledger writes (a cancel's last event) notify the streams as well.
        ledger = Ledger(url, notify_channel=settings.events_channel)
        await to_thread.run_sync(ledger.upgrade)
        await to_thread.run_sync(self.teams.warn_of_shadowed, ledger)
        broker = BrokerDispatch(
            ledger,
            create_celery_app(settings),
            publish_ahead=settings.publish_ahead,
            max_running=self.settings.project_max_running,
        )
        listener = EventListener(libpq_url(url), channel=settings.events_channel)
        try:
            await to_thread.run_sync(lambda: listener.start(timeout=LISTEN_START_SECONDS))
        except ConnectionError as exc:  # It keeps trying; streams poll meanwhile.
            log.warning("event notices unavailable at start: %s", exc)
        self._ledger, self._dispatch, self._broker = ledger, broker, broker
        self.listener = listener
        sweeping: asyncio.Task[None] | None = None
        retention = _start_retention(ledger, self.home, self.settings)
        try:
            if self.start_workers:
                await to_thread.run_sync(broker.republish_stale)
                try:
                    await to_thread.run_sync(broker.publish_held)
                except ErrorAnswer as exc:  # The broker is away: the sweep tries again.
                    log.warning("queued tasks not published at start: %s", exc.message)
                sweeping = asyncio.create_task(_sweep_lost(broker, self.sweep_seconds))
            yield
        finally:
            await _stop(sweeping)
            await _stop(retention)
            await to_thread.run_sync(listener.close)
            self.listener = None
            broker.close()
            ledger.close()


async def _sweep_lost(broker: Any, every: float) -> None:
    """Every ``every`` seconds, publish again what lost its message (``sweep_lost``); a
    failing sweep is logged and tried again at the next."""
    while True:
        await asyncio.sleep(every)
        try:
            swept = await to_thread.run_sync(broker.sweep_lost)
        except Exception:  # The ledger away for a moment must not end the server's loop.
            log.exception("the sweep for tasks that lost their message failed")
            continue
        if swept:
            log.info("published %d task(s) again whose message was lost", swept)
        try:
            held = await to_thread.run_sync(broker.publish_held)
        except Exception:  # As above: the next sweep tries again.
            log.exception("publishing the queued tasks that wait in the ledger failed")
            continue
        if held:
            log.info("published %d queued task(s) that waited in the ledger", held)


def _start_retention(
    ledger: Ledger, home: Path, settings: ServiceSettings
) -> asyncio.Task[None] | None:
    """With ``RELAYGRAPH_RETENTION_DAYS``, delete old tasks' files now and every
    :data:`~relaygraph.runner.RETENTION_SWEEP_SECONDS` (``collect_garbage``)."""
    days = settings.retention_days
    if days is None:
        return None

    async def loop() -> None:
        while True:
            try:
                freed = await to_thread.run_sync(
                    lambda: collect_garbage(
                        ledger, home, older_than_days=days, artifacts=settings.retention_artifacts
                    )
                )
            except Exception:  # The ledger away for a moment must not end the loop.
                log.warning("deleting the files of old tasks failed", exc_info=True)
            else:
                if freed.tasks:
                    log.info(
                        "retention: deleted %d files (%d bytes) of %d tasks ended over %g days ago",
                        freed.files,
                        freed.bytes,
                        freed.tasks,
                        days,
                    )
            await asyncio.sleep(RETENTION_SWEEP_SECONDS)

    return asyncio.create_task(loop())


async def _stop(task: asyncio.Task[None] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _shared_ledger_url(settings: ServiceSettings) -> str:
    """The worker mode's ledger: PostgreSQL, which every API server and worker shares.

    Raises:
        ConfigError: The ledger would be SQLite (a file only this process sees).
    """
    url = database_url(settings.database_url)
    if make_url(url).get_backend_name() != "postgresql":
        raise ConfigError(
            "the worker mode (RELAYGRAPH_BROKER_URL is set) needs the ledger on PostgreSQL, "
            "shared by every API server and worker: set RELAYGRAPH_DATABASE_URL to "
            "postgresql+psycopg://USER:PASSWORD@HOST:5432/DATABASE (the ledger would be "
            f"{make_url(url).render_as_string(hide_password=True)})"
        )
    return url
