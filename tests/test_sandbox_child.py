"""What the sandbox's child does between fork and exec, tried in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROGRAM = """
import mmap, sys
from relaygraph.backends._sandbox_child import child_setup
from relaygraph.backends.sandbox import SandboxLimits
with mmap.mmap(-1, 2) as flags:
    child_setup(SandboxLimits(), flags, cgroup=None, unshare_net=False, parent_pid=int(sys.argv[1]))
print("set up")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_child_whose_server_died_before_its_death_signal_was_set_ends() -> None:
    # The server's pid as the child read it before the fork is not its parent now: the
    # server died in between, and the death signal asked for would never come.
    gone = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(os.getpid() + 1_000_000)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (gone.returncode, gone.stdout) == (1, "")
    alive = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(os.getpid())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (alive.returncode, alive.stdout) == (0, "set up\n"), alive.stderr
