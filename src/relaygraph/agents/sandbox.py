"""Run untrusted Python for the coder agent in an isolated child process.

The program runs in a fresh interpreter (``python -I -B``) in the task's workspace, with a
scrubbed environment, resource limits (CPU time, address space, file size, core dumps,
process count), a wall-clock timeout, capped output, and its own empty network namespace.

Where bubblewrap (``bwrap``) works, the program also runs in its own user, mount, PID, IPC,
UTS and cgroup namespaces: it sees a read-only system (``/usr``, the Python installation)
and its own workspace at ``/workspace``, and nothing else of the host's files, sockets or
processes. :func:`filesystem_isolation` says whether this host has that; without it the
program can read and write every file of the relaygraph user, and the result says so
(``SandboxResult.isolation == "none"``). See ``docs/sandbox.md`` for what each mechanism
isolates, and what it does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from relaygraph.agents import _bubblewrap
from relaygraph.errors import ConfigError, ToolInputError

__all__ = [
    "Isolation",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "filesystem_isolation",
    "run_python_sandboxed",
]

Isolation = Literal["bubblewrap", "none"]
"""How a run was isolated from the host's files and processes: by bubblewrap's namespaces,
or not at all (resource limits and a network namespace only)."""

# Namespace flags from <linux/sched.h>; the stdlib exposes them only from Python 3.12 on.
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000

# Values written by the child into the shared flag page (see _child_setup).
_NET_NONE = 0
_NET_USER_AND_NET = 1
_NET_NET_ONLY = 2

_SANDBOX_DIR = ".sandbox"
"""Per-run scratch lives under this hidden folder of the workspace and is removed after."""

_PIPE_GRACE_SECONDS = 0.5
"""How long to wait for output pipes to close after the program exited (see _collect)."""

_POLL_SECONDS = 0.02

_MIN_OUTPUT_CHARS = 200
_MARKER_RESERVE = 64
"""Characters kept free for the truncation marker, so a stream never exceeds the limit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxLimits:
    """Resource limits for one sandboxed run. The defaults suit short scripts.

    Raises:
        ConfigError: A limit is not positive, or ``max_output_chars`` is below 200.
    """

    cpu_seconds: int = 10
    """CPU time in seconds (``RLIMIT_CPU``); the program gets SIGXCPU when it is used up."""
    memory_mb: int = 512
    """Address space in MiB (``RLIMIT_AS``); allocations beyond it fail with MemoryError."""
    file_size_mb: int = 16
    """Largest file the program may write, in MiB (``RLIMIT_FSIZE``)."""
    max_processes: int = 32
    """Processes for the user (``RLIMIT_NPROC``). Counted per user, not per run, and not
    enforced at all when relaygraph runs as root."""
    wall_seconds: float = 20.0
    """Wall-clock seconds before the whole process group is killed."""
    max_output_chars: int = 8000
    """Characters kept of stdout and of stderr each; the rest is cut from the middle."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"sandbox limit {f.name}={value!r} must be a positive number")
        if self.max_output_chars < _MIN_OUTPUT_CHARS:
            raise ConfigError(
                f"sandbox limit max_output_chars={self.max_output_chars!r} is too small; "
                f"use at least {_MIN_OUTPUT_CHARS}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxResult:
    """What a sandboxed run produced. ``to_text()`` is what the model is shown."""

    exit_code: int | None
    """The exit status; negative ``-N`` means killed by signal N; ``None`` after a wall
    timeout, because the program never finished on its own."""
    stdout: str
    stderr: str
    timed_out: bool
    """The wall-clock limit was reached and the process group was killed."""
    truncated: bool
    """stdout or stderr was longer than ``max_output_chars`` and was cut."""
    network_isolated: bool
    """The program ran in its own network namespace, with no interfaces up."""
    isolation: Isolation
    """``"bubblewrap"``: the program saw only the system and its workspace, and only its
    own processes. ``"none"``: it could read and write every file of the relaygraph user."""
    duration_seconds: float
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    """The limits the run had; used to explain in ``to_text()`` which one was hit."""

    def notes(self) -> list[str]:
        """Explain, one line each, the limits that were hit and anything else unusual."""
        limits = self.limits
        notes: list[str] = []
        if self.timed_out:
            notes.append(
                f"killed after wall timeout of {limits.wall_seconds:g} s; "
                "make the program faster or do less work per run"
            )
        code = self.exit_code
        if code == -signal.SIGXCPU:
            notes.append(f"killed: CPU time limit of {limits.cpu_seconds} s exceeded")
        elif code == -signal.SIGKILL and not self.timed_out:
            notes.append(
                f"killed by SIGKILL: the CPU time limit ({limits.cpu_seconds} s) "
                "or the system's out-of-memory killer"
            )
        elif code == -signal.SIGXFSZ:
            notes.append(f"killed: file size limit of {limits.file_size_mb} MB exceeded")
        elif code is not None and code < 0 and not self.timed_out:
            notes.append(
                f"killed by signal {_signal_name(-code)}; a crash like this can mean the "
                f"memory limit of {limits.memory_mb} MB was reached"
            )
        if code is not None and code > 0:
            # The interpreter turns these limits into exceptions; name the limit so the
            # model does not mistake it for a bug in its own logic.
            if "MemoryError" in self.stderr:
                notes.append(
                    f"memory limit of {limits.memory_mb} MB reached (MemoryError); "
                    "use less memory, for example by streaming instead of loading everything"
                )
            if "File too large" in self.stderr:
                notes.append(f"file size limit of {limits.file_size_mb} MB reached")
        if self.truncated:
            notes.append(
                f"output truncated to {limits.max_output_chars} characters per stream "
                "(the start and the end are kept); print less"
            )
        if self.isolation == "none":
            notes.append(
                "files and processes were not isolated (bubblewrap is not available on this "
                "system): the program could read and write every file of the server's user"
            )
        if not self.network_isolated:
            notes.append("network was not isolated (this system refused a network namespace)")
        return notes

    def to_text(self) -> str:
        """A compact summary for the model: status line, notes, stdout and stderr."""
        if self.timed_out:
            status = f"timed out after {self.duration_seconds:.2f} s"
        else:
            status = f"exit code {self.exit_code} after {self.duration_seconds:.2f} s"
        lines = [status]
        notes = self.notes()
        if notes:
            lines.append("notes:")
            lines.extend(f"- {note}" for note in notes)
        lines.append("stdout:" if self.stdout else "stdout: (empty)")
        if self.stdout:
            lines.append(self.stdout.rstrip("\n"))
        lines.append("stderr:" if self.stderr else "stderr: (empty)")
        if self.stderr:
            lines.append(self.stderr.rstrip("\n"))
        return "\n".join(lines)


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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _load_unshare() -> Callable[[int], int] | None:
    # Resolved once at import, in the parent: the child after fork should only make the
    # call, not load libraries.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.unshare
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    func.restype = ctypes.c_int
    return func


_LIBC_UNSHARE = _load_unshare()
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    func.restype = ctypes.c_int
    return func


_LIBC_PRCTL = _load_prctl()


def _unshare(flags: int) -> int:
    """Call unshare(2) and return 0 on success or the errno on failure."""
    if _LIBC_UNSHARE is None:
        return errno.ENOSYS
    if _LIBC_UNSHARE(flags) == 0:
        return 0
    return ctypes.get_errno() or errno.EPERM


def _set_limit(which: int, value: int) -> None:
    # Without privileges a soft or hard limit cannot exceed the current hard limit; clamp
    # so a stricter inherited limit stays in force instead of failing the run.
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _child_setup(limits: SandboxLimits, net_flag: mmap.mmap | None) -> None:
    """Run in the child between fork and exec: apply limits, then leave the network.

    With ``net_flag`` None the child is bubblewrap, which makes the namespaces itself; the
    limits set here are inherited by the program it starts.
    """
    if _LIBC_PRCTL is not None:
        # If the process that started the program dies (a server killed mid-run), the
        # program dies with it instead of finishing unobserved; a restarted server runs
        # the interrupted step again from its checkpoint.
        _LIBC_PRCTL(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    mib = 1024 * 1024
    # The hard CPU limit is one second above the soft one: SIGXCPU comes first, and SIGKILL
    # follows if the program ignores SIGXCPU.
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    cpu_soft = limits.cpu_seconds
    if cpu_hard != resource.RLIM_INFINITY:
        cpu_soft = min(cpu_soft, cpu_hard)
        cpu_hard = min(cpu_soft + 1, cpu_hard)
    else:
        cpu_hard = cpu_soft + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_soft, cpu_hard))
    _set_limit(resource.RLIMIT_AS, limits.memory_mb * mib)
    _set_limit(resource.RLIMIT_FSIZE, limits.file_size_mb * mib)
    _set_limit(resource.RLIMIT_NPROC, limits.max_processes)
    _set_limit(resource.RLIMIT_CORE, 0)
    if net_flag is None:
        return
    # Limits are set before unshare: inside a new user namespace the process loses the
    # privilege to change hard limits. The network part must never fail the run.
    try:
        # A user namespace first: then even a root program has no privilege over the host
        # namespaces and cannot setns(2) back into the host network. Plain CLONE_NEWNET is
        # the fallback for kernels without user namespaces; root can undo that one.
        if _unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            net_flag[0] = _NET_USER_AND_NET
        elif _unshare(_CLONE_NEWNET) == 0:
            net_flag[0] = _NET_NET_ONLY
    except BaseException:  # a failed isolation is reported, not raised
        pass


class _CappedStream:
    """Keeps the first and last bytes of a stream, so memory stays bounded however much
    the program prints, while the end (where a traceback is) is not lost."""

    def __init__(self, max_chars: int) -> None:
        self._max_chars = max_chars
        # Four bytes per character is the UTF-8 worst case, so the head always holds
        # enough bytes for max_chars characters.
        self._head_cap = 4 * max_chars
        self._tail_cap = max_chars
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            # Trim in batches rather than on every read, to keep feeding cheap.
            if len(self._tail) > 2 * self._tail_cap:
                del self._tail[: -self._tail_cap]

    def text(self) -> tuple[str, bool]:
        """Return the decoded text, cut to ``max_chars``, and whether anything was cut."""
        tail = bytes(self._tail[-self._tail_cap :])
        kept = len(self._head) + len(tail)
        if kept == self.total_bytes:
            whole = (bytes(self._head) + tail).decode("utf-8", errors="replace")
            if len(whole) <= self._max_chars:
                return whole, False
        budget = self._max_chars - _MARKER_RESERVE
        head_chars = budget * 3 // 4
        tail_chars = budget - head_chars
        head_text = bytes(self._head).decode("utf-8", errors="replace")[:head_chars]
        if kept < self.total_bytes:
            tail_text = tail.decode("utf-8", errors="replace")[-tail_chars:]
        else:
            # Nothing was dropped between head and tail, so slice the joined text instead,
            # which keeps a character split across the two buffers intact.
            joined = (bytes(self._head) + tail).decode("utf-8", errors="replace")
            tail_text = joined[-tail_chars:]
        omitted = self.total_bytes - len(head_text.encode()) - len(tail_text.encode())
        marker = f"\n[... {max(omitted, 0):,} bytes omitted ...]\n"
        return head_text + marker + tail_text, True


def _leader_exited(pid: int) -> bool:
    # WNOWAIT leaves the child a zombie: its pid, and so its process group id, cannot be
    # reused before we reap it, which makes the later killpg safe.
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_run(proc: subprocess.Popen[bytes], namespace: _bubblewrap.NamespaceInit | None) -> None:
    """Kill the program and everything it started: the PID namespace (if there is one) and
    the process group."""
    if namespace is not None:
        namespace.kill()
    _kill_group(proc.pid)


def _collect(
    proc: subprocess.Popen[bytes],
    limits: SandboxLimits,
    start: float,
    namespace: _bubblewrap.NamespaceInit | None,
) -> tuple[_CappedStream, _CappedStream, bool]:
    """Drain stdout and stderr until the program ends; kill it at the wall limit."""
    assert proc.stdout is not None and proc.stderr is not None
    out = _CappedStream(limits.max_output_chars)
    err = _CappedStream(limits.max_output_chars)
    deadline = start + limits.wall_seconds
    timed_out = False
    exited_at: float | None = None
    sinks: list[tuple[int, _CappedStream | _bubblewrap.NamespaceInit]] = [
        (proc.stdout.fileno(), out),
        (proc.stderr.fileno(), err),
    ]
    if namespace is not None:
        sinks.append((namespace.fileno(), namespace))
    with selectors.DefaultSelector() as selector:
        for fd, sink in sinks:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, sink)
        while True:
            now = time.monotonic()
            if exited_at is None and _leader_exited(proc.pid):
                exited_at = now
            if exited_at is None and not timed_out and now >= deadline:
                _kill_run(proc, namespace)
                timed_out = True
            if exited_at is not None and (
                not selector.get_map() or now >= exited_at + _PIPE_GRACE_SECONDS
            ):
                # A background child the program left behind may hold the pipes open;
                # it is killed below instead of being waited for.
                break
            if not selector.get_map():
                time.sleep(_POLL_SECONDS)
                continue
            for key, _ in selector.select(_POLL_SECONDS):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    key.data.feed(data)
                else:
                    selector.unregister(key.fd)
    # Anything still running (background children) goes with the run.
    _kill_run(proc, namespace)
    return out, err, timed_out


def run_python_sandboxed(
    code: str,
    *,
    workspace: Path,
    limits: SandboxLimits = SandboxLimits(),
    hidden: Iterable[Path] = (),
) -> SandboxResult:
    """Run ``code`` as a Python program in an isolated child process inside ``workspace``.

    The program runs with ``sys.executable -I -B`` in ``workspace`` (created if missing),
    with only ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR`` set, stdin from /dev/null, the
    resource limits in ``limits``, and its own network namespace. Where bubblewrap works
    (:func:`filesystem_isolation`), it runs in its own user, mount and PID namespaces too:
    the workspace is mounted at ``/workspace`` (its cwd and ``HOME``) beside a read-only
    system, and every process it starts ends with the run. Otherwise it runs with the
    relaygraph user's view of the files, and the result's ``isolation`` is ``"none"``.

    Isolated mode (``-I``) means neither the workspace nor the current directory is on
    ``sys.path``; a program that imports its own modules must add ``"."`` itself. A failing
    program is not an error here: its exit code and traceback are in the result.

    Args:
        code: The program's source.
        workspace: The task's workspace directory; the program's cwd and ``HOME``.
        limits: Resource limits for this run.
        hidden: Host paths that must stay out of sight (the data directory) even if they
            lie under a folder the sandbox mounts, such as the Python installation.

    Returns:
        The exit status, capped output and notes on which limits were hit.
    """
    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    bwrap = _bubblewrap.available()
    # A fresh folder per run, so concurrent runs in one workspace do not collide.
    run_name = f"run-{secrets.token_hex(6)}"
    run_dir = workspace / _SANDBOX_DIR / run_name
    (run_dir / "tmp").mkdir(parents=True)
    (run_dir / "main.py").write_text(code, encoding="utf-8", errors="surrogateescape")
    # The workspace as the program sees it.
    seen = Path(_bubblewrap.WORKSPACE) if bwrap is not None else workspace
    seen_run = seen / _SANDBOX_DIR / run_name
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(seen),
        "LANG": "C.UTF-8",
        "TMPDIR": str(seen_run / "tmp"),
    }
    # -u: unbuffered, so what a program printed before it was killed (a timeout, a CPU or
    # memory limit) reaches the model; -I ignores PYTHONUNBUFFERED with the environment.
    command = [sys.executable, "-I", "-B", "-u", str(seen_run / "main.py")]
    try:
        if bwrap is None:
            run = _run_unisolated(command, env=env, workspace=workspace, limits=limits)
        else:
            launch = _bubblewrap.BwrapLaunch(
                bwrap,
                workspace=workspace,
                hidden=tuple(hidden),
                tmpfs_bytes=limits.file_size_mb * 1024 * 1024,
            )
            with launch:
                run = _run_in_bubblewrap(command, env=env, launch=launch, limits=limits)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            (workspace / _SANDBOX_DIR).rmdir()
    stdout, out_cut = run.out.text()
    stderr, err_cut = run.err.text()
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
    )


@dataclass(frozen=True, slots=True)
class _Run:
    returncode: int
    out: _CappedStream
    err: _CappedStream
    timed_out: bool
    network_isolated: bool
    duration: float


def _run_unisolated(
    command: list[str], *, env: dict[str, str], workspace: Path, limits: SandboxLimits
) -> _Run:
    """Run with resource limits and (when permitted) a network namespace, nothing more."""
    # The child records in this shared page whether it entered a network namespace. The
    # page is shared across fork, and Popen returns only after exec, so the value is final.
    with mmap.mmap(-1, 1) as net_flag:
        start = time.monotonic()
        with subprocess.Popen(
            command,
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, net_flag),
        ) as proc:
            network = net_flag[0]
            try:
                out, err, timed_out = _collect(proc, limits, start, None)
            finally:
                # Reached on any exception too, e.g. KeyboardInterrupt in the parent:
                # never leave the program running.
                _kill_group(proc.pid)
            returncode = proc.wait()
        duration = time.monotonic() - start
    return _Run(returncode, out, err, timed_out, network != _NET_NONE, duration)


def _run_in_bubblewrap(
    command: list[str],
    *,
    env: dict[str, str],
    launch: _bubblewrap.BwrapLaunch,
    limits: SandboxLimits,
) -> _Run:
    """Run inside bubblewrap's namespaces; the limits are set on bwrap and inherited."""
    info_read, info_write = os.pipe()
    namespace: _bubblewrap.NamespaceInit | None = None
    try:
        argv = launch.argv(command, env=env, info_fd=info_write)
        start = time.monotonic()
        with subprocess.Popen(
            argv,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(*launch.pass_fds, info_write),
            preexec_fn=lambda: _child_setup(limits, None),
        ) as proc:
            os.close(info_write)
            info_write = -1
            namespace = _bubblewrap.NamespaceInit(info_read, proc.pid)
            info_read = -1
            try:
                out, err, timed_out = _collect(proc, limits, start, namespace)
            finally:
                _kill_run(proc, namespace)
            returncode = proc.wait()
        duration = time.monotonic() - start
    finally:
        if namespace is not None:
            namespace.close()
        for fd in (info_read, info_write):
            if fd >= 0:
                os.close(fd)
    # bwrap reports a program killed by signal N as exit status 128 + N, as a shell does.
    if 128 < returncode < 128 + signal.NSIG:
        returncode = 128 - returncode
    return _Run(returncode, out, err, timed_out, True, duration)
