"""``GET /healthz`` and ``GET /readyz``: is the process up, is the service ready."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from relaygraph.api._errors import error_body, error_responses
from relaygraph.api._schemas import Status
from relaygraph.api._state import ServiceState

__all__ = ["health_router"]


def health_router(state: ServiceState) -> APIRouter:
    """The health endpoints (no key needed)."""
    router = APIRouter()

    @router.get("/healthz", response_model=Status)
    def healthz() -> dict[str, str]:
        """Answers while the process is up."""
        return {"status": "ok"}

    @router.get(
        "/readyz",
        response_model=Status,
        responses={200: {"description": '`{"status": "ready"}`'}, **error_responses(503)},
    )
    def readyz() -> JSONResponse:
        """Ready when the database is reachable and migrated (with a broker: and the broker
        takes connections, and the event listener is connected)."""
        problem = _not_ready(state)
        if problem is not None:
            return JSONResponse(error_body("not_ready", problem), status_code=503)
        return JSONResponse({"status": "ready"})

    return router


def _not_ready(state: ServiceState) -> str | None:
    """What keeps the service from taking requests, or None."""
    try:
        current = state.ledger().is_current()
    except Exception as exc:  # Any database failure means not ready.
        return f"database: {exc}"
    if not current:
        return "migrations pending"
    if not state.worker_mode:
        return None
    broker = state.broker().broker_problem()
    if broker is not None:
        return f"broker: {broker}"
    if state.listener is None or not state.listener.listening:
        return "event notices: the LISTEN connection to the database is down"
    return None
