"""The task service: the FastAPI app, assembled from its state and its routers."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from relaygraph._home import data_home
from relaygraph.api._errors import (
    BodyLimit,
    document_errors_only_as_answered,
    install_error_handlers,
    one_value_per_query_parameter,
)
from relaygraph.api._settings import BROKER_URL_ENV, ServiceSettings
from relaygraph.api._state import ServiceState
from relaygraph.api.routes import (
    approvals_router,
    events_router,
    health_router,
    metrics_router,
    projects_router,
    replays_router,
    tasks_router,
    teams_router,
)
from relaygraph.errors import ConfigError
from relaygraph.models import parse_model_spec

if TYPE_CHECKING:
    from relaygraph.worker import WorkerSettings

__all__ = ["create_app"]


def create_app(
    settings: ServiceSettings | None = None,
    *,
    start_workers: bool = True,
    worker_settings: WorkerSettings | None = None,
) -> FastAPI:
    """Build the API app. Migrations run and unfinished tasks restart when it starts.

    With a broker (``RELAYGRAPH_BROKER_URL``, docs/deploy.md) the server runs no tasks: it
    records each in the ledger, which must be PostgreSQL, and publishes its id for a
    ``relaygraph worker``.

    Args:
        settings: Service settings; read from the environment when None.
        start_workers: Pick up unfinished tasks at start-up (tests of a stopped server
            turn it off).
        worker_settings: The worker mode's settings; read from the environment when None
            (:func:`relaygraph.worker.load_worker_settings`). Without a broker URL in
            them, tasks run in this process.

    Raises:
        ConfigError: A bad setting; in the worker mode, a ledger that is not PostgreSQL.
    """
    settings = settings or ServiceSettings()
    parse_model_spec(settings.default_model)
    broker = worker_settings or _worker_settings()
    state = ServiceState(
        settings,
        home=data_home(settings.home),
        start_workers=start_workers,
        worker_settings=broker if broker is not None and broker.broker_url else None,
    )
    app = FastAPI(
        title="relaygraph",
        version="0.1.0",
        description="Submit tasks to a supervised team of agents and follow them as they run.",
        lifespan=state.lifespan,
        openapi_url="/openapi.json",
        # Operation ids are the routes' names (`create_task`, `cancel`): the links use them.
        generate_unique_id_function=lambda route: route.name,
        dependencies=[Depends(one_value_per_query_parameter)],
    )
    app.state.service = state
    app.state.teams = state.teams
    install_error_handlers(app)
    document_errors_only_as_answered(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    for router in (
        teams_router,
        health_router,
        metrics_router,
        tasks_router,
        replays_router,
        approvals_router,
        projects_router,
        events_router,
    ):
        app.include_router(router(state))
    _include_dashboard(app, state)
    return app


def _worker_settings() -> WorkerSettings | None:
    """The worker mode's settings from the environment; None when Celery is not installed
    and no broker is asked for (the single-machine server needs neither).

    Raises:
        ConfigError: A bad worker setting, or a broker without Celery installed.
    """
    try:
        from relaygraph.worker import load_worker_settings
    except ImportError as exc:  # Celery is the `workers` extra.
        if os.environ.get(BROKER_URL_ENV):
            raise ConfigError(
                f"{BROKER_URL_ENV} is set, but the worker mode is not installed ({exc}): "
                "pip install 'relaygraph[workers]'"
            ) from None
        return None
    return load_worker_settings()


def _include_dashboard(app: FastAPI, state: ServiceState) -> None:
    """The audit dashboard (``/ui``) and the ``/v1`` endpoints it reads beyond the others."""
    from relaygraph.api._dashboard_api import dashboard_api_router
    from relaygraph.api._ui import ui_router
    from relaygraph.api.routes.replays import replay_in_project
    from relaygraph.api.ui import DashboardSettings

    dashboard = DashboardSettings()
    app.include_router(
        dashboard_api_router(ledger=state.ledger, home=state.home, show_evals=dashboard.show_evals)
    )
    app.include_router(
        ui_router(
            ledger=state.ledger,
            dispatch=state.dispatch,
            notices=lambda: state.listener,
            task_team=state.teams.resolve,
            home=state.home,
            settings=dashboard,
            streams=state.streams,
            quotas=state.settings.quotas,
            replay=lambda project_id, task, body: (
                replay_in_project(state, project_id, task, body).task
            ),
        )
    )
