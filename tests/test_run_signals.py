"""Ctrl-C and SIGTERM of ``relaygraph run``: the task ends on the record, and its result is
printed. Before, the process died with the task ``running`` in the ledger and no result.

A real ``relaygraph run`` process runs a task whose coder's program waits until the test
lets it go, so each signal arrives while the task is mid-step, however slow the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from relaygraph.store import LOCAL_PROJECT_ID, Ledger

DEADLINE = 120.0
RUN = (sys.executable, "-m", "relaygraph.cli", "run")

WAITING_CODE = (
    "import os, time\n"
    "open('started', 'w').close()\n"
    "deadline = time.monotonic() + 300\n"
    "while not os.path.exists('go') and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('went')"
)
SCRIPT = {
    "supervisor": [
        {"route": {"next": "coder", "task": "compute", "reason": "code to run"}},
        {"route": {"next": "writer", "task": "write it up", "reason": "a deliverable"}},
        {"route": {"next": "FINISH", "task": "", "reason": "done"}},
    ],
    "coder": [
        {"tool_calls": [{"name": "run_python", "args": {"code": WAITING_CODE}}]},
        {"content": "It ran."},
    ],
    "writer": [{"content": "Written."}],
}


def start_run(home: Path, tmp_path: Path) -> subprocess.Popen[str]:
    """``relaygraph run --json`` of the waiting task; its stderr goes to ``stderr.txt``."""
    script = tmp_path / "waiting.json"
    script.write_text(json.dumps(SCRIPT), encoding="utf-8")
    with (tmp_path / "stderr.txt").open("w") as err:
        return subprocess.Popen(
            [*RUN, "Compute it", "--json", "--model", f"scripted:{script}"],
            env={**os.environ, "RELAYGRAPH_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def wait_for_line(tmp_path: Path, text: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while text not in (tmp_path / "stderr.txt").read_text():
        assert time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
        time.sleep(0.05)


def workspace_once_started(home: Path, process: subprocess.Popen[str]) -> Path:
    """The task's workspace, once its program has started."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = list((home / "tasks").glob("*/workspace/started"))
        if found:
            return found[0].parent
        if process.poll() is not None:
            pytest.fail(f"relaygraph run ended early:\n{process.communicate()[0]}")
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the program never started:\n{process.communicate()[0]}")


def recorded(home: Path, task_id: str) -> Any:
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        return ledger.get_task(task_id, project_id=LOCAL_PROJECT_ID)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_one_signal_stops_the_task_at_its_next_step_and_prints_the_result(
    home: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    process = start_run(home, tmp_path)
    workspace = workspace_once_started(home, process)
    process.send_signal(sig)
    wait_for_line(tmp_path, f"relaygraph: {sig.name}: stopping at the next step")
    # The program's step ends (the writer's never starts): the run stops there.
    (workspace / "go").touch()
    out, _ = process.communicate(timeout=DEADLINE)
    assert process.returncode == 130, (tmp_path / "stderr.txt").read_text()
    result = json.loads(out)
    assert result["status"] == "cancelled"
    assert "writer" not in result["usage"], result["usage"]
    assert "coder" in result["usage"], result["usage"]
    task = recorded(home, result["task_id"])
    assert task.status == "cancelled"


def test_a_second_signal_stops_the_task_at_once_cancelled_on_the_record(
    home: Path, tmp_path: Path
) -> None:
    process = start_run(home, tmp_path)
    workspace_once_started(home, process)
    process.send_signal(signal.SIGINT)
    wait_for_line(tmp_path, "relaygraph: SIGINT: stopping at the next step")
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=DEADLINE)
    err = (tmp_path / "stderr.txt").read_text()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    result = json.loads(out)
    assert result["status"] == "cancelled"
    assert result["stop_reason"].startswith("cancelled: the process running it was stopped")
    task = recorded(home, result["task_id"])
    assert task.status == "cancelled" and task.stop_reason == result["stop_reason"]
