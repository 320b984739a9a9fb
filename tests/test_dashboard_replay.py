"""The dashboard's "Replay" action on a task page and its diff page."""

from __future__ import annotations

from ._service import FINISHED
from .test_dashboard import HTML, Dash, csrf_of


async def test_replay_from_the_task_page_and_read_the_diff(dash: Dash) -> None:
    mine, theirs = dash.key("acme"), dash.key("globex")
    task = await dash.finished(mine, input="When are checkpoints written?")
    async with dash.browser(mine) as client:
        page = await client.get(f"/ui/tasks/{task['id']}", headers=HTML)
        assert f'action="/ui/tasks/{task["id"]}/replay"' in page.text
        form = {"csrf": csrf_of(page.text), "from_step": "2"}
        bad = await client.post(f"/ui/tasks/{task['id']}/replay", data={**form, "from_step": "9"})
        assert bad.status_code == 422 and "from_step takes 0 to 3 (got 9)" in bad.text
        made = await client.post(f"/ui/tasks/{task['id']}/replay", data=form)
        assert made.status_code == 303, made.text
        replay_id = made.headers["location"].rsplit("/", 1)[1]
        await dash.wait(mine, replay_id, FINISHED)
        replay_page = await client.get(f"/ui/tasks/{replay_id}", headers=HTML)
        assert f'href="/ui/diff/{task["id"]}/{replay_id}"' in replay_page.text
        diff = await client.get(f"/ui/diff/{task['id']}/{replay_id}", headers=HTML)
        assert diff.status_code == 200
        assert "Same trajectory." in diff.text and "inherited: not run again" in diff.text
    async with dash.browser(theirs) as client:
        page = await client.get(f"/ui/diff/{task['id']}/{replay_id}", headers=HTML)
        assert page.status_code == 404
        refused = await client.post(
            f"/ui/tasks/{task['id']}/replay", data={"csrf": "x", "from_step": "0"}
        )
        assert refused.status_code in (403, 404)
