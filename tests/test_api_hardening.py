"""Hostile input at the HTTP edge, on SQLite and PostgreSQL alike: every bad request is a
4xx with the documented error body (``{"error": {"code", "message", "field"}}``), never a
500 or a stream that breaks after its 200."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaygraph.store import DATABASE_URL_ENV, Ledger

from ._service import ServiceClient, auth, in_process_service
from .conftest import EXAMPLE_RELAY


def latin1(headers: dict[str, str]) -> dict[bytes, bytes]:
    """Headers as bytes: HTTP carries Latin-1, which httpx would not encode from text."""
    return {name.encode(): value.encode("latin-1") for name, value in headers.items()}


def assert_error(got: httpx.Response, status: int, code: str, field: str | None) -> None:
    """The documented error body, as valid UTF-8 JSON, naming the field."""
    assert got.status_code == status, got.text
    assert got.headers["content-type"] == "application/json"
    error = json.loads(got.content.decode("utf-8"))["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert error.get("field") == field, error


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{home / 'ledger.sqlite'}"
    url = str(request.getfixturevalue("postgres_url"))
    monkeypatch.setenv(DATABASE_URL_ENV, url)  # The runs' checkpoints go there too.
    return url


@pytest.fixture
async def api(home: Path, ledger_url: str, scripts: Path) -> AsyncIterator[ServiceClient]:
    async with in_process_service(
        home, scripts_dir=scripts, database_url=ledger_url, workers=1, max_body_bytes=64 * 1024
    ) as service:
        yield service


# Text the ledger cannot store: the JSON escapes \udfff (a lone surrogate) and \u0000 (NUL).
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"input": "x", "metadata": {"\\udfff": 1}}', "metadata"),
        ('{"input": "x", "metadata": {"ticket": "4711\\udfff"}}', "metadata.ticket"),
        ('{"input": "x", "metadata": {"a\\u0000b": 1}}', "metadata"),
        ('{"input": "x", "metadata": {"tags": ["ok", "\\u0000"]}}', "metadata.tags[1]"),
        ('{"input": "x", "policy": {"\\udfff": {}}}', "policy"),
        (
            '{"input": "x", "policy": {"agents": {"coder": {"tools": ["run_\\udfff"]}}}}',
            "policy.agents.coder.tools[0]",
        ),
        ('{"input": "x", "agent_models": {"\\udfff": "openai:gpt-4o"}}', "agent_models"),
        ('{"input": "x", "agent_models": {"coder": "openai:\\u0000"}}', "agent_models.coder"),
        ('{"input": "x", "model": "scripted:/tmp/\\udfff.json"}', "model"),
        ('{"input": "x", "model": "openai:gpt\\u0000"}', "model"),
        ('{"input": "x\\u0000"}', "input"),
        ('{"input": "x", "thread_id": "t\\udfff"}', "thread_id"),
        ('{"input": "x", "\\udfff": 1}', "body"),
        ('{"input": "x", "metadata": {"n": NaN}}', "metadata.n"),
        ('{"input": "x", "metadata": {"n": 1e999}}', "metadata.n"),
    ],
)
async def test_text_the_ledger_cannot_store_is_422_naming_the_field(
    api: ServiceClient, body: str, field: str
) -> None:
    key = api.key("acme")
    got = await api.post_raw("/v1/tasks", body.encode(), key)
    assert_error(got, 422, "invalid_request", field)
    assert (await api.client.get("/v1/tasks", headers=auth(key))).json()["tasks"] == []


async def test_a_decision_with_unstorable_text_is_422(api: ServiceClient) -> None:
    key = api.key("acme")
    body = '{"decision": "reject", "reason": "no\\udfff"}'
    got = await api.post_raw("/v1/tasks/some-task/approvals/some-id", body.encode(), key)
    assert_error(got, 422, "invalid_request", "reason")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"input": "\xff\xfe"}', "not valid UTF-8"),
        (b'{"input": "x", "metadata": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nests too deeply"),
        (b'{"input": "x", "metadata": {"n": ' + b"9" * 5000 + b"}}", "digits"),
        (b'{"input": "x", "metadata": ' + b"[" * 40 + b"]" * 40 + b"}", "nests deeper than"),
        (b'{"input": "x"', "not valid JSON"),
    ],
    ids=["invalid-utf8", "2000-deep", "5000-digits", "40-deep", "truncated"],
)
async def test_a_body_that_cannot_be_read_is_422_naming_the_body(
    api: ServiceClient, body: bytes, message: str
) -> None:
    key = api.key("acme")
    got = await api.post_raw("/v1/tasks", body, key)
    assert got.status_code == 422, got.text
    error = got.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == "body" or error["field"].startswith("metadata")
    assert message in error["message"]


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ("until=0001-01-01T00:00:00%2B14:00", "until", "outside the times UTC can express"),
        ("since=9999-12-31T23:59:59-14:00", "since", "outside the times UTC can express"),
        ("since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z", "since", "is after until"),
        ("since=2026-01-01T00:00:00", "since", "has no time zone"),
        ("since=", "since", "since"),
    ],
)
async def test_usage_refuses_a_bad_range_naming_the_field(
    api: ServiceClient, query: str, field: str, message: str
) -> None:
    key = api.key("acme")
    got = await api.client.get(f"/v1/usage?{query}", headers=auth(key))
    assert_error(got, 422, "invalid_request", field)
    assert message in got.json()["error"]["message"]


@pytest.mark.parametrize(
    ("query", "field"),
    [("status=", "status"), ("status=bogus", "status"), ("limit=0", "limit")],
)
async def test_listing_refuses_an_empty_or_unknown_value(
    api: ServiceClient, query: str, field: str
) -> None:
    key = api.key("acme")
    got = await api.client.get(f"/v1/tasks?{query}", headers=auth(key))
    assert_error(got, 422, "invalid_request", field)


async def test_an_event_id_beyond_the_ledger_is_422_before_the_stream(api: ServiceClient) -> None:
    key = api.key("acme")
    made = await api.client.post("/v1/tasks", json={"input": "When?"}, headers=auth(key))
    task = await api.wait(made.json()["id"], key)
    path = f"/v1/tasks/{task['id']}/events"
    for value in ("99999999999999999999999", "2147483648", "-1", "1e3", "\xb2"):
        got = await api.client.get(path, headers=latin1({**auth(key), "Last-Event-ID": value}))
        assert_error(got, 422, "invalid_request", "Last-Event-ID")
    got = await api.client.get(f"{path}?after=99999999999999999999999", headers=auth(key))
    assert_error(got, 422, "invalid_request", "after")
    # The largest sequence number the ledger holds is a valid (empty) resume point.
    last = await api.client.get(path, headers={**auth(key), "Last-Event-ID": "2147483647"})
    assert last.status_code == 200
    assert last.headers["content-type"].startswith("text/event-stream")
    assert "id:" not in last.text


@pytest.mark.parametrize("value", [" ", "a\x00b"])
async def test_an_unstorable_idempotency_key_is_422(api: ServiceClient, value: str) -> None:
    key = api.key("acme")
    got = await api.client.post(
        "/v1/tasks",
        json={"input": "x"},
        headers=latin1({**auth(key), "Idempotency-Key": value}),
    )
    assert_error(got, 422, "invalid_request", "Idempotency-Key")


async def test_an_id_the_ledger_cannot_hold_is_404(api: ServiceClient) -> None:
    key = api.key("acme")
    got = await api.client.get("/v1/tasks/a%00b", headers=auth(key))
    assert_error(got, 404, "task_not_found", "task_id")


async def test_a_method_a_path_does_not_take_is_405_with_allow(api: ServiceClient) -> None:
    got = await api.client.request("TRACE", "/v1/tasks")
    assert_error(got, 405, "method_not_allowed", None)
    assert set(got.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
    got = await api.client.delete("/v1/tasks/x/cancel")
    assert got.status_code == 405 and got.headers["allow"] == "POST"


# Finding 6: an Idempotency-Key stands for one request, all of it.


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"input": "another question"}, "input"),
        ({"policy": {"team": {"max_agent_runs": 1}}}, "policy"),
        ({"model": "openai:gpt-4o"}, "model"),
        ({"metadata": {"ticket": "4712"}}, "metadata"),
        ({"thread_id": "ticket-4711"}, "thread"),
        ({"topology": "supervisor-tools"}, "topology"),
    ],
)
async def test_an_idempotency_key_reused_for_another_request_is_409(
    api: ServiceClient, change: dict[str, Any], named: str
) -> None:
    key = api.key("acme")
    headers = {**auth(key), "Idempotency-Key": "order-1"}
    body = {"input": "When are checkpoints written?", "metadata": {"ticket": "4711"}}
    first = await api.client.post("/v1/tasks", json=body, headers=headers)
    assert first.status_code == 202, first.text
    again = await api.client.post("/v1/tasks", json=body, headers=headers)
    assert (again.status_code, again.json()["id"]) == (202, first.json()["id"])
    other = await api.client.post("/v1/tasks", json={**body, **change}, headers=headers)
    assert_error(other, 409, "idempotency_key_reused", "Idempotency-Key")
    assert named in other.json()["error"]["message"]
    # Keys are per project: another project's same key is its own.
    stranger = api.key("other")
    theirs = await api.client.post(
        "/v1/tasks",
        json={**body, **change},
        headers={**auth(stranger), "Idempotency-Key": "order-1"},
    )
    assert theirs.status_code == 202, theirs.text
    assert theirs.json()["id"] != first.json()["id"]
    await api.wait(first.json()["id"], key)
    await api.wait(theirs.json()["id"], stranger)


# Finding 7: thread ids are each project's own.


def two_turns() -> dict[str, Any]:
    """A script a thread plays once per request: turn one, then turn two."""
    return {
        "supervisor": [
            {"route": {"next": "writer", "task": "answer", "reason": "first"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
            {"route": {"next": "writer", "task": "answer", "reason": "second"}},
            {"route": {"next": "FINISH", "task": "", "reason": "done"}},
        ],
        "writer": [{"content": "Answer one."}, {"content": "Answer two."}],
    }


async def test_a_thread_id_another_project_uses_is_a_new_thread(
    api: ServiceClient, scripts: Path
) -> None:
    (scripts / "two-turns.json").write_text(json.dumps(two_turns()), encoding="utf-8")
    b_key, a_key = api.key("b-project"), api.key("a-project")
    body = {"input": "go", "model": "scripted:two-turns.json", "thread_id": "ticket-4711"}
    b_first = await api.client.post("/v1/tasks", json=body, headers=auth(b_key))
    assert b_first.status_code == 202, b_first.text
    assert (await api.wait(b_first.json()["id"], b_key))["answer"] == "Answer one."
    # Project A's first use of the id is a new thread of A's, in any topology: it neither
    # continues B's conversation nor learns that B uses the id.
    a_first = await api.client.post("/v1/tasks", json=body, headers=auth(a_key))
    assert a_first.status_code == 202, a_first.text
    assert a_first.json()["thread_id"] == "ticket-4711"
    assert (await api.wait(a_first.json()["id"], a_key))["answer"] == "Answer one."
    # B's thread goes on where B left it, untouched by A's task.
    b_second = await api.client.post("/v1/tasks", json=body, headers=auth(b_key))
    assert (await api.wait(b_second.json()["id"], b_key))["answer"] == "Answer two."
    listed = (await api.client.get("/v1/tasks", headers=auth(a_key))).json()["tasks"]
    assert [t["id"] for t in listed] == [a_first.json()["id"]]
    # A busy thread of B's does not make A's thread busy.
    swarm = {**body, "topology": "swarm", "thread_id": "ticket-4712"}
    other = await api.client.post("/v1/tasks", json=swarm, headers=auth(b_key))
    assert other.status_code == 202, other.text
    mine = await api.client.post(
        "/v1/tasks", json={**body, "thread_id": "ticket-4712"}, headers=auth(a_key)
    )
    assert mine.status_code == 202, mine.text
    assert mine.json()["topology"] == {"kind": "structured"}
    await api.wait(other.json()["id"], b_key)
    await api.wait(mine.json()["id"], a_key)


# Finding 4 (the endpoint): cancel ends a task whose runner is dead.


async def test_cancel_ends_a_running_task_whose_runner_died(api: ServiceClient) -> None:
    key = api.key("acme")
    with Ledger(api.ledger_url) as ledger:
        project = ledger.authenticate(key)
        assert project is not None
        task, _ = ledger.create_task(project_id=project.id, input="x", thread_id="t-1")
        # A runner took it and died: its lease lapses, unrenewed.
        assert ledger.take_lease(task.id, "server-dead", seconds=0.05) is not None
    behind = {"input": "When?", "thread_id": "t-1", "multitask": "enqueue"}
    queued = await api.client.post("/v1/tasks", json=behind, headers=auth(key))
    assert queued.json()["status"] == "queued", queued.text
    await asyncio.sleep(0.2)
    got = await api.client.post(f"/v1/tasks/{task.id}/cancel", headers=auth(key))
    assert got.status_code == 202, got.text
    assert (got.json()["status"], got.json()["stop_reason"]) == (
        "cancelled",
        "cancelled by request",
    )
    again = await api.client.post(f"/v1/tasks/{task.id}/cancel", headers=auth(key))
    assert_error(again, 409, "task_finished", None)
    # The task enqueued behind it on its thread starts.
    assert (await api.wait(queued.json()["id"], key))["status"] == "succeeded"


async def test_cancel_of_a_task_another_live_runner_holds_is_asked_of_that_runner(
    api: ServiceClient,
) -> None:
    key = api.key("acme")
    with Ledger(api.ledger_url) as ledger:
        project = ledger.authenticate(key)
        assert project is not None
        task, _ = ledger.create_task(project_id=project.id, input="x")
        assert ledger.take_lease(task.id, "server-elsewhere", seconds=60) is not None
    got = await api.client.post(f"/v1/tasks/{task.id}/cancel", headers=auth(key))
    assert got.status_code == 202, got.text
    assert got.json()["status"] == "running"
    assert got.json()["cancel_requested_at"] is not None


# Findings 1 and 2 (the endpoint): a scripted spec names a file of the scripts folder only,
# and a refusal tells nothing about the server's files.


async def test_a_refused_scripted_spec_reveals_nothing_of_the_servers_files(
    api: ServiceClient, home: Path, scripts: Path
) -> None:
    key = api.key("acme")
    (scripts / "relay.json").write_text(EXAMPLE_RELAY.read_text(), encoding="utf-8")
    (scripts / "folder.json").mkdir()
    messages = {}
    for spec in (
        "scripted:/etc/hostname",  # exists
        "scripted:/no/such/file.json",  # does not
        f"scripted:{home / 'ledger.sqlite'}",
        "scripted:../scripts/relay.json",
        "scripted:missing.json",
        "scripted:folder.json",
    ):
        got = await api.client.post(
            "/v1/tasks", json={"input": "x", "model": spec}, headers=auth(key)
        )
        assert_error(got, 422, "model_not_allowed", "model")
        message = got.json()["error"]["message"]
        assert "not allowed on this server" in message
        for hint in ("exist", "director", "UTF-8", "Errno", "keys", "must be"):
            assert hint not in message, message
        messages[spec] = message.replace(spec, "SPEC")
    # A path that exists and one that does not are refused in the same words.
    assert messages["scripted:/etc/hostname"] == messages["scripted:/no/such/file.json"]
    assert messages["scripted:missing.json"] == messages["scripted:folder.json"]
    named = await api.client.post(
        "/v1/tasks", json={"input": "x", "model": "scripted:relay.json"}, headers=auth(key)
    )
    assert named.status_code == 202, named.text
    assert named.json()["models"]["supervisor"] == f"scripted:{scripts.resolve() / 'relay.json'}"
    await api.wait(named.json()["id"], key)
