"""The server never touches a path that code in the sandbox can change (issue 13, break 1).

The workspace is mounted read-write in the sandbox, so every name in it can become a symlink
at any moment. A server that prepared a run there by name (a run folder, ``main.py``, a
temporary folder, and deleting them afterwards) could be made to create, truncate, write or
delete files anywhere on the host, as root: a program in one run watched the workspace with
inotify and planted ``main.py`` of a parallel run as a symlink to a host file, and a program
that replaced the run folders' parent with a symlink sent the next run's files into a host
folder. These tests make both attacks for real and check that nothing outside the workspace
is created or changed. The program now reaches the sandbox through a memory file, and the
fallback without bubblewrap keeps it in a private folder outside the workspace.
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relaygraph.backends import _bubblewrap, _nofollow
from relaygraph.backends.sandbox import (
    SandboxLimits,
    SandboxResult,
    filesystem_isolation,
    run_python_sandboxed,
)

requires_bwrap = pytest.mark.skipif(
    filesystem_isolation() is None,
    reason="bubblewrap (bwrap) is not installed or cannot create namespaces on this host",
)

VICTIM_TEXT = "the host's file, which no tenant may change\n"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Host files next to the workspace: the targets of every symlink the attacker plants."""
    host = tmp_path / "host"
    (host / "folder").mkdir(parents=True)
    (host / "victim.txt").write_text(VICTIM_TEXT)
    (host / "folder" / "keep.txt").write_text("keep")
    return host


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "tasks" / "B" / "workspace"
    workspace.mkdir(parents=True)
    return workspace


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root``: its type, and a file's hash, a folder's mtime (which
    changes when an entry is made or removed in it, even if the tree looks the same after)."""
    found: dict[str, tuple[object, ...]] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        info = os.lstat(folder)
        found[folder] = ("dir", info.st_mtime_ns, stat.S_IMODE(info.st_mode))
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            entry = os.lstat(path)
            if stat.S_ISREG(entry.st_mode):
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                found[path] = ("file", digest, entry.st_mtime_ns)
            else:
                found[path] = ("other", entry.st_mode, entry.st_mtime_ns)
    return found


def run(code: str, workspace: Path, **limits: float) -> SandboxResult:
    return run_python_sandboxed(
        textwrap.dedent(code), workspace=workspace, limits=SandboxLimits(**limits)
    )


def _wait_for(path: Path, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


# --- the race: a parallel run plants symlinks in every new folder and over every new file ---

_ATTACKER = """
import ctypes, os, select, struct, time

VICTIM_FILE = {victim_file!r}
VICTIM_FOLDER = {victim_folder!r}
IN_CREATE, IN_MOVED_TO, IN_ISDIR = 0x100, 0x80, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
inotify = libc.inotify_init1(os.O_NONBLOCK)
watched = {{}}
planted = 0

def watch(folder):
    wd = libc.inotify_add_watch(inotify, folder.encode(), IN_CREATE | IN_MOVED_TO)
    if wd >= 0:
        watched[wd] = folder

def plant(path, target):
    global planted
    try:
        os.symlink(target, path)
        planted += 1
    except OSError:
        pass

# The old layout's parent folder, so runs that would prepare themselves there are seen
# the moment they start.
os.makedirs('/workspace/.sandbox', exist_ok=True)
watch('/workspace')
watch('/workspace/.sandbox')
open('/workspace/attacker-ready', 'w').close()
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists('/workspace/attacker-stop'):
    select.select([inotify], [], [], 0.05)
    try:
        events = os.read(inotify, 65536)
    except BlockingIOError:
        continue
    at = 0
    while at < len(events):
        wd, mask, _, size = struct.unpack_from('iIII', events, at)
        name = events[at + 16 : at + 16 + size].rstrip(b'\\0').decode()
        at += 16 + size
        path = os.path.join(watched.get(wd, '/workspace'), name)
        if name.startswith('attacker-') or os.path.islink(path):
            continue
        if mask & IN_ISDIR:
            # A folder someone else made: plant what a server would write into it next.
            watch(path)
            plant(os.path.join(path, 'main.py'), VICTIM_FILE)
            plant(os.path.join(path, 'program.py'), VICTIM_FILE)
            plant(os.path.join(path, 'run'), VICTIM_FOLDER)
        else:
            # A file someone else made: a symlink takes its place, in case it is written again.
            swap = path + '.swap'
            plant(swap, VICTIM_FILE)
            try:
                os.rename(swap, path)
            except OSError:
                pass
print('planted', planted)
"""

_PAYLOAD = "print('payload {i}')  # written into the host's file if the server follows a link\n"


@requires_bwrap
def test_parallel_runs_never_write_through_symlinks_planted_by_another_run(
    tmp_path: Path, host: Path, workspace: Path
) -> None:
    before = snapshot(host)
    attacker = _ATTACKER.format(
        victim_file=str(host / "victim.txt"), victim_folder=str(host / "folder")
    )
    payloads = [_PAYLOAD.format(i=i) for i in range(16)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        watcher = pool.submit(run, attacker, workspace, wall_seconds=90)
        assert _wait_for(workspace / "attacker-ready"), "the attacker never started"
        runs = [pool.submit(run, code, workspace, wall_seconds=60) for code in payloads]
        results = [r.result() for r in runs]
        (workspace / "attacker-stop").touch()
        watched = watcher.result()

    assert watched.exit_code == 0, watched.to_text()
    assert (host / "victim.txt").read_text() == VICTIM_TEXT
    assert snapshot(host) == before
    for i, result in enumerate(results):
        assert result.exit_code == 0, result.to_text()
        assert result.stdout == f"payload {i}\n"
    # The server made nothing in the workspace for the attacker to see.
    assert watched.stdout == "planted 0\n"
    assert sorted(p.name for p in workspace.iterdir()) == [
        ".sandbox",
        "attacker-ready",
        "attacker-stop",
    ]
    assert list((workspace / ".sandbox").iterdir()) == []


# --- no race: the run folders' parent replaced by a symlink ------------------------------


@requires_bwrap
def test_a_symlinked_sandbox_folder_leads_the_server_nowhere(host: Path, workspace: Path) -> None:
    before = snapshot(host)
    # The first run replaces the parent of the old run folders with a symlink to a host
    # folder, and a file the old server would have written with one to a host file.
    first = run(
        f"""
        import os
        if os.path.isdir('/workspace/.sandbox'):
            os.rename('/workspace/.sandbox', '/workspace/.sandbox-old')
        os.symlink({str(host / "folder")!r}, '/workspace/.sandbox')
        os.symlink({str(host / "victim.txt")!r}, '/workspace/main.py')
        os.symlink({str(host / "folder")!r}, '/workspace/tmp')
        print(sorted(os.listdir('/workspace')))
        """,
        workspace,
    )
    assert first.exit_code == 0, first.to_text()
    second = run(
        """
        import os, sys, tempfile
        print(sys.argv[0].startswith('/workspace'), tempfile.gettempdir())
        """,
        workspace,
    )

    assert second.exit_code == 0, second.to_text()
    assert second.stdout == "False /tmp\n"
    assert snapshot(host) == before
    assert os.readlink(workspace / ".sandbox") == str(host / "folder")


@requires_bwrap
def test_a_run_creates_nothing_in_the_workspace(workspace: Path) -> None:
    result = run(
        """
        import os, sys, tempfile
        print(sorted(os.listdir('.')), sys.argv[0], tempfile.gettempdir())
        """,
        workspace,
    )
    assert result.stdout == f"[] {_bubblewrap.PROGRAM} /tmp\n", result.to_text()
    assert list(workspace.iterdir()) == []


@requires_bwrap
def test_the_program_file_is_read_only_in_the_sandbox(workspace: Path) -> None:
    result = run(
        """
        import sys
        try:
            open(sys.argv[0], 'a').write('# more')
        except OSError as exc:
            print(type(exc).__name__)
        """,
        workspace,
    )
    assert result.stdout == "OSError\n", result.to_text()


# --- the fallback: a private folder outside the workspace ---------------------------------


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_bubblewrap.BWRAP_ENV, "")


@pytest.mark.usefixtures("no_bwrap")
def test_fallback_runs_the_program_from_a_private_folder_outside_the_workspace(
    workspace: Path,
) -> None:
    result = run(
        """
        import os, stat, sys, tempfile
        here = os.path.dirname(sys.argv[0])
        info = os.lstat(here)
        print(here)
        print(oct(stat.S_IMODE(info.st_mode)), info.st_uid == os.geteuid() or info.st_uid)
        print(os.path.dirname(tempfile.gettempdir()) == here, sorted(os.listdir('.')))
        """,
        workspace,
    )

    assert result.exit_code == 0, result.to_text()
    folder, mode, tmp = result.stdout.splitlines()
    assert not Path(folder).is_relative_to(workspace.resolve())
    assert mode.split()[0] == "0o700"
    assert tmp == "True []"
    assert not os.path.lexists(folder)
    assert list(workspace.iterdir()) == []


_DEEP = """
import os, sys, tempfile
for start in {starts}:
    os.chdir(start)
    for _ in range(3000):
        os.mkdir('d')
        os.chdir('d')
    open('bottom.txt', 'w').close()
    os.symlink('/', 'root-link')
print(os.path.dirname(sys.argv[0]))
"""
_FALLBACK_STARTS = "[os.path.dirname(sys.argv[0])]"


@pytest.mark.usefixtures("no_bwrap")
def test_fallback_removes_3000_nested_folders_without_recursing(workspace: Path) -> None:
    # shutil.rmtree recursed once per folder and raised RecursionError in the server.
    try:
        result = run(_DEEP.format(starts=_FALLBACK_STARTS), workspace)
    finally:
        for left in glob.glob(os.path.join(tempfile.gettempdir(), "relaygraph-run-*")):
            if os.stat(left).st_mtime > time.time() - 120:
                subprocess.run(["rm", "-rf", "--", left], check=False)
        subprocess.run(["rm", "-rf", "--", str(workspace / ".sandbox")], check=False)

    assert result.exit_code == 0, result.to_text()
    assert not os.path.lexists(result.stdout.strip())
    assert list(workspace.iterdir()) == []


@requires_bwrap
def test_3000_nested_folders_in_the_sandboxs_tmp_end_with_it(workspace: Path) -> None:
    result = run(_DEEP.format(starts="[tempfile.gettempdir()]"), workspace)
    assert result.exit_code == 0, result.to_text()
    assert list(workspace.iterdir()) == []


# --- removing a tree: no symlink followed, no recursion -----------------------------------


@pytest.fixture
def tree(tmp_path: Path, host: Path) -> Iterator[Path]:
    root = tmp_path / "private"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth in range(1201):
            # At the top and at the bottom: a file, symlinks out, a FIFO and a hard link.
            if depth in (0, 1200):
                os.close(os.open("f.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
                os.symlink(host / "folder", "to-folder", dir_fd=fd)
                os.symlink(host / "victim.txt", "to-file", dir_fd=fd)
                os.mkfifo("pipe", dir_fd=fd)
                os.link(host / "victim.txt", "hard-link", dst_dir_fd=fd)
            if depth < 1200:
                os.mkdir("d", dir_fd=fd)
                deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = deeper
    finally:
        os.close(fd)
    (root / "wide").mkdir()
    for i in range(300):
        (root / "wide" / f"f{i}").touch()
    yield root
    # pytest's own clean-up recurses too: never leave a deep tree behind, even on failure.
    subprocess.run(["rm", "-rf", "--", str(root)], check=False)


def test_remove_tree_removes_everything_and_follows_nothing(tree: Path, host: Path) -> None:
    before = snapshot(host)
    # A folder's link count, and so its mtime, changes when a hard link is removed; the
    # rest of the snapshot must be exactly as before.
    _nofollow.remove_tree(tree)

    assert not os.path.lexists(tree)
    after = snapshot(host)
    assert {k: v for k, v in after.items() if k != str(host / "victim.txt")} == {
        k: v for k, v in before.items() if k != str(host / "victim.txt")
    }
    assert (host / "victim.txt").read_text() == VICTIM_TEXT
    assert (host / "folder" / "keep.txt").read_text() == "keep"


def test_remove_tree_of_a_symlink_removes_only_the_link(tmp_path: Path, host: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(host / "folder")
    _nofollow.remove_tree(link)
    assert not os.path.lexists(link)
    assert (host / "folder" / "keep.txt").read_text() == "keep"
