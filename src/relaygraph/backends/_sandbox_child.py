"""The child's side of a sandboxed run, between fork and exec.

:func:`child_setup` joins the run's cgroup, sets the resource limits, arranges for the
program to die with the server, and (without bubblewrap) leaves the host's network. It
reports in a shared page what it did, since it cannot raise to the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import resource
import signal
from collections.abc import Callable

from relaygraph.backends import _cgroup
from relaygraph.backends._sandbox_limits import SandboxLimits

# Namespace flags from <linux/sched.h>; the stdlib exposes them only from Python 3.12 on.
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000

# The child reports in a shared page what it did (see child_setup): byte 0 which network
# namespace it entered, byte 1 whether it joined the run's cgroup.
FLAG_NET = 0
FLAG_CGROUP = 1
NET_NONE = 0
NET_USER_AND_NET = 1
NET_NET_ONLY = 2


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


def child_setup(
    limits: SandboxLimits,
    flags: mmap.mmap,
    *,
    cgroup: _cgroup.RunCgroup | None,
    unshare_net: bool,
    file_size_bytes: int | None = None,
    parent_pid: int | None = None,
) -> None:
    """Run in the child between fork and exec: join the cgroup, apply limits, then leave the
    network (with ``unshare_net``; bubblewrap makes its namespaces itself, and the limits
    set here are inherited by the program it starts). What it did goes to ``flags``.
    ``file_size_bytes``: ``RLIMIT_FSIZE`` when it is below ``limits.file_size_mb`` (the
    room left in the task's workspace quota). ``parent_pid``: the server's pid, read before
    the fork, so that a server that died before the death signal was asked for is noticed.
    """
    # First, while the child is still the server's user in the host's namespaces: inside a
    # user namespace it could no longer write to the host's cgroup files.
    if cgroup is not None and cgroup.join():
        flags[FLAG_CGROUP] = 1
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
        if parent_pid is not None and os.getppid() != parent_pid:
            # The server died between the fork and the line above: the signal asked for
            # will never come (the child was re-parented already), so end here.
            os._exit(1)
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
    file_size = limits.file_size_mb * mib
    if file_size_bytes is not None:
        file_size = min(file_size, file_size_bytes)
    _set_limit(resource.RLIMIT_FSIZE, file_size)
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
            flags[FLAG_NET] = NET_USER_AND_NET
        elif _unshare(_CLONE_NEWNET) == 0:
            flags[FLAG_NET] = NET_NET_ONLY
        # An IPC namespace of its own: SysV shared memory the program leaves behind ends
        # with its last process instead of staying on the host.
        _unshare(_CLONE_NEWIPC)
    except BaseException:  # a failed isolation is reported, not raised
        pass
