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
        """Ready when the database is reachable and migrated."""
        try:
            current = state.ledger().is_current()
        except Exception as exc:  # Any database failure means not ready.
            return JSONResponse(error_body("not_ready", f"database: {exc}"), status_code=503)
        if not current:
            return JSONResponse(error_body("not_ready", "migrations pending"), status_code=503)
        return JSONResponse({"status": "ready"})

    return router
