"""The task service: the FastAPI app, assembled from its state and its routers."""

from fastapi import FastAPI

from relaygraph._home import data_home
from relaygraph.api._errors import (
    BodyLimit,
    document_errors_only_as_answered,
    install_error_handlers,
)
from relaygraph.api._settings import ServiceSettings
from relaygraph.api._state import ServiceState
from relaygraph.api.routes import (
    approvals_router,
    events_router,
    health_router,
    projects_router,
    tasks_router,
    teams_router,
)
from relaygraph.models import parse_model_spec

__all__ = ["create_app"]


def create_app(settings: ServiceSettings | None = None, *, start_workers: bool = True) -> FastAPI:
    """Build the API app. Migrations run and unfinished tasks restart when it starts.

    Args:
        settings: Service settings; read from the environment when None.
        start_workers: Pick up unfinished tasks at start-up (tests of a stopped server
            turn it off).
    """
    settings = settings or ServiceSettings()
    parse_model_spec(settings.default_model)
    state = ServiceState(settings, home=data_home(settings.home), start_workers=start_workers)
    app = FastAPI(
        title="relaygraph",
        version="0.1.0",
        description="Submit tasks to a supervised team of agents and follow them as they run.",
        lifespan=state.lifespan,
        openapi_url="/openapi.json",
        # Operation ids are the routes' names (`create_task`, `cancel`): the links use them.
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.service = state
    app.state.teams = state.teams
    install_error_handlers(app)
    document_errors_only_as_answered(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    for router in (
        teams_router,
        health_router,
        tasks_router,
        approvals_router,
        projects_router,
        events_router,
    ):
        app.include_router(router(state))
    _include_dashboard(app, state)
    return app


def _include_dashboard(app: FastAPI, state: ServiceState) -> None:
    """The audit dashboard (``/ui``) and the ``/v1`` endpoints it reads beyond the others."""
    from relaygraph.api._dashboard_api import dashboard_api_router
    from relaygraph.api._ui import ui_router
    from relaygraph.api.ui import DashboardSettings

    dashboard = DashboardSettings()
    app.include_router(
        dashboard_api_router(ledger=state.ledger, home=state.home, show_evals=dashboard.show_evals)
    )
    app.include_router(
        ui_router(
            ledger=state.ledger,
            workers=state.workers,
            team_of=state.teams.resolve,
            home=state.home,
            settings=dashboard,
        )
    )
