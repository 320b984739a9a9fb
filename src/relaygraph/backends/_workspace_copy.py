"""Copying one task's workspace into a new task's (a replay from step N goes on in the files
the original left).

The source is a folder that sandboxed code wrote (see :mod:`relaygraph.backends.workspace`),
so the copy holds to the workspace tools' rules: it walks from descriptors, opens each name
with ``O_NOFOLLOW``, and copies only what is a regular file with a single link (a hard link
may be another name of a file outside the workspace) and folders. Symlinks, FIFOs, sockets
and devices are left out, never followed or opened; so are folders deeper than
:data:`~relaygraph.backends._quota.MAX_WALK_DEPTH`. Permission bits are copied without the
setuid and setgid bits (what ``clear_set_id_bits`` removes after every sandboxed run).

``shutil.copytree`` is not used: it follows a symlinked folder met on the way (its
``symlinks=False`` default copies what a link points to) and checks each path before it
opens it, the gap the workspace tools avoid.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaygraph.backends import _nofollow
from relaygraph.backends._nofollow import CREATE_FLAGS, FOLDER_FLAGS, READ_FLAGS
from relaygraph.backends._quota import (
    MAX_WALK_DEPTH,
    TaskFilesUsage,
    WorkspaceQuota,
    task_files_usage,
)
from relaygraph.errors import RelaygraphError

__all__ = ["CopiedWorkspace", "WorkspaceTooLarge", "copy_workspace"]

_CHUNK = 1024 * 1024
_KEPT_MODE = stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO
"""The permission bits a copy keeps: not setuid, setgid or sticky."""


class WorkspaceTooLarge(RelaygraphError):
    """A workspace to copy holds more than the quota lets the new task's files hold.

    Attributes:
        source: The workspace that was to be copied.
        quota: Which quota, and what the workspace holds.
    """

    def __init__(self, source: Path, quota: str) -> None:
        self.source, self.quota = source, quota
        super().__init__(f"the workspace {source} cannot be copied: {quota}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CopiedWorkspace:
    """What :func:`copy_workspace` copied and left out."""

    files: int
    """Files and folders copied."""
    bytes: int
    """Bytes of file content copied."""
    left_out: tuple[str, ...]
    """Paths (relative to the workspace) not copied: symlinks, special files, files with
    more than one link, folders too deep, entries that vanished or could not be read."""


def copy_workspace(source: Path, destination: Path, *, quota: WorkspaceQuota) -> CopiedWorkspace:
    """Copy the workspace ``source`` to ``destination``, a folder that must not exist yet
    (its parent is made, private, if missing), following no symlink.

    The workspace is measured first, as the quota measures a task's files; one past the
    quota is refused before anything is copied. The copy counts again as it goes (the
    workspace may change while it runs, if its task still does) and stops past the quota.
    A ``source`` that does not exist (the original wrote no file) copies nothing.

    Raises:
        WorkspaceTooLarge: The workspace holds more than ``quota`` lets a task's files
            hold; nothing is left at ``destination``.
        FileExistsError: ``destination`` exists.
    """
    usage = task_files_usage([source], stop_after_files=quota.max_files)
    over = quota.exceeded_by(usage, allowed=TaskFilesUsage(0, 0))
    if over is not None:
        raise WorkspaceTooLarge(source, over)
    try:
        top = os.open(source, FOLDER_FLAGS)
    except FileNotFoundError:
        return CopiedWorkspace(files=0, bytes=0, left_out=())
    except OSError:  # A symlink or a file planted where the folder was: not followed.
        return CopiedWorkspace(files=0, bytes=0, left_out=(".",))
    with _nofollow.closing_fd(top):
        destination.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkdir(destination, 0o700)
        try:
            with _nofollow.opened_folder(destination) as target:
                return _Copy(quota, source).run(top, target)
        except BaseException:
            _nofollow.remove_tree(destination)
            raise


class _Copy:
    """One copy: a depth-first walk of source and destination folders side by side, a
    descriptor and a directory iterator open per level, with the running count the quota
    is held to."""

    def __init__(self, quota: WorkspaceQuota, source: Path) -> None:
        self.quota, self.source = quota, source
        self.files = self.bytes = 0
        self.left_out: list[str] = []
        # Per level: the source folder's descriptor, its listing, the destination
        # folder's descriptor, and the level's path relative to the workspace.
        self.levels: list[tuple[int, Any, int, str]] = []

    def run(self, source_fd: int, target_fd: int) -> CopiedWorkspace:
        self._enter(os.dup(source_fd), os.dup(target_fd), "")
        try:
            while self.levels:
                source, listing, target, prefix = self.levels[-1]
                entry = next(listing, None)
                if entry is None:
                    self._leave()
                    continue
                self._copy_entry(entry, source, target, prefix + entry.name)
        finally:
            while self.levels:
                self._leave()
        return CopiedWorkspace(files=self.files, bytes=self.bytes, left_out=tuple(self.left_out))

    def _enter(self, source: int, target: int, prefix: str) -> None:
        try:
            listing = os.scandir(source)
        except OSError:
            os.close(source)
            os.close(target)
            self.left_out.append(prefix or ".")
            return
        self.levels.append((source, listing, target, prefix))

    def _leave(self) -> None:
        source, listing, target, _ = self.levels.pop()
        listing.close()
        os.close(source)
        os.close(target)

    def _copy_entry(self, entry: os.DirEntry[str], source: int, target: int, path: str) -> None:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            self.left_out.append(path)
            return
        if stat.S_ISDIR(info.st_mode):
            if len(self.levels) > MAX_WALK_DEPTH:
                self.left_out.append(path)
                return
            self._count(files=1, size=0)
            try:
                sub_source = os.open(entry.name, FOLDER_FLAGS, dir_fd=source)
            except OSError:  # Swapped for a symlink since the listing: not followed.
                self.left_out.append(path)
                return
            try:
                os.mkdir(entry.name, stat.S_IMODE(info.st_mode) & _KEPT_MODE, dir_fd=target)
                sub_target = os.open(entry.name, FOLDER_FLAGS, dir_fd=target)
            except BaseException:
                os.close(sub_source)
                raise
            self._enter(sub_source, sub_target, path + "/")
        elif stat.S_ISREG(info.st_mode):
            self._copy_file(entry.name, source, target, path)
        else:
            self.left_out.append(path)

    def _copy_file(self, name: str, source: int, target: int, path: str) -> None:
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=source)
        except OSError:  # Gone, or a symlink swapped in (O_NOFOLLOW refused it).
            self.left_out.append(path)
            return
        with _nofollow.closing_fd(fd):
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                self.left_out.append(path)
                return
            self._count(files=1, size=0)
            os.set_blocking(fd, True)
            out = os.open(name, CREATE_FLAGS, 0o600, dir_fd=target)
            with _nofollow.closing_fd(out):
                while chunk := os.read(fd, _CHUNK):
                    self._count(files=0, size=len(chunk))
                    _write_all(out, chunk)
                os.fchmod(out, stat.S_IMODE(info.st_mode) & _KEPT_MODE)
                # The mtime too: a program of a later step may compare files by it (make).
                os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))

    def _count(self, *, files: int, size: int) -> None:
        self.files += files
        self.bytes += size
        usage = TaskFilesUsage(self.bytes, self.files)
        over = self.quota.exceeded_by(usage, allowed=TaskFilesUsage(0, 0))
        if over is not None:
            raise WorkspaceTooLarge(self.source, over)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
