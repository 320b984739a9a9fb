"""Retention: the files of tasks that ended long ago are deleted, by the server
(``RELAYGRAPH_RETENTION_DAYS``) and by ``relaygraph gc``; the ledger's records stay (issue
41). The clock is never waited for: the tasks' end times are moved back in the ledger."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from relaygraph.runner import collect_garbage, run_task
from relaygraph.store import Ledger

from .conftest import EXAMPLE_RELAY
from .test_cli import relaygraph
from .test_server import _env


def _ended_task(home: Path) -> str:
    """A task of the built-in team that ran code and saved an artifact, ended now."""
    result = run_task("When are checkpoints written?", model=f"scripted:{EXAMPLE_RELAY}", home=home)
    assert result.status == "succeeded"
    task_dir = home / "tasks" / result.task_id
    (task_dir / "workspace").mkdir(parents=True, exist_ok=True)
    (task_dir / "workspace" / "data.bin").write_bytes(b"d" * 10_000)
    assert (task_dir / "artifacts" / "report.md").is_file()
    return result.task_id


def _ended_days_ago(home: Path, task_id: str, days: float) -> None:
    ended = datetime.now(UTC) - timedelta(days=days)
    with sqlite3.connect(home / "ledger.sqlite") as db:
        db.execute(
            "UPDATE tasks SET finished_at = ? WHERE id = ?",
            (ended.replace(tzinfo=None).isoformat(sep=" "), task_id),
        )


def test_gc_deletes_old_workspaces_only_and_never_follows_a_planted_symlink(
    home: Path, tmp_path: Path
) -> None:
    old, recent = _ended_task(home), _ended_task(home)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (home / "tasks" / old / "workspace" / "link").symlink_to(outside)
    unfinished = home / "tasks" / "not-in-the-ledger" / "workspace"
    unfinished.mkdir(parents=True)
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        freed = collect_garbage(
            ledger, home, older_than_days=7, now=datetime.now(UTC) + timedelta(days=7, hours=1)
        )
        assert set(freed.task_ids) == {old, recent}  # Both ended over 7 days before `now`.
        assert freed.bytes >= 2 * 10_000
        assert freed.files >= 4
        for task_id in (old, recent):
            assert not (home / "tasks" / task_id / "workspace").exists()
            assert (home / "tasks" / task_id / "artifacts" / "report.md").is_file()
            owner = ledger.task_owner(task_id)
            assert owner is not None
            record = ledger.get_task(task_id, project_id=owner)
            assert record is not None and record.status == "succeeded"
        again = collect_garbage(ledger, home, older_than_days=7, now=datetime.now(UTC))
        assert again.tasks == 0
    assert (outside / "precious.txt").read_text() == "keep me"
    assert unfinished.is_dir()


def test_gc_command_deletes_what_ended_before_the_days_given_and_prints_it(home: Path) -> None:
    old, recent = _ended_task(home), _ended_task(home)
    _ended_days_ago(home, old, 8)
    gc = ("gc", "--older-than", "7", "--artifacts", "--json")
    done = relaygraph(*gc, home=home, env=_env(home))
    assert done.returncode == 0, done.stderr
    freed = json.loads(done.stdout)
    assert freed["task_ids"] == [old]
    assert freed["tasks"] == 1 and freed["bytes"] >= 10_000 and freed["files"] >= 3
    assert not (home / "tasks" / old / "workspace").exists()
    assert not (home / "tasks" / old / "artifacts").exists()
    assert (home / "tasks" / recent / "workspace" / "data.bin").is_file()
    unset = {k: v for k, v in _env(home).items() if k != "RELAYGRAPH_RETENTION_DAYS"}
    refused = relaygraph("gc", home=home, env=unset)
    assert refused.returncode != 0
    assert "--older-than DAYS" in refused.stderr


def test_the_server_deletes_old_workspaces_with_retention_days(
    home: Path, start_server: Any
) -> None:
    old, recent = _ended_task(home), _ended_task(home)
    _ended_days_ago(home, old, 3)
    start_server(RELAYGRAPH_RETENTION_DAYS="2")
    deadline = time.monotonic() + 60
    while (home / "tasks" / old / "workspace").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (home / "tasks" / old / "workspace").exists()
    assert (home / "tasks" / old / "artifacts" / "report.md").is_file()  # Not asked for.
    assert (home / "tasks" / recent / "workspace" / "data.bin").is_file()
