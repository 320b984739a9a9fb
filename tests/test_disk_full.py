"""A full disk: the server answers 507 ``insufficient_storage`` on writes, never a 500
(issue 41). The data directory is a small tmpfs the test mounts (root only; skipped
elsewhere), filled by a file as another project's program would fill it."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from relaygraph.client import ApiError, Client
from relaygraph.runner._no_room import RESERVE_BYTES, RoomReserve, UnrecordedFailures
from relaygraph.store import is_disk_full

from ._scripts import call, one_visit, say
from .test_server import create_project


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB tmpfs, unmounted at the end."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Write a file until the disk has no room left, in ever smaller pieces; returns it."""
    filler = disk / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def test_a_submission_on_a_full_disk_gets_507_not_500(
    small_disk: Path, start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = small_disk / "home"
    monkeypatch.setenv("RELAYGRAPH_HOME", str(home))
    server = start_server(RELAYGRAPH_HOME=str(home))
    key = create_project(home, "alpha")
    filler = _fill(small_disk)
    with Client(server.url, key) as client:
        for _ in range(3):
            with pytest.raises(ApiError) as full:
                client.submit("When are checkpoints written?", metadata={"pad": "x" * 8000})
            assert (full.value.status, full.value.code) == (507, "insufficient_storage")
            assert "disk is full" in full.value.message
        filler.unlink()  # Room again: the same request is taken.
        task = client.submit("When are checkpoints written?")
        assert client.wait(task["id"], timeout=120)["status"] == "succeeded"
    log = server.log.read_text()
    assert "Traceback" not in log
    assert "no room on disk" in log


def test_what_counts_as_a_full_disk() -> None:
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    sqlite_full.sqlite_errorcode = 13  # type: ignore[attr-defined]
    assert is_disk_full(OperationalError("INSERT", {}, sqlite_full))
    assert is_disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert not is_disk_full(OperationalError("INSERT", {}, sqlite3.OperationalError("locked")))
    assert not is_disk_full(OSError(errno.EACCES, "denied"))


DISK_FILLING_PROGRAM = """
    import errno, os
    with open("runs.txt", "a") as marker:  # One line per run of this program.
        marker.write("ran\\n")
    full, n = False, 0
    while not full:
        name, written = f"fill-{n}.bin", 0
        n += 1
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (65536, 4096, 1):
                try:
                    while written + size <= 8 << 20:  # Under the sandbox's file-size cap.
                        written += os.write(fd, b"x" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    full = True
        finally:
            os.close(fd)
    print("the disk is full after", n, "files")
"""


def test_a_task_that_fills_the_disk_fails_once_with_the_reason(
    small_disk: Path, start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another project's program fills the data directory to its last byte: the run can
    write nothing more to the ledger. Once there is room again, the task is ``failed``
    with the full disk as its reason, and its program never ran a second time; another
    project's task runs."""
    home = small_disk / "home"
    monkeypatch.setenv("RELAYGRAPH_HOME", str(home))
    filler = one_visit(
        "coder",
        "fill the disk",
        "attack",
        call("run_python", code=textwrap.dedent(DISK_FILLING_PROGRAM)),
        say("The disk is full."),
    )
    server = start_server(
        {"filler.json": filler},
        RELAYGRAPH_HOME=str(home),
        RELAYGRAPH_UNSAFE_SANDBOX="true",
        RELAYGRAPH_LEASE_SECONDS="4",
    )
    attacker, other = create_project(home, "bravo"), create_project(home, "alpha")
    with Client(server.url, attacker) as client:
        task = client.submit("fill it", model="scripted:filler.json")
        workspace = home / "tasks" / task["id"] / "workspace"
        deadline = time.monotonic() + 120
        # The run stops at its next write to the ledger, which the server logs; only then
        # is room made again (made before, the run would simply go on).
        stopped = f"task {task['id']!r} failed: error: no room on disk"
        while stopped not in server.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stopped in server.log.read_text(), server.log.read_text()[-3000:]
        for filled in workspace.glob("fill-*.bin"):
            filled.unlink()  # Room again.
        done = client.wait(task["id"], timeout=60)
    assert done["status"] == "failed", done
    assert "no room on disk" in (done["stop_reason"] or ""), done
    assert "disk is full" in done["stop_reason"], done
    with Client(server.url, other) as client:
        again = client.submit("When are checkpoints written?")
        assert client.wait(again["id"], timeout=120)["status"] == "succeeded"
    # By now the server's sweeps ran past the failed task many times: its program ran once.
    assert (workspace / "runs.txt").read_text() == "ran\n"
    assert "Traceback" not in server.log.read_text()


def _is_full(disk: Path) -> bool:
    return os.statvfs(disk).f_bavail == 0


def test_the_failure_is_on_the_record_while_the_disk_is_full_and_a_restart_runs_nothing(
    small_disk: Path, start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger is on the full disk: the room the runner keeps in reserve beside it is
    given up for the failure, which is on the record before any room is made. A server
    killed then (its memory lost) and started again once there is room does not run the
    program again, and the reserve is made again for the next."""
    home = small_disk / "home"
    monkeypatch.setenv("RELAYGRAPH_HOME", str(home))
    env = {
        "RELAYGRAPH_HOME": str(home),
        "RELAYGRAPH_UNSAFE_SANDBOX": "true",
        "RELAYGRAPH_LEASE_SECONDS": "4",
    }
    server = start_server({"filler.json": _filling_script()}, **env)
    attacker, other = create_project(home, "bravo"), create_project(home, "alpha")
    reserve = home / "ledger.sqlite.reserve"
    with Client(server.url, attacker) as client:
        task = client.submit("fill it", model="scripted:filler.json")
        workspace = home / "tasks" / task["id"] / "workspace"
        deadline = time.monotonic() + 120
        done = client.get(task["id"])
        while done["status"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.2)
            done = client.get(task["id"])
    assert done["status"] == "failed", done
    assert "no room on disk" in (done["stop_reason"] or ""), done
    assert not reserve.exists()  # Given up for the failure.
    server.process.kill()
    server.process.wait()
    for filled in workspace.glob("fill-*.bin"):
        filled.unlink()  # Room again.
    again = start_server(**env)
    with Client(again.url, other) as client:
        theirs = client.submit("When are checkpoints written?")
        assert client.wait(theirs["id"], timeout=120)["status"] == "succeeded"
    with Client(again.url, attacker) as client:
        assert client.get(task["id"])["status"] == "failed"
    # The restarted server's sweeps ran past the failed task: its program ran once.
    assert (workspace / "runs.txt").read_text() == "ran\n"
    assert reserve.stat().st_size == RESERVE_BYTES
    assert "Traceback" not in again.log.read_text()


def _filling_script() -> dict[str, Any]:
    return one_visit(
        "coder",
        "fill the disk",
        "attack",
        call("run_python", code=textwrap.dedent(DISK_FILLING_PROGRAM)),
        say("The disk is full."),
    )


class _FullLedger:
    """A ledger whose disk is full for its first ``refusals`` writes."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.written: list[tuple[str, str]] = []

    def append_events(self, task_id: str, events: Any, *, attempt: Any, end: Any) -> None:
        if self.refusals:
            self.refusals -= 1
            full = sqlite3.OperationalError("database or disk is full")
            full.sqlite_errorcode = 13  # type: ignore[attr-defined]
            raise OperationalError("INSERT", {}, full)
        self.written.append((task_id, end.stop_reason))


def test_the_reserve_makes_room_for_the_failure_and_without_it_the_failure_waits(
    tmp_path: Path,
) -> None:
    """With its reserve, a failure the full ledger refused is written at once (the reserve
    given up, then made again); without room to give, it waits for a later write."""
    reserve = RoomReserve(tmp_path / "ledger.sqlite.reserve")
    assert reserve.ensure() and reserve.path.stat().st_size == RESERVE_BYTES
    ledger = _FullLedger(refusals=1)
    failures = UnrecordedFailures(ledger, "runner-1", reserve=reserve)  # type: ignore[arg-type]
    assert failures.fail("t1", attempt=None, reason="error: no room on disk: x")
    assert ledger.written == [("t1", "error: no room on disk: x")] and not failures
    assert not reserve.path.exists()
    assert reserve.ensure() and reserve.path.exists()  # Room again: made again.
    # Refused, the reserve spent already: it waits in memory for the next try.
    ledger = _FullLedger(refusals=3)
    failures = UnrecordedFailures(ledger, "runner-1", reserve=None)  # type: ignore[arg-type]
    assert not failures.fail("t2", attempt=3, reason="error: no room on disk: y")
    assert "t2" in failures and failures.record() == 0
    assert failures.record() == 0
    assert failures.record() == 1 and not failures
    assert ledger.written == [("t2", "error: no room on disk: y")]
