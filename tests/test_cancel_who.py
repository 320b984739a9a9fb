"""A cancel records who asked (issue 46): the project whose key (the API) or dashboard
session (the page) sent it, as a ``cancel_requested`` event the task page shows."""

from __future__ import annotations

from pathlib import Path

from relaygraph.store import LOCAL_PROJECT_ID, Ledger

from ._service import FINISHED
from ._service import auth as bearer
from .test_dashboard import HTML, Dash, csrf_of


def _requests(service: Dash, task_id: str) -> list[dict]:
    with Ledger(service.ledger_url) as ledger:
        return [e.data for e in ledger.events_after(task_id) if e.type == "cancel_requested"]


async def test_a_cancel_through_the_api_records_the_projects_name(dash: Dash) -> None:
    key = dash.key("acme")
    task = await dash.paused(key)
    async with dash.browser(key) as client:
        done = await client.post(f"/v1/tasks/{task['id']}/cancel", headers=bearer(key))
        assert done.status_code == 202, done.text
        assert (await dash.wait(key, task["id"], FINISHED))["status"] == "cancelled"
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
    assert _requests(dash, task["id"]) == [{"type": "cancel_requested", "by": "acme", "via": "api"}]
    assert 'data-cancelled-by="acme" data-cancelled-via="api"' in page
    assert 'data-kind="cancel_requested" data-cancelled-by="acme"' in page  # the timeline


async def test_a_cancel_from_the_page_records_the_sessions_project(dash: Dash) -> None:
    key = dash.key("globex")
    task = await dash.paused(key)
    async with dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        confirmed = {"csrf": csrf_of(page), "confirm": "yes"}
        url = f"/ui/tasks/{task['id']}/cancel"
        done = await client.post(url, data=confirmed, headers={"Accept": "application/json"})
        assert done.status_code == 202
        assert (await dash.wait(key, task["id"], FINISHED))["status"] == "cancelled"
        after = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
    assert _requests(dash, task["id"]) == [
        {"type": "cancel_requested", "by": "globex", "via": "dashboard"}
    ]
    assert 'data-cancelled-by="globex" data-cancelled-via="dashboard"' in after


def test_a_running_tasks_cancel_is_recorded_once_and_a_finished_ones_not(home: Path) -> None:
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        ledger.upgrade()
        task, _ = ledger.create_task(project_id=LOCAL_PROJECT_ID, input="a long one")
        assert ledger.take_lease(task.id, "runner-a", seconds=60) is not None
        asked = ledger.request_cancel(task.id, by="acme", via="api")
        assert asked.status == "running" and asked.cancel_requested_at is not None
        # Asked again (another click) while the runner has not stopped yet: one request.
        ledger.request_cancel(task.id, by="acme", via="dashboard")
        ledger.set_status(task.id, "cancelled", stop_reason="cancelled by request")
        ledger.request_cancel(task.id, by="globex", via="api")
        requests = [e.data for e in ledger.events_after(task.id) if e.type == "cancel_requested"]
    assert requests == [{"type": "cancel_requested", "by": "acme", "via": "api"}]
