"""A full disk: the server answers 507 ``insufficient_storage`` on writes, never a 500
(issue 41). The data directory is a small tmpfs the test mounts (root only; skipped
elsewhere), filled by a file as another project's program would fill it."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from relaygraph.client import ApiError, Client
from relaygraph.store import is_disk_full

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
