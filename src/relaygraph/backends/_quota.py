"""A task's files on disk: how much they hold, and the quota they may not pass.

A task's files are its workspace and its artifacts together (``tasks/<id>/``). The quota is
``RELAYGRAPH_WORKSPACE_MAX_MB`` megabytes and ``RELAYGRAPH_WORKSPACE_MAX_FILES`` entries.
It is enforced where the files are written:

- ``write_file`` and ``save_artifact`` measure before they write and refuse a write past it
  (:meth:`WorkspaceQuota.check_write`);
- a sandboxed program, while it runs (``backends/sandbox.py``): its ``RLIMIT_FSIZE`` is the
  room left, so a write past it fails inside the program with ``EFBIG`` (``OSError: File
  too large``), and :class:`QuotaWatch` measures the files a few times a second and stops
  the program once they are past the quota (many small files, each under the room left).

The measure is a bounded walk of the folders from descriptors, following no symlink (the
sandbox may plant them): it stops one entry past the files quota, which is then reached
anyway, so it costs at most that many ``stat`` calls however many files a program made.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from relaygraph.backends._nofollow import FOLDER_FLAGS, walk_below
from relaygraph.errors import ConfigError, ToolInputError

__all__ = [
    "QuotaWatch",
    "TaskFilesUsage",
    "WorkspaceQuota",
    "WorkspaceQuotaExceeded",
    "task_files_usage",
]

_MIB = 1024 * 1024
MAX_WALK_DEPTH = 256
"""Folders deeper than this are not looked into (one descriptor is open per level)."""
WATCH_SECONDS = 0.25
"""Between two measures of a running program's files."""
MB_SETTING = "RELAYGRAPH_WORKSPACE_MAX_MB"
FILES_SETTING = "RELAYGRAPH_WORKSPACE_MAX_FILES"


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkspaceQuota:
    """How much a task's files (its workspace and its artifacts) may hold.

    Raises:
        ConfigError: A bound is not a positive whole number.
    """

    max_mb: int = 1024
    """Megabytes (MiB) on disk, workspace and artifacts together."""
    max_files: int = 10_000
    """Files and folders, workspace and artifacts together."""

    def __post_init__(self) -> None:
        for name in ("max_mb", "max_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"workspace quota {name}={value!r} must be a positive integer")

    @property
    def max_bytes(self) -> int:
        return self.max_mb * _MIB

    def describe_bytes(self) -> str:
        return f"the workspace quota of {self.max_mb:,} MB ({MB_SETTING})"

    def describe_files(self) -> str:
        return f"the workspace quota of {self.max_files:,} files ({FILES_SETTING})"

    def check_write(
        self, folders: Sequence[Path], *, what: str, adding_bytes: int, adding_files: int
    ) -> None:
        """Refuse a write of ``adding_bytes`` more (``adding_files`` new entries) that would
        take the task's files past the quota.

        Raises:
            WorkspaceQuotaExceeded: The quota, and what the files hold with the write.
        """
        usage = task_files_usage(folders, stop_after_files=self.max_files)
        after_bytes = usage.bytes + adding_bytes
        after_files = usage.files + adding_files
        if adding_bytes > 0 and after_bytes > self.max_bytes:
            raise WorkspaceQuotaExceeded(
                what,
                f"{self.describe_bytes()}: the task's files hold {_mb(usage.bytes)}, "
                f"{_mb(after_bytes)} with it",
            )
        if adding_files > 0 and after_files > self.max_files:
            raise WorkspaceQuotaExceeded(
                what,
                f"{self.describe_files()}: the task's files are {usage.files:,} files and "
                "folders already",
            )

    def exceeded_by(self, usage: TaskFilesUsage, *, allowed: TaskFilesUsage) -> str | None:
        """Which quota ``usage`` is past, as a sentence, or None. ``allowed`` is what the
        files may hold at most (the quota, or more when they were past it already)."""
        if usage.bytes > max(self.max_bytes, allowed.bytes):
            return f"{self.describe_bytes()} reached: the task's files hold {_mb(usage.bytes)}"
        if usage.files > max(self.max_files, allowed.files):
            return (
                f"{self.describe_files()} reached: the task's files are over "
                f"{min(usage.files, self.max_files):,} files and folders"
            )
        return None


class WorkspaceQuotaExceeded(ToolInputError):
    """A write would take a task's files past their quota. The message, which the model
    reads as the tool's result, names the quota and what the files hold.

    Attributes:
        what: The refused write (``write_file 'big.txt'``).
        quota: Which quota, and what the files hold.
    """

    def __init__(self, what: str, quota: str) -> None:
        self.what, self.quota = what, quota
        super().__init__(
            f"{what} is refused: it would pass {quota}. Delete files in the workspace "
            "(with run_python) or write less"
        )


@dataclass(frozen=True, slots=True)
class TaskFilesUsage:
    """What a task's files hold: bytes on disk, and entries (files, folders, links)."""

    bytes: int
    files: int


def task_files_usage(folders: Iterable[Path], *, stop_after_files: int) -> TaskFilesUsage:
    """Measure ``folders`` together: a walk from descriptors that follows no symlink, at
    most :data:`MAX_WALK_DEPTH` deep, that stops once it has counted more than
    ``stop_after_files`` entries. A file counts its size or its blocks on disk, whichever is
    larger (a sparse file counts its size: it may be filled in later)."""
    usage = TaskFilesUsage(0, 0)
    for folder in folders:
        try:
            top = os.open(folder, FOLDER_FLAGS)
        except OSError:
            continue  # Not made yet, or not a folder (a symlink planted in its place).
        usage = _walk(top, usage, stop_after_files)
    return usage


def _walk(top: int, usage: TaskFilesUsage, stop_after_files: int) -> TaskFilesUsage:
    """Add what lies below the folder ``top`` (a descriptor, closed here) to ``usage``."""
    total, files = usage.bytes, usage.files
    with contextlib.closing(walk_below(top, max_depth=MAX_WALK_DEPTH)) as walk:
        for _, _, info in walk:
            if files > stop_after_files:
                break
            files += 1
            total += max(info.st_size, getattr(info, "st_blocks", 0) * 512)
    return TaskFilesUsage(total, files)


class QuotaWatch:
    """Watches a running program's files: :meth:`over` measures them at most every
    :data:`WATCH_SECONDS` and says which quota they passed.

    Args:
        quota: The task's quota.
        folders: The task's folders (the workspace first).
    """

    def __init__(self, quota: WorkspaceQuota, folders: Sequence[Path]) -> None:
        self.quota, self.folders = quota, tuple(folders)
        self.at_start = self.measure()
        """What the files held when the run began: a run in files already past the quota
        (it may delete some) is stopped only if they grow."""
        self.last = self.at_start
        """What the files held at the last measure."""
        self.exceeded: str | None = None
        """Which quota the files passed, once they did."""
        self._next = 0.0

    def measure(self) -> TaskFilesUsage:
        return task_files_usage(self.folders, stop_after_files=self.quota.max_files)

    @property
    def room_bytes(self) -> int:
        """Bytes the run may add before the files reach the quota (0 when they have)."""
        return max(self.quota.max_bytes - self.at_start.bytes, 0)

    def over(self, *, now: float | None = None, force: bool = False) -> bool:
        """Whether the files are past the quota (measured if the last measure is older
        than :data:`WATCH_SECONDS`, or ``force``)."""
        if self.exceeded is not None:
            return True
        now = time.monotonic() if now is None else now
        if not force and now < self._next:
            return False
        self._next = now + WATCH_SECONDS
        self.last = self.measure()
        self.exceeded = self.quota.exceeded_by(self.last, allowed=self.at_start)
        return self.exceeded is not None


def _mb(size: int) -> str:
    return f"{size / _MIB:,.1f} MB"
