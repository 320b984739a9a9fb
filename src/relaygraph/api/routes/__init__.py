"""The task service's routes, one router per resource: tasks, their approvals and event
streams, the project's usage, its teams, the health checks and the operators' metrics. Each
router is made from the app's :class:`~relaygraph.api._state.ServiceState`.

The route modules do without ``from __future__ import annotations``: FastAPI reads their
annotations, and the project dependency is an alias local to each router.
"""

from relaygraph.api.routes.approvals import approvals_router
from relaygraph.api.routes.events import events_router
from relaygraph.api.routes.health import health_router
from relaygraph.api.routes.metrics import metrics_router
from relaygraph.api.routes.projects import projects_router
from relaygraph.api.routes.replays import replays_router
from relaygraph.api.routes.tasks import tasks_router
from relaygraph.api.routes.teams import teams_router

__all__ = [
    "approvals_router",
    "events_router",
    "health_router",
    "metrics_router",
    "projects_router",
    "replays_router",
    "tasks_router",
    "teams_router",
]
