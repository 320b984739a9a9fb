"""What a sandboxed run may use and what it did: :class:`SandboxLimits` and :class:`SandboxResult`.

The result explains, in ``notes()``, which limit a run hit, so the model reading
``to_text()`` does not mistake a limit for a bug in its own program. Both are re-exported
by :mod:`relaygraph.backends.sandbox`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, fields
from typing import Literal

from relaygraph.backends._cgroup import CgroupVersion
from relaygraph.errors import ConfigError

__all__ = ["Isolation", "SandboxLimits", "SandboxResult"]

Isolation = Literal["bubblewrap", "none"]
"""How a run was isolated from the host's files and processes: by bubblewrap's namespaces,
or not at all (resource limits and a network namespace only)."""

_MIN_OUTPUT_CHARS = 200


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
    workspace_quota: str | None = None
    """Which quota of the task's files the run reached, as a sentence (a write past it
    failed, or the run was stopped); None when it reached none."""

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
        if self.workspace_quota is not None:
            notes.append(
                f"{self.workspace_quota}; delete files in the workspace to make room, or write less"
            )
        if self.workspace_quota is not None and code is not None and code < 0:
            pass  # Stopped for its files: the note above says so.
        elif code == -signal.SIGXCPU:
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
            if "File too large" in self.stderr and self.workspace_quota is None:
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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
