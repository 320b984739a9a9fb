"""One cgroup per sandboxed run: a cap on the memory and the processes of the run as a whole.

``RLIMIT_AS`` counts only the address space one process has mapped. Memory held in memfds or
SysV shared memory that is not mapped escapes it, so do the other processes of the run, and
the kernel does not apply ``RLIMIT_NPROC`` to root. A cgroup's memory controller counts every
page charged to its processes (anonymous memory, memfds, shared memory, tmpfs files, kernel
memory), and its pids controller every process and thread, so each run gets a cgroup of its
own:

- cgroup v2: ``memory.max``, ``memory.swap.max = 0``, ``memory.oom.group = 1`` (an OOM kill
  ends the whole run) and ``pids.max``;
- cgroup v1, on hosts that still mount the legacy hierarchies: ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap is accounted) in the memory hierarchy and
  ``pids.max`` in the pids hierarchy.

The run cgroups are made in a folder relaygraph owns, ``relaygraph-sandbox`` below the
server's own cgroup, or in the cgroup v2 folder the operator names with
``RELAYGRAPH_CGROUP``; the empty string turns cgroups off. The child joins its run's cgroup
between fork and exec by writing ``0`` (itself) to ``cgroup.procs`` through descriptors the
parent opened, so the program's first instruction already counts. After the run everything
left in it is killed and the cgroup is removed. Whether this works is probed once per process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("relaygraph.backends.sandbox")

CGROUP_ENV = "RELAYGRAPH_CGROUP"
"""A cgroup v2 folder in which relaygraph may make the runs' cgroups (delegated to it, with
``memory`` and ``pids`` available and no processes of its own); the empty string turns
cgroups off. Unset: ``relaygraph-sandbox`` below the server's own cgroup."""

PARENT_NAME = "relaygraph-sandbox"

CgroupVersion = Literal["v2", "v1"]

_CONTROLLERS = ("memory", "pids")
_REMOVE_SECONDS = 5.0
_PROBE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class CgroupParent:
    """Where run cgroups are made: one folder for v2, one per hierarchy for v1."""

    version: CgroupVersion
    memory: Path
    pids: Path

    @property
    def folders(self) -> tuple[Path, ...]:
        return (self.memory,) if self.memory == self.pids else (self.memory, self.pids)


@dataclass(frozen=True, slots=True)
class _Found:
    parent: CgroupParent | None
    problem: str | None


def available() -> CgroupParent | None:
    """The parent of the runs' cgroups on this host, probed once; None if there is none."""
    return _found().parent


def problem() -> str | None:
    """Why runs get no cgroup here, in a few words; None if they do."""
    return _found().problem


def _found() -> _Found:
    with _PROBE_LOCK:
        return _probe(os.environ.get(CGROUP_ENV))


@functools.cache
def _probe(configured: str | None) -> _Found:
    if configured == "":
        return _Found(None, f"turned off with {CGROUP_ENV}=''")
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError as exc:
        return _Found(None, f"cannot read /proc/self/cgroup: {exc.strerror or exc}")
    parent, problem = find_parent(configured, proc_cgroup, mountinfo)
    if parent is not None:
        problem = _prepare(parent, own=None if configured else parent.memory.parent)
        if problem is None:
            problem = _try(parent)
    if problem is not None:
        log.warning(
            "sandboxed runs get no cgroup, so the memory and the processes of a run are "
            "capped per process only: %s",
            problem,
        )
        return _Found(None, problem)
    assert parent is not None
    _remove_stale(parent)
    return _Found(parent, None)


def find_parent(
    configured: str | None, proc_cgroup: str, mountinfo: str
) -> tuple[CgroupParent | None, str | None]:
    """Where run cgroups would go, from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.

    Nothing is created here. cgroup v2 is preferred when it offers both controllers; else
    the v1 memory and pids hierarchies.

    Returns:
        The parent, or None and why there is none.
    """
    if configured:
        path = Path(configured)
        missing = _missing_v2_controllers(path)
        if missing:
            return None, f"{CGROUP_ENV}={configured} does not offer {', '.join(missing)}"
        return CgroupParent("v2", path, path), None
    mounts = _cgroup_mounts(mountinfo)
    memberships = _memberships(proc_cgroup)
    v2_problem = "no cgroup v2 hierarchy"
    if "" in memberships and "cgroup2" in mounts:
        own = _locate(mounts["cgroup2"], memberships[""])
        if own is not None:
            missing = _missing_v2_controllers(own)
            if not missing:
                return CgroupParent("v2", own / PARENT_NAME, own / PARENT_NAME), None
            v2_problem = f"cgroup v2 at {own} does not offer {', '.join(missing)}"
    folders: dict[str, Path] = {}
    for controller in _CONTROLLERS:
        if controller in mounts and controller in memberships:
            located = _locate(mounts[controller], memberships[controller])
            if located is not None:
                folders[controller] = located
    if "memory" in folders and "pids" in folders:
        memory, pids = folders["memory"] / PARENT_NAME, folders["pids"] / PARENT_NAME
        return CgroupParent("v1", memory, pids), None
    missing_v1 = [c for c in _CONTROLLERS if c not in folders]
    return None, f"{v2_problem}, and no cgroup v1 hierarchy for {', '.join(missing_v1)}"


def _missing_v2_controllers(path: Path) -> list[str]:
    try:
        offered = (path / "cgroup.controllers").read_text().split()
    except OSError:
        return list(_CONTROLLERS)
    return [c for c in _CONTROLLERS if c not in offered]


def _cgroup_mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """Mount root and mount point of the cgroup2 hierarchy and of each v1 controller."""
    mounts: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        where = (_unescape(fields[3]), _unescape(fields[4]))
        if fstype == "cgroup2":
            mounts.setdefault("cgroup2", where)
        elif fstype == "cgroup":
            for controller in _CONTROLLERS:
                if controller in options:
                    mounts.setdefault(controller, where)
    return mounts


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _memberships(proc_cgroup: str) -> dict[str, str]:
    """The process's cgroup path per v1 controller, and under ``""`` in the v2 hierarchy."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            found[""] = path
        for controller in controllers.split(","):
            if controller in _CONTROLLERS:
                found[controller] = path
    return found


def _locate(mount: tuple[str, str], path: str) -> Path | None:
    root, point = mount
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        return None  # the process's cgroup lies outside what is mounted here
    located = Path(os.path.normpath(os.path.join(point, relative)))
    return located if located.is_dir() else None


def _prepare(parent: CgroupParent, *, own: Path | None) -> str | None:
    """Make the parent folders and, for v2, hand the controllers down to the runs."""
    try:
        if parent.version == "v2":
            if own is not None:
                _enable_controllers(own)
                parent.memory.mkdir(exist_ok=True)
            _enable_controllers(parent.memory)
        else:
            for folder in parent.folders:
                folder.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot prepare {exc.filename or parent.memory}: {exc.strerror or exc}"
    return None


def _enable_controllers(folder: Path) -> None:
    control = folder / "cgroup.subtree_control"
    if all(c in control.read_text().split() for c in _CONTROLLERS):
        return
    # Refused (EBUSY) in a non-root cgroup that has processes of its own: cgroup v2 lets
    # only leaves hold processes. RELAYGRAPH_CGROUP then names a cgroup that has none.
    control.write_text(" ".join(f"+{c}" for c in _CONTROLLERS))


def _try(parent: CgroupParent) -> str | None:
    """Start one tiny process in a run cgroup; None if it joined, else what went wrong."""
    try:
        with RunCgroup(parent, memory_bytes=64 << 20, max_tasks=8) as cgroup:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", ""],
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                check=False,
                preexec_fn=cgroup.join_or_raise,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run a process in a cgroup below {parent.memory}: {exc}"
    if done.returncode != 0:
        return f"a process in a cgroup below {parent.memory} exited with {done.returncode}"
    return None


def _remove_stale(parent: CgroupParent) -> None:
    """Remove run cgroups left by servers that died mid-run (their processes died too)."""
    for folder in parent.folders:
        with contextlib.suppress(OSError):
            for entry in folder.iterdir():
                pid = entry.name.split("-")[1] if entry.name.startswith("run-") else ""
                if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
                    with contextlib.suppress(OSError):
                        entry.rmdir()


class RunCgroup:
    """The cgroup (v2) or cgroups (v1: memory and pids) of one run.

    Use as a context manager: entering makes the cgroup and sets its limits; exiting kills
    whatever is still in it and removes it.

    Args:
        parent: Where to make it.
        memory_bytes: Memory of all its processes together.
        max_tasks: Processes and threads together.
    """

    def __init__(self, parent: CgroupParent, *, memory_bytes: int, max_tasks: int) -> None:
        self.parent = parent
        self.version: CgroupVersion = parent.version
        self.memory_bytes = memory_bytes
        self.max_tasks = max_tasks
        self.name = f"run-{os.getpid()}-{secrets.token_hex(6)}"
        self._made: list[Path] = []
        self._join_fds: tuple[int, ...] = ()

    @property
    def memory(self) -> Path:
        return self.parent.memory / self.name

    @property
    def pids(self) -> Path:
        return self.parent.pids / self.name

    def __enter__(self) -> RunCgroup:
        try:
            for folder in self.parent.folders:
                path = folder / self.name
                path.mkdir()
                self._made.append(path)
            self._set_limits()
            self._join_fds = tuple(
                os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for path in self._made
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._join_fds:
            os.close(fd)
        self._join_fds = ()
        if self._made:
            self.kill_all()
        for path in self._made:
            _remove(path)
        self._made.clear()

    def _set_limits(self) -> None:
        memory, tasks = str(self.memory_bytes), str(self.max_tasks)
        if self.version == "v2":
            _write(self.memory / "memory.max", memory)
            _write(self.memory / "memory.swap.max", "0", optional=True)
            _write(self.memory / "memory.oom.group", "1", optional=True)
            _write(self.pids / "pids.max", tasks)
        else:
            _write(self.memory / "memory.limit_in_bytes", memory)
            # Where swap is accounted, memory plus swap gets the same cap: no swapping out.
            if not _write(self.memory / "memory.memsw.limit_in_bytes", memory, optional=True):
                _write(self.memory / "memory.swappiness", "0", optional=True)
            _write(self.pids / "pids.max", tasks)

    def join(self) -> bool:
        """Move the calling process into the cgroup; True if it is in. For the child of a
        fork, before it execs: only ``write`` system calls, no allocation of note."""
        try:
            for fd in self._join_fds:
                os.write(fd, b"0")
        except OSError:
            return False
        return True

    def join_or_raise(self) -> None:
        if not self.join():
            raise OSError("could not join the cgroup")

    def limits_hit(self) -> tuple[bool, bool]:
        """Whether the memory cap made the kernel kill a process, and a fork was refused."""
        if self.version == "v2":
            memory_events = _counters(self.memory / "memory.events")
        else:
            memory_events = _counters(self.memory / "memory.oom_control")
        pids_events = _counters(self.pids / "pids.events")
        return memory_events.get("oom_kill", 0) > 0, pids_events.get("max", 0) > 0

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup, until it is empty (bounded in time)."""
        kill_file = self.pids / "cgroup.kill"
        if self.version == "v2" and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        deadline = time.monotonic() + _REMOVE_SECONDS
        while time.monotonic() < deadline:
            members = _members(self.pids)
            if not members:
                return
            for pid in members:
                _kill_member(pid, self.name)
            time.sleep(0.01)


def _write(path: Path, value: str, *, optional: bool = False) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if optional:
            return False
        raise
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    return True


def _counters(path: Path) -> dict[str, int]:
    counters: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                counters[key] = int(value)
    return counters


def _members(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_member(pid: int, name: str) -> None:
    # A pid read from cgroup.procs may have been reused by the time it is signalled. The
    # pidfd pins one process; it is signalled only if that process is still in the run's
    # cgroup, so an unrelated process that got the pid is never hit.
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if f"/{name}\n" in Path(f"/proc/{pid}/cgroup").read_text() + "\n":
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _remove(path: Path) -> None:
    # An emptied cgroup can be busy for a moment while its last processes are reaped.
    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("could not remove the run's cgroup %s: %s", path, exc.strerror)
                return
            time.sleep(0.01)
