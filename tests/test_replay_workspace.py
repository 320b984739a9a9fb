"""A replay from step N starts in a copy of the original's workspace (held to the workspace
quota, following no symlink), and ``POST /v1/tasks/{id}/replay`` honours Idempotency-Key."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaygraph._home import TASKS_FOLDER
from relaygraph.backends.workspace import WorkspaceQuota, WorkspaceTooLarge, copy_workspace
from relaygraph.evals import diff_trajectories, read_trajectory
from relaygraph.runner import (
    Intake,
    ReplayChanges,
    RequestRefused,
    ledger_for,
    replay_task,
    run_task,
    submit_replay,
    team_of_record,
)
from relaygraph.runner._checkpoint import open_checkpointer
from relaygraph.store import LOCAL_PROJECT_ID, Task

from ._service import ServiceClient, auth, in_process_service
from .conftest import isolation_missing

SUM = "print('sum', sum(int(n) for n in open('data/numbers.txt').read().split()))"

# Step 1: the coder writes data/numbers.txt; step 2: the writer; step 3: the coder's program
# reads the file step 1 wrote.
READS_EARLIER_FILE = {
    "supervisor": [
        {"route": {"next": "coder", "task": "Write the numbers", "reason": "data first"}},
        {"route": {"next": "writer", "task": "Note what was written", "reason": "a note"}},
        {"route": {"next": "coder", "task": "Sum the numbers", "reason": "the total"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ],
    "coder": [
        {
            "tool_calls": [
                {"name": "write_file", "args": {"path": "data/numbers.txt", "content": "1 2 3"}}
            ]
        },
        {"content": "Wrote data/numbers.txt."},
        {"tool_calls": [{"name": "run_python", "args": {"code": SUM}}]},
        {"content": "The sum is 6."},
    ],
    "writer": [{"content": "Noted: the numbers are in data/numbers.txt."}],
}


def _program_output(home: Path, task_id: str) -> str:
    calls = [c for c in ledger_for(home).tool_calls(task_id) if c.tool == "run_python"]
    assert len(calls) == 1, calls
    return calls[0].result_preview or ""


def _task(home: Path, task_id: str) -> Task:
    task = ledger_for(home).get_task(task_id, project_id=LOCAL_PROJECT_ID)
    assert task is not None
    return task


def _workspace(home: Path, task_id: str) -> Path:
    return home / TASKS_FOLDER / task_id / "workspace"


def test_a_program_after_the_step_reads_a_file_written_before_it(
    home: Path, script: Callable[[dict[str, Any]], str]
) -> None:
    original = run_task("Sum the numbers", model=script(READS_EARLIER_FILE), home=home)
    assert original.status == "succeeded", original.stop_reason
    assert "sum 6" in _program_output(home, original.task_id)
    replayed = replay_task(original.task_id, ReplayChanges(from_step=2), home=home)
    assert replayed.status == "succeeded", replayed.stop_reason
    # The program of step 3 ran again, in the replay's own workspace, and found the file
    # the coder wrote at step 1 (which was not written again: its call is inherited).
    assert "sum 6" in _program_output(home, replayed.task_id)
    assert [c.tool for c in ledger_for(home).tool_calls(replayed.task_id)] == ["run_python"]
    copied = _workspace(home, replayed.task_id) / "data" / "numbers.txt"
    assert copied.read_text() == "1 2 3"
    assert (_workspace(home, original.task_id) / "data" / "numbers.txt").read_text() == "1 2 3"
    ledger = ledger_for(home)
    diff = diff_trajectories(
        read_trajectory(ledger, _task(home, original.task_id)),
        read_trajectory(ledger, _task(home, replayed.task_id)),
    )
    assert diff.same, diff.to_json()["steps"]
    # A replay from the request starts in an empty workspace, as any task does.
    again = replay_task(original.task_id, home=home)
    assert again.status == "succeeded"
    assert [c.tool for c in ledger.tool_calls(again.task_id)] == ["write_file", "run_python"]


def test_the_copy_follows_no_symlink_and_keeps_only_plain_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the task's")
    source = tmp_path / "workspace"
    (source / "src" / "pkg").mkdir(parents=True)
    (source / "src" / "pkg" / "main.py").write_text("print('hi')")
    (source / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(source / "run.sh", 0o755 | stat.S_ISUID)
    (source / "secret-link").symlink_to(outside / "secret.txt")
    (source / "folder-link").symlink_to(outside)
    os.link(outside / "secret.txt", source / "hard-link")
    os.mkfifo(source / "pipe")
    destination = tmp_path / "replay" / "workspace"
    copied = copy_workspace(source, destination, quota=WorkspaceQuota())
    found = sorted(str(p.relative_to(destination)) for p in destination.rglob("*"))
    assert found == ["run.sh", "src", "src/pkg", "src/pkg/main.py"]
    assert (destination / "src" / "pkg" / "main.py").read_text() == "print('hi')"
    # Executable, but not setuid (a copied program must not run as the server's user).
    assert stat.S_IMODE((destination / "run.sh").stat().st_mode) == 0o755
    assert sorted(copied.left_out) == ["folder-link", "hard-link", "pipe", "secret-link"]
    assert copied.files == 4
    # A workspace that was never made copies nothing; a destination that exists is refused.
    empty = copy_workspace(tmp_path / "none", tmp_path / "other" / "ws", quota=WorkspaceQuota())
    assert (empty.files, empty.left_out) == (0, ())
    with pytest.raises(FileExistsError):
        copy_workspace(source, destination, quota=WorkspaceQuota())
    # Past the quota: refused before anything is copied, naming the quota.
    with pytest.raises(WorkspaceTooLarge, match="RELAYGRAPH_WORKSPACE_MAX_FILES"):
        copy_workspace(source, tmp_path / "small", quota=WorkspaceQuota(max_files=2))
    assert not (tmp_path / "small").exists()


def test_a_workspace_past_the_quota_is_refused_naming_it_and_leaves_nothing(
    home: Path, script: Callable[[dict[str, Any]], str]
) -> None:
    run = run_task("Sum the numbers", model=script(READS_EARLIER_FILE), home=home)
    original = _task(home, run.task_id)
    ledger = ledger_for(home)
    # More than a megabyte: past the smallest bytes quota.
    (_workspace(home, original.id) / "big.bin").write_bytes(b"x" * (1024 * 1024 + 1))
    tasks_before = set(os.listdir(home / TASKS_FOLDER))
    for quota, setting in (
        (WorkspaceQuota(max_files=2), "RELAYGRAPH_WORKSPACE_MAX_FILES"),
        (WorkspaceQuota(max_mb=1), "RELAYGRAPH_WORKSPACE_MAX_MB"),
    ):
        with pytest.raises(RequestRefused, match=setting) as refused:
            submit_replay(
                original,
                ReplayChanges(from_step=2),
                team=team_of_record(original),
                policy=None,
                intake=Intake(ledger=ledger),
                home=home,
                workspace_quota=quota,
            )
        assert refused.value.field == "from_step"
        assert refused.value.code == "workspace_quota_exceeded"
        assert "replay from step 0" in str(refused.value)
    # Nothing recorded, no files and no fork left behind.
    assert ledger.replays_of(original.id, project_id=LOCAL_PROJECT_ID) == []
    assert set(os.listdir(home / TASKS_FOLDER)) == tasks_before
    with open_checkpointer(home) as saver:
        threads = {
            saved.config["configurable"]["thread_id"] for saved in saver.list(None, limit=10_000)
        }
    assert threads == {original.checkpoint_thread}


def _service(
    home: Path, scripts: Path, **settings: Any
) -> AbstractAsyncContextManager[ServiceClient]:
    return in_process_service(
        home, scripts_dir=scripts, workers=2, unsafe_sandbox=isolation_missing(), **settings
    )


async def _summed(
    api: ServiceClient, served_script: Callable[[dict[str, Any]], str]
) -> tuple[str, dict[str, Any], str]:
    """A project ``acme`` and its task summing the numbers (:data:`READS_EARLIER_FILE`),
    which succeeded: the project's key, the task and the spec of its script."""
    spec = served_script(READS_EARLIER_FILE)
    key = api.key("acme")
    made = await api.submit(key, input="Sum the numbers", model=spec)
    original = await api.wait(made.json()["id"], key)
    assert original["status"] == "succeeded", original
    return key, original, spec


async def test_replay_over_the_api_honours_an_idempotency_key(
    home: Path, scripts: Path, served_script: Callable[[dict[str, Any]], str]
) -> None:
    async with _service(home, scripts) as api:
        key, original, spec = await _summed(api, served_script)
        url = f"/v1/tasks/{original['id']}/replay"

        async def replay(body: dict[str, Any], idempotency: str) -> httpx.Response:
            headers = {**auth(key), "Idempotency-Key": idempotency}
            return await api.client.post(url, json=body, headers=headers)

        for step in (0, 2):
            first = await replay({"from_step": step}, f"replay-{step}")
            assert first.status_code == 202, first.text
            again = await replay({"from_step": step}, f"replay-{step}")
            assert again.status_code == 202, again.text
            assert again.json()["id"] == first.json()["id"]
            assert again.json()["thread_id"] == first.json()["thread_id"]
            done = await api.wait(first.json()["id"], key)
            assert done["status"] == "succeeded", done
        ledger = ledger_for(home)
        replays = ledger.replays_of(original["id"], project_id=_project(ledger, "acme"))
        assert sorted(t.from_step or 0 for t in replays) == [0, 2]
        # The key names one request: another step, another task's replay or a plain task
        # is refused naming what differs.
        other_step = await replay({"from_step": 1}, "replay-2")
        assert other_step.status_code == 409, other_step.text
        assert other_step.json()["error"]["code"] == "idempotency_key_reused"
        assert "from_step" in other_step.json()["error"]["message"]
        plain = await api.client.post(
            "/v1/tasks",
            json={"input": "Sum the numbers", "model": spec},
            headers={**auth(key), "Idempotency-Key": "replay-0"},
        )
        assert plain.status_code == 409, plain.text
        blank = await replay({}, " ")
        assert blank.status_code == 422 and blank.json()["error"]["field"] == "Idempotency-Key"
        # The fork of a refused retry was never copied: one per replay from a step.
        with open_checkpointer(home) as saver:
            threads = {
                saved.config["configurable"]["thread_id"]
                for saved in saver.list(None, limit=10_000)
            }
        assert len(threads) == 3, threads


async def test_replay_over_the_api_refuses_a_workspace_past_the_quota(
    home: Path, scripts: Path, served_script: Callable[[dict[str, Any]], str]
) -> None:
    async with _service(home, scripts) as api:
        key, original, _ = await _summed(api, served_script)
    # The operator lowers the quota: the original's data/ and data/numbers.txt pass it.
    async with _service(home, scripts, workspace_max_files=1) as api:
        refused = await api.client.post(
            f"/v1/tasks/{original['id']}/replay", json={"from_step": 2}, headers=auth(key)
        )
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"]) == ("workspace_quota_exceeded", "from_step")
        assert "RELAYGRAPH_WORKSPACE_MAX_FILES" in error["message"]
        # From the request nothing is copied: the same quota lets it through.
        fresh = await api.client.post(
            f"/v1/tasks/{original['id']}/replay", json={}, headers=auth(key)
        )
        assert fresh.status_code == 202, fresh.text


def _project(ledger: Any, name: str) -> str:
    project = ledger.get_project(name)
    assert project is not None
    project_id: str = project.id
    return project_id


def test_a_recorded_replay_whose_start_fails_keeps_its_fork_and_files(
    home: Path, script: Callable[[dict[str, Any]], str]
) -> None:
    """A start that fails after the replay is recorded (a broker down, in the worker mode)
    leaves the replay queued with its fork and its workspace, for a retry to start."""
    from relaygraph.runner import TaskRunner

    run = run_task("Sum the numbers", model=script(READS_EARLIER_FILE), home=home)
    original = _task(home, run.task_id)
    ledger = ledger_for(home)

    def broker_down(task: Task) -> None:
        raise ConnectionError("the broker is down")

    submit = {
        "team": team_of_record(original),
        "policy": None,
        "home": home,
        "idempotency_key": "sum-2",
    }
    with pytest.raises(ConnectionError):
        submit_replay(
            original,
            ReplayChanges(from_step=2),
            intake=Intake(ledger=ledger, enqueue=broker_down),
            **submit,
        )
    [queued] = ledger.replays_of(original.id, project_id=LOCAL_PROJECT_ID)
    assert queued.status == "queued"
    assert (_workspace(home, queued.id) / "data" / "numbers.txt").read_text() == "1 2 3"
    retried = submit_replay(
        original, ReplayChanges(from_step=2), intake=Intake(ledger=ledger), **submit
    )
    assert (retried.task.id, retried.created) == (queued.id, False)
    result = TaskRunner(ledger=ledger, home=home).run(
        queued, {"request": queued.input}, only_from=("queued",)
    )
    assert result.status == "succeeded", result.stop_reason
    assert "sum 6" in _program_output(home, queued.id)
