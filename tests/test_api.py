"""The task API in process (httpx.ASGITransport, lifespan run by hand)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from relaygraph.api import ServiceSettings, create_app
from relaygraph.store import Ledger

from ._scripts import call, one_visit, say
from ._service import ServiceClient, auth, in_process

Script = Callable[[dict[str, Any]], str]


async def test_submit_follow_and_replay(api: ServiceClient) -> None:
    key = api.key("acme")
    made = await api.client.post(
        "/v1/tasks", json={"input": "When are checkpoints written?"}, headers=auth(key)
    )
    assert made.status_code == 202, made.text
    task = await api.wait(made.json()["id"], key)
    assert task["status"] == "succeeded"
    assert "41 checkpoints" in task["answer"]
    # Events replay from the ledger, in order, each with its sequence id, and close.
    events = await api.client.get(f"/v1/tasks/{task['id']}/events", headers=auth(key))
    frames = [f for f in events.text.split("\r\n\r\n") if f.strip()]
    ids = [int(line[4:]) for f in frames for line in f.splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1))
    kinds = [line[7:] for f in frames for line in f.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert "handoff" in kinds
    # Last-Event-ID resumes after that event: no loss, no repetition.
    again = await api.client.get(
        f"/v1/tasks/{task['id']}/events", headers={**auth(key), "Last-Event-ID": str(ids[4])}
    )
    again_ids = [int(line[4:]) for line in again.text.splitlines() if line.startswith("id: ")]
    assert again_ids == ids[5:]
    handoffs = (await api.client.get(f"/v1/tasks/{task['id']}/handoffs", headers=auth(key))).json()
    assert [(h["kind"], h["from"], h["to"]) for h in handoffs["handoffs"]] == [
        ("route", "supervisor", "researcher"),
        ("direct", "researcher", "coder"),
        ("route", "supervisor", "writer"),
    ]
    assert handoffs["handoffs"][1]["step"] is not None


async def test_auth_and_project_isolation(api: ServiceClient) -> None:
    assert (await api.client.get("/v1/tasks")).status_code == 401
    bad = await api.client.get("/v1/tasks", headers=auth("rg_nope"))
    assert bad.status_code == 401
    assert bad.json()["error"]["code"] == "unauthorized"
    a, b = api.key("a-project"), api.key("b-project")
    made = await api.client.post("/v1/tasks", json={"input": "x"}, headers=auth(a))
    other = await api.client.get(f"/v1/tasks/{made.json()['id']}", headers=auth(b))
    assert other.status_code == 404  # not 403: another project's task does not exist for b
    assert other.json()["error"]["code"] == "task_not_found"
    listed = await api.client.get("/v1/tasks", headers=auth(b))
    assert listed.json()["tasks"] == []
    await api.wait(made.json()["id"], a)


async def test_idempotent_retry_returns_the_same_task(api: ServiceClient) -> None:
    key = api.key("acme")
    headers = {**auth(key), "Idempotency-Key": "retry-1"}
    first = await api.client.post("/v1/tasks", json={"input": "x"}, headers=headers)
    second = await api.client.post("/v1/tasks", json={"input": "x"}, headers=headers)
    assert first.json()["id"] == second.json()["id"]
    await api.wait(first.json()["id"], key)


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"input": ""}, 422, "invalid_request", "input"),
        ({"input": "x", "colour": "red"}, 422, "invalid_request", "colour"),
        ({"input": "x", "model": "gpt-4o"}, 422, "invalid_model", "model"),
        (
            {"input": "x", "model": "openai:gpt-4o", "agent_models": {"pilot": "openai:x"}},
            422,
            "invalid_model",
            "agent_models.pilot",
        ),
        (
            {"input": "x", "agent_models": {"coder": "gpt-4o"}},
            422,
            "invalid_model",
            "agent_models.coder",
        ),
        ({"input": "x", "model": "acme:big"}, 422, "invalid_model", "model"),
        ({"input": "x", "model": "scripted:/no/such.json"}, 422, "model_not_allowed", "model"),
        ({"input": "x", "model": "scripted:../relay.json"}, 422, "model_not_allowed", "model"),
        ({"input": "x", "model": "scripted:missing.json"}, 422, "model_not_allowed", "model"),
        (
            {"input": "x", "metadata": {"policy_source": "audited.toml"}},
            422,
            "invalid_request",
            "metadata.policy_source",
        ),
        (
            {"input": "x", "agent_models": {"coder": "scripted:/etc/hostname"}},
            422,
            "model_not_allowed",
            "agent_models.coder",
        ),
        (
            {"input": "x", "policy": {"team": {"max_tokens": 10**9}}},
            422,
            "policy_loosens",
            "policy",
        ),
        ({"input": "x", "policy": {"team": {"max_tokenz": 1}}}, 422, "invalid_policy", "policy"),
        ({"input": "x" * 5000}, 413, "body_too_large", None),
    ],
)
async def test_bad_bodies_are_refused_naming_the_field(
    api: ServiceClient, body: dict[str, Any], status: int, code: str, field: str | None
) -> None:
    key = api.key("acme")
    got = await api.client.post("/v1/tasks", json=body, headers=auth(key))
    assert got.status_code == status, got.text
    error = got.json()["error"]
    assert error["code"] == code
    if field is not None:
        assert error.get("field") == field or field in error["message"]


async def test_policy_in_body_tightens(api: ServiceClient, served_script: Script) -> None:
    key = api.key("acme")
    made = await api.client.post(
        "/v1/tasks",
        json={"input": "x", "policy": {"team": {"max_agent_runs": 1}}},
        headers=auth(key),
    )
    assert made.status_code == 202, made.text
    task = await api.wait(made.json()["id"], key)
    assert task["status"] == "degraded"
    assert task["stop_reason"] == "budget:team:max_agent_runs"
    # The server, not the caller, says where the task's policy came from.
    assert task["policy_source"] == "default + request"
    assert task["metadata"] == {}


async def test_approval_resumes_and_busy_thread_is_409(
    api: ServiceClient, served_script: Script, home: Path
) -> None:
    key = api.key("acme")
    spec = served_script(
        one_visit(
            "coder",
            "compute",
            "math",
            call("run_python", code="print(6*7)"),
            say("The answer is 42."),
        )
    )
    body = {
        "input": "6*7?",
        "thread_id": str(uuid.uuid4()),
        "model": spec,
        "policy": {"agents": {"coder": {"approval": ["run_python"]}}},
    }
    made = await api.client.post(
        "/v1/tasks", json=body, headers={**auth(key), "Idempotency-Key": "first"}
    )
    task = await api.wait(made.json()["id"], key)
    assert task["status"] == "interrupted"
    # A retry of the task that keeps the thread busy is that task, not a conflict.
    retry = await api.client.post(
        "/v1/tasks", json=body, headers={**auth(key), "Idempotency-Key": "first"}
    )
    assert retry.status_code == 202, retry.text
    assert retry.json()["id"] == task["id"]
    busy = await api.client.post(
        "/v1/tasks", json={"input": "more", "thread_id": task["thread_id"]}, headers=auth(key)
    )
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "thread_busy"
    pending = await api.client.get(f"/v1/tasks/{task['id']}/approvals", headers=auth(key))
    approval = pending.json()["approvals"][0]
    assert (approval["agent"], approval["tool"], approval["decision"]) == (
        "coder",
        "run_python",
        None,
    )
    # Edited arguments the tool would refuse are refused here, and the task still waits.
    refused = await api.client.post(
        f"/v1/tasks/{task['id']}/approvals/{approval['id']}",
        json={"decision": "edit", "args": {"cmd": "ls"}},
        headers=auth(key),
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["field"] == "args"
    assert "run_python takes code; not 'cmd'" in refused.json()["error"]["message"]
    decided = await api.client.post(
        f"/v1/tasks/{task['id']}/approvals/{approval['id']}",
        json={"decision": "approve", "reason": "fine"},
        headers=auth(key),
    )
    assert decided.status_code == 202, decided.text
    done = await api.wait(task["id"], key, ("succeeded", "degraded", "failed"))
    assert done["status"] == "succeeded"
    assert done["answer"] == "The answer is 42."
    record = await api.client.get(f"/v1/tasks/{task['id']}/approvals", headers=auth(key))
    decided_record = record.json()["approvals"][0]
    assert decided_record["decided_by"] == "acme"
    assert decided_record["reason"] == "fine"
    assert decided_record["decided_at"] >= decided_record["requested_at"]
    assert decided_record["applied_at"] is not None
    assert decided_record["edited_args"] is None
    again = await api.client.post(
        f"/v1/tasks/{task['id']}/approvals/{approval['id']}",
        json={"decision": "approve"},
        headers=auth(key),
    )
    assert again.status_code == 409


async def test_cancel_an_interrupted_task_and_usage(
    api: ServiceClient, served_script: Script
) -> None:
    key = api.key("acme")
    spec = served_script(
        {
            "supervisor": [{"route": {"next": "coder", "task": "compute", "reason": "math"}}],
            "coder": [{"tool_calls": [{"name": "run_python", "args": {"code": "print(1)"}}]}],
        }
    )
    made = await api.client.post(
        "/v1/tasks",
        json={
            "input": "x",
            "model": spec,
            "policy": {"agents": {"coder": {"approval": ["run_python"]}}},
        },
        headers=auth(key),
    )
    task = await api.wait(made.json()["id"], key)
    cancelled = await api.client.post(f"/v1/tasks/{task['id']}/cancel", headers=auth(key))
    assert cancelled.json()["status"] == "cancelled"
    again = await api.client.post(f"/v1/tasks/{task['id']}/cancel", headers=auth(key))
    assert again.status_code == 409
    usage = (await api.client.get("/v1/usage", headers=auth(key))).json()
    # The supervisor's route is counted; the coder's visit was never finished, so its
    # usage is not recorded (visits are accounted when they end).
    assert usage["agents"]["supervisor"]["model_calls"] == 1
    assert usage["tasks"] == 1
    # The tenant is a project; "team" names only a team, so its old key for the project
    # is gone.
    assert usage["project_id"] != "" and "team_id" not in usage
    trace = (await api.client.get(f"/v1/tasks/{task['id']}/trace", headers=auth(key))).json()
    assert trace["project_id"] == usage["project_id"] and "team_id" not in trace


async def test_health_and_openapi(api: ServiceClient) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).status_code == 200
    spec = (await api.client.get("/openapi.json")).json()
    assert "/v1/tasks" in spec["paths"]


async def test_trace_endpoint_returns_the_timeline(api: ServiceClient) -> None:
    key = api.key("acme")
    made = await api.client.post("/v1/tasks", json={"input": "When?"}, headers=auth(key))
    task = await api.wait(made.json()["id"], key)
    trace = await api.client.get(f"/v1/tasks/{task['id']}/trace", headers=auth(key))
    assert trace.status_code == 200
    body = json.dumps(trace.json())
    for agent in ("researcher", "coder", "writer"):
        assert agent in body
    other = api.key("other")
    hidden = await api.client.get(f"/v1/tasks/{task['id']}/trace", headers=auth(other))
    assert hidden.status_code == 404


async def test_scripted_models_are_refused_unless_the_server_allows_them(
    home: Path, served_script: Script
) -> None:
    settings = ServiceSettings(home=home, allowed_models=["openai:*"])
    app = create_app(settings)
    async with in_process(app) as client:
        with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
            key = ledger.create_project("acme")[1]
        spec = served_script({"supervisor": []})
        got = await client.post("/v1/tasks", json={"input": "x", "model": spec}, headers=auth(key))
        assert got.status_code == 422
        assert got.json()["error"]["code"] == "model_not_allowed"
        assert got.json()["error"]["field"] == "model"
        other = await client.post(
            "/v1/tasks",
            json={"input": "x", "model": "openai:gpt-4o", "agent_models": {"coder": spec}},
            headers=auth(key),
        )
        assert other.status_code == 422
        assert other.json()["error"]["field"] == "agent_models.coder"


async def test_topology_in_the_body(api: ServiceClient, served_script: Script) -> None:
    key = api.key("acme")
    spec = served_script({"researcher": [{"content": "swarm answer"}]})
    made = await api.client.post(
        "/v1/tasks",
        json={"input": "go", "model": spec, "topology": "swarm", "start_agent": "researcher"},
        headers=auth(key),
    )
    assert made.status_code == 202, made.text
    assert made.json()["topology"] == {"kind": "swarm", "start_agent": "researcher"}
    task = await api.wait(made.json()["id"], key)
    assert task["status"] == "succeeded" and task["answer"] == "swarm answer"
    # A thread keeps its topology; options of another topology are refused by name.
    cases = [
        ({"thread_id": task["thread_id"]}, "topology", "runs the 'swarm' topology"),
        ({"output_mode": "full_history"}, "output_mode", "applies only to the supervisor-tools"),
        ({"topology": "swarm", "start_agent": "critic"}, "start_agent", "not an agent"),
        ({"topology": "mesh"}, "topology", "structured"),
    ]
    for extra, field, message in cases:
        bad = await api.client.post(
            "/v1/tasks", json={"input": "go", "model": spec, **extra}, headers=auth(key)
        )
        assert bad.status_code == 422, bad.text
        error = bad.json()["error"]
        assert field in error["field"] and message in error["message"], error


async def test_a_chunked_body_over_the_limit_is_413_and_one_under_it_is_read(
    api: ServiceClient,
) -> None:
    key = api.key("acme")

    def chunks(body: bytes) -> Any:
        async def gen() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 1000):
                yield body[start : start + 1000]

        return gen()

    headers = {**auth(key), "Content-Type": "application/json"}
    big = json.dumps({"input": "x" * 6000}).encode()
    refused = await api.client.post("/v1/tasks", content=chunks(big), headers=headers)
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["code"] == "body_too_large"
    small = json.dumps({"input": "When are checkpoints written?"}).encode()
    made = await api.client.post("/v1/tasks", content=chunks(small), headers=headers)
    assert made.status_code == 202, made.text
    await api.wait(made.json()["id"], key)


@pytest.mark.parametrize(
    ("method", "path", "content", "field", "message"),
    [
        ("GET", "/v1/tasks?status=bogus", None, "status", "status 'bogus' is not one of"),
        ("GET", "/v1/tasks?cursor=not-a-cursor", None, "cursor", "cursor"),
        ("GET", "/v1/usage?since=2026-01-01T00:00:00", None, "since", "has no time zone"),
        (
            "GET",
            "/v1/usage?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z",
            None,
            "since",
            "is after until",
        ),
        ("POST", "/v1/tasks", b"{not json", "body", "the body is not valid JSON"),
        (  # FastAPI would keep the last value silently.
            "GET",
            "/v1/tasks?status=succeeded&status=failed",
            None,
            "status",
            "query parameter 'status' is given 2 times",
        ),
        (
            "GET",
            "/v1/task-summaries?limit=1&q=a&limit=2",
            None,
            "limit",
            "query parameter 'limit' is given 2 times",
        ),
    ],
)
async def test_bad_query_and_body_name_their_field(
    api: ServiceClient, method: str, path: str, content: bytes | None, field: str, message: str
) -> None:
    key = api.key("acme")
    headers = {**auth(key), "Content-Type": "application/json"}
    got = await api.client.request(method, path, content=content, headers=headers)
    assert got.status_code == 422, got.text
    error = got.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert message in error["message"]


async def test_a_body_that_is_not_sent_as_json_says_so(api: ServiceClient) -> None:
    key = api.key("acme")
    headers = {**auth(key), "Content-Type": "text/plain"}
    got = await api.client.post("/v1/tasks", content=b'{"input": "x"}', headers=headers)
    assert got.status_code == 422, got.text
    error = got.json()["error"]
    assert error["field"] == "body"
    assert "Content-Type: application/json" in error["message"]
    assert "'text/plain'" in error["message"]
