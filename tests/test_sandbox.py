"""The coder's Python sandbox: limits, scrubbed environment, network isolation, and honesty
about what it does not isolate.

Every test runs twice: inside bubblewrap (skipped where it is missing; CI installs it) and
in the fallback without it (``RELAYGRAPH_BWRAP=""``), so each protection holds in both.
What only bubblewrap isolates is tested in ``test_sandbox_isolation.py``.
"""

from __future__ import annotations

import errno
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relaygraph.backends import _cgroup, _sandbox_child
from relaygraph.backends.sandbox import (
    SandboxLimits,
    SandboxResult,
    run_python_sandboxed,
)
from relaygraph.errors import ConfigError

MiB = 1024 * 1024


pytestmark = pytest.mark.usefixtures("isolation")
"""Every test runs inside bubblewrap, then again in the fallback without it."""
fallback_only = pytest.mark.parametrize("isolation", ["none"], indirect=True)
"""For tests of the fallback's own network namespace (bubblewrap makes its own)."""


def seen_workspace(tmp_path: Path, isolation: str) -> str:
    """The workspace's path as the program sees it."""
    return "/workspace" if isolation == "bubblewrap" else str(tmp_path.resolve())


def run(code: str, workspace: Path, **limits: int | float) -> SandboxResult:
    return run_python_sandboxed(
        textwrap.dedent(code), workspace=workspace, limits=SandboxLimits(**limits)
    )


def _process_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (missing, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


def _pids_with(token: str) -> list[int]:
    """Host pids of running processes whose command line contains ``token``. A pid printed
    inside bubblewrap belongs to its PID namespace, so tests find processes by a token."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() in (entry / "cmdline").read_bytes() and not _process_gone(
                int(entry.name)
            ):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll ``condition()`` until it is true or ``seconds`` pass (generous: CI is busy)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _wait_all_gone(token: str, seconds: float = 10.0) -> bool:
    return _wait_until(lambda: not _pids_with(token), seconds)


def _sleeper(token: str) -> str:
    """Python source that starts a 30-second child carrying ``token`` in its command line."""
    return f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', {token!r}])"


# --- normal runs -------------------------------------------------------------------------


def test_runs_code_and_captures_stdout(tmp_path: Path) -> None:
    result = run("print('hello', 6 * 7)", tmp_path)

    assert result.exit_code == 0
    assert result.stdout == "hello 42\n"
    assert result.stderr == ""
    assert not result.timed_out and not result.truncated
    assert 0 < result.duration_seconds < 5
    text = result.to_text()
    assert text.startswith("exit code 0 after ")
    assert "stdout:\nhello 42" in text
    assert "stderr: (empty)" in text


def test_failing_script_reports_exit_code_and_traceback(tmp_path: Path) -> None:
    result = run("x = 1\nprint('before')\n1 / 0\n", tmp_path)

    assert result.exit_code == 1
    assert result.stdout == "before\n"
    assert "Traceback (most recent call last)" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    text = result.to_text()
    assert "exit code 1" in text
    assert "ZeroDivisionError" in text
    # No limit was hit; the fallback only says that it did not isolate files, and a host
    # without cgroups that it limited per process only.
    assert [n for n in result.notes() if "not isolated" not in n and "per process" not in n] == []


def test_sys_exit_code_is_kept(tmp_path: Path) -> None:
    assert run("import sys; sys.exit(3)", tmp_path).exit_code == 3


def test_stdin_is_empty(tmp_path: Path) -> None:
    result = run("input()", tmp_path)
    assert result.exit_code == 1
    assert "EOFError" in result.stderr


def test_workspace_is_created_if_missing(tmp_path: Path) -> None:
    workspace = tmp_path / "new" / "workspace"
    result = run("print('ok')", workspace)
    assert result.stdout == "ok\n"
    assert workspace.is_dir()


# --- environment and files ---------------------------------------------------------------


def test_environment_is_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-from-parent")
    result = run(
        """
        import os
        print(sorted(os.environ))
        print(os.environ['HOME'])
        print(os.environ['TMPDIR'])
        print(os.environ.get('OPENAI_API_KEY'))
        """,
        tmp_path,
    )

    keys, home, tmpdir, key = result.stdout.splitlines()
    # bubblewrap sets PWD when it enters the workspace.
    assert keys == (
        "['HOME', 'LANG', 'PATH', 'PWD', 'TMPDIR']"
        if isolation == "bubblewrap"
        else "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    )
    assert home == seen_workspace(tmp_path, isolation)
    # Temporary files never go to the workspace: the sandbox's own /tmp, or a private
    # folder of the server's.
    assert not Path(tmpdir).is_relative_to(home)
    assert tmpdir == "/tmp" if isolation == "bubblewrap" else "relaygraph-run-" in tmpdir
    assert key == "None"
    assert "sk-secret" not in result.to_text()


def test_cwd_is_the_workspace_and_files_land_there(tmp_path: Path, isolation: str) -> None:
    result = run(
        """
        import os, tempfile
        print(os.getcwd())
        with open('out.txt', 'w') as f:
            f.write('written by the sandbox')
        with tempfile.NamedTemporaryFile(delete=False) as f:
            print(f.name)
        """,
        tmp_path,
    )

    cwd, temp_file = result.stdout.splitlines()
    assert cwd == seen_workspace(tmp_path, isolation)
    assert (tmp_path / "out.txt").read_text() == "written by the sandbox"
    assert not Path(temp_file).is_relative_to(cwd)
    # Neither the program file nor its temporary folder was ever in the workspace; in the
    # fallback, the private folder that held them is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    if isolation == "none":
        assert not os.path.lexists(temp_file)
        assert not os.path.lexists(Path(temp_file).parent.parent)


@fallback_only
def test_fallback_filesystem_is_not_a_jail(tmp_path: Path) -> None:
    # Documented: without bubblewrap the sandbox limits resources and the network, not
    # which files are read, and the result says so.
    result = run("print(open('/etc/passwd').read().splitlines()[0])", tmp_path)
    assert result.exit_code == 0
    assert result.stdout.startswith("root:")
    assert result.isolation == "none"
    assert "files and processes were not isolated" in result.to_text()


def test_resource_limits_are_applied_in_the_child(tmp_path: Path) -> None:
    result = run(
        """
        import resource as r
        for name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_CORE'):
            print(name, *r.getrlimit(getattr(r, name)))
        """,
        tmp_path,
        cpu_seconds=3,
        memory_mb=256,
        file_size_mb=2,
        max_processes=7,
    )

    limits = dict(
        (name, (int(soft), int(hard)))
        for name, soft, hard in (line.split() for line in result.stdout.splitlines())
    )
    assert limits == {
        "RLIMIT_CPU": (3, 4),
        "RLIMIT_AS": (256 * MiB, 256 * MiB),
        "RLIMIT_FSIZE": (2 * MiB, 2 * MiB),
        "RLIMIT_NPROC": (7, 7),
        "RLIMIT_CORE": (0, 0),
    }


@pytest.fixture
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run without a cgroup, as on a host that offers none."""
    monkeypatch.setenv(_cgroup.CGROUP_ENV, "")


requires_cgroup = pytest.mark.skipif(
    _cgroup.available() is None,
    reason=f"no cgroup for sandboxed runs on this host: {_cgroup.problem()}",
)


@pytest.mark.skipif(os.geteuid() != 0, reason="documents behaviour under root only")
@pytest.mark.usefixtures("no_cgroup")
def test_process_limit_is_not_enforced_for_root_without_a_cgroup(tmp_path: Path) -> None:
    # Documented: the kernel exempts root from RLIMIT_NPROC, so alone it is no fork guard,
    # and the result says that the processes were not capped.
    result = run(
        """
        import os
        pids = [os.fork() or os._exit(0) for _ in range(5)]
        for pid in pids:
            os.waitpid(pid, 0)
        print(len(pids))
        """,
        tmp_path,
        max_processes=2,
    )
    assert result.stdout == "5\n"
    assert result.cgroup is None
    assert "memory and processes were limited per process only" in result.to_text()


_FORK_200 = """
import os, time
children = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(3)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print('refused', exc.errno)
print('forked', len(children))
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


@requires_cgroup
def test_a_fork_of_200_processes_is_capped_by_the_runs_cgroup(tmp_path: Path) -> None:
    # As root, RLIMIT_NPROC let 300 processes run; the run's cgroup counts them all.
    result = run(_FORK_200, tmp_path, max_processes=32)

    assert result.exit_code == 0, result.to_text()
    refused, forked = result.stdout.splitlines()
    assert refused == f"refused {errno.EAGAIN}"
    assert int(forked.split()[1]) < 32
    assert result.cgroup is not None and result.process_limit_hit
    assert "process limit of 32 reached" in result.to_text()


_MEMFDS = """
import os
held = 0
try:
    for i in range(64):  # 64 memory files of 16 MiB: 1 GiB, never mapped
        fd = os.memfd_create(f'held-{i}')
        os.posix_fallocate(fd, 0, 16 << 20)
        held += 16
        print(held, flush=True)
except OSError as exc:
    print('refused', exc.errno, flush=True)
"""

_SYSV_SHM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
held = 0
for i in range(64):  # 64 segments of 16 MiB: 1 GiB, each detached once touched
    segment = libc.shmget(0, 16 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if segment < 0:
        print('refused', ctypes.get_errno(), flush=True)
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(address)
    held += 16
    print(held, flush=True)
"""


def _shmem_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    return 0


@requires_cgroup
@pytest.mark.parametrize("program", [_MEMFDS, _SYSV_SHM], ids=["memfd", "sysv-shm"])
def test_a_gib_in_memory_files_is_stopped_at_the_memory_limit(tmp_path: Path, program: str) -> None:
    # Memory files and shared memory that are not mapped are outside RLIMIT_AS: 2 GiB were
    # held under a 512 MiB limit. The run's cgroup counts their pages.
    own_cgroup = Path("/proc/self/cgroup").read_text()
    own_oom_score_adj = Path("/proc/self/oom_score_adj").read_text()
    shmem_before = _shmem_kib()
    result = run(program, tmp_path, memory_mb=256)

    held = [int(line) for line in result.stdout.split() if line.isdigit()]
    assert held, result.to_text()
    assert max(held) < 256, result.to_text()
    assert "refused" in result.stdout or result.exit_code == -signal.SIGKILL
    assert result.cgroup is not None and result.memory_limit_hit
    assert "killed: memory limit of 256 MB reached" in result.to_text()
    # The server is unaffected: still in its own cgroup, not the OOM killer's choice, and
    # no memory of the run is left on the host.
    assert Path("/proc/self/cgroup").read_text() == own_cgroup
    assert Path("/proc/self/oom_score_adj").read_text() == own_oom_score_adj
    # (An IPC namespace's segments are freed by the kernel shortly after its end.)
    assert _wait_until(lambda: _shmem_kib() < shmem_before + 128 * 1024, 30)
    assert run("print('next')", tmp_path).stdout == "next\n"


def test_the_program_is_the_oom_killers_first_choice(tmp_path: Path) -> None:
    result = run("print(open('/proc/self/oom_score_adj').read().strip())", tmp_path)
    assert result.stdout == "1000\n"


@requires_cgroup
def test_the_runs_cgroup_is_removed_after_the_run(tmp_path: Path, isolation: str) -> None:
    parent = _cgroup.available()
    assert parent is not None
    mine = f"run-{os.getpid()}-"
    result = run(
        "print([l for l in open('/proc/self/cgroup') if 'relaygraph-sandbox/run-' in l] != [])",
        tmp_path,
    )
    assert result.cgroup == parent.version
    # Under bubblewrap the program sees its own cgroup as the root of a cgroup namespace;
    # without it, it sees where it is.
    assert result.stdout == ("False\n" if isolation == "bubblewrap" else "True\n")
    for folder in parent.folders:
        assert [p.name for p in folder.iterdir() if p.name.startswith(mine)] == []


@requires_cgroup
def test_a_run_that_could_not_join_its_cgroup_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child joins between fork and exec; the fake is inherited by the forked child.
    monkeypatch.setattr(_cgroup.RunCgroup, "join", lambda self: False)
    result = run("print('ran')", tmp_path)
    assert result.stdout == "ran\n"
    assert result.cgroup is None
    assert "memory and processes were limited per process only" in result.to_text()


def killed(
    exit_code: int, *, duration_seconds: float = 0.5, limits: SandboxLimits | None = None
) -> SandboxResult:
    """The result of a program in bubblewrap that a signal ended (``exit_code`` below 0),
    with no output."""
    return SandboxResult(
        exit_code=exit_code,
        stdout="",
        stderr="",
        timed_out=False,
        truncated=False,
        network_isolated=True,
        isolation="bubblewrap",
        duration_seconds=duration_seconds,
        limits=limits or SandboxLimits(),
    )


def _fake_cgroup(folder: Path, controllers: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    return folder


@fallback_only
@pytest.mark.parametrize(
    ("cgroups", "mounts", "proc", "folders"),
    [
        pytest.param(
            {"unified/system.slice/relaygraph.service": "memory pids"},
            [
                "30 1 0:26 / {root}/unified rw,nosuid - cgroup2 cgroup2 rw",
                "31 1 0:27 / {root}/memory rw - cgroup cgroup rw,memory",
            ],
            "4:memory:/system.slice\n0::/system.slice/relaygraph.service\n",
            (
                "v2",
                "unified/system.slice/relaygraph.service",
                "unified/system.slice/relaygraph.service",
            ),
            id="v2-preferred-when-it-offers-memory-and-pids",
        ),
        # This host's layout: cgroup2 mounted beside the v1 hierarchies, which own the
        # controllers.
        pytest.param(
            {"unified": "hugetlb", "memory/process_api/abc": "", "pids": ""},
            [
                "30 1 0:26 / {root}/unified rw - cgroup2 cgroup2 rw",
                "31 1 0:27 / {root}/memory rw - cgroup cgroup rw,memory",
                "32 1 0:28 / {root}/pids rw - cgroup cgroup rw,pids",
            ],
            "8:pids:/\n4:memory:/process_api/abc\n0::/\n",
            ("v1", "memory/process_api/abc", "pids"),
            id="v1-hierarchies-when-v2-has-no-controllers",
        ),
    ],
)
def test_the_cgroup_that_offers_memory_and_pids_is_found(
    tmp_path: Path,
    cgroups: dict[str, str],
    mounts: list[str],
    proc: str,
    folders: tuple[str, str, str],
) -> None:
    for folder, controllers in cgroups.items():
        _fake_cgroup(tmp_path / folder, controllers)
    mountinfo = "".join(line.format(root=tmp_path) + "\n" for line in mounts)
    parent, problem = _cgroup.find_parent(None, proc, mountinfo)
    assert problem is None
    version, memory, pids = folders
    assert parent == _cgroup.CgroupParent(
        version, tmp_path / memory / _cgroup.PARENT_NAME, tmp_path / pids / _cgroup.PARENT_NAME
    )


@fallback_only
def test_no_cgroup_is_found_without_the_controllers(tmp_path: Path) -> None:
    _fake_cgroup(tmp_path / "unified", "cpu io")
    mountinfo = f"30 1 0:26 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    parent, problem = _cgroup.find_parent(None, "0::/\n", mountinfo)
    assert parent is None
    assert problem == (
        f"cgroup v2 at {tmp_path}/unified does not offer memory, pids, "
        "and no cgroup v1 hierarchy for memory, pids"
    )


@fallback_only
def test_a_configured_cgroup_must_offer_memory_and_pids(tmp_path: Path) -> None:
    good = _fake_cgroup(tmp_path / "delegated", "cpu memory pids")
    assert _cgroup.find_parent(str(good), "", "") == (
        _cgroup.CgroupParent("v2", good, good),
        None,
    )
    bad = _fake_cgroup(tmp_path / "other", "memory")
    assert _cgroup.find_parent(str(bad), "", "") == (
        None,
        f"{_cgroup.CGROUP_ENV}={bad} does not offer pids",
    )


# --- limits ------------------------------------------------------------------------------


def test_wall_timeout_kills_the_program(tmp_path: Path) -> None:
    result = run("while True: pass", tmp_path, cpu_seconds=100, wall_seconds=1)

    assert result.timed_out
    assert result.exit_code is None
    assert 1 <= result.duration_seconds < 2.5
    text = result.to_text()
    assert text.startswith("timed out after ")
    assert "killed after wall timeout of 1 s" in text


def test_output_printed_before_a_kill_is_kept(tmp_path: Path) -> None:
    hung = run("print('before hang')\nimport time\ntime.sleep(30)", tmp_path, wall_seconds=1)
    assert hung.timed_out
    assert "before hang" in hung.to_text()
    busy = run("print('before spin')\nwhile True: pass", tmp_path, cpu_seconds=1)
    assert busy.exit_code is not None and busy.exit_code < 0
    assert "before spin" in busy.to_text()


def test_wall_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    token = f"relaygraph-test-{secrets.token_hex(8)}"
    result = run(
        f"""
        import subprocess, sys, time
        {_sleeper(token)}
        print('started', flush=True)
        time.sleep(30)
        """,
        tmp_path,
        wall_seconds=2,
    )

    assert result.timed_out
    assert result.stdout == "started\n"
    assert _wait_all_gone(token)


def test_background_children_are_killed_when_the_program_ends(tmp_path: Path) -> None:
    # The child inherits stdout and would keep the run waiting until the wall limit.
    token = f"relaygraph-test-{secrets.token_hex(8)}"
    result = run(
        f"""
        import subprocess, sys
        {_sleeper(token)}
        """,
        tmp_path,
        wall_seconds=10,
    )

    assert result.exit_code == 0
    assert not result.timed_out
    assert result.duration_seconds < 5
    assert _wait_all_gone(token)


_SERVER = """
import sys
from pathlib import Path
from relaygraph.backends.sandbox import SandboxLimits, run_python_sandboxed
limits = SandboxLimits(wall_seconds=120)
run_python_sandboxed(sys.argv[1], workspace=Path(sys.argv[2]), limits=limits)
"""


def test_the_program_dies_with_the_server(tmp_path: Path) -> None:
    # A server killed mid-run (SIGKILL: no cleanup code runs) takes the program with it.
    # The program replaces itself with a process that carries a token, to be found.
    token = f"relaygraph-test-{secrets.token_hex(8)}"
    code = (
        "import os, sys\n"
        "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', "
        f"{token!r}])\n"
    )
    server = subprocess.Popen([sys.executable, "-c", _SERVER, code, str(tmp_path)])
    try:
        assert _wait_until(lambda: bool(_pids_with(token)), 60), "the program never started"
    finally:
        server.kill()
        server.wait()
    assert _wait_all_gone(token, 30)


def test_closing_output_does_not_end_the_run_early(tmp_path: Path) -> None:
    result = run(
        """
        import os, time
        os.close(1); os.close(2)
        time.sleep(0.3)
        open('done', 'w').close()
        """,
        tmp_path,
    )
    assert result.exit_code == 0
    assert (tmp_path / "done").exists()


def test_cpu_limit_kills_a_busy_loop(tmp_path: Path) -> None:
    result = run("while True: pass", tmp_path, cpu_seconds=1, wall_seconds=10)

    assert not result.timed_out
    assert result.exit_code == -signal.SIGXCPU
    assert "killed: CPU time limit of 1 s exceeded" in result.to_text()


def test_sigkill_without_timeout_is_explained() -> None:
    # What a program that ignores SIGXCPU gets one second later (the hard limit is checked in
    # test_resource_limits_are_applied_in_the_child; running it would cost two CPU seconds).
    result = killed(-signal.SIGKILL, duration_seconds=2.0, limits=SandboxLimits(cpu_seconds=1))
    assert "killed by SIGKILL: the CPU time limit (1 s)" in result.to_text()


def test_memory_limit_gives_memory_error(tmp_path: Path) -> None:
    result = run("data = bytearray(1024 ** 3)", tmp_path, memory_mb=128)

    assert result.exit_code == 1
    assert "MemoryError" in result.stderr
    assert "memory limit of 128 MB reached (MemoryError)" in result.to_text()


def test_file_size_limit_stops_large_writes(tmp_path: Path) -> None:
    result = run("open('big.bin', 'wb').write(b'x' * (10 * 1024 * 1024))", tmp_path, file_size_mb=1)

    assert result.exit_code == 1
    assert "File too large" in result.stderr
    assert "file size limit of 1 MB reached" in result.to_text()
    assert (tmp_path / "big.bin").stat().st_size <= MiB


def test_crash_signal_is_named_and_leaves_no_core_file(tmp_path: Path) -> None:
    result = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", tmp_path)

    assert result.exit_code == -signal.SIGSEGV
    assert "killed by signal SIGSEGV" in result.to_text()
    assert list(tmp_path.iterdir()) == []


# --- output ------------------------------------------------------------------------------


def test_large_output_is_truncated_keeping_start_and_end(tmp_path: Path) -> None:
    result = run("print('START' + 'x' * (1024 * 1024) + 'END')", tmp_path, max_output_chars=2000)

    assert result.exit_code == 0
    assert result.truncated
    assert len(result.stdout) <= 2000
    assert result.stdout.startswith("START")
    assert result.stdout.rstrip().endswith("END")
    assert "bytes omitted" in result.stdout
    assert "output truncated to 2000 characters per stream" in result.to_text()


def test_traceback_survives_truncated_stderr(tmp_path: Path) -> None:
    result = run(
        """
        import sys
        sys.stderr.write('noise\\n' * 100_000)
        raise ValueError('the real problem')
        """,
        tmp_path,
    )
    assert result.truncated
    assert len(result.stderr) <= SandboxLimits().max_output_chars
    assert "ValueError: the real problem" in result.stderr


def test_truncation_counts_characters_not_bytes(tmp_path: Path) -> None:
    # Two bytes per character: the byte buffers must not cut text short or split characters.
    result = run("print('é' * 1500)", tmp_path, max_output_chars=2000)
    assert result.stdout == "é" * 1500 + "\n"
    assert not result.truncated

    result = run("print('é' * 100_000)", tmp_path, max_output_chars=2000)
    assert result.truncated
    assert len(result.stdout) <= 2000
    assert "\ufffd" not in result.stdout


# --- network -----------------------------------------------------------------------------


def _connect(port: int, host: str = "127.0.0.1") -> str:
    return textwrap.dedent(
        f"""
        import errno, socket
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(({host!r}, {port}))
            print('connected')
        except OSError as e:
            print(errno.errorcode.get(e.errno, e.errno))
        """
    )


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    """A server on the host's loopback that the program must not reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


def _accepted_nothing(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def test_network_is_unreachable_when_isolated(
    tmp_path: Path, host_listener: socket.socket, isolation: str
) -> None:
    port = host_listener.getsockname()[1]
    result = run(_connect(port) + _connect(80, "192.0.2.1"), tmp_path)
    if not result.network_isolated:
        pytest.skip("this kernel does not let us create a network namespace")
    # The fallback's namespace has no interface up: ENETUNREACH even for 127.0.0.1.
    # bubblewrap brings up a loopback of the sandbox's own, where nothing listens.
    loopback, outside = result.stdout.split()
    assert loopback == ("ECONNREFUSED" if isolation == "bubblewrap" else "ENETUNREACH")
    assert outside == "ENETUNREACH"
    assert _accepted_nothing(host_listener)
    assert "network was not isolated" not in result.to_text()


def test_program_cannot_rejoin_the_host_network(
    tmp_path: Path, host_listener: socket.socket
) -> None:
    escape = textwrap.dedent(
        """
        import ctypes, os
        print(os.getuid())
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(f'/proc/{os.getppid()}/ns/net', os.O_RDONLY)
            print('setns', libc.setns(fd, 0x40000000))
        except OSError as e:
            print('open', e.errno)
        """
    )
    result = run(escape + _connect(host_listener.getsockname()[1]), tmp_path)
    if not result.network_isolated:
        pytest.skip("this kernel does not let us create a network namespace")
    uid, attempt, connect = result.stdout.splitlines()
    if os.geteuid() == 0 and uid == "0":
        pytest.skip("no user namespace here; root can setns back (see docs/sandbox.md)")
    assert attempt in {f"open {errno.EACCES}", "setns -1"}
    assert connect != "connected"
    assert _accepted_nothing(host_listener)


@pytest.fixture
def no_user_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make user namespaces fail, so the sandbox falls back to a plain network namespace."""
    if os.geteuid() != 0:
        pytest.skip("a plain network namespace needs root")
    real = _sandbox_child._unshare

    def unshare(flags: int) -> int:
        if flags & _sandbox_child._CLONE_NEWUSER:
            return errno.EPERM
        return real(flags)

    monkeypatch.setattr(_sandbox_child, "_unshare", unshare)


@fallback_only
@pytest.mark.usefixtures("no_user_namespaces")
def test_falls_back_to_a_plain_network_namespace(tmp_path: Path) -> None:
    result = run("import os; print(os.getuid())\n" + _connect(5432), tmp_path)

    assert result.network_isolated
    assert result.stdout.splitlines() == ["0", "ENETUNREACH"]


@fallback_only
@pytest.mark.usefixtures("no_user_namespaces")
def test_plain_network_namespace_can_be_left_by_root(tmp_path: Path) -> None:
    # Documented weakness of the fallback: a root program rejoins the host network.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result = run(
            f"""
            import ctypes, os, socket
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f'/proc/{{os.getppid()}}/ns/net', os.O_RDONLY)
            assert libc.setns(fd, 0x40000000) == 0
            socket.create_connection(('127.0.0.1', {port}), timeout=2).close()
            print('rejoined')
            """,
            tmp_path,
        )
    assert result.network_isolated
    assert result.stdout == "rejoined\n", result.to_text()


@fallback_only
def test_runs_without_isolation_when_namespaces_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sandbox_child, "_unshare", lambda flags: errno.EPERM)
    result = run("print('still runs')", tmp_path)

    assert result.exit_code == 0
    assert result.stdout == "still runs\n"
    assert not result.network_isolated
    assert "network was not isolated" in result.to_text()


@fallback_only
def test_a_failing_isolation_attempt_never_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(flags: int) -> int:
        raise OSError("unexpected")

    monkeypatch.setattr(_sandbox_child, "_unshare", broken)
    result = run("print('still runs')", tmp_path)

    assert result.stdout == "still runs\n"
    assert not result.network_isolated


def test_unshare_reports_errno_without_libc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sandbox_child, "_LIBC_UNSHARE", None)
    assert _sandbox_child._unshare(_sandbox_child._CLONE_NEWNET) == errno.ENOSYS


# --- limits and result values ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu_seconds", 0),
        ("memory_mb", -1),
        ("wall_seconds", 0.0),
        ("file_size_mb", True),
        ("max_processes", "32"),
        ("max_output_chars", 100),
    ],
)
def test_invalid_limits_are_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        SandboxLimits(**{field: value})  # type: ignore[arg-type]


def test_default_limits() -> None:
    assert SandboxLimits() == SandboxLimits(
        cpu_seconds=10,
        memory_mb=512,
        file_size_mb=16,
        max_processes=32,
        wall_seconds=20.0,
        max_output_chars=8000,
    )


def test_to_text_of_an_unusual_signal() -> None:
    result = killed(-signal.SIGABRT, limits=SandboxLimits(memory_mb=64))
    text = result.to_text()
    assert "killed by signal SIGABRT" in text
    assert "memory limit of 64 MB" in text
    assert "stdout: (empty)" in text


def test_file_size_signal_is_explained(tmp_path: Path) -> None:
    # Python ignores SIGXFSZ; a program that restores the default handler dies of it.
    result = run(
        """
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        open('big.bin', 'wb').write(b'x' * (2 * 1024 * 1024))
        """,
        tmp_path,
        file_size_mb=1,
    )
    assert result.exit_code == -signal.SIGXFSZ
    assert "killed: file size limit of 1 MB exceeded" in result.to_text()


def test_to_text_of_an_unknown_signal_number() -> None:
    result = killed(-200)
    assert "killed by signal 200" in result.to_text()


def test_inherited_stricter_hard_limits_stay_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A parent that already runs under lower hard limits keeps them; the run does not fail.
    # The fake is inherited by the forked child, where the limits are set.
    real_getrlimit = resource.getrlimit
    inherited = {resource.RLIMIT_CPU: 2, resource.RLIMIT_FSIZE: 1024}

    def getrlimit(which: int) -> tuple[int, int]:
        if which in inherited:
            return (inherited[which], inherited[which])
        return real_getrlimit(which)

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    result = run(
        "import resource as r; print(r.getrlimit(r.RLIMIT_CPU), r.getrlimit(r.RLIMIT_FSIZE))",
        tmp_path,
        cpu_seconds=5,
    )
    assert result.stdout == "(2, 2) (1024, 1024)\n"
