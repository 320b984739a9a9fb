"""Run untrusted Python for the coder agent in an isolated child process.

The program runs in a fresh interpreter (``python -I -B``) in the task's workspace, with a
scrubbed environment, resource limits (CPU time, address space, file size, core dumps,
process count), a cgroup of its own where the host offers one (the memory and the processes
of the whole run), a wall-clock timeout, capped output, and its own empty network namespace.

Where bubblewrap (``bwrap``) works, the program also runs in its own user, mount, PID, IPC,
UTS and cgroup namespaces: it sees a read-only system (``/usr``, the Python installation)
and its own workspace at ``/workspace``, and nothing else of the host's files, sockets or
processes. :func:`filesystem_isolation` says whether this host has that; without it the
program can read and write every file of the relaygraph user, and the result says so
(``SandboxResult.isolation == "none"``). See ``docs/sandbox.md`` for what each mechanism
isolates, and what it does not.

The server never creates, writes or deletes anything in the workspace to prepare a run: the
workspace is writable by the program (and by programs running in parallel), so every name in
it may become a symlink at any moment. Under bubblewrap the program reaches the sandbox
through a memory file and its temporary folder is the sandbox's own ``/tmp``; without it,
both live in a private folder of the server's, outside the workspace.

This module chooses how to run and puts the result together; the parts are private:
``_sandbox_limits`` (the limits and the result), ``_sandbox_process`` (starting the program,
draining its capped output, ending it) and ``_sandbox_child`` (what the child does between
fork and exec: the cgroup, the resource limits, the network namespace).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from relaygraph.backends import _bubblewrap, _cgroup, _nofollow
from relaygraph.backends._cgroup import CgroupVersion
from relaygraph.backends._quota import QuotaWatch, WorkspaceQuota
from relaygraph.backends._sandbox_limits import Isolation, SandboxLimits, SandboxResult
from relaygraph.backends._sandbox_process import RunBounds, run_in_bubblewrap, run_unisolated
from relaygraph.errors import ToolInputError

log = logging.getLogger("relaygraph.backends.sandbox")

__all__ = [
    "CgroupVersion",
    "Isolation",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "WorkspaceQuota",
    "filesystem_isolation",
    "run_python_sandboxed",
]

_BWRAP_PROCESSES = 2
"""bwrap itself and the PID namespace's init, which run in the run's cgroup beside the program."""

_MIB = 1024 * 1024
_MIN_FILE_ROOM = 64 * 1024
"""The smallest ``RLIMIT_FSIZE`` of a run (besides the program's own size), even when the
task's files are at their quota: bwrap writes a few small files of its own under it."""
_WORKSPACE_MODE = 0o700
"""The workspace's mode after each run: the server's user's alone."""

_DEFAULT_LIMITS = SandboxLimits()
"""``run_python_sandboxed``'s default: one frozen value, made once, shared by every call."""


class SandboxUnavailableError(ToolInputError):
    """``run_python`` is refused: code from tenants must be isolated, and this host cannot.

    Raised by the ``run_python`` tool when the task requires filesystem isolation
    (``TaskContext.sandbox_isolation_required``) and :func:`filesystem_isolation` finds
    none. The message is the tool result the model reads.

    Attributes:
        tool: The refused tool.
    """

    def __init__(self, tool: str = "run_python") -> None:
        self.tool = tool
        super().__init__(
            f"{tool} is refused on this server: no filesystem isolation (bubblewrap) is "
            "available to run code apart from the server's files. Do not call it again; "
            "finish the task without running code. (The operator may allow unisolated code "
            "with `relaygraph serve --unsafe-sandbox`.)"
        )


def filesystem_isolation() -> Literal["bubblewrap"] | None:
    """The mechanism that isolates sandboxed code from the host's files here, if any.

    bubblewrap is used when ``bwrap`` is found (``$RELAYGRAPH_BWRAP`` names it, or the empty
    string turns it off) and a probe run works; the probe runs once per process and path.

    Returns:
        ``"bubblewrap"``, or None when code would run with limits and a network namespace
        only (see ``docs/sandbox.md``).
    """
    return "bubblewrap" if _bubblewrap.available() is not None else None


def run_python_sandboxed(
    code: str,
    *,
    workspace: Path,
    limits: SandboxLimits = _DEFAULT_LIMITS,
    hidden: Iterable[Path] = (),
    quota: WorkspaceQuota | None = None,
    counted: Iterable[Path] = (),
) -> SandboxResult:
    """Run ``code`` as a Python program in an isolated child process inside ``workspace``.

    The program runs with ``sys.executable -I -B`` in ``workspace`` (created if missing),
    with only ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR`` set, stdin from /dev/null, the
    resource limits in ``limits`` (for the whole run in a cgroup of its own, where the host
    has one), and its own network namespace. Where bubblewrap works
    (:func:`filesystem_isolation`), it runs in its own user, mount and PID namespaces too:
    the workspace is mounted at ``/workspace`` (its cwd and ``HOME``) beside a read-only
    system, and every process it starts ends with the run. Otherwise it runs with the
    relaygraph user's view of the files, and the result's ``isolation`` is ``"none"``.

    Nothing is created in the workspace to run the program: it is passed to bubblewrap in a
    memory file, or, without bubblewrap, kept in a private folder outside the workspace.

    Isolated mode (``-I``) means neither the workspace nor the current directory is on
    ``sys.path``; a program that imports its own modules must add ``"."`` itself. A failing
    program is not an error here: its exit code and traceback are in the result.

    Args:
        code: The program's source.
        workspace: The task's workspace directory; the program's cwd and ``HOME``.
        limits: Resource limits for this run.
        hidden: Host paths that must stay out of sight (the data directory) even if they
            lie under a folder the sandbox mounts, such as the Python installation.
        quota: What the task's files may hold, enforced while the program runs (see
            :mod:`relaygraph.backends._quota`); None: no quota.
        counted: The task's other folders that count against ``quota`` with the
            workspace (its artifacts).

    Returns:
        The exit status, capped output and notes on which limits were hit.
    """
    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    bwrap = _bubblewrap.available()
    program = code.encode("utf-8", errors="surrogateescape")
    # -u: unbuffered, so what a program printed before it was killed (a timeout, a CPU or
    # memory limit) reaches the model; -I ignores PYTHONUNBUFFERED with the environment.
    interpreter = [sys.executable, "-I", "-B", "-u"]
    watch = None if quota is None else QuotaWatch(quota, (workspace, *counted))
    # The room left in the quota is the program's largest file: a write past it fails
    # inside the program (EFBIG, `OSError: File too large`), which no measure from outside
    # could do. The same limit holds under bubblewrap (set on bwrap, inherited), and bwrap
    # writes the program's source into its own tmpfs under it: it always has that room.
    file_size = None if watch is None else max(watch.room_bytes, len(program) + _MIN_FILE_ROOM)
    with contextlib.ExitStack() as stack:
        if bwrap is None:
            # The private folder is entered before the cgroup, so it is removed after
            # everything left of the run has been killed.
            folder = stack.enter_context(_private_folder(program))
            env = _environment(home=workspace, tmp=folder / "tmp")
            cgroup = _run_cgroup(stack, limits, extra_tasks=0)
            run = run_unisolated(
                [*interpreter, str(folder / "main.py")],
                env=env,
                workspace=workspace,
                bounds=RunBounds(
                    limits=limits, cgroup=cgroup, watch=watch, file_size_bytes=file_size
                ),
            )
        else:
            env = _environment(home=Path(_bubblewrap.WORKSPACE), tmp=Path("/tmp"))
            launch = stack.enter_context(
                _bubblewrap.BwrapLaunch(
                    bwrap,
                    workspace=workspace,
                    hidden=tuple(hidden),
                    tmpfs_bytes=limits.file_size_mb * _MIB,
                )
            )
            cgroup = _run_cgroup(stack, limits, extra_tasks=_BWRAP_PROCESSES)
            run = run_in_bubblewrap(
                [*interpreter, _bubblewrap.PROGRAM],
                env=env,
                launch=launch,
                program=program,
                bounds=RunBounds(
                    limits=limits, cgroup=cgroup, watch=watch, file_size_bytes=file_size
                ),
            )
        version: CgroupVersion | None = None
        memory_hit = processes_hit = False
        if cgroup is not None and run.joined_cgroup:
            version = cgroup.version
            memory_hit, processes_hit = cgroup.limits_hit()
    # Nothing of the run is left running (its PID namespace or its cgroup ended with it):
    # take back what it may have given away of the server's user on the host.
    _disarm(workspace)
    stdout, out_cut = run.out.text()
    stderr, err_cut = run.err.text()
    quota_note = None
    if watch is not None and file_size is not None:
        quota_note = _quota_reached(watch, file_size, limits, run.returncode, stdout + stderr)
    return SandboxResult(
        exit_code=None if run.timed_out else run.returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=run.timed_out,
        truncated=out_cut or err_cut,
        network_isolated=run.network_isolated,
        isolation="none" if bwrap is None else "bubblewrap",
        duration_seconds=run.duration,
        limits=limits,
        cgroup=version,
        memory_limit_hit=memory_hit,
        process_limit_hit=processes_hit,
        workspace_quota=quota_note,
    )


def _quota_reached(
    watch: QuotaWatch, file_size: int, limits: SandboxLimits, returncode: int, output: str
) -> str | None:
    """Which quota of the task's files the run reached, as the result says it, or None:
    passed (the run was stopped, or its files were past it at the end), or reached (a
    write failed at the room left, or the files fill the quota: the next write fails)."""
    stopped = watch.exceeded is not None
    if watch.over(force=True):
        return f"{watch.exceeded}; the run was stopped" if stopped else watch.exceeded
    failed_write = returncode == -signal.SIGXFSZ or "File too large" in output
    full = watch.last.bytes >= watch.quota.max_bytes
    if full or (failed_write and file_size < limits.file_size_mb * _MIB):
        return (
            f"{watch.quota.describe_bytes()} reached: {watch.room_bytes / _MIB:,.1f} MB were "
            "left, so a write past them failed with 'File too large'"
        )
    return None


def _disarm(workspace: Path) -> None:
    """Make the workspace its owner's alone again (the program may have opened it to every
    user, or closed it to its owner), then clear the setuid and setgid bits the program
    set below it (:func:`~relaygraph.backends._nofollow.clear_set_id_bits`, bounded). Never
    raises: the run's result stands, and what could not be done is logged."""
    try:
        if stat.S_ISDIR(workspace.lstat().st_mode):
            os.chmod(workspace, _WORKSPACE_MODE, follow_symlinks=False)
        _nofollow.clear_set_id_bits(workspace)
    except (OSError, NotImplementedError) as exc:
        log.warning("could not disarm the workspace %s after a run: %s", workspace, exc)


def _environment(*, home: Path, tmp: Path) -> dict[str, str]:
    """The program's whole environment; nothing of the server's is passed on."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TMPDIR": str(tmp)}


@contextlib.contextmanager
def _private_folder(program: bytes) -> Iterator[Path]:
    """A folder of the server's own (mode 0700, outside the workspace) holding ``main.py``
    and ``tmp/``; removed afterwards without following symlinks or recursing."""
    folder = Path(tempfile.mkdtemp(prefix="relaygraph-run-"))
    try:
        with _nofollow.opened_folder(folder) as fd:
            _nofollow.replace_file(fd, "main.py", program)
            os.mkdir("tmp", 0o700, dir_fd=fd)
        yield folder
    finally:
        _nofollow.remove_tree(folder)


def _run_cgroup(
    stack: contextlib.ExitStack, limits: SandboxLimits, *, extra_tasks: int
) -> _cgroup.RunCgroup | None:
    """A cgroup for this run, with the run's limits, or None where there is none."""
    parent = _cgroup.available()
    if parent is None:
        return None
    cgroup = _cgroup.RunCgroup(
        parent,
        memory_bytes=limits.memory_mb * _MIB,
        max_tasks=limits.max_processes + extra_tasks,
    )
    try:
        return stack.enter_context(cgroup)
    except OSError as exc:
        # Reported in the result (cgroup None, and a note), not raised: the per-process
        # limits still hold.
        log.warning("could not make a cgroup for a sandboxed run: %s", exc)
        return None
