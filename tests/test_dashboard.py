"""The audit dashboard in process: sign-in and sessions, the pages, and the ``/v1`` endpoints
it reads (httpx.ASGITransport, lifespan run by hand). The browser tests are in
``test_dashboard_browser.py``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from relaygraph.api import ServiceSettings, _ui, create_app
from relaygraph.api.ui._charts import usage_chart
from relaygraph.api.ui._graph import HandoffGraph, Transfer, layout, text_width, transfers_of
from relaygraph.api.ui._queries import DEFAULT_USAGE_DAYS, DailyUsage, DayUsage
from relaygraph.api.ui._sessions import SessionStore
from relaygraph.events import PREVIEW_CHARS
from relaygraph.store import Event, HandoffEntry, Ledger, QuotaOverrides

from ._scripts import COUNTED_BY_THE_REVIEWER, REFUSED_RUN_PYTHON, call, one_visit, say
from ._service import FINISHED, auth
from .conftest import EXAMPLE_RELAY, REPO, isolation_missing
from .test_timeline import record_task

HTML = {"Accept": "text/html"}
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

    async def paused(self, key: str) -> dict[str, Any]:
        """A task of the project ``key`` whose coder's program waits for a person's
        approval (:data:`APPROVAL_POLICY`)."""
        task = await self.submit(key, input="Compute it", policy=APPROVAL_POLICY)
        await self.wait(key, task["id"], ("interrupted",))
        return task

    async def finished(self, key: str, **body: Any) -> dict[str, Any]:
        """The task of ``body`` submitted as the project ``key``, once it has finished
        (as :meth:`submit` answered it)."""
        task = await self.submit(key, **body)
        await self.wait(key, task["id"], FINISHED)
        return task

    async def submit(self, key: str, **body: Any) -> dict[str, Any]:
        async with self.client() as client:
            made = await client.post("/v1/tasks", json=body, headers=auth(key))
            assert made.status_code == 202, made.text
            return made.json()

    async def wait(self, key: str, task_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        async with self.client() as client:
            while time.monotonic() < deadline:
                task = (await client.get(f"/v1/tasks/{task_id}", headers=auth(key))).json()
                if task["status"] in statuses:
                    return task
                await asyncio.sleep(0.05)
        raise AssertionError(f"task {task_id} did not reach {statuses}")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "the page has no CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, key: str, next_url: str = "/ui") -> httpx.Response:
    form = await client.get("/ui/login", headers=HTML)
    return await client.post(
        "/ui/login", data={"key": key, "csrf": csrf_of(form.text), "next": next_url}
    )


@asynccontextmanager
async def running(
    home: Path, scripts: Path, *, start_workers: bool = True, **more: Any
) -> AsyncIterator[Dash]:
    """The task service with its dashboard, started (and stopped after); without
    ``start_workers``, its workers take no task, so a task a test queues stays queued."""
    settings = ServiceSettings(
        default_model=f"scripted:{EXAMPLE_RELAY}",
        scripts_dir=scripts,
        home=home,
        workers=2,
        # The dashboard shows what the coder's program did, not how it was isolated.
        unsafe_sandbox=isolation_missing(),
        **more,
    )
    app = create_app(settings, start_workers=start_workers)
    async with app.router.lifespan_context(app):
        yield Dash(app, f"sqlite:///{home / 'ledger.sqlite'}", scripts)


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
    # The sessions' own clock, moved by the test: a loaded machine's pauses between the
    # requests must not count as idle time.
    clock = [0.0]
    monkeypatch.setattr(_ui, "SessionStore", partial(SessionStore, clock=lambda: clock[0]))
    refresh = {"X-Relaygraph-Refresh": "1", "Accept": "application/json"}
    async with running(home, scripts) as dash, dash.browser(dash.key("acme")) as client:
        clock[0] += 0.7
        assert (await client.get("/ui", headers=HTML)).status_code == 200  # a person: kept
        clock[0] += 0.7
        assert (await client.get("/ui?fragment=rows", headers=refresh)).status_code == 200
        clock[0] += 0.7  # 1.4 s since the person's last request; refreshes don't count
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


# -- tasks: the list, a task's page, another project's ------------------------------------


async def test_task_summaries_count_and_filter(dash: Dash) -> None:
    key = dash.key("acme")
    relay = await dash.submit(key, input="When are checkpoints written?")
    refused = await dash.submit(
        key, input="Look it up, no code", model=dash.script("refusing.json", REFUSED_RUN_PYTHON)
    )
    await dash.wait(key, relay["id"], FINISHED)
    await dash.wait(key, refused["id"], FINISHED)
    async with dash.client() as client:

        async def page(**query: str) -> dict[str, Any]:
            got = await client.get("/v1/task-summaries", params=query, headers=auth(key))
            assert got.status_code == 200, got.text
            return got.json()

        every = {t["id"]: t for t in (await page())["tasks"]}
        assert list(every) == [refused["id"], relay["id"]]  # newest first
        assert every[relay["id"]]["agents"] == ["researcher", "coder", "writer"]
        assert every[relay["id"]]["handoffs"] == 3 and every[relay["id"]]["violations"] == 0
        assert every[refused["id"]]["violation_kinds"] == ["tool_not_allowed"]
        assert every[refused["id"]]["violations"] == 1 and every[relay["id"]]["tokens"] > 0

        def ids(found: dict[str, Any]) -> list[str]:
            return [t["id"] for t in found["tasks"]]

        assert ids(await page(violation="tool_not_allowed")) == [refused["id"]]
        assert ids(await page(agent="coder")) == [relay["id"]]
        assert ids(await page(q="NO CODE")) == [refused["id"]]
        assert ids(await page(q=relay["id"][:8])) == [relay["id"]]
        assert ids(await page(status="succeeded")) == [refused["id"], relay["id"]]
        later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        assert ids(await page(since=later)) == []
        assert ids(await page(until=later)) == [refused["id"], relay["id"]]
        first = await page(limit="1")
        assert ids(first) == [refused["id"]] and first["next_cursor"]
        assert ids(await page(limit="1", cursor=first["next_cursor"])) == [relay["id"]]
        bad = await client.get("/v1/task-summaries", params={"cursor": "nope"}, headers=auth(key))
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "cursor"
        bogus = await client.get(
            "/v1/task-summaries", params={"violation": "bogus"}, headers=auth(key)
        )
        assert bogus.status_code == 422, bogus.text
        assert bogus.json()["error"]["field"] == "violation"
        assert "'bogus'" in bogus.json()["error"]["message"]
        assert (await client.get("/v1/task-summaries")).status_code == 401
    async with dash.browser(key) as browser:
        listed = await browser.get("/ui", params={"violation": "tool_not_allowed"}, headers=HTML)
        assert refused["id"] in listed.text and relay["id"] not in listed.text
        assert 'class="count-bad"' in listed.text
        nothing = await browser.get("/ui", params={"q": "zebra"}, headers=HTML)
        assert "No task matches these filters" in nothing.text


async def test_the_empty_list_says_how_to_submit_a_task(dash: Dash) -> None:
    async with dash.browser(dash.key("acme")) as client:
        page = await client.get("/ui", headers=HTML)
        assert "No tasks yet" in page.text and "/v1/tasks" in page.text


async def test_another_projects_task_is_not_found(dash: Dash) -> None:
    mine, theirs = dash.key("acme"), dash.key("globex")
    task = await dash.finished(mine, input="When are checkpoints written?")
    async with dash.browser(theirs) as client:
        page = await client.get(f"/ui/tasks/{task['id']}", headers=HTML)
        assert page.status_code == 404 and "Not found" in page.text
        assert "checkpoints" not in page.text
        assert task["id"] not in (await client.get("/ui", headers=HTML)).text
        events = await client.get(f"/ui/tasks/{task['id']}/events")
        assert events.status_code == 404
        artifact = await client.get(f"/ui/tasks/{task['id']}/artifacts/report.md", headers=HTML)
        assert artifact.status_code == 404
        fragment = await client.get(f"/ui/tasks/{task['id']}?fragment=1")
        assert fragment.status_code == 404
    async with dash.client() as client:
        for path in ("artifacts", "artifacts/report.md"):
            got = await client.get(f"/v1/tasks/{task['id']}/{path}", headers=auth(theirs))
            assert got.status_code == 404 and got.json()["error"]["code"] == "task_not_found"


async def test_task_page_shows_the_trace_the_graph_and_the_budgets(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.finished(key, input="When are checkpoints written?")
    async with dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        trace = (await client.get(f"/v1/tasks/{task['id']}/trace", headers=auth(key))).json()
    edges = re.findall(
        r'data-edge="(\d+)" data-from="(\w+)" data-to="(\w+)" data-kind="(\w+)"', page
    )
    assert edges == [
        ("1", "supervisor", "researcher", "route"),
        ("2", "researcher", "coder", "direct"),
        ("3", "supervisor", "writer", "route"),
    ]
    for reason in (
        "the request needs facts from the docs",
        "a calculation is best checked by running code",
        "the facts and the numbers are in; a report is the deliverable",
    ):
        assert reason in page
    # The timeline holds every node of GET /v1/tasks/{id}/trace, in order.

    def seqs(nodes: list[dict[str, Any]]) -> list[int]:
        found: list[int] = []
        for node in nodes:
            found.append(node["seq"])
            found += seqs(node.get("children", []))
        return found

    timeline = page[page.index('id="section-timeline"') : page.index('id="section-answer"')]
    assert [int(s) for s in re.findall(r'data-seq="(\d+)"', timeline)] == seqs(trace["children"])
    assert 'data-budget="team"' in page and "agent visits" in page
    assert "report.md" in page and "# Checkpoint durability" in page  # the artifact, shown
    assert trace["answer"] in page.replace("&#39;", "'")


async def test_model_retries_failures_a_suspended_run_and_a_cut_result_on_the_page(
    home: Path, scripts: Path
) -> None:
    # Written before the server starts, so that no worker of it takes the task up.
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        project, key = ledger.create_project("acme")
        task_id = record_task(ledger, project_id=project.id)
    async with running(home, scripts) as dash, dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task_id}", headers=HTML)).text
        trace = (await client.get(f"/v1/tasks/{task_id}/trace", headers=auth(key))).json()
    timeline = page[page.index('id="section-timeline"') : page.index('id="section-answer"')]
    shown = re.findall(r'data-seq="\d+" data-kind="(\w+)"', timeline)
    assert shown.count("model_retry") == 2 and shown.count("model_error") == 1
    assert "run_suspended" in shown
    assert "the server is shutting down" in timeline and "HTTP 500: the server broke" in timeline
    # The page and GET /v1/tasks/{id}/trace show the same nodes.
    kinds = [n["kind"] for n in trace["children"]]
    assert "model_retry" in kinds and "run_suspended" in kinds
    [visit] = [n for n in trace["children"] if n["kind"] == "agent"]
    assert [c["kind"] for c in visit["children"]][2:] == ["model_retry", "model_error"]
    # The result the ledger kept only the start of says so; the whole one does not.
    [cut] = re.findall(r"<details[^>]*data-preview-cut[^>]*>.*?</details>", timeline, re.S)
    assert f"its first {PREVIEW_CHARS} characters" in cut and "not the whole" in cut
    assert timeline.count("data-preview-cut") == 1


OTEL_IDS = ("4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c")
LANGSMITH_RUN = "01890a5d-ac96-774b-bcce-b302099a8057"
LANGSMITH_PAGE = f"https://smith.example.com/o/0c1d/projects/p/5e6f/r/{LANGSMITH_RUN}?poll=true"


def trace_section(page: str) -> str:
    start = page.index('id="section-summary"')
    return page[start : page.index('id="section-approvals"')]


async def test_the_task_page_shows_where_each_run_was_traced(dash: Dash) -> None:
    mine, theirs = dash.key("acme"), dash.key("globex")
    task = await dash.finished(mine, input="When are checkpoints written?")
    links_url = f"/v1/tasks/{task['id']}/trace-links"
    async with dash.browser(mine) as client:
        untraced = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        assert "data-trace-links" not in untraced and "OpenTelemetry" not in untraced
        assert (await client.get(links_url, headers=auth(mine))).json() == {"runs": []}

    # A run traced by OpenTelemetry, then (resumed) one traced by both; the ledger records
    # each in its run_started event.
    with Ledger(dash.ledger_url) as ledger:
        first = ledger.append_event(
            task["id"], {"type": "run_started", "trace": {"otel_trace_id": OTEL_IDS[0]}}
        )
        ledger.append_event(task["id"], {"type": "run_started"})  # untraced: not listed
        latest = ledger.append_event(
            task["id"],
            {
                "type": "run_started",
                "trace": {
                    "otel_trace_id": OTEL_IDS[1],
                    "langsmith_run_id": LANGSMITH_RUN,
                    "langsmith_url": LANGSMITH_PAGE,
                },
            },
        )
    async with dash.browser(mine) as client:
        page = trace_section((await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text)
        links = (await client.get(links_url, headers=auth(mine))).json()
        fragment = (await client.get(f"/ui/tasks/{task['id']}?fragment=1")).json()
    assert [(r["seq"], r["otel_trace_id"], r["langsmith_run_id"]) for r in links["runs"]] == [
        (latest, OTEL_IDS[1], LANGSMITH_RUN),
        (first, OTEL_IDS[0], None),
    ]
    assert links["runs"][0]["langsmith_url"] == LANGSMITH_PAGE
    # The latest run: its trace id to copy, its LangSmith run to open in a new tab.
    assert f'<code class="copyable" data-otel-trace-id>{OTEL_IDS[1]}</code>' in page
    assert f'data-copy="{OTEL_IDS[1]}"' in page
    link = re.search(r'<a [^>]*data-langsmith-run="([^"]+)"[^>]*>', page)
    assert link is not None and link.group(1) == LANGSMITH_RUN
    assert f'href="{LANGSMITH_PAGE}"' in link.group(0)
    assert 'target="_blank"' in link.group(0) and 'rel="noopener"' in link.group(0)
    # The earlier run, listed apart.
    earlier = page[page.index('data-key="earlier-traces"') :]
    assert f'data-trace-run="{first}"' in earlier and OTEL_IDS[0] in earlier
    assert OTEL_IDS[0] not in page[: page.index('data-key="earlier-traces"')]
    # The live update renders the same.
    assert f"data-otel-trace-id>{OTEL_IDS[1]}<" in fragment["sections"]["summary"]

    async with dash.client() as client:
        other = await client.get(links_url, headers=auth(theirs))
        assert other.status_code == 404 and other.json()["error"]["code"] == "task_not_found"


async def test_trace_links_keep_only_ids_and_web_addresses(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.finished(key, input="When are checkpoints written?")
    with Ledger(dash.ledger_url) as ledger:
        ledger.append_event(
            task["id"],
            {
                "type": "run_started",
                "trace": {
                    "otel_trace_id": "<b>not an id</b>",
                    "langsmith_run_id": LANGSMITH_RUN,
                    "langsmith_url": "javascript:alert(1)",
                },
            },
        )
        ledger.append_event(task["id"], {"type": "run_started", "trace": "nonsense"})
    async with dash.browser(key) as client:
        page = trace_section((await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text)
        links = await client.get(f"/v1/tasks/{task['id']}/trace-links", headers=auth(key))
    [run] = links.json()["runs"]
    assert (run["otel_trace_id"], run["langsmith_run_id"], run["langsmith_url"]) == (
        None,
        LANGSMITH_RUN,
        None,
    )
    assert "javascript:" not in page and "not an id" not in page
    # Without the project's page, the run id is shown to copy instead of a link.
    assert f'<code class="copyable" data-langsmith-run="{LANGSMITH_RUN}">' in page
    assert f'data-copy="{LANGSMITH_RUN}"' in page and "OpenTelemetry" not in page


async def test_a_task_the_server_traced_shows_its_root_spans_trace_id(
    home: Path, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import format_trace_id

    import relaygraph.tracing._config as tracing_config

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setattr(tracing_config, "exporting_provider", lambda exporters: provider)
    async with running(home, scripts) as dash:
        key = dash.key("acme")
        task = await dash.finished(key, input="When are checkpoints written?")
        async with dash.browser(key) as client:
            page = trace_section((await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text)
    [root] = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert root.context is not None and root.attributes is not None
    assert root.attributes["relaygraph.task_id"] == task["id"]
    trace_id = format_trace_id(root.context.trace_id)
    assert f"data-otel-trace-id>{trace_id}</code>" in page


async def test_artifacts_are_served_as_text_or_downloads_never_as_html(dash: Dash) -> None:
    key = dash.key("acme")
    html = "<script>alert(1)</script>"
    script = one_visit(
        "writer",
        "Write it",
        "a page",
        call("save_artifact", name="x.html", content=html),
        say("Saved."),
        final="Done.",
    )
    task = await dash.finished(key, input="a page", model=dash.script("page.json", script))
    async with dash.client() as client:
        listed = await client.get(f"/v1/tasks/{task['id']}/artifacts", headers=auth(key))
        assert listed.json() == {"artifacts": [{"name": "x.html", "size_bytes": len(html)}]}
        got = await client.get(f"/v1/tasks/{task['id']}/artifacts/x.html", headers=auth(key))
        assert got.text == html
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"] == 'attachment; filename="x.html"'
        missing = await client.get(f"/v1/tasks/{task['id']}/artifacts/y.md", headers=auth(key))
        assert missing.json()["error"]["code"] == "artifact_not_found"
    async with dash.browser(key) as browser:
        shown = await browser.get(f"/ui/tasks/{task['id']}/artifacts/x.html")
        assert shown.headers["content-type"].startswith("text/plain")
        assert "sandbox" in shown.headers["content-security-policy"]
        page = await browser.get(f"/ui/tasks/{task['id']}", headers=HTML)
        assert html not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


async def test_decisions_from_the_page_check_arguments_and_resume(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.paused(key)
    async with dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        assert "waiting for you" in page and "run_python" in page
        approval = re.search(r'data-approval="([^"]+)"', page)
        assert approval is not None
        url = f"/ui/tasks/{task['id']}/approvals/{approval.group(1)}"
        answer = {"Accept": "application/json"}
        form = {"csrf": csrf_of(page), "decision": "edit", "args": '{"source": "print(1)"}'}
        bad = await client.post(url, data=form, headers=answer)
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "args"
        assert "source" in bad.json()["error"]["message"]
        not_json = await client.post(url, data={**form, "args": "{code"}, headers=answer)
        assert not_json.status_code == 422 and "not JSON" in not_json.json()["error"]["message"]
        no_reason = await client.post(url, data={**form, "decision": "reject", "args": ""})
        assert no_reason.status_code == 422 and "say why" in no_reason.text
        forged = await client.post(url, data={"csrf": "x", "decision": "approve"}, headers=answer)
        assert forged.status_code == 403
        assert (await dash.wait(key, task["id"], ("interrupted",)))["status"] == "interrupted"
        ok = await client.post(
            url, data={"csrf": form["csrf"], "decision": "approve"}, headers=answer
        )
        assert ok.status_code == 202, ok.text
        done = await dash.wait(key, task["id"], FINISHED)
        assert done["status"] == "succeeded"
        again = await client.post(
            url, data={"csrf": form["csrf"], "decision": "approve"}, headers=answer
        )
        assert again.status_code == 409
        approvals = await client.get(f"/v1/tasks/{task['id']}/approvals", headers=auth(key))
        assert approvals.json()["approvals"][0]["decided_by"] == "acme"


async def test_the_event_stream_of_the_page_replays_and_closes(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.finished(key, input="When are checkpoints written?")
    async with dash.browser(key) as client:
        stream = await client.get(f"/ui/tasks/{task['id']}/events?after=2")
        ids = [int(i) for i in re.findall(r"^id: (\d+)", stream.text, re.M)]
        assert ids[0] == 3 and ids == list(range(3, ids[-1] + 1))
        assert "event: run_finished" in stream.text
        assert (await client.get(f"/ui/tasks/{task['id']}/events?after=x")).status_code == 422


# -- evals, usage, the graph -----------------------------------------------------------


def record_eval(ledger_url: str, outcomes: dict[str, bool], task_id: str | None = None) -> str:
    """An eval run in the ledger whose cases passed or failed as ``outcomes`` says."""
    with Ledger(ledger_url) as ledger:
        run = ledger.record_eval_run(
            golden="golden.jsonl",
            models={"model": None, "agent_models": {}},
            options={"repeat": 1},
            case_count=len(outcomes),
            run_count=len(outcomes),
        )
        for case_id, passed in outcomes.items():
            check = {
                "name": "first_agent",
                "passed": passed,
                "expected": "researcher",
                "actual": "researcher" if passed else "writer-" + case_id,
            }
            ledger.record_eval_case(
                run, case_id=case_id, trial=1, passed=passed, checks=[check], task_id=task_id
            )
        share = sum(outcomes.values()) / len(outcomes)
        ledger.finish_eval_run(run, metrics={"pass_rate": share, "routing_accuracy": share})
        return run


@pytest.fixture
async def evals_shown(
    home: Path, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Dash]:
    """The dashboard of a server whose operator shows the eval runs to its projects."""
    monkeypatch.setenv("RELAYGRAPH_UI_SHOW_EVALS", "true")
    async with running(home, scripts) as started:
        yield started


async def test_eval_runs_their_cases_and_two_side_by_side(evals_shown: Dash) -> None:
    dash = evals_shown
    key = dash.key("acme")
    task = await dash.submit(key, input="When are checkpoints written?")
    before = record_eval(dash.ledger_url, {"a": True, "b": False, "c": True})
    after = record_eval(dash.ledger_url, {"a": False, "b": True, "c": True}, task_id=task["id"])
    async with dash.client() as client:
        runs = (await client.get("/v1/evals", headers=auth(key))).json()["eval_runs"]
        assert [r["id"] for r in runs] == [after, before] and runs[0]["cases"] is None
        one = (await client.get(f"/v1/evals/{after}", headers=auth(key))).json()
        assert [c["case_id"] for c in one["cases"]] == ["a", "b", "c"]
        assert one["cases"][0]["checks"][0]["actual"] == "writer-a"
        missing = await client.get("/v1/evals/nope", headers=auth(key))
        assert missing.json()["error"]["code"] == "eval_run_not_found"
    async with dash.browser(key) as browser:
        listed = (await browser.get("/ui/evals", headers=HTML)).text
        assert f"/ui/evals/{after}" in listed and "67%" in listed
        page = (await browser.get(f"/ui/evals/{after}", headers=HTML)).text
        assert "writer-a" in page and 'data-case="a"' in page  # expected and actual
        assert f'href="/ui/tasks/{task["id"]}"' in page  # the project's own task: a link
        pair = (await browser.get(f"/ui/evals/{after}?against={before}", headers=HTML)).text
        changes = re.findall(r'data-case="(\w)" data-change="(\w+)"', pair)
        assert changes == [("a", "regressed"), ("b", "fixed"), ("c", "passing")]
        compare = await browser.get(f"/ui/evals/compare?run={after}&against={before}")
        assert compare.headers["location"] == f"/ui/evals/{after}?against={before}"
        assert (await browser.get("/ui/evals/nope", headers=HTML)).status_code == 404


async def test_eval_runs_are_hidden_from_projects_unless_the_operator_shows_them(
    home: Path, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAYGRAPH_UI_SHOW_EVALS", raising=False)
    async with running(home, scripts) as dash:
        key = dash.key("acme")
        run = record_eval(dash.ledger_url, {"a": True})
        async with dash.client() as client:
            assert (await client.get("/v1/evals", headers=auth(key))).json() == {"eval_runs": []}
            assert (await client.get(f"/v1/evals/{run}", headers=auth(key))).status_code == 404
        async with dash.browser(key) as browser:
            listed = (await browser.get("/ui/evals", headers=HTML)).text
            assert "not shown on this server" in listed
            assert "RELAYGRAPH_UI_SHOW_EVALS=true" in listed  # what the operator may set
            assert (await browser.get(f"/ui/evals/{run}", headers=HTML)).status_code == 404


async def test_usage_per_day_and_agent(dash: Dash) -> None:
    key, other = dash.key("acme"), dash.key("globex")
    await dash.finished(key, input="When are checkpoints written?")
    today = datetime.now(UTC).date()
    async with dash.client() as client:
        daily = (await client.get("/v1/usage/daily", headers=auth(key))).json()
        assert len(daily["days"]) in (14, 15) and daily["days"][-1]["date"] == today.isoformat()
        assert daily["days"][-1]["tasks"] == 1 and "writer" in daily["days"][-1]["agents"]
        assert sum(d["tasks"] for d in daily["days"][:-1]) == 0
        whole = (await client.get("/v1/usage", headers=auth(key))).json()
        assert daily["days"][-1]["total"] == whole["total"]
        theirs = (await client.get("/v1/usage/daily", headers=auth(other))).json()
        assert all(d["tasks"] == 0 for d in theirs["days"])
        too_long = await client.get(
            "/v1/usage/daily",
            params={"since": "2020-01-01T00:00:00Z", "until": "2022-01-01T00:00:00Z"},
            headers=auth(key),
        )
        assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "until"
        naive = await client.get(
            "/v1/usage/daily", params={"since": "2026-01-01"}, headers=auth(key)
        )
        assert naive.status_code == 422 and naive.json()["error"]["field"] == "since"
    async with dash.browser(key) as browser:
        page = (await browser.get("/ui/usage", headers=HTML)).text
        assert 'class="chart"' in page and "writer" in page
        # The chart's figures as a table too, a row per day, today's with the task.
        table = page[page.index("data-usage-days") : page.index("</table>")]
        assert table.count("<tr data-day=") == DEFAULT_USAGE_DAYS  # the page's default range
        row = re.search(rf'<tr data-day="{today.isoformat()}">(.*?)</tr>', table)
        assert row is not None and '<td class="num">1</td>' in row.group(1)
        total = daily["days"][-1]["total"]
        assert f"{total['input_tokens'] + total['output_tokens']:,}" in row.group(1)
        cost = (await browser.get("/ui/usage?metric=cost&since=2020-01-01", headers=HTML)).text
        assert "Cost per day" in cost and "choose at most 366 days" in cost
    async with dash.browser(other) as browser:
        assert "No usage in this range" in (await browser.get("/ui/usage", headers=HTML)).text


async def test_the_usage_page_shows_the_projects_quotas_and_use_now(
    home: Path, scripts: Path
) -> None:
    """The same figures as ``GET /v1/projects/me``: the operator's quotas for the project,
    the server's otherwise, and its own use only."""
    # No workers: a started server's would take globex's queued task within a pull, and the
    # page would count it running, or finished, instead of queued.
    async with running(home, scripts, start_workers=False) as dash:
        key, other = dash.key("acme"), dash.key("globex")
        with Ledger(dash.ledger_url) as ledger:
            ledger.set_project_quotas("acme", QuotaOverrides(max_running=3, daily_cost_usd=2.5))
            project = ledger.get_project("globex")
            assert project is not None
            ledger.create_task(project_id=project.id, input="waits")  # globex's, queued
        async with dash.browser(key) as browser:
            page = (await browser.get("/ui/usage", headers=HTML)).text
        quotas = page[page.index("data-quotas") : page.index("</table>", page.index("data-quotas"))]
        running_row = re.search(r'data-quota="running">(.*?)</tr>', quotas)
        assert running_row is not None and '<td class="num">3</td>' in running_row.group(1)
        queued = re.search(r'data-quota="queued">(.*?)</tr>', quotas)
        # None of globex's tasks counts here; the server's queued quota is the default 1,000.
        assert queued is not None and '<td class="num">0</td>' in queued.group(1)
        assert "1,000" in queued.group(1)
        cost = re.search(r'data-quota="cost">(.*?)</tr>', quotas)
        assert cost is not None and "2.50" in cost.group(1)
        async with dash.browser(other) as browser:
            theirs = (await browser.get("/ui/usage", headers=HTML)).text
        mine = theirs[theirs.index("data-quotas") :]
        row = re.search(r'data-quota="queued">(.*?)</tr>', mine)
        assert row is not None and '<td class="num">1</td>' in row.group(1)
        assert "no limit" in mine  # globex has no running quota of its own, nor the server


def _days(count: int) -> DailyUsage:
    first = date(2026, 1, 1)
    usage = {"input_tokens": 10, "output_tokens": 2, "cost_usd": 0.0}
    return DailyUsage(
        project_id="p",
        since=datetime.combine(first, datetime.min.time(), UTC),
        until=datetime.combine(first + timedelta(days=count), datetime.min.time(), UTC),
        days=[
            DayUsage(date=first + timedelta(days=i), tasks=1, total=usage, agents={"coder": usage})
            for i in range(count)
        ],
    )


@pytest.mark.parametrize("count", [7, 14, 30, 366])
def test_the_usage_charts_last_day_has_its_label_inside_the_chart(count: int) -> None:
    chart = usage_chart(_days(count), "tokens")
    last = (date(2026, 1, 1) + timedelta(days=count - 1)).strftime("%b %d")
    assert chart.labels[-1].day == last
    assert all(0 < label.x <= chart.width - 18 for label in chart.labels)
    assert len(chart.labels) <= 12
    assert [row.total for row in chart.rows] == [12.0] * count


def _event(seq: int, type_: str, **data: Any) -> Event:
    return Event(
        task_id="t",
        seq=seq,
        type=type_,
        agent=None,
        data={"type": type_, **data},
        created_at=datetime.now(UTC),
    )


def _handoff(seq: int, event_seq: int, kind: str, source: str, target: str) -> HandoffEntry:
    return HandoffEntry(
        task_id="t",
        seq=seq,
        event_seq=event_seq,
        kind=kind,  # type: ignore[arg-type]
        source=source,
        target=target,
        task=f"task {seq}",
        reason=f"reason {seq}",
        step=seq,
        checkpoint_ns=None,
        tokens_so_far=100 * seq,
        created_at=datetime.now(UTC),
    )


def test_the_graph_numbers_transfers_and_marks_the_bounce_that_tripped_ping_pong() -> None:
    handoffs = [
        _handoff(1, 2, "route", "supervisor", "researcher"),
        _handoff(2, 5, "direct", "researcher", "writer"),
        _handoff(3, 8, "direct", "writer", "researcher"),
        _handoff(4, 11, "direct", "researcher", "writer"),
    ]
    events = [
        _event(14, "violation", kind="ping_pong", agent="researcher", detail="3 bounces"),
        _event(
            15,
            "handoff",
            source="writer",
            target="researcher",
            task="again",
            reason="w2",
            step=6,
            tokens_so_far=768,
            carried_out=False,
        ),
        _event(16, "route", next="FINISH", carried_out=True),
    ]
    transfers = transfers_of(handoffs, events)
    assert [(t.number, t.kind, t.source, t.target) for t in transfers] == [
        (1, "route", "supervisor", "researcher"),
        (2, "direct", "researcher", "writer"),
        (3, "direct", "writer", "researcher"),
        (4, "direct", "researcher", "writer"),
        (5, "direct", "writer", "researcher"),
    ]
    last = transfers[-1]
    assert last.ping_pong == "3 bounces" and not last.carried_out and last.tokens_so_far == 768
    assert all(t.ping_pong is None and t.carried_out for t in transfers[:-1])
    graph = layout(["researcher", "coder", "writer"], transfers)
    assert [n.name for n in graph.nodes] == ["supervisor", "researcher", "coder", "writer"]
    assert [n.ran for n in graph.nodes] == [True, True, False, True]
    # Arcs between the same two agents do not lie on top of each other.
    assert len({e.path for e in graph.edges}) == len(graph.edges)
    assert all(0 < e.label_y < graph.height for e in graph.edges)


def _transfer(number: int, kind: str, source: str, target: str) -> Transfer:
    return Transfer(
        number=number,
        kind=kind,  # type: ignore[arg-type]
        source=source,
        target=target,
        task="t",
        reason="r",
        step=number,
        tokens_so_far=None,
        carried_out=True,
        ping_pong=None,
        event_seq=number,
    )


def test_a_large_team_with_long_names_gets_a_row_wide_enough_and_cut_labels() -> None:
    names = [f"Agent{i}-WithAVeryLongNameMadeOfManyWords"[:40] for i in range(8)]
    transfers = [_transfer(1, "route", "supervisor", names[0])]
    # The first and the last agent bounce work five times: the deepest arc there is.
    for n in range(2, 7):
        source, target = (names[0], names[7]) if n % 2 else (names[7], names[0])
        transfers.append(_transfer(n, "direct", source, target))
    graph = layout(names, transfers)
    row = sorted((n for n in graph.nodes if not n.supervisor), key=lambda n: n.x)
    assert [n.name for n in row] == names
    boxes = [(n.x - graph.node_width / 2, n.x + graph.node_width / 2) for n in row]
    assert all(left[1] < right[0] for left, right in pairwise(boxes)), boxes
    assert boxes[0][0] >= 0 and boxes[-1][1] <= graph.width and graph.wide
    for node in row:
        assert node.label.endswith("…") and node.name.startswith(node.label[:-1])
        assert text_width(node.label) <= graph.node_width - 2 * 8
    # Tall enough for the deepest arc's number, and no taller than it needs.
    deepest = max(e.label_y for e in graph.edges)
    assert deepest + 11 < graph.height <= deepest + 11 + 20
    # The page draws the boxes it was given and names each cut one in full.
    html = render_graph(graph)
    assert html.count(f'width="{graph.node_width}"') == len(graph.nodes)
    assert all(f"<title>{name}</title>" in html for name in names)
    assert 'class="graph-layout graph-wide"' in html


def test_a_small_team_keeps_its_names_and_a_graph_as_tall_as_its_arcs() -> None:
    routes = [_transfer(1, "route", "supervisor", "researcher")]
    flat = layout(["researcher", "coder", "writer"], routes)
    assert flat.width == 760 and not flat.wide
    assert [n.label for n in flat.nodes] == ["supervisor", "researcher", "coder", "writer"]
    assert "<title>researcher</title>" not in render_graph(flat)
    arced = layout(
        ["researcher", "coder", "writer"], [*routes, _transfer(2, "direct", "researcher", "coder")]
    )
    assert flat.height < arced.height < 350


def render_graph(graph: HandoffGraph) -> str:
    from types import SimpleNamespace

    from relaygraph.api.ui._templates import render

    view = SimpleNamespace(graph=graph, transfers=[e.transfer for e in graph.edges])
    return render("_task_graph.html", request=None, view=view)


async def test_the_openapi_document_lists_the_dashboards_endpoints_not_its_pages(
    dash: Dash,
) -> None:
    async with dash.client() as client:
        paths = (await client.get("/openapi.json")).json()["paths"]
    for path in (
        "/v1/task-summaries",
        "/v1/tasks/{task_id}/artifacts",
        "/v1/tasks/{task_id}/artifacts/{name}",
        "/v1/tasks/{task_id}/trace-links",
        "/v1/evals",
        "/v1/evals/{run_id}",
        "/v1/usage/daily",
    ):
        assert path in paths
    assert not [p for p in paths if p.startswith("/ui")]
    # docs/api.md's table of endpoints names every one (``{id}`` for a task's id).
    table = {
        row.split("`")[1].split("?")[0]
        for row in (REPO / "docs" / "api.md").read_text(encoding="utf-8").splitlines()
        if row.startswith("| `")
    }
    documented = {
        f"{method.upper()} {path.replace('{task_id}', '{id}')}"
        for path, operations in paths.items()
        if path.startswith("/v1/")
        for method in operations
    }
    assert documented - table == set()


async def test_cancel_from_the_page(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.paused(key)
    async with dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        assert "Cancel task" in page
        url = f"/ui/tasks/{task['id']}/cancel"
        answer = {"Accept": "application/json"}
        assert (await client.post(url, data={"csrf": "x"}, headers=answer)).status_code == 403
        unconfirmed = await client.post(url, data={"csrf": csrf_of(page)}, headers=answer)
        assert unconfirmed.status_code == 422
        assert unconfirmed.json()["error"]["field"] == "confirm"
        confirmed = {"csrf": csrf_of(page), "confirm": "yes"}
        done = await client.post(url, data=confirmed, headers=answer)
        assert done.status_code == 202
        assert (await dash.wait(key, task["id"], FINISHED))["status"] == "cancelled"
        again = await client.post(url, data=confirmed, headers=answer)
        assert again.status_code == 409
        after = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        assert "Cancel task" not in after


async def test_a_form_posted_after_the_session_ended_leads_to_sign_in(dash: Dash) -> None:
    async with dash.client() as client:
        posted = await client.post("/ui/tasks/abc/cancel", data={"csrf": "x"}, headers=HTML)
        assert posted.status_code == 303 and posted.headers["location"] == "/ui/login?next=%2Fui"
        script = await client.post(
            "/ui/tasks/abc/cancel", data={"csrf": "x"}, headers={"Accept": "application/json"}
        )
        assert script.status_code == 401 and script.json()["error"]["code"] == "unauthorized"


def agent_suggestions(page: str) -> list[str]:
    found = re.search(r'<datalist id="agent-names">(.*?)</datalist>', page, re.S)
    assert found is not None, "the task list has no agent suggestions"
    return re.findall(r'<option value="([^"]+)">', found.group(1))


async def test_the_agent_filter_suggests_the_agents_of_the_projects_own_tasks(
    dash: Dash,
) -> None:
    mine, theirs = dash.key("acme"), dash.key("globex")
    async with dash.browser(mine) as browser:
        assert agent_suggestions((await browser.get("/ui", headers=HTML)).text) == []
    await dash.finished(theirs, input="When are checkpoints written?")
    async with dash.browser(theirs) as browser:
        shown = agent_suggestions((await browser.get("/ui", headers=HTML)).text)
        assert shown == ["coder", "researcher", "writer"]  # no supervisor, no finalize
    async with dash.browser(mine) as browser:
        assert agent_suggestions((await browser.get("/ui", headers=HTML)).text) == []


REVIEW_TEAM = """\
name = "docs-review"

[agents.reviewer]
description = "counts the words of a draft"
prompt = "You are the reviewer. Count the words with word_count."
tools = ["rg_dash_tools:word_count"]
"""


async def test_an_edit_is_checked_against_a_registered_teams_own_tool(
    home: Path, scripts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site" / "rg_dash_tools"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(
        'def word_count(text: str) -> int:\n    """Count the words of a text."""\n'
        "    return len(text.split())\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(site.parent))
    async with running(home, scripts, tool_modules=["rg_dash_tools"]) as dash:
        key = dash.key("acme")
        async with dash.client() as client:
            pushed = await client.put(
                "/v1/teams/docs-review", json={"toml": REVIEW_TEAM}, headers=auth(key)
            )
            assert pushed.status_code == 201, pushed.text
        script = COUNTED_BY_THE_REVIEWER
        task = await dash.submit(
            key,
            input="count",
            team="docs-review",
            model=dash.script("review.json", script),
            policy={"agents": {"reviewer": {"approval": ["word_count"]}}},
        )
        await dash.wait(key, task["id"], ("interrupted",))
        async with dash.browser(key) as browser:
            # The agent filter suggests the agents this project's tasks ran: its own team's.
            listed = (await browser.get("/ui", headers=HTML)).text
            assert agent_suggestions(listed) == ["reviewer"]
            page = (await browser.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
            assert "docs-review" in page and "word_count" in page
            approval = re.search(r'data-approval="([^"]+)"', page)
            assert approval is not None
            url = f"/ui/tasks/{task['id']}/approvals/{approval.group(1)}"
            form = {"csrf": csrf_of(page), "decision": "edit"}
            answer = {"Accept": "application/json"}
            wrong = await browser.post(url, data={**form, "args": '{"words": 2}'}, headers=answer)
            assert wrong.status_code == 422 and "'words'" in wrong.json()["error"]["message"]
            right = await browser.post(
                url, data={**form, "args": '{"text": "a b"}'}, headers=answer
            )
            assert right.status_code == 202, right.text
        assert (await dash.wait(key, task["id"], FINISHED))["status"] == "succeeded"
