"""Run untrusted Python for the coder agent in a limited child process.

The program runs in a fresh interpreter (``python -I -B``) started in the task's workspace,
with a scrubbed environment, resource limits (CPU time, address space, file size, core
dumps, process count), a wall-clock timeout that kills its whole process group, capped
output, and, when the kernel allows it, its own empty network namespace.

This is damage control for mistakes in generated code, not a security boundary: the program
can read any file the relaygraph user can read and is not confined to a container. See
``docs/sandbox.md`` for what is and is not isolated.
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
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from relaygraph.errors import ConfigError

__all__ = ["SandboxLimits", "SandboxResult", "run_python_sandboxed"]

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


def _child_setup(limits: SandboxLimits, net_flag: mmap.mmap) -> None:
    """Run in the child between fork and exec: apply limits, then leave the network."""
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


def _collect(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float
) -> tuple[_CappedStream, _CappedStream, bool]:
    """Drain stdout and stderr until the program ends; kill it at the wall limit."""
    assert proc.stdout is not None and proc.stderr is not None
    out = _CappedStream(limits.max_output_chars)
    err = _CappedStream(limits.max_output_chars)
    deadline = start + limits.wall_seconds
    timed_out = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
            os.set_blocking(stream.fileno(), False)
            selector.register(stream.fileno(), selectors.EVENT_READ, sink)
        while True:
            now = time.monotonic()
            if exited_at is None and _leader_exited(proc.pid):
                exited_at = now
            if exited_at is None and not timed_out and now >= deadline:
                _kill_group(proc.pid)
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
    # Anything still running in the group (background children) goes with the run.
    _kill_group(proc.pid)
    return out, err, timed_out


def run_python_sandboxed(
    code: str, *, workspace: Path, limits: SandboxLimits = SandboxLimits()
) -> SandboxResult:
    """Run ``code`` as a Python program in a limited child process inside ``workspace``.

    The program runs with ``sys.executable -I -B`` in ``workspace`` (created if missing),
    with only ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR`` set, stdin from /dev/null, its own
    session and process group, the resource limits in ``limits``, and its own network
    namespace when the kernel permits. Isolated mode (``-I``) means neither the workspace nor
    the current directory is on ``sys.path``; a program that imports its own modules must
    add ``"."`` to ``sys.path`` itself.

    A failing program is not an error here: its exit code and traceback are in the result.

    Args:
        code: The program's source.
        workspace: The task's workspace directory; the program's cwd and ``HOME``.
        limits: Resource limits for this run.

    Returns:
        The exit status, capped output and notes on which limits were hit.
    """
    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    # A fresh folder per run, so concurrent runs in one workspace do not collide.
    run_dir = workspace / _SANDBOX_DIR / f"run-{secrets.token_hex(6)}"
    tmp_dir = run_dir / "tmp"
    tmp_dir.mkdir(parents=True)
    script = run_dir / "main.py"
    script.write_text(code, encoding="utf-8", errors="surrogateescape")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workspace),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp_dir),
    }
    # The child records in this shared page whether it entered a network namespace. The
    # page is shared across fork, and Popen returns only after exec, so the value is final.
    with mmap.mmap(-1, 1) as net_flag:
        try:
            start = time.monotonic()
            with subprocess.Popen(
                # -u: unbuffered, so what a program printed before it was killed (a
                # timeout, a CPU or memory limit) reaches the model; -I ignores
                # PYTHONUNBUFFERED along with the rest of the environment.
                [sys.executable, "-I", "-B", "-u", str(script)],
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=lambda: _child_setup(limits, net_flag),
            ) as proc:
                isolation = net_flag[0]
                try:
                    out, err, timed_out = _collect(proc, limits, start)
                finally:
                    # Reached on any exception too, e.g. KeyboardInterrupt in the parent:
                    # never leave the program running.
                    _kill_group(proc.pid)
                returncode = proc.wait()
            duration = time.monotonic() - start
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                (workspace / _SANDBOX_DIR).rmdir()
    stdout, out_cut = out.text()
    stderr, err_cut = err.text()
    return SandboxResult(
        exit_code=None if timed_out else returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        truncated=out_cut or err_cut,
        network_isolated=isolation != _NET_NONE,
        duration_seconds=duration,
        limits=limits,
    )
