"""The dashboard's numbers against the API's and the trace's (issue 46): costs per role add
up to the total, counts agree between the list and the task page, waits for a person are no
blown time, and every refusal names its kind and the policy's rule. In process, like
``test_dashboard.py``; the browser checks are in ``test_dashboard_browser.py``."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest

from relaygraph.api.ui._audit import refusing_rule
from relaygraph.api.ui._policy_text import policy_lines, policy_origin
from relaygraph.api.ui._templates import seconds
from relaygraph.store import Ledger

from ._scripts import REFUSED_RUN_PYTHON
from ._service import FINISHED
from ._service import auth as bearer
from .test_dashboard import (
    HTML,
    Dash,
    csrf_of,
    running,
)

PRICE = {"input": 2.0, "output": 8.0}
"""US dollars per million tokens of every scripted model, so that every role costs."""


async def _pages(dash: Dash, key: str, task_id: str) -> tuple[str, str, dict, dict]:
    """The task page, the list page, the trace and the task's summary line."""
    async with dash.browser(key) as client:
        page = (await client.get(f"/ui/tasks/{task_id}", headers=HTML)).text
        listed = (await client.get("/ui", headers=HTML)).text
        trace = (await client.get(f"/v1/tasks/{task_id}/trace", headers=bearer(key))).json()
        summaries = (await client.get("/v1/task-summaries", headers=bearer(key))).json()
    [summary] = [t for t in summaries["tasks"] if t["id"] == task_id]
    return page, listed, trace, summary


def _row(listed: str, task_id: str) -> str:
    start = listed.index(f'data-task="{task_id}"')
    return listed[start : listed.index("</tr>", start)]


def _attr(html: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', html)
    assert found, f"no {name} in the page"
    return found.group(1)


async def decide_on_page(
    dash: Dash, key: str, task_id: str, *, decision: str, reason: str | None = None
) -> str:
    """Decide the approval the task's page waits for, through the page's form signed in
    with ``key`` (with ``reason``, when given); returns the page as it was."""
    async with dash.browser(key) as client:
        waiting = (await client.get(f"/ui/tasks/{task_id}", headers=HTML)).text
        form = {"csrf": csrf_of(waiting), "decision": decision}
        if reason is not None:
            form["reason"] = reason
        decided = await client.post(
            f"/ui/tasks/{task_id}/approvals/{_attr(waiting, 'data-approval')}",
            data=form,
            headers={"Accept": "application/json"},
        )
    assert decided.status_code == 202, decided.text
    return waiting


async def test_costs_per_role_with_supervisor_and_finalize_add_up_to_the_total(
    priced: Dash,
) -> None:
    key = priced.key("acme")
    # One agent visit: the supervisor's next route is stopped and finalize answers.
    task = await priced.submit(
        key,
        input="When are checkpoints written?",
        model="scripted:relay.json",
        policy={"team": {"max_agent_runs": 1}},
    )
    assert (await priced.wait(key, task["id"], FINISHED))["status"] == "degraded"
    page, listed, trace, summary = await _pages(priced, key, task["id"])
    roles = {
        role: float(cost)
        for role, cost in re.findall(r'<tr data-role="(\w+)" data-cost="([^"]+)"', page)
    }
    assert {"supervisor", "finalize", "researcher"} <= set(roles)
    assert all(cost > 0 for cost in roles.values()), roles
    total = trace["usage"]["total"]["cost_usd"]
    assert roles == {r: u["cost_usd"] for r, u in trace["usage"]["agents"].items()}
    assert math.isclose(sum(roles.values()), total, abs_tol=1e-6)
    assert float(_attr(page, "data-cost-total")) == total
    assert math.isclose(summary["cost_usd"], total, abs_tol=1e-6)
    summary_card = page[page.index('id="section-summary"') : page.index('id="section-approvals"')]
    assert float(_attr(summary_card, "data-cost")) == summary["cost_usd"]
    # The Budgets card has a row for the supervisor and finalize too, and the list shows
    # the same cost as the page.
    budgets = page[page.index('id="section-budgets"') : page.index('id="section-answer"')]
    assert 'data-budget="supervisor"' in budgets and 'data-budget="finalize"' in budgets
    cost = re.findall(r'class="num">(\$[0-9.,]+)<', _row(listed, task["id"]))
    assert cost == [f"${summary['cost_usd']:.4f}"]
    # A budget hit is no violation, on the list, its API and the page alike.
    assert summary["violations"] == 0 and summary["budget_hits"] == 1
    assert _attr(summary_card, "data-violations") == "0"
    assert _attr(summary_card, "data-budget-hits") == "1"
    assert _attr(_row(listed, task["id"]), "data-violations") == "0"
    assert 'data-rule="team.max_agent_runs"' in page


async def test_a_wait_for_approval_is_no_blown_time_and_labels_follow_the_run(priced: Dash) -> None:
    key = priced.key("acme")
    task = await priced.paused(key)
    waiting = await decide_on_page(priced, key, task["id"], decision="approve")
    assert "waiting for a person" in waiting
    await priced.wait(key, task["id"], FINISHED)
    page, _, trace, summary = await _pages(priced, key, task["id"])
    team = page[page.index('data-budget="team"') :]
    working = re.search(r'aria-label="seconds working: ([^"]+?)(?: of |, no limit)', team)
    # The server counts the roles' time against the limit, not the wall time with the wait.
    assert working and working.group(1) == seconds(trace["usage"]["total"]["seconds"])
    assert summary["waited_s"] > 0
    assert summary["waited_s"] < trace["duration_s"]
    assert 'data-waited="' in page and "waiting for a person" in page
    # The call held for approval says so and where it ran; nothing is left pending.
    outcomes = re.findall(r'data-kind="tool" data-outcome="(\w+)"', page)
    assert "pending" not in outcomes and outcomes.count("held") == 1
    # The visit the pause cut says how it ended, not "running"; the resumed one goes on
    # with it, and both count as one visit.
    assert 'data-visit-ended="interrupted"' in page and 'data-visit-ended="running"' not in page
    visits = re.search(r'aria-label="agent visits: (\d+)', page)
    assert visits and visits.group(1) == "3"
    assert summary["approvals"] == 1 and summary["rejected"] == 0
    # The waterfall has the turns, visits, calls and the wait, the wait as long as the
    # summary's, on the task's time axis.
    bars = re.findall(r'data-bar="(\w+)" data-start="([^"]+)" data-seconds="([^"]+)"', page)
    kinds = [kind for kind, _, _ in bars]
    assert kinds.count("supervisor") == 3 and kinds.count("agent") == 4
    assert kinds.count("wait") == 1 and "tool" in kinds
    [(_, _, waited)] = [bar for bar in bars if bar[0] == "wait"]
    assert math.isclose(float(waited), summary["waited_s"], abs_tol=0.002)
    # (The trace's duration is rounded to the millisecond.)
    assert all(0 <= float(start) <= trace["duration_s"] + 0.001 for _, start, _ in bars), (
        bars,
        trace["duration_s"],
        trace["start"],
    )


async def test_refusals_name_their_rule_and_the_policy_shows_as_text(
    priced: Dash, priced_policy: Path
) -> None:
    key = priced.key("acme")
    refused = await priced.submit(
        key,
        input="Look it up, no code",
        model=priced.script("refusing.json", REFUSED_RUN_PYTHON),
        metadata={"ticket": "OPS-4711"},
    )
    await priced.wait(key, refused["id"], FINISHED)
    page, listed, _, summary = await _pages(priced, key, refused["id"])
    assert summary["violations"] == 1 and summary["violation_kinds"] == ["tool_not_allowed"]
    row = _row(listed, refused["id"])
    assert _attr(row, "data-violations") == "1"
    assert "tool_not_allowed" in row.split('data-violations="1"')[1]  # shown, not a tooltip
    assert _attr(page, "data-violations") == "1"
    # The refused call is "refused", not an "error" like a tool that crashed.
    assert re.findall(r'data-kind="tool" data-outcome="(\w+)"', page) == ["refused"]
    violations = page[page.index('id="section-violations"') : page.index('id="section-graph"')]
    assert 'data-violation-row="tool_not_allowed" data-rule="agents.researcher.tools"' in (
        violations
    )
    # The policy's content is on the page, the refusing rule marked; the server's path is not.
    policy = page[page.index('id="section-policy"') :]
    assert "\n[agents.researcher]\n" in policy and '">max_agent_runs = ' in policy
    assert re.search(
        r'<mark id="rule-agents.researcher.tools"[^>]*data-refusing>tools = \[', policy
    )
    assert str(priced_policy.parent) not in page and "server-only" not in page
    origin = page[page.index("data-policy-origin") :][:200]
    assert '<a href="#policy">&#39;priced.toml&#39;</a>' in origin, origin
    # The caller's metadata is shown and searchable.
    assert "OPS-4711" in page and "OPS-4711" in row
    async with priced.browser(key) as client:
        found = await client.get("/ui", params={"q": "ops-4711"}, headers=HTML)
        assert refused["id"] in found.text
        anything = await client.get("/v1/task-summaries?violation=any", headers=bearer(key))
        assert [t["id"] for t in anything.json()["tasks"]] == [refused["id"]]
        # The API names the policy file without the server's path too.
        got = (await client.get(f"/v1/tasks/{refused['id']}", headers=bearer(key))).json()
        assert got["policy_source"] == "'priced.toml'", got["policy_source"]


async def test_a_rejected_call_is_rejected_not_a_plain_success(priced: Dash) -> None:
    key = priced.key("acme")
    task = await priced.paused(key)
    await decide_on_page(priced, key, task["id"], decision="reject", reason="no code today")
    await priced.wait(key, task["id"], FINISHED)
    page, listed, _, summary = await _pages(priced, key, task["id"])
    assert summary["rejected"] == 1
    assert _attr(_row(listed, task["id"]), "data-rejected") == "1"
    assert "rejected" in re.findall(r'data-kind="tool" data-outcome="(\w+)"', page)
    assert 'data-violation-row="rejected"' in page and "no code today" in page


@pytest.mark.parametrize(
    ("kind", "agent", "budget", "rule"),
    [
        ("tool_not_allowed", "coder", None, "agents.coder.tools"),
        ("handoff_not_allowed", "researcher", None, "agents.researcher.handoffs"),
        ("budget", None, {"scope": "team", "limit": "max_tokens"}, "team.max_tokens"),
        (
            "budget",
            "coder",
            {"scope": "agent", "agent": "coder", "limit": "max_model_calls"},
            "agents.coder.max_model_calls",
        ),
        ("ping_pong", "coder", None, "ping_pong.max_bounces"),
        ("invalid_arguments", "coder", None, None),
    ],
)
def test_the_rule_behind_each_kind_of_refusal(
    kind: str, agent: str | None, budget: dict[str, Any] | None, rule: str | None
) -> None:
    assert refusing_rule(kind, agent, budget) == rule


def test_the_policy_text_keys_every_line_and_hides_the_servers_paths() -> None:
    lines = policy_lines(
        {
            "team": {"max_tokens": 10},
            "agents": {"coder": {"tools": ["run_python"]}},
            "prices": {"gpt-4o": {"input": 2.5, "output": 10}},
        }
    )
    text = "\n".join(line.text for line in lines)
    assert text == (
        '[team]\nmax_tokens = 10\n\n[agents.coder]\ntools = ["run_python"]\n\n'
        "[prices.gpt-4o]\ninput = 2.5\noutput = 10"
    )
    assert [line.rule for line in lines if line.rule] == [
        "team.max_tokens",
        "agents.coder.tools",
        "prices.gpt-4o.input",
        "prices.gpt-4o.output",
    ]
    assert policy_origin("/srv/secret/tight.toml + request") == "tight.toml + request"
    assert policy_origin("'/srv/x/t.toml' under C:\\etc\\c.toml") == "'t.toml' under c.toml"
    assert policy_origin(None) == "default" and policy_origin("default") == "default"


async def test_an_unknown_dashboard_address_is_a_page_not_bare_json(priced: Dash) -> None:
    async with priced.client() as stranger:
        away = await stranger.get("/ui/no/such/page", headers=HTML)
        assert away.status_code in (302, 303, 307) and "/ui/login" in away.headers["location"]
    async with priced.browser(priced.key("acme")) as client:
        missing = await client.get("/ui/no/such/page", headers=HTML)
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "Not found" in missing.text and "Back to the tasks" in missing.text


def _eval_run(ledger_url: str, *, topology: str, passed: bool, task_id: str | None) -> str:
    with Ledger(ledger_url) as ledger:
        run = ledger.record_eval_run(
            golden="golden.jsonl",
            models={"model": None, "agent_models": {}},
            options={"repeat": 1, "topology": {"kind": topology}},
            case_count=1,
            run_count=1,
        )
        check = {
            "name": "answer_contains",
            "passed": passed,
            "expected": ["I don't know"],
            "actual": "I don't know" if passed else "Paris",
        }
        ledger.record_eval_case(
            run, case_id="unknown", trial=1, passed=passed, checks=[check], task_id=task_id
        )
        ledger.finish_eval_run(run, metrics={"pass_rate": float(passed)})
        return run


async def test_eval_runs_show_their_topology_and_compare_like_with_like(
    home: Path, scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYGRAPH_UI_SHOW_EVALS", "true")
    async with running(home, scripts) as dash:
        key = dash.key("acme")
        task = await dash.submit(key, input="When are checkpoints written?")
        older = _eval_run(dash.ledger_url, topology="structured", passed=True, task_id=None)
        _eval_run(dash.ledger_url, topology="swarm", passed=True, task_id=None)
        newest = _eval_run(dash.ledger_url, topology="structured", passed=False, task_id=task["id"])
        async with dash.browser(key) as browser:
            listed = (await browser.get("/ui/evals", headers=HTML)).text
            page = (await browser.get(f"/ui/evals/{newest}", headers=HTML)).text
            pair = (await browser.get(f"/ui/evals/{newest}?against={older}", headers=HTML)).text
    # The newest run is compared by default with the older structured one, not the swarm's.
    against = listed[listed.index('id="c-against"') :]
    assert re.search(rf'<option value="{older}" selected>', against), against[:600]
    assert re.findall(r"<td data-topology>(\w+)</td>", listed) == [
        "structured",
        "swarm",
        "structured",
    ]
    assert "<strong data-topology>structured</strong>" in page
    # The expected value reads as written, not with JSON's escapes.
    assert "[&#34;I don&#39;t know&#34;]" in page and "\\u0027" not in page
    # The regressed case links to its task, on the side-by-side page too.
    regressed = pair[pair.index('data-change="regressed"') :]
    assert f'href="/ui/tasks/{task["id"]}"' in regressed[: regressed.index("</tr>")]


async def test_an_approval_takes_a_note(priced: Dash) -> None:
    key = priced.key("acme")
    task = await priced.paused(key)
    await decide_on_page(priced, key, task["id"], decision="approve", reason="checked: harmless")
    await priced.wait(key, task["id"], FINISHED)
    async with priced.browser(key) as client:
        approvals = await client.get(f"/v1/tasks/{task['id']}/approvals", headers=bearer(key))
        page = (await client.get(f"/ui/tasks/{task['id']}", headers=HTML)).text
    assert approvals.json()["approvals"][0]["reason"] == "checked: harmless"
    assert "checked: harmless" in page


def test_the_graph_draws_who_worked_refused_handoffs_and_every_bounce_apart() -> None:
    from relaygraph.api.ui._graph import layout, transfers_of

    from .test_dashboard import _event, _handoff

    # A swarm: the first agent worked though no work was sent to it.
    handoffs = [_handoff(n, 2 * n, "direct", *pair) for n, pair in enumerate(
        [("triage", "billing"), ("billing", "triage")] * 4, start=1)]  # fmt: skip
    refused = _event(
        20,
        "tool_result",
        agent="billing",
        tool="transfer_to_legal",
        tool_call_id="c1",
        status="error",
        ran=False,
        preview="billing may not hand off to legal",
    )
    transfers = transfers_of(handoffs, [refused])
    assert [(t.source, t.target, t.refused) for t in transfers][-1] == ("billing", "legal", True)
    assert not transfers[-1].carried_out
    names = ["triage", "billing", "legal"]
    swarm = layout(names, transfers, ran=["triage", "billing"])
    assert {n.name: n.ran for n in swarm.nodes} == {"triage": True, "billing": True, "legal": False}
    # Eight bounces between the same two agents: each arc deeper than the one before.
    depths = [e.label_y for e in swarm.edges if {e.transfer.source, e.transfer.target} == {
        "triage", "billing"}]  # fmt: skip
    assert depths == sorted(set(depths)) and len(depths) == 8
    assert swarm.height > max(depths)


def test_a_seven_agent_teams_names_fit_when_the_row_has_room() -> None:
    from relaygraph.api.ui._graph import layout

    names = [f"{role}Specialist" for role in ("Billing", "Legal", "Refunds", "Shipping",
                                              "Accounts", "Security", "Onboarding")]  # fmt: skip
    graph = layout(names, [])
    row = [n for n in graph.nodes if not n.supervisor]
    assert [n.label for n in row] == names
    boxes = sorted((n.x - graph.node_width / 2, n.x + graph.node_width / 2) for n in row)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(boxes))
    assert boxes[0][0] >= 0 and boxes[-1][1] <= graph.width


async def test_the_list_filters_by_team_and_approvals(priced: Dash) -> None:
    key = priced.key("acme")
    relay = await priced.submit(key, input="When are checkpoints written?")
    asked = await priced.paused(key)
    await priced.wait(key, relay["id"], FINISHED)
    async with priced.client() as client:

        async def ids(**query: str) -> list[str]:
            got = await client.get("/v1/task-summaries", params=query, headers=bearer(key))
            assert got.status_code == 200, got.text
            return [t["id"] for t in got.json()["tasks"]]

        assert await ids(approvals="any") == [asked["id"]]
        assert await ids(approvals="rejected") == []
        assert await ids(team="default") == [asked["id"], relay["id"]]
        assert await ids(team="docs-review") == []
        bad = await client.get(
            "/v1/task-summaries", params={"approvals": "maybe"}, headers=bearer(key)
        )
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "approvals"
    async with priced.browser(key) as browser:
        page = (await browser.get("/ui", params={"approvals": "any"}, headers=HTML)).text
        assert asked["id"] in page and relay["id"] not in page
        wrong = (await browser.get("/ui", params={"approvals": "maybe"}, headers=HTML)).text
        assert "&#39;maybe&#39; is not one of any, rejected" in wrong
