"""The parent's side of a sandboxed run: start the process, drain its output, end it.

:func:`run_unisolated` and :func:`run_in_bubblewrap` start the program (the child's side is
:mod:`relaygraph.backends._sandbox_child`), read stdout and stderr into a
:class:`CappedStream` each until it exits or reaches the wall limit, and kill everything it
left running.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relaygraph.backends import _bubblewrap, _cgroup
from relaygraph.backends._quota import QuotaWatch
from relaygraph.backends._sandbox_child import FLAG_CGROUP, FLAG_NET, NET_NONE, child_setup
from relaygraph.backends._sandbox_limits import SandboxLimits

_PIPE_GRACE_SECONDS = 0.5
"""How long to wait for output pipes to close after the program exited (see _collect)."""

_POLL_SECONDS = 0.02

_MARKER_RESERVE = 64
"""Characters kept free for the truncation marker, so a stream never exceeds the limit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunBounds:
    """What holds a run in, however it is started: the child sets these limits on itself
    between fork and exec, and the parent watches the wall clock and the quota."""

    limits: SandboxLimits
    cgroup: _cgroup.RunCgroup | None
    """The run's cgroup, which the child joins; None where the host offers none."""
    watch: QuotaWatch | None = None
    """Stops the run when the task's files pass their quota; None: no quota."""
    file_size_bytes: int | None = None
    """``RLIMIT_FSIZE`` lowered to the room left in the quota; None: the limits' own."""

    def child_setup(self, flags: mmap.mmap, *, unshare_net: bool) -> Callable[[], None]:
        """The ``preexec_fn`` that sets these bounds in the child, reporting in ``flags``."""
        parent_pid = os.getpid()  # Read here: in the child, before its exec, it is the child's.
        return lambda: child_setup(
            self.limits,
            flags,
            cgroup=self.cgroup,
            unshare_net=unshare_net,
            file_size_bytes=self.file_size_bytes,
            parent_pid=parent_pid,
        )


class CappedStream:
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
    bounds: RunBounds,
    start: float,
    namespace: _bubblewrap.NamespaceInit | None,
) -> tuple[CappedStream, CappedStream, bool]:
    """Drain stdout and stderr until the program ends; kill it at the wall limit, or when
    the bounds' ``watch`` finds the task's files past their quota."""
    assert proc.stdout is not None and proc.stderr is not None
    out = CappedStream(bounds.limits.max_output_chars)
    err = CappedStream(bounds.limits.max_output_chars)
    deadline = start + bounds.limits.wall_seconds
    timed_out = False
    exited_at: float | None = None
    sinks: list[tuple[int, CappedStream | _bubblewrap.NamespaceInit]] = [
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
            if exited_at is None and bounds.watch is not None and bounds.watch.over(now=now):
                # Many files, each below the room left (RLIMIT_FSIZE): no write of them
                # failed, so the run is stopped here.
                _kill_run(proc, namespace)
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


@dataclass(frozen=True, slots=True)
class Run:
    returncode: int
    out: CappedStream
    err: CappedStream
    timed_out: bool
    network_isolated: bool
    joined_cgroup: bool
    duration: float


def run_unisolated(
    command: list[str],
    *,
    env: dict[str, str],
    workspace: Path,
    bounds: RunBounds,
) -> Run:
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
            preexec_fn=bounds.child_setup(flags, unshare_net=True),
        ) as proc:
            network, joined = flags[FLAG_NET], flags[FLAG_CGROUP]
            try:
                out, err, timed_out = _collect(proc, bounds, start, None)
            finally:
                # Reached on any exception too, e.g. KeyboardInterrupt in the parent:
                # never leave the program running.
                _kill_group(proc.pid)
                if bounds.cgroup is not None:
                    # Children that left the process group with setsid() are still in
                    # the run's cgroup.
                    bounds.cgroup.kill_all()
            returncode = proc.wait()
        duration = time.monotonic() - start
    return Run(returncode, out, err, timed_out, network != NET_NONE, joined == 1, duration)


def run_in_bubblewrap(
    command: list[str],
    *,
    env: dict[str, str],
    launch: _bubblewrap.BwrapLaunch,
    program: bytes,
    bounds: RunBounds,
) -> Run:
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
                preexec_fn=bounds.child_setup(flags, unshare_net=False),
            ) as proc:
                joined = flags[FLAG_CGROUP]
                os.close(info_write)
                info_write = -1
                namespace = _bubblewrap.NamespaceInit(info_read, proc.pid)
                info_read = -1
                try:
                    out, err, timed_out = _collect(proc, bounds, start, namespace)
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
    return Run(returncode, out, err, timed_out, True, joined == 1, duration)
