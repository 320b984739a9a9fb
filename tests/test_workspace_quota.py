"""A task's workspace quota (``RELAYGRAPH_WORKSPACE_MAX_MB``, ``..._MAX_FILES``), enforced
while the program runs, and by ``write_file`` and ``save_artifact`` (issue 41).

The sandbox tests run inside bubblewrap (skipped where it is missing) and in the fallback
without it (``RELAYGRAPH_BWRAP=""``): the quota holds on both paths.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from relaygraph.backends._quota import task_files_usage
from relaygraph.backends.sandbox import (
    SandboxLimits,
    SandboxResult,
    run_python_sandboxed,
)
from relaygraph.backends.workspace import (
    ArtifactStore,
    Workspace,
    WorkspaceQuota,
    WorkspaceQuotaExceeded,
)
from relaygraph.client import Client
from relaygraph.errors import ConfigError

from ._scripts import call, one_visit, say
from .test_server import create_project

MiB = 1024 * 1024


@pytest.fixture
def task_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A task's workspace and artifacts folder, as the server lays them out."""
    workspace, artifacts = tmp_path / "task" / "workspace", tmp_path / "task" / "artifacts"
    workspace.mkdir(parents=True)
    artifacts.mkdir()
    return workspace, artifacts


def _usage(*folders: Path) -> int:
    return task_files_usage(folders, stop_after_files=1_000_000).bytes


def run_in_task(
    task_dir: tuple[Path, Path],
    program: str,
    quota: WorkspaceQuota,
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Run ``program`` (dedented) in the task's workspace under ``quota``, which counts the
    task's artifacts too, with the sandbox's default ``limits`` unless given."""
    workspace, artifacts = task_dir
    return run_python_sandboxed(
        textwrap.dedent(program),
        workspace=workspace,
        limits=limits if limits is not None else SandboxLimits(),
        quota=quota,
        counted=(artifacts,),
    )


FILLING_LOOP = """
    import errno
    written = 0
    try:
        with open("fill.bin", "wb") as out:
            while True:
                out.write(b"x" * 65536)
                out.flush()
                written += 65536
    except OSError as exc:
        print("write failed:", errno.errorcode[exc.errno], exc.strerror, "after", written)
"""


@pytest.mark.usefixtures("isolation")
def test_a_program_writing_in_a_loop_gets_an_error_inside_at_the_quota(
    task_dir: tuple[Path, Path],
) -> None:
    workspace, artifacts = task_dir
    (artifacts / "report.md").write_bytes(b"r" * MiB)  # The artifacts count too.
    quota = WorkspaceQuota(max_mb=3, max_files=100)
    result = run_in_task(task_dir, FILLING_LOOP, quota, SandboxLimits(file_size_mb=16))
    # The program saw the error itself and went on to print it: it was not killed.
    assert result.exit_code == 0, result.to_text()
    assert "write failed: EFBIG File too large" in result.stdout
    written = int(result.stdout.split("after")[1])
    assert written <= 2 * MiB
    assert _usage(workspace, artifacts) <= 3 * MiB + 64 * 1024
    assert result.workspace_quota is not None
    text = result.to_text()
    assert "workspace quota of 3 MB (RELAYGRAPH_WORKSPACE_MAX_MB) reached" in text
    assert "file size limit of 16 MB" not in text


MANY_FILES = """
    import os
    for i in range(200_000):
        with open(f"f{i}.bin", "wb") as out:
            out.write(b"y" * 65536)
    print("wrote them all")
"""


@pytest.mark.usefixtures("isolation")
def test_many_small_files_past_the_quota_stop_the_run(task_dir: tuple[Path, Path]) -> None:
    workspace = task_dir[0]
    quota = WorkspaceQuota(max_mb=4, max_files=100_000)
    result = run_in_task(task_dir, MANY_FILES, quota)
    assert "wrote them all" not in result.stdout
    assert result.workspace_quota is not None
    assert "RELAYGRAPH_WORKSPACE_MAX_MB" in result.workspace_quota
    assert "the run was stopped" in result.to_text()
    # Stopped near the quota, not at 200,000 files (12 GB). How far past it depends on how
    # fast the program writes between two measures, which a loaded machine slows: the bound
    # is the order of magnitude, not a timing.
    assert _usage(workspace) < 2048 * MiB


EMPTY_FILES = """
    for i in range(200_000):
        open(f"e{i}", "w").close()
    print("made them all")
"""


@pytest.mark.usefixtures("isolation")
def test_files_past_the_files_quota_stop_the_run(task_dir: tuple[Path, Path]) -> None:
    workspace = task_dir[0]
    quota = WorkspaceQuota(max_mb=1024, max_files=500)
    result = run_in_task(task_dir, EMPTY_FILES, quota)
    assert "made them all" not in result.stdout
    assert result.workspace_quota is not None
    assert "500 files (RELAYGRAPH_WORKSPACE_MAX_FILES)" in result.workspace_quota
    assert len(os.listdir(workspace)) < 200_000


@pytest.mark.usefixtures("isolation")
def test_a_run_in_a_full_workspace_may_delete_but_not_grow(task_dir: tuple[Path, Path]) -> None:
    workspace = task_dir[0]
    (workspace / "old.bin").write_bytes(b"o" * 3 * MiB)
    quota = WorkspaceQuota(max_mb=2)
    result = run_in_task(
        task_dir,
        """
        import os
        try:
            with open("more.bin", "wb") as out:
                out.write(b"m" * 200_000)
        except OSError as exc:
            print("refused:", exc.strerror)
        os.remove("old.bin")
        print("deleted")
        """,
        quota,
    )
    assert "refused: File too large" in result.stdout, result.to_text()
    assert "deleted" in result.stdout
    assert not (workspace / "old.bin").exists()


def test_write_file_is_refused_past_the_quota_naming_it(task_dir: tuple[Path, Path]) -> None:
    workspace, artifacts = task_dir
    (artifacts / "report.md").write_bytes(b"r" * 700_000)
    tools = Workspace(workspace, quota=WorkspaceQuota(max_mb=1, max_files=5), counted=(artifacts,))
    tools.write_text("small.txt", "s" * 100_000)
    with pytest.raises(WorkspaceQuotaExceeded) as refused:
        tools.write_text("big.txt", "b" * 400_000)
    message = str(refused.value)
    assert "write_file 'big.txt' (400,000 bytes) is refused" in message
    assert "the workspace quota of 1 MB (RELAYGRAPH_WORKSPACE_MAX_MB)" in message
    assert not (workspace / "big.txt").exists()
    # Replacing a file counts only what it adds.
    tools.write_text("small.txt", "t" * 150_000)
    for name in ("a", "b", "c"):  # report.md, small.txt and these: 5 files
        tools.write_text(name, "x")
    with pytest.raises(WorkspaceQuotaExceeded, match="5 files \\(RELAYGRAPH_WORKSPACE_MAX_FILES"):
        tools.write_text("d", "x")


def test_save_artifact_is_refused_past_the_quota_naming_it(task_dir: tuple[Path, Path]) -> None:
    workspace, artifacts = task_dir
    (workspace / "data.bin").write_bytes(b"d" * 900_000)
    store = ArtifactStore(artifacts, quota=WorkspaceQuota(max_mb=1), counted=(workspace,))
    with pytest.raises(WorkspaceQuotaExceeded) as refused:
        store.save("report.md", "r" * 200_000)
    assert "save_artifact 'report.md' (200,000 bytes) is refused" in str(refused.value)
    assert "RELAYGRAPH_WORKSPACE_MAX_MB" in str(refused.value)
    assert store.list() == []
    store.save("note.md", "short")


def test_the_measure_follows_no_symlink_and_is_bounded(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge.bin").write_bytes(b"h" * MiB)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "link").symlink_to(outside)
    assert task_files_usage([workspace], stop_after_files=10).bytes < MiB
    for i in range(50):
        (workspace / f"f{i}").touch()
    assert task_files_usage([workspace], stop_after_files=10).files == 11


def test_a_quota_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_mb=0 must be a positive integer"):
        WorkspaceQuota(max_mb=0)


def test_a_task_past_its_quota_is_told_which_quota_and_goes_on(
    start_server: Any, home: Path
) -> None:
    """The attack through the service: the coder's program fills its workspace in a loop,
    then the coder writes a big file; both are refused with the quota named, and the task
    ends honestly (here: it goes on and succeeds)."""
    filler = one_visit(
        "coder",
        "fill the disk",
        "attack",
        call("run_python", code=textwrap.dedent(FILLING_LOOP)),
        call("write_file", path="more.txt", content="m" * 600_000),
        say("The workspace is full."),
    )
    server = start_server(
        {"filler.json": filler},
        RELAYGRAPH_WORKSPACE_MAX_MB="2",
        RELAYGRAPH_UNSAFE_SANDBOX="true",
    )
    key = create_project(home, "bravo")
    with Client(server.url, key) as client:
        task = client.submit("fill it", model="scripted:filler.json")
        done = client.wait(task["id"], timeout=120)
        results = [e["data"] for e in client.events(task["id"]) if e["event"] == "tool_result"]
    assert done["status"] == "succeeded", done
    ran, wrote = results[0], results[1]
    # The event holds the result's first 300 characters: the quota's note comes first (the
    # program's own "write failed: EFBIG" follows, past the cut where the host's lack of
    # isolation adds a note; test_a_program_writing_in_a_loop_... reads it in full).
    assert "workspace quota of 2 MB (RELAYGRAPH_WORKSPACE_MAX_MB) reached" in json.dumps(ran)
    assert "write_file 'more.txt' (600,000 bytes) is refused" in json.dumps(wrote)
    workspace = home / "tasks" / task["id"] / "workspace"
    assert _usage(workspace) <= 2 * MiB + 64 * 1024
