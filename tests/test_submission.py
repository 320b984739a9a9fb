"""One submission path and one decision path: a refusal names its field, code and kind as
attributes (the API answers from those, not from the message), a submission is handed to
the caller's ``enqueue`` by id, and a decision to its ``resume`` with JSON answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relaygraph.api._errors import ErrorAnswer
from relaygraph.client import ApiError
from relaygraph.runner import (
    Decision,
    Intake,
    ModelRules,
    RequestRefused,
    TaskRequest,
    check_request,
    decide_task,
    ledger_for,
    run_task,
    submit_task,
)
from relaygraph.store import LOCAL_PROJECT_ID, Ledger, Task
from relaygraph.team import default_team
from relaygraph.topology import Topology

from ._scripts import call, one_visit, say

Script = Callable[[dict[str, Any]], str]

FINISH_AT_ONCE = {
    "supervisor": [{"route": {"next": "FINISH", "task": "", "reason": "done"}}] * 5,
    "finalize": [{"content": "Done."}] * 5,
}
APPROVAL_POLICY = {"agents": {"coder": {"approval": ["run_python"]}}}


@pytest.fixture
def home_ledger(home: Path) -> Ledger:
    return ledger_for(home)  # type: ignore[no-any-return]


def refusal(
    request: TaskRequest, home_ledger: Ledger, rules: ModelRules | None = None
) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        check_request(request, ledger=home_ledger, model_rules=rules)
    return caught.value


def test_a_refusal_names_its_field_code_and_kind(home_ledger: Ledger, script: Script) -> None:
    team = default_team()
    spec = script(FINISH_AT_ONCE)

    def request(**fields: Any) -> TaskRequest:
        return TaskRequest(**{"input": "go", "team": team, "model": spec, **fields})

    cases: list[tuple[TaskRequest, str, str]] = [
        (request(input="   "), "input", "invalid_request"),
        (request(agent_models={"pilot": spec}), "agent_models.pilot", "invalid_model"),
        (request(agent_models={"coder": "gpt-4o"}), "agent_models.coder", "invalid_model"),
        (request(model="acme:big"), "model", "invalid_model"),
        (request(start_agent="coder"), "start_agent", "invalid_topology"),
        (request(topology="swarm", start_agent="critic"), "start_agent", "invalid_topology"),
        (request(output_mode="full_history"), "output_mode", "invalid_topology"),
        (request(topology="mesh"), "topology", "invalid_topology"),
        (request(policy_override={"team": {"max_tokens": 10**9}}), "policy", "policy_loosens"),
        (request(policy_override={"team": {"max_tokenz": 1}}), "policy", "invalid_policy"),
        (
            request(metadata={"policy_source": "audited.toml"}),
            "metadata.policy_source",
            "invalid_request",
        ),
    ]
    for asked, field, code in cases:
        refused = refusal(asked, home_ledger)
        assert (refused.field, refused.code, refused.kind) == (field, code, "invalid"), asked
    # The request's policy is named as such, once ("policy policy: ..." read badly).
    loose = refusal(request(policy_override={"team": {"max_tokens": 10**9}}), home_ledger)
    assert str(loose).startswith("policy in the request loosens the team's policy: ")
    bad = refusal(request(policy_override={"team": {"max_tokens": -1}}), home_ledger)
    assert str(bad).startswith("policy in the request: team.max_tokens = -1")
    unknown = refusal(request(thread_id="nope"), home_ledger)
    assert (unknown.field, unknown.kind) == ("thread_id", "not_found")
    assert "thread 'nope' has no earlier run" in str(unknown)


def test_the_callers_model_rules_name_the_field(home_ledger: Ledger, script: Script) -> None:
    allowed = script(FINISH_AT_ONCE)

    def allow(spec: str) -> str:
        from relaygraph.errors import ModelNotAllowed

        if spec != allowed:
            raise ModelNotAllowed(spec, "not on the list")
        return spec

    rules = ModelRules(default=allowed, allow=allow)
    team = default_team()
    other = script(FINISH_AT_ONCE)
    refused = refusal(TaskRequest(input="go", team=team, model=other), home_ledger, rules)
    assert (refused.field, refused.code) == ("model", "model_not_allowed")
    refused = refusal(
        TaskRequest(input="go", team=team, agent_models={"writer": other}), home_ledger, rules
    )
    assert (refused.field, refused.code) == ("agent_models.writer", "model_not_allowed")
    # The default is the caller's own and is not asked about.
    checked = check_request(
        TaskRequest(input="go", team=team), ledger=home_ledger, model_rules=rules
    )
    assert set(checked.models.recorded.values()) == {allowed}


def test_a_thread_keeps_its_topology_and_the_refusal_names_the_option(
    home: Path, home_ledger: Ledger, script: Script
) -> None:
    first = run_task(
        "go",
        model=script({"researcher": [{"content": "hi"}]}),
        topology=Topology.parse("swarm", start_agent="researcher"),
        home=home,
    )
    assert first.status == "succeeded", first.stop_reason
    again = TaskRequest(input="again", team=default_team(), thread_id=first.thread_id)
    refused = refusal(again, home_ledger)
    assert (refused.field, refused.code) == ("topology", "invalid_topology")
    assert "runs the 'swarm' topology" in str(refused)


def test_a_submission_is_handed_to_enqueue_unless_its_thread_is_busy(
    home_ledger: Ledger, script: Script
) -> None:
    spec = script(FINISH_AT_ONCE)
    project, _ = home_ledger.create_project("acme")
    enqueued: list[str] = []

    def submit(**fields: Any) -> Any:
        request = TaskRequest(
            input="go", team=default_team(), model=spec, project_id=project.id, **fields
        )
        return submit_task(
            request, Intake(ledger=home_ledger, enqueue=lambda task: enqueued.append(task.id))
        )

    first = submit(thread_id="t-1", thread_must_exist=False, multitask="reject")
    assert first.created and first.starts and enqueued == [first.task.id]
    assert first.task.status == "queued"
    assert first.task.metadata["policy_source"] == "default"
    with pytest.raises(RequestRefused) as busy:
        submit(thread_id="t-1", multitask="reject")
    assert (busy.value.field, busy.value.code, busy.value.kind) == (
        "thread_id",
        "thread_busy",
        "conflict",
    )
    queued = submit(thread_id="t-1", multitask="enqueue")
    assert queued.created and not queued.starts and enqueued == [first.task.id]
    # A retry with the key of a created task is that task, and starts nothing again.
    keyed = submit(idempotency_key="k-1")
    retry = submit(idempotency_key="k-1")
    assert retry.task.id == keyed.task.id and not retry.created and not retry.starts
    with pytest.raises(RequestRefused) as reused:
        submit(idempotency_key="k-1", metadata={"other": 1})
    assert (reused.value.field, reused.value.code) == ("idempotency_key", "idempotency_key_reused")


@pytest.fixture
def paused_task(home: Path, home_ledger: Ledger, script: Script) -> Task:
    """The ledger's record of a task whose coder waits for approval to run ``run_python``."""
    spec = script(
        one_visit(
            "coder",
            "compute",
            "math",
            call("run_python", code="print(1)"),
            say("It ran."),
            final="Done.",
        )
    )
    policy = default_team().policy_from(APPROVAL_POLICY)
    paused = run_task("compute", model=spec, policy=policy, home=home)
    assert paused.status == "interrupted", paused.stop_reason
    task = home_ledger.get_task(paused.task_id, project_id=LOCAL_PROJECT_ID)
    assert task is not None
    return task


def test_a_decision_is_checked_recorded_and_handed_to_resume(
    home_ledger: Ledger, paused_task: Task
) -> None:
    from relaygraph.agents.tools import BUILTIN_TOOLS

    task = paused_task
    [approval] = home_ledger.approvals(task.id)

    def decide(decision: Decision, **options: Any) -> Any:
        return decide_task(
            task,
            decision,
            ledger=home_ledger,
            tools=lambda: BUILTIN_TOOLS,
            decided_by="me",
            **options,
        )

    with pytest.raises(RequestRefused) as missing:
        decide(Decision(decision="approve"), approval_id="nope")
    assert (missing.value.field, missing.value.code, missing.value.kind) == (
        "approval_id",
        "approval_not_found",
        "not_found",
    )
    with pytest.raises(RequestRefused) as wrong:
        decide(Decision(decision="edit", args={"cmd": "ls"}))
    assert (wrong.value.field, wrong.value.code) == ("args", "invalid_request")
    with pytest.raises(RequestRefused) as no_args:
        Decision(decision="edit")
    assert no_args.value.field == "args"
    assert home_ledger.approvals(task.id)[0].pending  # Nothing recorded so far.

    resumed: list[tuple[str, Any]] = []
    answers = decide(
        Decision(decision="edit", args={"code": "print(2)"}, reason="smaller"),
        resume=lambda task_id, answers: resumed.append((task_id, answers)) or True,
    )
    expected = {"decision": "edit", "args": {"code": "print(2)"}, "reason": "smaller"}
    assert answers == {approval.interrupt_id: expected}
    assert resumed == [(task.id, answers)]
    json.dumps(answers)  # A queue can carry them.
    decided = home_ledger.approvals(task.id)[0]
    assert (decided.decision, decided.decided_by, decided.edited_args) == (
        "edit",
        "me",
        {"code": "print(2)"},
    )
    with pytest.raises(RequestRefused) as again:
        decide(Decision(decision="approve"), approval_id=approval.interrupt_id)
    assert (again.value.code, again.value.kind) == ("not_waiting", "conflict")


def test_a_decision_refused_by_resume_is_not_waiting(
    home_ledger: Ledger, paused_task: Task
) -> None:
    with pytest.raises(RequestRefused) as taken:
        decide_task(
            paused_task,
            Decision(decision="approve"),
            ledger=home_ledger,
            tools=dict,
            decided_by="me",
            resume=lambda task_id, answers: False,
        )
    assert (taken.value.code, taken.value.kind) == ("not_waiting", "conflict")


@pytest.mark.parametrize(
    ("kind", "field", "status", "shown"),
    [
        ("invalid", "agent_models.coder", 422, "agent_models.coder"),
        ("not_found", "approval_id", 404, "approval_id"),
        ("conflict", "idempotency_key", 409, "Idempotency-Key"),
        ("conflict", None, 409, None),
    ],
)
def test_the_api_answers_a_refusal_from_its_fields(
    kind: Any, field: str | None, status: int, shown: str | None
) -> None:
    answer = ErrorAnswer.refused(
        RequestRefused("a message that names nothing", field=field, code="some_code", kind=kind)
    )
    assert (answer.status, answer.code, answer.field) == (status, "some_code", shown)
    assert answer.message == "a message that names nothing"


def test_the_server_and_the_client_errors_are_two_names() -> None:
    from relaygraph.api import _errors

    assert ErrorAnswer is not ApiError
    assert not issubclass(ErrorAnswer, ApiError) and not issubclass(ApiError, ErrorAnswer)
    assert _errors.ErrorAnswer is ErrorAnswer
