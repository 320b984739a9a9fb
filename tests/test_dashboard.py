"""The audit dashboard in process: sign-in and sessions, the pages, and the ``/v1`` endpoints
it reads (httpx.ASGITransport, lifespan run by hand). The browser tests are in
``test_dashboard_browser.py``."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from relaygraph.api import ServiceSettings, create_app
from relaygraph.store import Ledger

from .conftest import EXAMPLE_RELAY

FINISHED = ("succeeded", "degraded", "failed", "cancelled")
HTML = {"Accept": "text/html"}
REFUSING = {
    "supervisor": [
        {"route": {"next": "researcher", "task": "Look it up", "reason": "facts first"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ],
    "researcher": [
        {"tool_calls": [{"name": "run_python", "args": {"code": "print(1)"}}]},
        {"content": "I may not run code; checkpoints are written after each super-step."},
    ],
    "finalize": [{"content": "Checkpoints are written after every super-step."}],
}
"""A task in which the researcher calls a tool it is not allowed: one violation."""
APPROVAL_POLICY = {"agents": {"coder": {"approval": ["run_python"]}}}


class Dash:
    """The app in process, with a signed-in browser per project."""

    def __init__(self, app: FastAPI, ledger_url: str, scripts: Path) -> None:
        self.app = app
        self.ledger_url = ledger_url
        self.scripts = scripts

    def key(self, name: str) -> str:
        with Ledger(self.ledger_url) as ledger:
            return ledger.create_project(name)[1]

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://test")

    @asynccontextmanager
    async def browser(self, key: str) -> AsyncIterator[httpx.AsyncClient]:
        """A client signed in with ``key`` (its cookies are the session)."""
        async with self.client() as client:
            await sign_in(client, key)
            yield client

    def script(self, name: str, turns: dict[str, Any]) -> str:
        import json

        (self.scripts / name).write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{name}"

    async def submit(self, key: str, **body: Any) -> dict[str, Any]:
        async with self.client() as client:
            made = await client.post("/v1/tasks", json=body, headers=bearer(key))
            assert made.status_code == 202, made.text
            return made.json()  # type: ignore[no-any-return]

    async def wait(self, key: str, task_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        async with self.client() as client:
            while time.monotonic() < deadline:
                task = (await client.get(f"/v1/tasks/{task_id}", headers=bearer(key))).json()
                if task["status"] in statuses:
                    return task  # type: ignore[no-any-return]
                await asyncio.sleep(0.05)
        raise AssertionError(f"task {task_id} did not reach {statuses}")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, key: str, next_url: str = "/ui") -> httpx.Response:
    form = await client.get("/ui/login", headers=HTML)
    return await client.post(
        "/ui/login", data={"key": key, "csrf": csrf_of(form.text), "next": next_url}
    )


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir()
    shutil.copy(EXAMPLE_RELAY, folder / "relay.json")
    return folder


@asynccontextmanager
async def running(home: Path, scripts: Path) -> AsyncIterator[Dash]:
    """The task service with its dashboard, started (and stopped after)."""
    settings = ServiceSettings(
        default_model=f"scripted:{EXAMPLE_RELAY}", scripts_dir=scripts, home=home, workers=2
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield Dash(app, f"sqlite:///{home / 'ledger.sqlite'}", scripts)


@pytest.fixture
async def dash(home: Path, scripts: Path) -> AsyncIterator[Dash]:
    async with running(home, scripts) as started:
        yield started


# -- signing in and sessions ------------------------------------------------------------


async def test_sign_in_keeps_the_key_out_of_urls_cookies_and_pages(dash: Dash) -> None:
    key = dash.key("acme")
    async with dash.client() as client:
        away = await client.get("/ui/tasks/abc?x=1", headers=HTML)
        assert away.status_code == 303
        assert away.headers["location"] == "/ui/login?next=%2Fui%2Ftasks%2Fabc%3Fx%3D1"
        page = await client.get("/ui/login", headers=HTML)
        assert 'name="key"' in page.text and 'type="password"' in page.text
        wrong = await client.post(
            "/ui/login", data={"key": key + "x", "csrf": csrf_of(page.text), "next": "/ui"}
        )
        assert wrong.status_code == 401
        assert "not valid" in wrong.text and key not in wrong.text
        signed = await sign_in(client, key, next_url="/ui/usage")
        assert signed.status_code == 303 and signed.headers["location"] == "/ui/usage"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert key not in cookie and key[3:] not in cookie
        tasks = await client.get("/ui", headers=HTML)
        assert tasks.status_code == 200 and key not in tasks.text
        assert "acme" in tasks.text
    # Only dashboard addresses are followed after signing in.
    async with dash.client() as client:
        elsewhere = await sign_in(client, key, next_url="https://evil.example/")
        assert elsewhere.headers["location"] == "/ui"


async def test_sign_in_form_and_sign_out_need_their_csrf_token(dash: Dash) -> None:
    key = dash.key("acme")
    async with dash.client() as client:
        await client.get("/ui/login", headers=HTML)
        forged = await client.post("/ui/login", data={"key": key, "csrf": "made-up"})
        assert forged.status_code == 403
        await sign_in(client, key)
        kept = await client.post("/ui/logout", data={"csrf": "made-up"})
        assert kept.status_code == 403
        assert (await client.get("/ui", headers=HTML)).status_code == 200
        page = await client.get("/ui", headers=HTML)
        out = await client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login?signed_out=1"


async def test_a_session_ends_at_sign_out_even_for_a_copied_cookie(dash: Dash) -> None:
    key = dash.key("acme")
    async with dash.client() as client:
        await sign_in(client, key)
        copied = dict(client.cookies)
        page = await client.get("/ui", headers=HTML)
        await client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
    async with dash.client() as thief:
        for name, value in copied.items():
            thief.cookies.set(name, value)
        assert (await thief.get("/ui", headers=HTML)).status_code == 303


async def test_an_idle_session_ends_and_refreshes_do_not_keep_it(
    home: Path, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGRAPH_UI_IDLE_MINUTES", "0.02")  # 1.2 s
    refresh = {"X-Relaygraph-Refresh": "1", "Accept": "application/json"}
    async with running(home, scripts) as dash, dash.browser(dash.key("acme")) as client:
        await asyncio.sleep(0.7)
        assert (await client.get("/ui", headers=HTML)).status_code == 200  # a person: kept
        await asyncio.sleep(0.7)
        assert (await client.get("/ui?fragment=rows", headers=refresh)).status_code == 200
        await asyncio.sleep(0.7)  # 1.4 s since the person's last request; refreshes don't count
        assert (await client.get("/ui?fragment=rows", headers=refresh)).status_code == 401
        gone = await client.get("/ui", headers=HTML)
        assert gone.status_code == 303 and gone.headers["location"].startswith("/ui/login?next=")
        said = await client.get("/ui/login?expired=1", headers=HTML)
        assert "without activity" in said.text


async def test_a_revoked_key_ends_its_sessions(dash: Dash) -> None:
    key = dash.key("acme")
    async with dash.browser(key) as client:
        assert (await client.get("/ui", headers=HTML)).status_code == 200
        with Ledger(dash.ledger_url) as ledger:
            project = ledger.authenticate(key)
            assert project is not None
            for each in ledger.api_keys(project.id):
                ledger.revoke_api_key(each.id)
        assert (await client.get("/ui", headers=HTML)).status_code == 303


async def test_pages_forbid_inline_script_and_framing(dash: Dash) -> None:
    async with dash.browser(dash.key("acme")) as client:
        page = await client.get("/ui", headers=HTML)
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "<script>" not in page.text and " style=" not in page.text
        script = await client.get("/ui/static/dashboard.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert (await client.get("/ui/static/..%2F_ui.py")).status_code == 404
