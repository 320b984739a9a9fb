"""The task page's *Model calls* (issue 46): each call's messages, reply, tokens, cost and
latency, whose figures add up to the Budgets card's and the API's per role. In process,
like ``test_dashboard_audit.py``."""

from __future__ import annotations

import html
import math
import re
from collections import defaultdict
from pathlib import Path

from ._service import auth as bearer
from .test_dashboard import HTML, Dash, running

REQUEST = "When are checkpoints written?"


def _section(page: str) -> str:
    return page[page.index('id="section-model_calls"') : page.index('id="section-timeline"')]


async def test_each_model_call_shows_what_it_saw_and_adds_up_to_the_budgets(
    priced: Dash,
) -> None:
    key = priced.key("acme")
    task = await priced.finished(key, input=REQUEST, model="scripted:relay.json")
    async with priced.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
        trace = (await client.get(f"/v1/tasks/{task['id']}/trace", headers=bearer(key))).json()
        stream = (await client.get(f"/v1/tasks/{task['id']}/events", headers=bearer(key))).text
    calls = _section(page)
    rows = re.findall(
        r'data-model-call="\d+" data-role="(\w+)" data-input-tokens="(\d+)" '
        r'data-output-tokens="(\d+)" data-cost="([^"]+)"',
        calls,
    )
    assert rows, "no model call on the page"
    spent: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for role, tokens_in, tokens_out, cost in rows:
        spent[role][0] += 1
        spent[role][1] += int(tokens_in)
        spent[role][2] += int(tokens_out)
        spent[role][3] += float(cost)
    usage = trace["usage"]["agents"]
    assert set(spent) == set(usage)
    for role, (n, tokens_in, tokens_out, cost) in spent.items():
        assert n == usage[role]["model_calls"], role
        assert (tokens_in, tokens_out) == (
            usage[role]["input_tokens"],
            usage[role]["output_tokens"],
        ), role
        assert math.isclose(cost, usage[role]["cost_usd"], abs_tol=1e-6), role
    # The messages the model saw, as stored: the request reached the supervisor's first call.
    assert REQUEST in html.unescape(calls)
    # The API's event stream carries the same calls.
    assert stream.count("event: model_call\r\n") == len(rows)


async def test_a_server_that_keeps_no_messages_shows_only_the_figures(
    home: Path, scripts: Path
) -> None:
    async with running(home, scripts, model_call_messages=False) as dash:
        key = dash.key("acme")
        task = await dash.finished(key, input=REQUEST, model="scripted:relay.json")
        async with dash.browser(key) as client:
            page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
    calls = _section(page)
    assert "data-model-call=" in calls and "not kept" in calls
    assert REQUEST not in html.unescape(calls)
