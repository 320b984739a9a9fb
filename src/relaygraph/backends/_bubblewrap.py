"""The sandbox's filesystem and process isolation with bubblewrap (``bwrap``).

bubblewrap starts the program in new user, mount, PID, IPC, UTS, network and cgroup
namespaces. Its root is an empty, read-only tmpfs into which only the system (``/usr`` and
the merged-usr links), the Python installation, a few files of ``/etc`` and the task's
workspace (at ``/workspace``) are mounted. Whether bwrap works on this host is probed once
per process and bwrap path, by running a real sandboxed interpreter.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("relaygraph.backends.sandbox")

BWRAP_ENV = "RELAYGRAPH_BWRAP"
"""Where bwrap is: a path, or the empty string to run without it. Unset: found on ``PATH``."""

WORKSPACE = "/workspace"
"""Where the task's workspace appears inside the sandbox; no server path is revealed."""

PROGRAM = "/run/relaygraph/main.py"
"""Where the program's source appears inside the sandbox: a read-only copy of a memory file,
so the server writes nothing where the sandbox can plant a symlink."""

SANDBOX_UID = 65534
"""The program's user and group id inside the sandbox (``nobody``); on disk its files belong
to the relaygraph user, whom the user namespace maps to this id."""

USR = Path("/usr")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_ENTRIES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
"""What the interpreter and the tools in /usr/bin read from /etc: the dynamic linker's
cache, the time zone and the symlinks behind commands such as ``awk``. Nothing else of the
host's /etc (no ``passwd``, ``hosts``, credentials) is mounted."""
_PASSWD = f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:nobody:{WORKSPACE}:/usr/sbin/nologin\n"
_GROUP = f"nogroup:x:{SANDBOX_UID}:\n"

_PROBE_LOCK = threading.Lock()
_PROBE_SECONDS = 60.0
"""Generous: the probe starts an interpreter once, on a machine that may be busy."""


@dataclass(frozen=True, slots=True)
class Bubblewrap:
    """A bwrap that works on this host, and the options it accepted."""

    path: str
    disable_userns: bool
    """``--disable-userns`` works here: the program cannot create nested user namespaces
    (which would widen the kernel interface it can reach)."""


def bwrap_path() -> str | None:
    """Where bwrap is, honouring :data:`BWRAP_ENV`; None if it is disabled or not found."""
    configured = os.environ.get(BWRAP_ENV)
    if configured is not None:
        return configured or None
    return shutil.which("bwrap")


def available() -> Bubblewrap | None:
    """The working bubblewrap of this host, probed once per path; None if there is none."""
    path = bwrap_path()
    if path is None:
        return None
    # Workers of a server ask at once on the first tasks; the probe must run once.
    with _PROBE_LOCK:
        return _probe(path)


@functools.cache
def _probe(path: str) -> Bubblewrap | None:
    # A full run of the real command line proves more than `bwrap --version`: namespaces
    # may be refused by the kernel, a container or an LSM, and the interpreter must start
    # with only the folders the sandbox mounts.
    problems = []
    for disable_userns in (True, False):
        candidate = Bubblewrap(path=path, disable_userns=disable_userns)
        with tempfile.TemporaryDirectory(prefix="relaygraph-bwrap-probe-") as tmp:
            problem = _try(candidate, Path(tmp))
        if problem is None:
            return candidate
        problems.append(problem)
    log.warning(
        "bubblewrap at %s cannot run the sandbox on this host, so sandboxed code will not "
        "be isolated from the filesystem: %s",
        path,
        problems[-1],
    )
    return None


def _try(bwrap: Bubblewrap, workspace: Path) -> str | None:
    """Run ``print('ok')`` in the sandbox; return None if it worked, else what went wrong."""
    with BwrapLaunch(bwrap, workspace=workspace, hidden=(), tmpfs_bytes=1 << 20) as launch:
        command = launch.argv([sys.executable, "-I", "-B", "-c", "print('ok')"], env={})
        try:
            done = subprocess.run(
                command,
                pass_fds=launch.pass_fds,
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_PROBE_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
    if done.returncode == 0 and done.stdout == b"ok\n":
        return None
    detail = done.stderr.decode("utf-8", errors="replace").strip()
    return f"exit status {done.returncode}: {detail or '(no output)'}"


def _interpreter_paths() -> set[str]:
    """The paths by which the interpreter finds itself, as it names them (not resolved)."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)),
        *site.getsitepackages(),
    }
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        paths.add(sysconfig.get_path(key))
    return {os.path.abspath(p) for p in paths if p}


def python_roots() -> list[Path]:
    """The folders of the running Python installation the sandboxed interpreter needs.

    The prefixes (a virtual environment and the installation it was made from), the
    standard library and the site-packages folders, so the packages installed with
    relaygraph stay importable, with symlinks resolved. Folders under ``/usr`` are mounted
    with it already.
    """
    roots = {Path(os.path.realpath(p)) for p in _interpreter_paths()}
    return sorted(r for r in roots if r.is_dir() and r != Path("/"))


def symlinked_components(paths: Iterable[str], mounted: Sequence[Path]) -> dict[Path, str]:
    """The symlinks on the way to ``paths`` outside the ``mounted`` folders, with targets.

    Only resolved folders are mounted; recreating these links (a home folder that is a
    link, as ``/home -> var/home``) lets the interpreter find itself by the paths it knows.
    """
    links: dict[Path, str] = {}
    for raw in paths:
        parts = Path(raw).parts
        for depth in range(2, len(parts) + 1):
            prefix = Path(*parts[:depth])
            if any(_is_within(prefix, m) for m in mounted):
                break  # the mounted folder brings its own links
            if prefix.is_symlink():
                links[prefix] = os.readlink(prefix)
                break  # what follows lies under the link's target
    return links


def _is_within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


@dataclass(frozen=True, slots=True)
class _Mount:
    dest: Path
    args: tuple[str, ...]
    order: int
    """Mounts of the same depth: binds (0) before the masks over them (1)."""


def _system_mounts(roots: Iterable[Path], hidden: Iterable[Path]) -> list[_Mount]:
    """Read-only binds of the Python roots, and tmpfs masks over hidden paths below them."""
    usr = USR
    hidden = [Path(os.path.realpath(h)) for h in hidden]
    roots = [r for r in roots if not _is_within(r, usr)]

    def covered(root: Path) -> bool:
        # A root inside another needs no mount of its own, unless a hidden folder lies
        # between them: the mask over that folder would hide it.
        return any(
            other != root
            and root.is_relative_to(other)
            and not any(h != other and _is_within(h, other) and _is_within(root, h) for h in hidden)
            for other in roots
        )

    kept = [r for r in roots if not covered(r)]
    mounts = [_Mount(r, ("--ro-bind", str(r), str(r)), 0) for r in kept]
    visible = [h for h in hidden if any(_is_within(h, r) for r in [usr, *kept])]
    for path in visible:
        if any(other != path and path.is_relative_to(other) for other in visible):
            continue  # inside a folder that is masked already
        if path.is_dir():
            mounts.append(_Mount(path, ("--tmpfs", str(path)), 1))
        elif path.exists():
            mounts.append(_Mount(path, ("--ro-bind", "/dev/null", str(path)), 1))
    return sorted(mounts, key=lambda m: (len(m.dest.parts), m.order, str(m.dest)))


def _root_links() -> list[str]:
    args: list[str] = []
    for name in _MERGED_USR:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    for entry in _ETC_ENTRIES:
        if os.path.islink(entry):
            args += ["--symlink", os.readlink(entry), entry]
        elif os.path.exists(entry):
            args += ["--ro-bind", entry, entry]
    return args


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)  # close-on-exec: only bwrap gets it, through pass_fds
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class BwrapLaunch:
    """The bwrap command line of one run, and the file descriptors it reads.

    The options travel through a memory file (``--args``), so the namespace's init process,
    whose command line the program can read in ``/proc/1/cmdline``, shows no host paths.
    Use as a context manager: the descriptors are closed on exit.

    Args:
        bwrap: The working bubblewrap.
        workspace: The task's workspace on the host, mounted read-write at ``/workspace``.
        hidden: Host paths to mask if they lie under a mounted folder (the data directory).
        tmpfs_bytes: Size of the fresh ``/tmp`` and ``/dev/shm`` (memory-backed) each.
    """

    def __init__(
        self, bwrap: Bubblewrap, *, workspace: Path, hidden: Sequence[Path], tmpfs_bytes: int
    ) -> None:
        self.bwrap = bwrap
        self.workspace = Path(os.path.realpath(workspace))
        self.hidden = (*hidden, self.workspace)
        self.tmpfs_bytes = tmpfs_bytes
        self._fds: list[int] = []

    def __enter__(self) -> BwrapLaunch:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return tuple(self._fds)

    def _fd(self, name: str, data: bytes) -> str:
        fd = _memfd(name, data)
        self._fds.append(fd)
        return str(fd)

    def argv(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str],
        info_fd: int | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> list[str]:
        """The full bwrap command that runs ``command`` with ``env`` in the sandbox.

        Args:
            files: Read-only files to make in the sandbox, by path: bwrap copies each from
                a memory file, so nothing is written on the host's disk.
        """
        size = str(self.tmpfs_bytes)
        options = [
            "--unshare-all",
            "--unshare-user",
            *(["--disable-userns"] if self.bwrap.disable_userns else []),
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
            *_root_links(),
            "--ro-bind-data",
            self._fd("passwd", _PASSWD.encode()),
            "/etc/passwd",
            "--ro-bind-data",
            self._fd("group", _GROUP.encode()),
            "/etc/group",
        ]
        options += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            size,
            "--tmpfs",
            "/dev/shm",
            "--size",
            size,
            "--tmpfs",
            "/tmp",
        ]
        # After /tmp: a Python installation may live there (a virtual environment in CI).
        roots = python_roots()
        for mount in _system_mounts(roots, self.hidden):
            options += mount.args
        for link, target in symlinked_components(_interpreter_paths(), [USR, *roots]).items():
            options += ["--symlink", target, str(link)]
        options += ["--bind", str(self.workspace), WORKSPACE]
        for path, data in (files or {}).items():
            options += ["--ro-bind-data", self._fd(os.path.basename(path), data), path]
        options += [
            # Last: nothing more can be created in the root or in /dev; /tmp, /dev/shm and
            # the workspace are separate mounts and stay writable.
            "--remount-ro",
            "/dev",
            "--remount-ro",
            "/",
            "--chdir",
            WORKSPACE,
            "--clearenv",
        ]
        for key, value in env.items():
            options += ["--setenv", key, value]
        args_fd = self._fd("bwrap-args", b"".join(o.encode() + b"\0" for o in options))
        head = [self.bwrap.path, "--args", args_fd]
        if info_fd is not None:
            head += ["--info-fd", str(info_fd)]
        return [*head, "--", *command]


class NamespaceInit:
    """The init process of the sandbox's PID namespace, as bwrap reports it on ``--info-fd``.

    When a namespace's init dies, the kernel kills every other process in it, including
    ones that left the process group with ``setsid()``. bwrap's ``--die-with-parent`` does
    that when the bwrap process is killed, but only once the namespace is set up; killing
    the init directly also covers a run stopped in its first milliseconds.

    The init is held through a pidfd, opened as soon as its pid is known and checked to be
    the bwrap process's child, so a later kill can never hit a reused pid.

    Args:
        read_fd: The read end of the pipe whose write end is bwrap's ``--info-fd``.
        launcher_pid: The pid of the bwrap process this parent started.
    """

    _MAX_INFO_BYTES = 4096

    def __init__(self, read_fd: int, launcher_pid: int) -> None:
        self._fd = read_fd
        self._launcher_pid = launcher_pid
        self._info = bytearray()
        self._pidfd: int | None = None

    def fileno(self) -> int:
        return self._fd

    def feed(self, data: bytes) -> None:
        if self._pidfd is not None or len(self._info) > self._MAX_INFO_BYTES:
            return
        self._info += data
        try:
            pid = int(json.loads(self._info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return  # not complete yet
        self._pidfd = _open_child(pid, self._launcher_pid)

    def kill(self) -> None:
        """SIGKILL the namespace's init, which ends every process in the namespace."""
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        for fd in (self._fd, self._pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pidfd = None


def _open_child(pid: int, parent: int) -> int | None:
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None  # gone already, or no pidfds here: --die-with-parent still applies
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        parent_seen = int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        parent_seen = None
    if parent_seen != parent:
        # The init has already been reaped and the pid reused by another process.
        os.close(pidfd)
        return None
    return pidfd
