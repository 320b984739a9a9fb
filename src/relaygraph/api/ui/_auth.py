"""Signing in and out of the dashboard, and its static files."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from relaygraph.api.ui._dashboard import SECURITY_HEADERS, Dashboard, dashboard_router, safe_next
from relaygraph.api.ui._sessions import COOKIE, LOGIN_COOKIE, same_token
from relaygraph.api.ui._templates import assets

KEY_PREFIX_CHARS = 10
"""How many of a key's first characters the ledger keeps to tell keys apart."""


def auth_router(dashboard: Dashboard) -> APIRouter:
    router = dashboard_router()

    def login_page(
        request: Request, *, status: int = 200, error: str | None = None, next_url: str = "/ui"
    ) -> Response:
        token = secrets.token_urlsafe(32)
        notice = None
        if request.query_params.get("expired"):
            minutes = dashboard.settings.idle_minutes
            notice = f"Your session ended after {minutes:g} minutes without activity."
        elif request.query_params.get("signed_out"):
            notice = "You are signed out."
        response = dashboard.page(
            request,
            "login.html",
            None,
            status=status,
            csrf=token,
            error=error,
            notice=notice,
            next_url=next_url,
        )
        _set_cookie(request, response, LOGIN_COOKIE, token, path="/ui/login")
        return response

    @router.get("/login")
    def login(request: Request) -> Response:
        session, _ = dashboard.session(request)
        next_url = safe_next(request.query_params.get("next"))
        if session is not None:
            return RedirectResponse(next_url, status_code=303, headers=SECURITY_HEADERS)
        return login_page(request, next_url=next_url)

    @router.post("/login")
    async def sign_in(request: Request) -> Response:
        form = await request.form()
        next_url = safe_next(str(form.get("next") or ""))
        if not same_token(str(form.get("csrf") or ""), request.cookies.get(LOGIN_COOKIE, "")):
            return login_page(
                request,
                status=403,
                error="The sign-in form had expired. Please enter your key again.",
                next_url=next_url,
            )
        key = str(form.get("key") or "").strip()
        project = dashboard.ledger().authenticate(key) if key else None
        if project is None:
            # The key is never echoed back, logged or kept.
            return login_page(
                request,
                status=401,
                error="That key is not valid, or it was revoked.",
                next_url=next_url,
            )
        key_ids = tuple(
            k.id
            for k in dashboard.ledger().api_keys(project.id)
            if k.revoked_at is None and k.prefix == key[:KEY_PREFIX_CHARS]
        )
        cookie = dashboard.sessions.open(
            project_id=project.id, project_name=project.name, key_ids=key_ids
        )
        response = RedirectResponse(next_url, status_code=303, headers=SECURITY_HEADERS)
        _set_cookie(request, response, COOKIE, cookie, path="/ui")
        response.delete_cookie(LOGIN_COOKIE, path="/ui/login")
        return response

    @router.post("/logout")
    async def sign_out(request: Request) -> Response:
        session, _ = dashboard.session(request)
        form = await request.form()
        if session is not None and same_token(str(form.get("csrf") or ""), session.csrf):
            dashboard.sessions.close(request.cookies.get(COOKIE))
        elif session is not None:
            return Response("The sign-out form had expired; reload the page.", status_code=403)
        response = RedirectResponse("/ui/login?signed_out=1", status_code=303)
        response.delete_cookie(COOKIE, path="/ui")
        return response

    @router.get("/static/{name}")
    def static(name: str, request: Request) -> Response:
        asset = assets().get(name)
        if asset is None:
            return Response("not found", status_code=404, media_type="text/plain")
        fresh = request.query_params.get("v") == asset.version
        cache = "public, max-age=31536000, immutable" if fresh else "no-cache"
        return Response(
            asset.body,
            media_type=asset.media_type,
            headers={"Cache-Control": cache, "X-Content-Type-Options": "nosniff"},
        )

    return router


def _set_cookie(request: Request, response: Response, name: str, value: str, *, path: str) -> None:
    response.set_cookie(
        name,
        value,
        path=path,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
