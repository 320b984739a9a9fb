"""Tenancy under pressure: fair shares between projects, their quotas, and what a project
sees of them (``GET /v1/projects/me``).

The ledger's fair queue is checked on SQLite and PostgreSQL; the HTTP behaviour in process
(httpx.ASGITransport); the flood against a real ``relaygraph serve`` (tests/worker_cluster.py)
with and without ``--processes``. Every wait polls under a generous deadline.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaygraph.api import ServiceSettings, create_app
from relaygraph.api._in_process import InProcessDispatch
from relaygraph.client import Client
from relaygraph.errors import ConfigError, QuotaExceeded
from relaygraph.store import (
    WORKER_GONE_SECONDS,
    Ledger,
    QuotaOverrides,
    Quotas,
    RecordNotFound,
)
from relaygraph.store._quotas import UNREPORTED_PUBLISH_AHEAD

from ._service import FINISHED, ServiceClient, auth, in_process
from .conftest import EXAMPLE_RELAY
from .openai_server import serve_script
from .test_serve_processes import _recording
from .worker_cluster import Cluster, fresh_database, wait_until

DEADLINE = 120.0
"""Seconds any one wait may take (generous: a loaded 2-core machine)."""


def _queue(ledger: Ledger, project_id: str, count: int, label: str) -> list[str]:
    return [
        ledger.create_task(project_id=project_id, input=f"{label}{i}", thread_id=f"{label}{i}")[
            0
        ].id
        for i in range(count)
    ]


def _run(ledger: Ledger, task_id: str, runner: str = "elsewhere") -> None:
    assert ledger.take_lease(task_id, runner, seconds=600, only_from=("queued",)) is not None


def _flood_then_one(ledger: Ledger, count: int) -> tuple[str, list[str], str]:
    """Project B queues ``count`` tasks and runs its first two; project A then queues one.
    Returns B's project id, B's tasks in the order they were queued, and A's task."""
    b, _ = ledger.create_project("b")
    a, _ = ledger.create_project("a")
    flood = _queue(ledger, b.id, count, "b")
    _run(ledger, flood[0])
    _run(ledger, flood[1])
    [mine] = _queue(ledger, a.id, 1, "a")
    return b.id, flood, mine


# -- the fair queue, in the ledger -------------------------------------------------------


def test_a_free_worker_serves_the_project_with_fewest_running_not_the_oldest_task(
    ledger: Ledger,
) -> None:
    """B floods the queue first and has two tasks running; A's one task, queued last, is
    the first a free worker takes. Oldest-first would take 50 of B's before it."""
    _, flood, mine = _flood_then_one(ledger, 52)
    assert ledger.queued_tasks(limit=3) == [mine, flood[2], flood[3]]


def test_equal_shares_go_round_the_projects(ledger: Ledger) -> None:
    """With as many running each, the project served longest ago goes first: one worker
    alternates between B's old backlog and A's newer tasks instead of draining B's."""
    b, _ = ledger.create_project("b")
    a, _ = ledger.create_project("a")
    flood = _queue(ledger, b.id, 5, "b")
    mine = _queue(ledger, a.id, 2, "a")
    order = []
    for _ in range(4):  # one worker: take the first, finish it, take the next
        [taken] = ledger.queued_tasks(limit=1)
        order.append(taken)
        _run(ledger, taken)
        ledger.set_status(taken, "succeeded")
    # B's oldest first (neither has run anything), then A, B, A.
    assert order == [flood[0], mine[0], flood[1], mine[1]]


def test_a_project_at_its_running_quota_leaves_the_worker_to_another(ledger: Ledger) -> None:
    b, _ = ledger.create_project("b")
    a, _ = ledger.create_project("a")
    flood = _queue(ledger, b.id, 4, "b")
    _run(ledger, flood[0])
    # The server's quota (2) lets B start one more; B's own (1, the operator's) none.
    assert ledger.queued_tasks(limit=10, max_running=2) == [flood[1]]
    ledger.set_project_quotas("b", QuotaOverrides(max_running=1))
    assert ledger.queued_tasks(limit=10, max_running=2) == []
    [mine] = _queue(ledger, a.id, 1, "a")
    assert ledger.queued_tasks(limit=10, max_running=2) == [mine]
    # Unlimited by default: B's queue is there behind A's.
    ledger.set_project_quotas("b", QuotaOverrides())
    assert ledger.queued_tasks(limit=10)[:2] == [mine, flood[1]]


def test_a_server_with_free_workers_leaves_a_project_at_its_running_quota_queued(
    ledger: Ledger, tmp_path: Path
) -> None:
    """The running quota where a server takes tasks: two workers free, B at its quota of
    2 running (the server's setting): the workers take A's task and none of B's."""
    b_id, flood, mine = _flood_then_one(ledger, 5)
    workers = InProcessDispatch(
        ledger, home=tmp_path, workers=2, pull=True, quotas=Quotas(max_running=2)
    )
    started = _recording(workers)
    try:
        assert workers.pull() == 1 and started == [mine]
    finally:
        workers.shutdown(wait=False)
    left = [ledger.get_task(t, project_id=b_id) for t in flood[2:]]
    assert {t.status for t in left if t} == {"queued"}


def test_the_worker_mode_publishes_within_its_budget_fairly(ledger: Ledger) -> None:
    """Published tasks not yet started count as running; at most ``budget`` wait."""
    b, _ = ledger.create_project("b")
    a, _ = ledger.create_project("a")
    flood = _queue(ledger, b.id, 6, "b")
    first = ledger.tasks_to_publish(budget=2)
    assert first == flood[:2]
    for task_id in first:
        assert ledger.claim_for_workers(task_id) == 1
        # Another server or worker that picked it at once publishes it not again.
        assert ledger.claim_for_workers(task_id) is None
    assert ledger.tasks_to_publish(budget=2) == []  # two wait for a worker already
    [mine] = _queue(ledger, a.id, 1, "a")
    assert ledger.start_attempt(flood[0], dispatch=1, worker_id="w", max_attempts=3)
    assert ledger.tasks_to_publish(budget=2) == [mine]


def test_the_worker_mode_publishes_as_many_as_the_live_workers_have_free(
    ledger: Ledger,
) -> None:
    """With no ``RELAYGRAPH_PUBLISH_AHEAD``, the budget is the live pool processes' free
    slots: with both of two workers busy, no task of B's waits in the broker where A's new
    task would queue behind it (a fixed budget of 4 published four); a task's end frees a
    slot, and A's task is the next published. A worker gone quiet counts no more."""
    b, _ = ledger.create_project("b")
    a, _ = ledger.create_project("a")
    flood = _queue(ledger, b.id, 8, "b")
    # No worker reported yet: a few go ahead, so that the first to start has work.
    assert len(ledger.tasks_to_publish()) == UNREPORTED_PUBLISH_AHEAD
    ledger.report_worker_slots("w1", slots=1)
    ledger.report_worker_slots("w2", slots=1)
    first = ledger.tasks_to_publish()
    assert first == flood[:2]
    for number, task_id in enumerate(first):
        assert ledger.claim_for_workers(task_id) == 1
        assert ledger.start_attempt(task_id, dispatch=1, worker_id=f"w{number}", max_attempts=3)
    assert ledger.tasks_to_publish() == []  # Both workers busy, and none waits.
    [mine] = _queue(ledger, a.id, 1, "a")
    assert ledger.tasks_to_publish() == []
    assert ledger.tasks_to_publish(budget=4) == [mine, flood[2], flood[3], flood[4]]
    ended = ledger.get_task(first[0], project_id=b.id)
    assert ended is not None
    ledger.end_run(first[0], usage={}, status="succeeded", attempt=ended.attempts)
    assert ledger.tasks_to_publish() == [mine]
    # A third worker, and one that stopped reporting long ago: one slot more, not two.
    ledger.report_worker_slots("w3", slots=1)
    long_ago = datetime.now(UTC) - timedelta(seconds=WORKER_GONE_SECONDS + 1)
    ledger.report_worker_slots("w4", slots=1, now=long_ago)
    assert ledger.tasks_to_publish() == [mine, flood[2]]
    ledger.forget_worker_slots("w3")
    assert ledger.tasks_to_publish() == [mine]


# -- the queued quota and the day's spend, in the ledger ---------------------------------


def test_the_queued_quota_refuses_a_new_task_not_a_retry(ledger: Ledger) -> None:
    project, _ = ledger.create_project("b")
    quotas = Quotas(max_queued=2)
    kept = [
        ledger.create_task(
            project_id=project.id, input=f"t{i}", idempotency_key=f"k{i}", quotas=quotas
        )[0]
        for i in range(2)
    ]
    with pytest.raises(QuotaExceeded) as refused:
        ledger.create_task(project_id=project.id, input="t2", quotas=quotas)
    assert refused.value.quota == "max_queued" and refused.value.limit == 2
    assert "max_queued is 2" in str(refused.value) and "'b'" in str(refused.value)
    assert refused.value.retry_after_seconds > 0
    # A retry of a recorded submission is the same task, not another.
    again, created = ledger.create_task(
        project_id=project.id, input="t0", idempotency_key="k0", quotas=quotas
    )
    assert again.id == kept[0].id and not created
    # The operator's quota for the project overrides the server's.
    ledger.set_project_quotas("b", QuotaOverrides(max_queued=3))
    ledger.create_task(project_id=project.id, input="t2", quotas=quotas)
    tasks, _ = ledger.list_tasks(project_id=project.id)
    assert len(tasks) == 3


def test_project_quotas_refuse_bad_values_by_name(ledger: Ledger) -> None:
    ledger.create_project("b")
    for bad, named in (
        (QuotaOverrides(max_running=0), "max_running 0"),
        (QuotaOverrides(max_queued=True), "max_queued True"),  # type: ignore[arg-type]
        (QuotaOverrides(daily_cost_usd=-1.0), "daily_cost_usd -1.0"),
        (QuotaOverrides(daily_cost_usd=float("nan")), "daily_cost_usd nan"),
    ):
        with pytest.raises(ConfigError, match=re.escape(named)):
            ledger.set_project_quotas("b", bad)
    with pytest.raises(RecordNotFound):
        ledger.set_project_quotas("nobody", QuotaOverrides(max_running=1))


def test_the_day_budget_counts_today_only(ledger: Ledger) -> None:
    project, _ = ledger.create_project("b")
    task, _ = ledger.create_task(project_id=project.id, input="x")
    usage = {
        "id": "coder:1",
        "agent": "coder",
        "model_calls": 1,
        "input_tokens": 10,
        "output_tokens": 1,
        "cost_usd": 0.4,
    }
    ledger.record_usage(task.id, [usage])
    assert ledger.spent_today(project.id) == pytest.approx(0.4)
    assert ledger.spent_today(project.id, excluding=task.id) == 0
    assert ledger.project_load(project.id).cost_today_usd == pytest.approx(0.4)
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    assert ledger.spent_today(project.id, now=tomorrow) == 0
    with pytest.raises(QuotaExceeded) as refused:
        ledger.create_task(project_id=project.id, input="y", quotas=Quotas(daily_cost_usd=0.4))
    assert refused.value.code == "budget_exhausted"
    # Retry-After: at 00:00 UTC, when the day's spend starts from 0 again.
    assert 0 < refused.value.retry_after_seconds <= 24 * 3600


# -- over HTTP, in process ---------------------------------------------------------------


class Service(ServiceClient):
    async def ask(self, key: str, text: str, **headers: str) -> httpx.Response:
        """``POST /v1/tasks`` of ``text``, with ``headers`` (an ``Idempotency-Key``)."""
        return await self.client.post(
            "/v1/tasks", json={"input": text}, headers={**auth(key), **headers}
        )


@pytest.fixture
def priced_policy(tmp_path: Path) -> Path:
    """The operator's policy: the relay script's tokens cost USD 1,000 per million (so a
    task costs about a dollar), no team cost cap below that."""
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[team]\nmax_cost_usd = 1000\n\n[prices."relay.json"]\ninput = 1000\noutput = 1000\n',
        encoding="utf-8",
    )
    return policy


@contextlib.asynccontextmanager
async def _service(home: Path, policy: Path, *, start_workers: bool) -> AsyncIterator[Service]:
    settings = ServiceSettings(
        default_model=f"scripted:{EXAMPLE_RELAY}",
        home=home,
        workers=1,
        policy_file=policy,
    )
    app = create_app(settings, start_workers=start_workers)
    async with in_process(app) as client:
        yield Service(client, f"sqlite:///{home / 'ledger.sqlite'}", seconds=DEADLINE)


@pytest.fixture
async def stopped(
    home: Path, priced_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Service]:
    """A server whose workers take nothing: what is submitted stays queued. Its server
    setting: 3 tasks queued per project."""
    monkeypatch.setenv("RELAYGRAPH_PROJECT_MAX_QUEUED", "3")
    async with _service(home, priced_policy, start_workers=False) as service:
        yield service


@pytest.fixture
async def running(home: Path, priced_policy: Path) -> AsyncIterator[Service]:
    async with _service(home, priced_policy, start_workers=True) as service:
        yield service


async def test_a_flood_past_the_queued_quota_gets_429_and_loses_nothing(stopped: Service) -> None:
    b = stopped.key("b")
    a = stopped.key("a")
    accepted = []
    for i in range(3):
        made = await stopped.ask(b, f"b{i}", **{"Idempotency-Key": f"b{i}"})
        assert made.status_code == 202, made.text
        accepted.append(made.json()["id"])
    refused = await stopped.ask(b, "b3")
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and error["field"] == "max_queued"
    assert "max_queued is 3" in error["message"] and "3 tasks queued" in error["message"]
    assert int(refused.headers["Retry-After"]) > 0
    # Nothing was recorded of the refused one; what was accepted is all there, and a
    # retry of an accepted submission is still that task (202), not a refusal.
    listed = (await stopped.client.get("/v1/tasks", headers=auth(b))).json()
    assert sorted(t["id"] for t in listed["tasks"]) == sorted(accepted)
    again = await stopped.ask(b, "b0", **{"Idempotency-Key": "b0"})
    assert again.status_code == 202 and again.json()["id"] == accepted[0]
    # Another project's submissions are its own quota's business.
    assert (await stopped.ask(a, "a0")).status_code == 202
    me = (await stopped.client.get("/v1/projects/me", headers=auth(b))).json()
    assert me["name"] == "b"
    assert me["quotas"] == {
        "max_running": None,
        "max_queued": 3,
        "daily_cost_usd": None,
        "max_streams": 100,
    }
    assert me["usage"]["queued"] == 3 and me["usage"]["running"] == 0
    theirs = (await stopped.client.get("/v1/projects/me", headers=auth(a))).json()
    assert theirs["name"] == "a" and theirs["usage"]["queued"] == 1  # its own only


async def test_projects_me_needs_a_key_and_shows_the_operators_quotas(stopped: Service) -> None:
    key = stopped.key("b", QuotaOverrides(max_running=4, max_queued=7, daily_cost_usd=2.5))
    assert (await stopped.client.get("/v1/projects/me")).status_code == 401
    me = (await stopped.client.get("/v1/projects/me", headers=auth(key))).json()
    assert me["quotas"]["max_running"] == 4
    assert me["quotas"]["max_queued"] == 7
    assert me["quotas"]["daily_cost_usd"] == 2.5
    assert me["usage"]["cost_today_usd"] == 0 and me["usage"]["streams"] == 0
    assert me["day_started_at"].endswith(("T00:00:00Z", "T00:00:00+00:00"))


async def test_the_day_budget_stops_a_running_task_and_refuses_the_next(running: Service) -> None:
    """Each relay task costs about a dollar at the operator's prices; B's day budget is 50
    cents. B's task stops ``degraded`` before the model call that would go past it, named;
    B's next submission gets 429 until 00:00 UTC; A, with no budget, is not touched."""
    b = running.key("b", QuotaOverrides(daily_cost_usd=0.5))
    a = running.key("a")
    made = await running.ask(b, "When are checkpoints written?")
    assert made.status_code == 202, made.text
    task = await running.wait(made.json()["id"], b)
    assert task["status"] == "degraded", task
    assert task["stop_reason"] == "budget:project:daily_cost_usd", task
    events = (await running.client.get(f"/v1/tasks/{task['id']}/events", headers=auth(b))).text
    assert "project &#x27;b&#x27; spent" in events or "project 'b' spent" in events
    assert "daily budget of 0.5 USD" in events
    refused = await running.ask(b, "Again")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exhausted"
    assert "daily_cost_usd is 0.5" in refused.json()["error"]["message"]
    assert 0 < int(refused.headers["Retry-After"]) <= 24 * 3600
    me = (await running.client.get("/v1/projects/me", headers=auth(b))).json()
    assert me["usage"]["cost_today_usd"] >= 0.5 and me["quotas"]["daily_cost_usd"] == 0.5
    theirs = await running.ask(a, "When are checkpoints written?")
    assert (await running.wait(theirs.json()["id"], a))["status"] == "succeeded"


# -- the flood, against a real server ----------------------------------------------------

FLOOD = 16
"""B's tasks, submitted at once before A's one."""
CALL_SECONDS = 0.4
"""How long the model double takes to answer each call: a task (three calls) holds its
worker about three times this, so B's flood is a backlog of several seconds."""
JOB = re.compile(r"job-[ab][0-9]+")


def _turns(job: str) -> list[dict[str, Any]]:
    return [
        {"route": {"next": "writer", "task": f"Write the line for {job}.", "reason": "asked"}},
        {"content": f"One line for {job}."},
        {"route": {"next": "FINISH", "task": "", "reason": "written"}},
    ]


def _job_of(body: dict[str, Any]) -> str | None:
    """The script of a call: the job its messages name (each task names its own)."""
    found = JOB.search(json.dumps(body.get("messages")))
    return found.group(0) if found else None


@pytest.fixture
def flood_cluster(tmp_path: Path) -> Iterator[Cluster]:
    jobs = [f"job-b{i}" for i in range(FLOOD)] + ["job-a0"]
    with serve_script(
        {job: _turns(job) for job in jobs}, delay_seconds=CALL_SECONDS, key_from=_job_of
    ) as double:
        env = {"OPENAI_BASE_URL": double.base_url, "OPENAI_API_KEY": "test-key"}
        with Cluster(tmp_path, database_url=None, broker=None, env=env) as cluster:
            yield cluster


def flood_and_check(cluster: Cluster, url: str, *, ahead: int, ledger_url: str) -> None:
    """B submits FLOOD tasks at once, then A one: A's task starts before B's backlog (at
    most ``ahead`` of B's tasks start between A's submission and A's start), where first
    in, first out would start all of B's waiting tasks first."""
    b_key, a_key = cluster.create_project("b"), cluster.create_project("a")
    with Client(url, b_key) as b, Client(url, a_key) as a:
        flood = [
            b.submit(f"Write one line for job-b{i}.", model="openai:relay")["id"]
            for i in range(FLOOD)
        ]
        mine = a.submit("Write one line for job-a0.", model="openai:relay")["id"]
        for client, ids in ((b, flood), (a, [mine])):
            for task_id in ids:
                done = wait_until(
                    lambda c=client, t=task_id: (got := c.get(t))["status"] in FINISHED and got,
                    DEADLINE,
                    f"task {task_id} finished",
                )
                assert done["status"] == "succeeded", done
    with Ledger(ledger_url) as ledger:
        project_b, project_a = ledger.get_project("b"), ledger.get_project("a")
        assert project_b is not None and project_a is not None
        theirs = [ledger.get_task(t, project_id=project_b.id) for t in flood]
        own = ledger.get_task(mine, project_id=project_a.id)
    assert own is not None and own.started_at is not None
    waiting = [t for t in theirs if t and t.started_at and t.started_at > own.created_at]
    # The attack needs a backlog: B's tasks still waiting when A submitted.
    assert len(waiting) >= ahead + 2, f"only {len(waiting)} of B's tasks waited"
    before = [t for t in waiting if t.started_at and t.started_at < own.started_at]
    assert len(before) <= ahead, (
        f"{len(before)} of B's {len(waiting)} waiting tasks started before A's task"
    )


def flood_one_server(cluster: Cluster, processes: int) -> None:
    """:func:`flood_and_check` on one ``relaygraph serve`` of two workers in ``processes``
    task processes, on its SQLite ledger."""
    server = cluster.serve("api", model="openai:relay", workers=2, processes=processes)
    flood_and_check(
        cluster,
        server.url,
        ahead=2,  # one per worker: a worker freed as A's task was being recorded
        ledger_url=f"sqlite:///{cluster.home / 'ledger.sqlite'}",
    )


def test_a_flood_by_one_project_does_not_hold_back_another_in_process(
    flood_cluster: Cluster,
) -> None:
    flood_one_server(flood_cluster, processes=1)


def test_a_flood_by_one_project_does_not_hold_back_another_with_processes(
    flood_cluster: Cluster,
) -> None:
    flood_one_server(flood_cluster, processes=2)


def test_a_flood_by_one_project_does_not_hold_back_another_in_the_worker_mode(
    tmp_path: Path, postgres_server: str, rabbitmq: str
) -> None:
    """Two workers of one task each on RabbitMQ; the API server and the workers publish
    only as many tasks as the workers have free slots, each picked from the ledger fairly:
    A's task waits behind the 2 running, not behind B's whole flood nor a fixed number of
    B's tasks published ahead."""
    jobs = [f"job-b{i}" for i in range(FLOOD)] + ["job-a0"]
    with (
        fresh_database(postgres_server) as database,
        serve_script(
            {job: _turns(job) for job in jobs}, delay_seconds=CALL_SECONDS, key_from=_job_of
        ) as double,
    ):
        # No RELAYGRAPH_PUBLISH_AHEAD: the workers' free slots set it.
        env = {"OPENAI_BASE_URL": double.base_url, "OPENAI_API_KEY": "test-key"}
        with Cluster(tmp_path, database_url=database, broker=rabbitmq, env=env) as cluster:
            server = cluster.serve("api", model="openai:relay")
            cluster.worker("w1", traced=False)
            cluster.worker("w2", traced=False)
            # Both workers busy, none of B's waits in RabbitMQ (a fixed 4 let 4 start
            # first): A's task is published at the next end, as a worker frees up; one of
            # B's may have been published for a slot freed just before A's submission.
            flood_and_check(cluster, server.url, ahead=2, ledger_url=database)
