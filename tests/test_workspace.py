"""A task's workspace keeps every path inside its folder; the artifact store takes plain
file names only.

The workspace is also mounted read-write in the sandbox, so the attacks below are what code
run by ``run_python`` can plant there: symlinks (also swapped in halfway through a tool call),
FIFOs, sockets, devices and hard links. No tool may follow a symlink, block, or open a file
outside the workspace, whatever the timing.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from relaygraph.agents import tools
from relaygraph.agents.context import TaskContext
from relaygraph.backends.sandbox import filesystem_isolation, run_python_sandboxed
from relaygraph.backends.workspace import (
    MAX_WRITE_BYTES,
    Artifact,
    ArtifactStore,
    Workspace,
    WorkspaceEscapeError,
)
from relaygraph.errors import ToolInputError


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "task" / "workspace")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A secret file next to the workspace, which no workspace path may reach."""
    secret = tmp_path / "task" / "secret.txt"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("top secret")
    return secret


OpenHook = Callable[[str, int], None]


class OpenSpy:
    """Wraps ``os.open``: runs a hook just before a chosen name is opened (the worst moment
    for a swap, after every check), and records what each descriptor really refers to."""

    def __init__(self) -> None:
        self.hooks: dict[str, OpenHook] = {}
        self.opened: list[str] = []

    def before(self, name: str, hook: OpenHook) -> None:
        """Run ``hook(name, flags)`` once, just before ``name`` is next opened."""
        self.hooks[name] = hook

    def outside(self, root: Path) -> list[str]:
        """Every file or folder opened that is not ``root`` or inside it."""
        return [p for p in self.opened if not Path(p).is_relative_to(root)]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> OpenSpy:
    real_open = os.open
    spy = OpenSpy()

    def spying_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if isinstance(path, str) and (hook := spy.hooks.pop(path, None)):
            hook(path, flags)
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        spy.opened.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fd

    monkeypatch.setattr(os, "open", spying_open)
    return spy


def _in_thread(call: Callable[[], object], *, seconds: float = 10.0) -> BaseException | None:
    """Run ``call`` in a thread; fail the test if it has not returned within ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call blocked for more than {seconds} s"
    return outcome[0]


# --- paths -------------------------------------------------------------------------------


def test_root_is_created_and_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    ws = Workspace(tmp_path / "link" / "ws")
    assert ws.root == tmp_path.resolve() / "real" / "ws"
    assert ws.root.is_dir()
    assert repr(ws) == f"Workspace({str(ws.root)!r})"


def test_relative_paths_resolve_inside(ws: Workspace) -> None:
    assert ws.resolve("a/b.txt") == ws.root / "a" / "b.txt"
    assert ws.resolve("a/../b.txt") == ws.root / "b.txt"
    assert ws.resolve("./c") == ws.root / "c"
    assert ws.resolve(".") == ws.root


def test_absolute_path_inside_is_accepted(ws: Workspace) -> None:
    assert ws.resolve(str(ws.root / "x.py")) == ws.root / "x.py"
    ws.write_text(str(ws.root / "x.py"), "x = 1\n")
    assert ws.read_text(str(ws.root / "x.py")) == "x = 1\n"


@pytest.mark.parametrize("path", ["../x", "a/../../x", "..", "../workspace2/x"])
def test_dotdot_escapes_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(WorkspaceEscapeError) as info:
        ws.resolve(path)
    message = str(info.value)
    assert repr(path) in message
    assert "uses '..' to leave the workspace" in message
    assert "relative to the task's workspace" in message
    assert info.value.path == path


def test_dotdot_is_settled_on_the_text_not_through_a_symlink(ws: Workspace, outside: Path) -> None:
    # Through the kernel, 'a/..' would be the folder above the symlink's target: outside.
    (outside.parent / "deep").mkdir()
    (ws.root / "a").symlink_to(outside.parent / "deep")

    ws.write_text("a/../secret.txt", "mine")

    assert (ws.root / "secret.txt").read_text() == "mine"
    assert outside.read_text() == "top secret"
    assert ws.read_text("a/../secret.txt") == "mine"


def test_absolute_path_outside_is_refused(ws: Workspace) -> None:
    with pytest.raises(WorkspaceEscapeError, match="'/etc/passwd' is an absolute path outside"):
        ws.resolve("/etc/passwd")


def test_escape_error_is_a_tool_input_error(ws: Workspace) -> None:
    with pytest.raises(ToolInputError):
        ws.read_text("/etc/passwd")


@pytest.mark.parametrize(("path", "problem"), [("", "is empty"), ("  ", "is empty")])
def test_empty_path_is_refused(ws: Workspace, path: str, problem: str) -> None:
    with pytest.raises(WorkspaceEscapeError, match=problem):
        ws.resolve(path)


def test_nul_byte_is_refused(ws: Workspace) -> None:
    with pytest.raises(WorkspaceEscapeError, match=r"'a\\x00b' contains a NUL byte"):
        ws.resolve("a\x00b")


def test_lone_surrogate_in_a_path_is_refused(ws: Workspace) -> None:
    for call in (ws.resolve, ws.read_text, lambda p: ws.write_text(p, "x")):
        with pytest.raises(WorkspaceEscapeError, match="not valid Unicode text at index 1"):
            call("a\udfff.txt")


# --- what code in the sandbox can plant --------------------------------------------------


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_symlink_to_a_file_outside_is_refused(
    ws: Workspace, outside: Path, spy: OpenSpy, target: str
) -> None:
    link = ws.root / "link.txt"
    link.symlink_to(outside if target == "absolute" else Path("..") / outside.name)
    assert link.read_text() == "top secret"  # The link really leads to the secret.

    for call in (ws.resolve, ws.read_text, lambda p: ws.write_text(p, "overwritten")):
        with pytest.raises(WorkspaceEscapeError) as info:
            call("link.txt")
        assert "goes through a symlink, and the workspace tools do not follow symlinks" in str(
            info.value
        )
        assert "relative to the task's workspace" in str(info.value)
    assert outside.read_text() == "top secret"
    assert link.is_symlink()
    assert spy.outside(ws.root) == []


def test_symlinked_folder_on_the_way_is_refused(ws: Workspace, outside: Path, spy: OpenSpy) -> None:
    (ws.root / "linkdir").symlink_to(outside.parent)
    (ws.root / "real").mkdir()
    (ws.root / "real" / "inner").symlink_to(outside.parent)

    for path in ("linkdir/secret.txt", "real/inner/secret.txt"):
        with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
            ws.read_text(path)
    for path in ("linkdir/new.txt", "linkdir/sub/new.txt", "real/inner/new.txt"):
        with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
            ws.write_text(path, "x")
        with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
            ws.resolve(path)
    assert sorted(p.name for p in outside.parent.iterdir()) == ["secret.txt", "workspace"]
    assert spy.outside(ws.root) == []


def test_symlink_inside_the_workspace_is_not_followed_either(ws: Workspace) -> None:
    # Code in the sandbox can repoint it at any moment, so no symlink is trusted.
    ws.write_text("real/data.txt", "hello")
    (ws.root / "alias").symlink_to(ws.root / "real")
    (ws.root / "same.txt").symlink_to("real/data.txt")

    for path in ("alias/data.txt", "same.txt"):
        with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
            ws.read_text(path)
    assert ws.read_text("real/data.txt") == "hello"


def test_dangling_symlink_is_not_written_through(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "created-outside.txt"
    (ws.root / "trap.txt").symlink_to(target)
    with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
        ws.write_text("trap.txt", "x")
    assert not target.exists()


def test_symlink_loop_is_refused(ws: Workspace) -> None:
    (ws.root / "a").symlink_to(ws.root / "b")
    (ws.root / "b").symlink_to(ws.root / "a")
    with pytest.raises(WorkspaceEscapeError, match="'a' goes through a symlink"):
        ws.read_text("a")
    with pytest.raises(WorkspaceEscapeError, match="'a/x' goes through a symlink"):
        ws.write_text("a/x", "")


def test_symlink_swapped_in_just_before_the_file_is_opened(
    ws: Workspace, outside: Path, spy: OpenSpy
) -> None:
    ws.write_text("notes.txt", "mine")

    def swap(name: str, flags: int) -> None:
        (ws.root / name).unlink()
        (ws.root / name).symlink_to(outside)

    spy.before("notes.txt", swap)
    with pytest.raises(WorkspaceEscapeError, match=r"'notes\.txt' goes through a symlink"):
        ws.read_text("notes.txt")
    assert "notes.txt" not in spy.hooks  # The hook ran: the swap really happened.
    assert spy.outside(ws.root) == []


def test_symlinked_folder_swapped_in_on_the_way(ws: Workspace, outside: Path, spy: OpenSpy) -> None:
    ws.write_text("sub/secret.txt", "mine")

    def swap(name: str, flags: int) -> None:
        (ws.root / name).rename(ws.root / "moved")
        (ws.root / name).symlink_to(outside.parent)

    spy.before("sub", swap)
    with pytest.raises(WorkspaceEscapeError, match=r"'sub/secret\.txt' goes through a symlink"):
        ws.read_text("sub/secret.txt")
    assert "sub" not in spy.hooks
    assert spy.outside(ws.root) == []


def test_folder_swapped_for_a_symlink_after_it_was_made(
    ws: Workspace, outside: Path, monkeypatch: pytest.MonkeyPatch, spy: OpenSpy
) -> None:
    real_mkdir = os.mkdir
    swapped: list[str] = []

    def mkdir_then_swap(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        if path == "new":
            os.rmdir(ws.root / "new")
            (ws.root / "new").symlink_to(outside.parent)
            swapped.append(path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(WorkspaceEscapeError, match=r"'new/x\.txt' goes through a symlink"):
        ws.write_text("new/x.txt", "x")
    assert swapped == ["new"]
    assert not (outside.parent / "x.txt").exists()
    assert spy.outside(ws.root) == []


def test_symlink_swapped_in_before_the_rename_is_replaced_not_followed(
    ws: Workspace, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws.write_text("out.txt", "old")
    real_rename = os.rename

    def swap_then_rename(src: Any, dst: Any, **dir_fds: Any) -> None:
        (ws.root / "out.txt").unlink()
        (ws.root / "out.txt").symlink_to(outside)
        real_rename(src, dst, **dir_fds)

    monkeypatch.setattr(os, "rename", swap_then_rename)
    ws.write_text("out.txt", "new")

    assert outside.read_text() == "top secret"
    assert not (ws.root / "out.txt").is_symlink()
    assert (ws.root / "out.txt").read_text() == "new"


def test_write_over_a_hard_link_leaves_the_other_name_alone(ws: Workspace, outside: Path) -> None:
    os.link(outside, ws.root / "hl.txt")
    ws.write_text("hl.txt", "new")
    assert outside.read_text() == "top secret"
    assert (ws.root / "hl.txt").read_text() == "new"
    assert outside.stat().st_nlink == 1


def test_hard_link_to_a_file_outside_is_not_read(
    ws: Workspace, outside: Path, spy: OpenSpy
) -> None:
    os.link(outside, ws.root / "hl.txt")
    with pytest.raises(ToolInputError) as info:
        ws.read_text("hl.txt")
    assert str(info.value).startswith(
        "'hl.txt' has 2 hard links, and the workspace tools read only files with one"
    )
    assert "top secret" not in str(info.value)
    assert spy.opened == [str(ws.root)]  # The file itself was not even opened.


def test_hard_link_made_just_before_the_open_is_not_read(
    ws: Workspace, outside: Path, spy: OpenSpy
) -> None:
    ws.write_text("notes.txt", "mine")

    def swap(name: str, flags: int) -> None:
        (ws.root / name).unlink()
        os.link(outside, ws.root / name)

    spy.before("notes.txt", swap)
    with pytest.raises(ToolInputError, match=r"'notes\.txt' has 2 hard links"):
        ws.read_text("notes.txt")


def test_fifo_is_refused_at_once(ws: Workspace) -> None:
    os.mkfifo(ws.root / "pipe")

    error = _in_thread(lambda: ws.read_text("pipe"))

    assert isinstance(error, ToolInputError)
    assert str(error) == (
        "'pipe' is a named pipe (FIFO), not a regular file; only regular files can be read"
    )
    # Writing replaces the FIFO instead of opening it (which would wait for a reader).
    assert _in_thread(lambda: ws.write_text("pipe", "text")) is None
    assert ws.read_text("pipe") == "text"


def test_fifo_swapped_in_just_before_the_open_does_not_block(ws: Workspace, spy: OpenSpy) -> None:
    ws.write_text("notes.txt", "mine")

    def swap(name: str, flags: int) -> None:
        (ws.root / name).unlink()
        os.mkfifo(ws.root / name)

    spy.before("notes.txt", swap)
    error = _in_thread(lambda: ws.read_text("notes.txt"))
    assert isinstance(error, ToolInputError)
    assert "'notes.txt' is a named pipe (FIFO)" in str(error)


def test_symlink_to_a_device_is_refused(ws: Workspace, spy: OpenSpy) -> None:
    (ws.root / "zero").symlink_to("/dev/zero")
    error = _in_thread(lambda: ws.read_text("zero"))
    assert isinstance(error, WorkspaceEscapeError)
    assert "/dev/zero" not in spy.opened


def test_device_is_refused(ws: Workspace, spy: OpenSpy) -> None:
    try:
        os.mknod(ws.root / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("this user may not create device nodes (needs CAP_MKNOD)")
    with pytest.raises(ToolInputError, match="'zero' is a device, not a regular file"):
        ws.read_text("zero")
    assert spy.opened == [str(ws.root)]


def test_device_swapped_in_just_before_the_open_is_not_read(ws: Workspace, spy: OpenSpy) -> None:
    ws.write_text("notes.txt", "mine")

    def swap(name: str, flags: int) -> None:
        (ws.root / name).unlink()
        os.mknod(ws.root / name, stat.S_IFCHR | 0o600, os.makedev(1, 5))

    try:
        os.mknod(ws.root / "probe", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("this user may not create device nodes (needs CAP_MKNOD)")
    spy.before("notes.txt", swap)
    with pytest.raises(ToolInputError, match=r"'notes\.txt' is a device"):
        ws.read_text("notes.txt")


def test_socket_is_refused(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ws.root)  # A relative name keeps within the socket path limit.
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock")
        with pytest.raises(ToolInputError, match="'sock' is a socket, not a regular file"):
            ws.read_text("sock")


def test_no_tool_opens_anything_outside(ws: Workspace, outside: Path, spy: OpenSpy) -> None:
    # Every kind of trap at once, and every operation over it.
    ws.write_text("ok/file.txt", "fine")
    (ws.root / "abs").symlink_to(outside)
    (ws.root / "rel").symlink_to(f"../{outside.name}")
    (ws.root / "dir").symlink_to(outside.parent)
    (ws.root / "ok" / "up").symlink_to("../..")
    os.link(outside, ws.root / "hard")
    os.mkfifo(ws.root / "pipe")
    paths = ["abs", "rel", "dir/secret.txt", "dir/x/y", "ok/up/secret.txt", "hard", "pipe"]

    for path in paths:
        error = _in_thread(functools.partial(ws.read_text, path))
        assert isinstance(error, ToolInputError), path
    for path in ["abs", "rel", "dir/secret.txt", "dir/x/y", "ok/up/secret.txt"]:
        with pytest.raises(WorkspaceEscapeError):
            ws.resolve(path)
        with pytest.raises(WorkspaceEscapeError):
            ws.write_text(path, "x")
    listed = ["abs", "dir", "hard", "ok/file.txt", "ok/up", "pipe", "rel"]
    assert ws.list_files() == listed

    assert spy.outside(ws.root) == []
    assert outside.read_text() == "top secret"


# --- writing -----------------------------------------------------------------------------


def test_write_creates_nested_folders(ws: Workspace) -> None:
    written = ws.write_text("src/pkg/mod.py", "print('hi')\n")
    assert written == ws.root / "src" / "pkg" / "mod.py"
    assert written.read_text() == "print('hi')\n"


def test_write_replaces_a_file(ws: Workspace) -> None:
    ws.write_text("a.txt", "first")
    ws.write_text("a.txt", "second")
    assert ws.read_text("a.txt") == "second"


def test_write_size_limit(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, max_write_bytes=10)
    ws.write_text("ok.txt", "x" * 10)
    with pytest.raises(ToolInputError, match=r"'big.txt' is 11 bytes; the limit is 10 bytes"):
        ws.write_text("big.txt", "x" * 11)
    # UTF-8 bytes count, not characters.
    with pytest.raises(ToolInputError, match="is 12 bytes"):
        ws.write_text("big.txt", "é" * 6)
    assert not (tmp_path / "big.txt").exists()
    assert Workspace(tmp_path).max_write_bytes == MAX_WRITE_BYTES == 1_000_000


def test_write_to_a_folder_is_refused(ws: Workspace) -> None:
    (ws.root / "docs").mkdir()
    with pytest.raises(ToolInputError, match=r"'docs' is a folder.*'docs/notes.txt'"):
        ws.write_text("docs", "x")
    with pytest.raises(ToolInputError, match="is a folder"):
        ws.write_text(".", "x")


def test_write_under_a_file_is_refused(ws: Workspace) -> None:
    ws.write_text("a.txt", "x")
    with pytest.raises(ToolInputError, match=r"'a.txt/b.txt'.*existing file, not a folder"):
        ws.write_text("a.txt/b.txt", "y")


def test_write_refuses_invalid_unicode(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="not valid Unicode text at index 2"):
        ws.write_text("a.txt", "ab\ud800")


def test_write_keeps_the_permission_bits_of_the_file_it_replaces(ws: Workspace) -> None:
    script = ws.write_text("run.sh", "echo 1\n")
    script.chmod(0o750)
    ws.write_text("run.sh", "echo 2\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.read_text() == "echo 2\n"


def test_write_leaves_no_temporary_file(ws: Workspace) -> None:
    ws.write_text("a.txt", "1")
    ws.write_text("a.txt", "2")
    with pytest.raises(ToolInputError):
        ws.write_text("a.txt/b.txt", "3")
    assert sorted(p.name for p in ws.root.iterdir()) == ["a.txt"]


def test_write_with_a_name_too_long_says_so(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match=r"cannot write 'x{300}': File name too long"):
        ws.write_text("x" * 300, "x")


# --- reading -----------------------------------------------------------------------------


def test_read_missing_file_lists_existing_files(ws: Workspace) -> None:
    ws.write_text("b.txt", "")
    ws.write_text("a/c.py", "")
    with pytest.raises(ToolInputError) as info:
        ws.read_text("nope.txt")
    assert str(info.value) == (
        "there is no file 'nope.txt' in the workspace. Files in the workspace: a/c.py, b.txt."
    )


def test_read_missing_file_lists_at_most_twenty(ws: Workspace) -> None:
    for i in range(25):
        ws.write_text(f"f{i:02}.txt", "")
    with pytest.raises(ToolInputError) as info:
        ws.read_text("nope.txt")
    message = str(info.value)
    assert "f19.txt and 5 more." in message
    assert "f20.txt" not in message


def test_read_missing_file_in_empty_workspace(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="The workspace has no files yet"):
        ws.read_text("nope.txt")


def test_read_folder_is_refused(ws: Workspace) -> None:
    ws.write_text("d/x.txt", "")
    with pytest.raises(ToolInputError, match=r"'d' is a folder, not a file. Files in the"):
        ws.read_text("d")


def test_read_binary_is_refused(ws: Workspace) -> None:
    (ws.root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ToolInputError, match=r"'img.png' is not UTF-8 text"):
        ws.read_text("img.png")
    (ws.root / "nul.bin").write_bytes(b"abc\x00def")
    with pytest.raises(ToolInputError, match=r"'nul.bin' contains NUL bytes"):
        ws.read_text("nul.bin")


def test_read_truncates_long_files(ws: Workspace) -> None:
    ws.write_text("long.txt", "é" * 50)
    assert ws.read_text("long.txt", max_chars=50) == "é" * 50
    text = ws.read_text("long.txt", max_chars=10)
    assert text == "é" * 10 + "\n[truncated: showing the first 10 characters of 100 bytes]"


def test_list_files_is_sorted_relative_posix(ws: Workspace, outside: Path) -> None:
    ws.write_text("z.txt", "")
    ws.write_text("a/b/c.txt", "")
    ws.write_text("a/a.txt", "")
    (ws.root / "empty").mkdir()
    # No symlink is walked into; symlinks and FIFOs are listed by name, never opened.
    (ws.root / "outdir").symlink_to(outside.parent)
    (ws.root / "outfile").symlink_to(outside)
    os.mkfifo(ws.root / "pipe")
    assert ws.list_files() == ["a/a.txt", "a/b/c.txt", "outdir", "outfile", "pipe", "z.txt"]


def test_list_files_stops_16_folders_deep(ws: Workspace) -> None:
    ws.write_text("/".join(["d"] * 16) + "/shown.txt", "")
    ws.write_text("/".join(["d"] * 17) + "/hidden.txt", "")
    assert ws.list_files() == ["/".join(["d"] * 16) + "/shown.txt"]


def test_list_files_keeps_the_first_names_only(ws: Workspace) -> None:
    for name in ("c.txt", "a/z.txt", "b.txt", "a/a.txt"):
        ws.write_text(name, "")
    assert ws.list_files(limit=2) == ["a/a.txt", "a/z.txt"]


class CountingScandir:
    """Wraps ``os.scandir``: counts every entry any listing is handed."""

    def __init__(self) -> None:
        self.entries = 0
        self._real = os.scandir

    def __call__(self, path: Any) -> Any:
        spy = self

        class Entries:
            def __init__(self) -> None:
                self._it = spy._real(path)

            def __iter__(self) -> Entries:
                return self

            def __next__(self) -> os.DirEntry[str]:
                entry = next(self._it)
                spy.entries += 1
                return entry

            def close(self) -> None:
                self._it.close()

            def __enter__(self) -> Entries:
                return self

            def __exit__(self, *exc: object) -> None:
                self.close()

        return Entries()


def _plant(folder: Path, count: int, name_chars: int) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            name = f"f{i:06}".ljust(name_chars, "y")
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)


def _missing_file_message(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> tuple[str, int, int]:
    """Read a missing file; return the message, the entries listed and the peak of memory."""
    spy = CountingScandir()
    monkeypatch.setattr(os, "scandir", spy)
    tracemalloc.start()
    try:
        with pytest.raises(ToolInputError) as info:
            ws.read_text("missing.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return str(info.value), spy.entries, peak


def test_a_missing_file_in_a_wide_workspace_lists_a_bounded_part(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Code in the sandbox can plant any number of files, and every failed read_file lists
    # the workspace in the server: 40,000 took a server from 142 MiB to 771 MiB.
    _plant(ws.root, 15_000, 12)
    message, entries, peak = _missing_file_message(ws, monkeypatch)

    assert entries <= 10_001
    assert peak < 4 * 1024 * 1024
    assert message.endswith("and more (the listing stopped after 10,001 entries).")
    assert message.count(", ") == 19


def test_a_missing_file_in_a_deep_workspace_of_long_names_lists_a_bounded_part(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 folders of 200-character names, 12,000 files of 200 characters at the bottom: each
    # path is 2.6 KB, 31 MB for all of them.
    deep = ws.root.joinpath(*[f"d{depth:02}".ljust(200, "x") for depth in range(12)])
    deep.mkdir(parents=True)
    _plant(deep, 12_000, 200)
    message, entries, peak = _missing_file_message(ws, monkeypatch)

    assert entries < 1_000
    assert peak < 4 * 1024 * 1024
    assert "and more (the listing stopped after" in message
    assert message.count(", ") == 19


# --- artifacts ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


def test_artifact_store_root_is_created(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "x" / "artifacts")
    assert store.root.is_dir()
    assert repr(store) == f"ArtifactStore({str(store.root)!r})"


def test_save_returns_artifact(store: ArtifactStore) -> None:
    artifact = store.save("report.md", "# Résumé\n")
    assert artifact == Artifact(
        name="report.md", path=store.root / "report.md", size_bytes=len("# Résumé\n".encode())
    )
    assert artifact.path.read_text(encoding="utf-8") == "# Résumé\n"


@pytest.mark.parametrize(
    "name", ["report.md", "a", "A-b_c.1.txt", "_x", "-x", "x" * 100, "no_extension"]
)
def test_valid_artifact_names(store: ArtifactStore, name: str) -> None:
    assert store.save(name, "x").name == name


@pytest.mark.parametrize(
    "name",
    ["", ".hidden", ".", "..", "a/b.md", "../x.md", "/etc/passwd", "a b.md", "ü.md",
     "x" * 101, "a\\b", "a\x00b", "report.md\n"],
)  # fmt: skip
def test_invalid_artifact_names_are_refused(store: ArtifactStore, name: str) -> None:
    with pytest.raises(ToolInputError) as info:
        store.save(name, "x")
    assert repr(name) in str(info.value)
    assert "plain file name" in str(info.value)
    assert list(store.root.iterdir()) == []


def test_save_overwrites(store: ArtifactStore) -> None:
    store.save("r.md", "first version")
    artifact = store.save("r.md", "v2")
    assert artifact.size_bytes == 2
    assert store.list() == [artifact]
    assert artifact.path.read_text() == "v2"


def test_save_size_limit(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=4)
    with pytest.raises(ToolInputError, match=r"artifact 'r.md' is 5 bytes; the limit is 4 bytes"):
        store.save("r.md", "12345")
    assert store.list() == []


def test_save_refuses_invalid_unicode(store: ArtifactStore) -> None:
    with pytest.raises(ToolInputError, match="not valid Unicode"):
        store.save("r.md", "\udc80")
    assert list(store.root.iterdir()) == []


def test_list_is_sorted_and_skips_other_entries(store: ArtifactStore) -> None:
    store.save("b.md", "bb")
    store.save("a.txt", "a")
    (store.root / ".b.md.1234.tmp").write_text("leftover")
    (store.root / "folder").mkdir()
    assert store.list() == [
        Artifact(name="a.txt", path=store.root / "a.txt", size_bytes=1),
        Artifact(name="b.md", path=store.root / "b.md", size_bytes=2),
    ]


def test_list_of_empty_store(store: ArtifactStore) -> None:
    assert store.list() == []


def test_list_skips_symlinks_and_save_replaces_them(store: ArtifactStore, outside: Path) -> None:
    (store.root / "evil.md").symlink_to(outside)
    assert store.list() == []
    store.save("evil.md", "mine")
    assert outside.read_text() == "top secret"
    assert store.list() == [Artifact(name="evil.md", path=store.root / "evil.md", size_bytes=4)]


# --- end to end: a planted symlink to the ledger -----------------------------------------

_PLANT = """
import os
os.symlink({ledger!r}, "abs")
os.symlink("../../../ledger.sqlite", "rel")
os.symlink({data!r}, "data")
os.mkfifo("pipe")
for source in ("/usr/bin/env", "/dev/zero"):
    try:
        os.link(source, "hard")
    except OSError as exc:
        print(exc.errno)
"""

_STILL_LOCKED = """
import fcntl, sys
with open(sys.argv[1], "rb+") as f:
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(0)
sys.exit(1)
"""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A server's data directory with a real SQLite ledger and a task's workspace."""
    data = tmp_path / "data"
    (data / "tasks" / "t1" / "workspace").mkdir(parents=True)
    with sqlite3.connect(data / "ledger.sqlite") as db:
        db.execute("CREATE TABLE tasks (id TEXT, answer TEXT)")
        db.execute("INSERT INTO tasks VALUES ('t0', 'acknowledged')")
    db.close()
    return data


def _run_tool(name: str, workspace: Path, **args: str) -> str:
    """Call the coder's LangChain tool as the agent would, with a ToolRuntime-like context."""
    func = getattr(tools, name).func
    assert func is not None
    context = TaskContext(
        task_id="t1",
        thread_id="t1",
        workspace=workspace,
        artifacts=workspace.parent / "artifacts",
        knowledge_base=workspace.parent / "kb.sqlite",
    )
    runtime = SimpleNamespace(context=context)
    result: str = func(runtime=runtime, **args)
    return result


@pytest.mark.skipif(filesystem_isolation() is None, reason="bubblewrap is not available here")
def test_sandbox_planted_symlinks_never_reach_the_ledger(data_dir: Path, spy: OpenSpy) -> None:
    ledger = data_dir / "ledger.sqlite"
    workspace = data_dir / "tasks" / "t1" / "workspace"
    before = (ledger.read_bytes(), ledger.stat().st_mtime_ns)

    result = run_python_sandboxed(
        _PLANT.format(ledger=str(ledger), data=str(data_dir)),
        workspace=workspace,
        hidden=[data_dir],
    )

    assert result.exit_code == 0, result.to_text()
    # Inside the sandbox a hard link to a file outside the workspace cannot be made: every
    # other file is on another mount, so only the fallback could plant one.
    assert result.stdout.split() == [str(errno.EXDEV)] * 2
    assert os.readlink(workspace / "rel") == "../../../ledger.sqlite"
    # A POSIX lock like SQLite's. This process drops it as soon as it closes *any* descriptor
    # of the file, which is the damage a tool that merely opened the ledger would do.
    with open(ledger, "rb+") as held:
        fcntl.lockf(held, fcntl.LOCK_SH)
        spy.opened.clear()  # From here on, only what the server's tools open.
        for path in ("abs", "rel", "data/ledger.sqlite"):
            with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
                _run_tool("read_file", workspace, path=path)
            with pytest.raises(WorkspaceEscapeError, match="goes through a symlink"):
                _run_tool("write_file", workspace, path=path, content="overwritten")
        with pytest.raises(ToolInputError, match="named pipe"):
            _run_tool("read_file", workspace, path="pipe")
        still_locked = subprocess.run([sys.executable, "-c", _STILL_LOCKED, ledger], check=False)

    assert still_locked.returncode == 0, "the ledger's POSIX lock was dropped"
    assert str(ledger) not in spy.opened
    assert spy.outside(workspace) == []
    assert (ledger.read_bytes(), ledger.stat().st_mtime_ns) == before
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT * FROM tasks").fetchall() == [("t0", "acknowledged")]
    db.close()
