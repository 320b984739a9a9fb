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
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from relaygraph.backends import _bubblewrap, _cgroup, _nofollow
from relaygraph.backends._cgroup import CgroupVersion
from relaygraph.errors import ConfigError, ToolInputError

log = logging.getLogger("relaygraph.backends.sandbox")

__all__ = [
    "CgroupVersion",
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
_CLONE_NEWIPC = 0x08000000

# The child reports in a shared page what it did (see _child_setup): byte 0 which network
# namespace it entered, byte 1 whether it joined the run's cgroup.
_FLAG_NET = 0
_FLAG_CGROUP = 1
_NET_NONE = 0
_NET_USER_AND_NET = 1
_NET_NET_ONLY = 2

_BWRAP_PROCESSES = 2
"""bwrap itself and the PID namespace's init, which run in the run's cgroup beside the program."""

_MIB = 1024 * 1024

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
    """Memory in MiB. Each process's address space (``RLIMIT_AS``: allocations beyond it fail
    with MemoryError), and, where a cgroup is available, all the run's memory together,
    memfds, shared memory and files in ``/tmp`` included (the kernel kills a process of the
    run when it is reached)."""
    file_size_mb: int = 16
    """Largest file the program may write, in MiB (``RLIMIT_FSIZE``)."""
    max_processes: int = 32
    """Processes and threads of the run together, where a cgroup is available (``pids.max``;
    bwrap's own two processes are not counted). Also ``RLIMIT_NPROC``, which counts per
    user, not per run, and which the kernel does not apply to root."""
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
    cgroup: CgroupVersion | None = None
    """``"v2"`` or ``"v1"``: a cgroup of that version capped the memory (memfds, shared
    memory and ``/tmp`` included) and the processes of the whole run. None: only the
    per-process limits applied; the notes say so."""
    memory_limit_hit: bool = False
    """The run's cgroup reached ``memory_mb`` and the kernel killed a process of the run."""
    process_limit_hit: bool = False
    """The run's cgroup refused a new process or thread at ``max_processes``."""

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
        if self.memory_limit_hit:
            notes.append(
                f"killed: memory limit of {limits.memory_mb} MB reached by the run's processes "
                "together (memory in memfds, shared memory and /tmp counts too)"
            )
        if self.process_limit_hit:
            notes.append(
                f"process limit of {limits.max_processes} reached: starting another process "
                "or thread failed"
            )
        if code == -signal.SIGXCPU:
            notes.append(f"killed: CPU time limit of {limits.cpu_seconds} s exceeded")
        elif code == -signal.SIGKILL and self.memory_limit_hit:
            pass
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
        if self.cgroup is None:
            notes.append(
                "memory and processes were limited per process only (no cgroup is available "
                "on this system): memfds, shared memory and the number of processes were not "
                "capped for the run as a whole"
            )
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


def _child_setup(
    limits: SandboxLimits,
    flags: mmap.mmap,
    *,
    cgroup: _cgroup.RunCgroup | None,
    unshare_net: bool,
) -> None:
    """Run in the child between fork and exec: join the cgroup, apply limits, then leave the
    network (with ``unshare_net``; bubblewrap makes its namespaces itself, and the limits
    set here are inherited by the program it starts). What it did goes to ``flags``.
    """
    # First, while the child is still the server's user in the host's namespaces: inside a
    # user namespace it could no longer write to the host's cgroup files.
    if cgroup is not None and cgroup.join():
        flags[_FLAG_CGROUP] = 1
    # If the host runs out of memory, the kernel's OOM killer picks the sandbox, not the
    # server. Raising one's own score needs no privilege.
    with contextlib.suppress(OSError):
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
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
    if not unshare_net:
        return
    # Limits are set before unshare: inside a new user namespace the process loses the
    # privilege to change hard limits. The network part must never fail the run.
    try:
        # A user namespace first: then even a root program has no privilege over the host
        # namespaces and cannot setns(2) back into the host network. Plain CLONE_NEWNET is
        # the fallback for kernels without user namespaces; root can undo that one.
        if _unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
            flags[_FLAG_NET] = _NET_USER_AND_NET
        elif _unshare(_CLONE_NEWNET) == 0:
            flags[_FLAG_NET] = _NET_NET_ONLY
        # An IPC namespace of its own: SysV shared memory the program leaves behind ends
        # with its last process instead of staying on the host.
        _unshare(_CLONE_NEWIPC)
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
    with contextlib.ExitStack() as stack:
        if bwrap is None:
            # The private folder is entered before the cgroup, so it is removed after
            # everything left of the run has been killed.
            folder = stack.enter_context(_private_folder(program))
            env = _environment(home=workspace, tmp=folder / "tmp")
            cgroup = _run_cgroup(stack, limits, extra_tasks=0)
            run = _run_unisolated(
                [*interpreter, str(folder / "main.py")],
                env=env,
                workspace=workspace,
                limits=limits,
                cgroup=cgroup,
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
            run = _run_in_bubblewrap(
                [*interpreter, _bubblewrap.PROGRAM],
                env=env,
                launch=launch,
                program=program,
                limits=limits,
                cgroup=cgroup,
            )
        version: CgroupVersion | None = None
        memory_hit = processes_hit = False
        if cgroup is not None and run.joined_cgroup:
            version = cgroup.version
            memory_hit, processes_hit = cgroup.limits_hit()
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
        cgroup=version,
        memory_limit_hit=memory_hit,
        process_limit_hit=processes_hit,
    )


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


@dataclass(frozen=True, slots=True)
class _Run:
    returncode: int
    out: _CappedStream
    err: _CappedStream
    timed_out: bool
    network_isolated: bool
    joined_cgroup: bool
    duration: float


def _run_unisolated(
    command: list[str],
    *,
    env: dict[str, str],
    workspace: Path,
    limits: SandboxLimits,
    cgroup: _cgroup.RunCgroup | None,
) -> _Run:
    """Run with resource limits and (when permitted) a network namespace, nothing more."""
    # The child records in this shared page what it did. The page is shared across fork,
    # and Popen returns only after exec, so the values are final.
    with mmap.mmap(-1, 2) as flags:
        start = time.monotonic()
        with subprocess.Popen(
            command,
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=lambda: _child_setup(limits, flags, cgroup=cgroup, unshare_net=True),
        ) as proc:
            network, joined = flags[_FLAG_NET], flags[_FLAG_CGROUP]
            try:
                out, err, timed_out = _collect(proc, limits, start, None)
            finally:
                # Reached on any exception too, e.g. KeyboardInterrupt in the parent:
                # never leave the program running.
                _kill_group(proc.pid)
                if cgroup is not None:
                    # Children that left the process group with setsid() are still in
                    # the run's cgroup.
                    cgroup.kill_all()
            returncode = proc.wait()
        duration = time.monotonic() - start
    return _Run(returncode, out, err, timed_out, network != _NET_NONE, joined == 1, duration)


def _run_in_bubblewrap(
    command: list[str],
    *,
    env: dict[str, str],
    launch: _bubblewrap.BwrapLaunch,
    program: bytes,
    limits: SandboxLimits,
    cgroup: _cgroup.RunCgroup | None,
) -> _Run:
    """Run inside bubblewrap's namespaces; the limits are set on bwrap and inherited."""
    info_read, info_write = os.pipe()
    namespace: _bubblewrap.NamespaceInit | None = None
    try:
        argv = launch.argv(
            command, env=env, info_fd=info_write, files={_bubblewrap.PROGRAM: program}
        )
        with mmap.mmap(-1, 2) as flags:
            start = time.monotonic()
            with subprocess.Popen(
                argv,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(*launch.pass_fds, info_write),
                preexec_fn=lambda: _child_setup(limits, flags, cgroup=cgroup, unshare_net=False),
            ) as proc:
                joined = flags[_FLAG_CGROUP]
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
    return _Run(returncode, out, err, timed_out, True, joined == 1, duration)
