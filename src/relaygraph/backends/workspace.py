"""A task's files: the coder's workspace folder and the writer's artifact store.

The workspace is also mounted read-write in the ``run_python`` sandbox (docs/sandbox.md), so
code a model wrote can put symlinks, FIFOs and hard links in it at any moment, also while a
tool is running. Checking a path and then opening it would leave a gap in which a symlink
could be swapped in, and the server would read or write a file of the sandbox's choosing (the
ledger, say: merely opening and closing SQLite's file in the server drops SQLite's locks). So
the tools here never check a path before using it and never follow a symlink:

- ``..`` is settled on the text of the path, before the filesystem is touched;
- every folder is opened one name at a time, relative to a descriptor of the folder above it,
  with ``O_NOFOLLOW | O_DIRECTORY``, starting from a descriptor of the workspace's root;
- a file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and read only if ``fstat`` of the
  descriptor says it is a regular file with a single link;
- a write goes to a new file (``O_CREAT | O_EXCL | O_NOFOLLOW``) that is then renamed over the
  name within the same folder descriptor, so whatever stood there is replaced, not written
  through.

The descriptor walk is in :mod:`relaygraph.backends._nofollow`. The refusals are
:class:`~relaygraph.errors.ToolInputError`, whose message the model reads as the tool result,
so each one says what to do instead.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import heapq
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from relaygraph.backends import _nofollow
from relaygraph.backends._quota import (
    TaskFilesUsage,
    WorkspaceQuota,
    WorkspaceQuotaExceeded,
    task_files_usage,
)
from relaygraph.backends._workspace_copy import CopiedWorkspace, WorkspaceTooLarge, copy_workspace
from relaygraph.errors import ToolInputError

__all__ = [
    "Artifact",
    "ArtifactStore",
    "CopiedWorkspace",
    "TaskFilesUsage",
    "Workspace",
    "WorkspaceEscapeError",
    "WorkspaceQuota",
    "WorkspaceQuotaExceeded",
    "WorkspaceTooLarge",
    "copy_workspace",
    "delete_folder",
]

MAX_WRITE_BYTES = 1_000_000
"""Largest text a tool may write in one call (1 MB), in UTF-8 bytes."""

_LISTED_FILES = 20
"""How many existing files a "no such file" message names."""

_MAX_LISTED_DEPTH = 16
"""How many folders deep ``list_files`` looks; code in the sandbox can nest folders without end."""

_MAX_LISTED_ENTRIES = 10_000
"""How many entries (files and folders) ``list_files`` looks at before it stops. Code in the
sandbox can plant any number of files, and every failed ``read_file`` lists the workspace in
the server (40,000 planted files took a server from 142 MiB to 771 MiB)."""

_MAX_LISTED_CHARS = 1_000_000
"""How many characters of paths ``list_files`` makes before it stops (a path may be 16
folders of 255 characters each)."""

_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


class WorkspaceEscapeError(ToolInputError):
    """A path is empty, malformed, leaves the task's workspace, or goes through a symlink.

    Attributes:
        path: The path as the caller gave it.
        problem: What is wrong with it.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"path {path!r} {problem}; paths are relative to the task's workspace, "
            "for example 'notes/plan.md'"
        )


def _utf8_size(content: str) -> int:
    # Lone surrogates cannot be written as UTF-8; refuse them here with a clear message
    # instead of a UnicodeEncodeError from deep inside the write.
    try:
        return len(content.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ToolInputError(
            f"content has a character that is not valid Unicode text at index {exc.start}; "
            "remove it and write again"
        ) from exc


def _not_a_plain_file(info: os.stat_result) -> str | None:
    """Why a file with this ``fstat`` may not be read, or None if it may."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        if info.st_nlink > 1:
            # Another name of the same file may lie outside the workspace (a hard link made
            # where the sandbox is not isolated), and no check of this name can tell.
            return (
                f"has {info.st_nlink} hard links, and the workspace tools read only files "
                "with one, since another link may be a file outside the workspace; copy it "
                "(for example with shutil.copyfile) and read the copy"
            )
        return None
    kind = _nofollow.special_kind(mode)
    return f"is {kind}, not a regular file; only regular files can be read"


class _TaskFolder:
    """A folder of a task's files whose writes count against the task's quota: what
    :class:`Workspace` and :class:`ArtifactStore` share.

    Args:
        root: The folder; created if missing.
        quota: What the task's files may hold: a write past it is refused. None: no quota.
        counted: The task's other folders that count against ``quota``.

    Attributes:
        root: The folder, fully resolved (symlinks followed).
    """

    def __init__(
        self, root: Path, *, quota: WorkspaceQuota | None, counted: Sequence[Path]
    ) -> None:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        # The root's own path is the server's to choose, and the sandbox cannot replace it:
        # there it is the mount point /workspace, and nothing above it is visible.
        self.root: Path = root.resolve()
        self.quota = quota
        self.counted = tuple(counted)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def _check_quota(self, what: str, size: int, existing: os.stat_result | None) -> None:
        """Refuse a write of ``size`` bytes (``what``, in the refusal) over the file
        ``existing`` (None: a new file) that would take the task's files past their quota.

        Raises:
            WorkspaceQuotaExceeded: It would.
        """
        if self.quota is not None:
            self.quota.check_write(
                (self.root, *self.counted),
                what=what,
                adding_bytes=size - (existing.st_size if existing else 0),
                adding_files=0 if existing else 1,
            )


class Workspace(_TaskFolder):
    """The folder a task's coder may read and write; nothing outside it is reachable.

    Paths are relative to the folder (absolute ones only if they point inside it). Symlinks
    are never followed, not even ones that point inside: code in the sandbox can change
    where a symlink points at any moment, so a path through one is refused.

    Args:
        root: The folder; created if missing.
        max_write_bytes: Largest content ``write_text`` accepts, in UTF-8 bytes.
        quota: What the task's files may hold: a write past it is refused. None: no quota.
        counted: The task's other folders that count against ``quota`` (its artifacts).

    Attributes:
        root: The folder, fully resolved (symlinks followed).
    """

    def __init__(
        self,
        root: Path,
        *,
        max_write_bytes: int = MAX_WRITE_BYTES,
        quota: WorkspaceQuota | None = None,
        counted: Sequence[Path] = (),
    ) -> None:
        super().__init__(root, quota=quota, counted=counted)
        self.max_write_bytes = max_write_bytes

    def resolve(self, path: str) -> Path:
        """Return where ``path`` (relative to the root) is, if it stays inside without symlinks.

        ``..`` is settled on the text. The folders on the way and the last name are looked at
        without following any of them, and a symlink among them is refused. The answer is for
        showing: ``read_text`` and ``write_text`` do not open it, but walk the path again.

        Raises:
            WorkspaceEscapeError: ``path`` is empty, has a NUL byte, leaves the workspace, or
                goes through a symlink.
        """
        names = self._names(path)
        if names:
            try:
                with self._folder(path, names[:-1]) as folder:
                    entry = _nofollow.entry_at(folder, names[-1])
            except (FileNotFoundError, NotADirectoryError):
                entry = None  # Not there yet: this is where a write would create it.
            if entry and stat.S_ISLNK(entry.st_mode):
                raise self._symlink_error(path)
        return self.root.joinpath(*names)

    def write_text(self, path: str, content: str) -> Path:
        """Write ``content`` as UTF-8 to ``path``, creating parent folders; replace any file.

        The file is always a new one renamed into place, so a symlink or a hard link at
        ``path`` is replaced, and what it pointed to is never touched.

        Returns:
            The path written.

        Raises:
            WorkspaceEscapeError: ``path`` leaves the workspace or goes through a symlink.
            ToolInputError: The content is too large, or ``path`` is a folder or lies
                under a file.
            WorkspaceQuotaExceeded: The write would take the task's files past their quota.
        """
        names = self._names(path)
        size = _utf8_size(content)
        if size > self.max_write_bytes:
            raise ToolInputError(
                f"content for {path!r} is {size:,} bytes; the limit is "
                f"{self.max_write_bytes:,} bytes per file; split it into smaller files"
            )
        if not names:
            raise self._folder_error(path)
        try:
            with self._folder(path, names[:-1], create=True) as folder:
                existing = _nofollow.entry_at(folder, names[-1])
                if existing and stat.S_ISDIR(existing.st_mode):
                    raise self._folder_error(path)
                if existing and stat.S_ISLNK(existing.st_mode):
                    raise self._symlink_error(path)
                self._check_quota(f"write_file {path!r} ({size:,} bytes)", size, existing)
                # Keep a replaced file's permission bits (an executable script stays one).
                mode = stat.S_IMODE(existing.st_mode) & 0o777 if existing else None
                _nofollow.replace_file(folder, names[-1], content.encode("utf-8"), mode=mode)
        except NotADirectoryError as exc:
            raise ToolInputError(
                f"cannot write {path!r}: a part of the path is an existing file, not a folder"
            ) from exc
        except IsADirectoryError as exc:
            # A folder took the name after it was looked at.
            raise self._folder_error(path) from exc
        except OSError as exc:
            raise ToolInputError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
        return self.root.joinpath(*names)

    def read_text(self, path: str, max_chars: int = 20000) -> str:
        """Read up to ``max_chars`` characters of a UTF-8 text file.

        A longer file is cut, with a note at the end saying so and how large it is. Only a
        regular file with one link is read: not a FIFO, socket or device, and not a file with
        further hard links, one of which may lie outside the workspace.

        Raises:
            WorkspaceEscapeError: ``path`` leaves the workspace or goes through a symlink.
            ToolInputError: There is no such file, it is a folder or not a regular file, or
                it is not UTF-8 text.
        """
        names = self._names(path)
        if not names:
            raise ToolInputError(f"{path!r} is a folder, not a file. {self._listing()}")
        fd, info = self._open_for_reading(path, names)
        try:
            with open(fd, encoding="utf-8", errors="strict", closefd=False) as f:
                # Read one character more than needed to learn whether the file is longer,
                # without loading a large file whole.
                text = f.read(max_chars + 1)
        except UnicodeDecodeError as exc:
            raise ToolInputError(
                f"{path!r} is not UTF-8 text (a binary file?); only text files can be read"
            ) from exc
        finally:
            os.close(fd)
        if "\x00" in text:
            raise ToolInputError(
                f"{path!r} contains NUL bytes, so it is binary; only text files can be read"
            )
        if len(text) <= max_chars:
            return text
        return (
            f"{text[:max_chars]}\n[truncated: showing the first {max_chars:,} characters "
            f"of {info.st_size:,} bytes]"
        )

    def list_files(self, limit: int | None = None) -> list[str]:
        """The workspace's files as relative POSIX paths, sorted; the first ``limit`` if given.

        Symlinks, FIFOs and other entries that are not folders are listed by name; no
        symlink is followed, so a link to a folder outside does not pull that folder into
        the listing. The walk is bounded, since code in the sandbox can plant any tree: it
        looks 16 folders deep and stops after 10,000 entries or 1,000,000 characters of
        paths, and only ``limit`` names are kept while it runs.
        """
        with contextlib.closing(_FileWalk(self.root)) as walk:
            return _first(walk, limit)

    def _names(self, path: str) -> tuple[str, ...]:
        """The names from the root to ``path``, with ``.`` and ``..`` settled on the text.

        Since the kernel never sees a ``..``, no folder on the way, however it is linked,
        can lead out of the workspace.
        """
        if not path or not path.strip():
            raise WorkspaceEscapeError(path, "is empty")
        if "\x00" in path:
            raise WorkspaceEscapeError(path, "contains a NUL byte")
        try:
            path.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WorkspaceEscapeError(
                path, f"has a character that is not valid Unicode text at index {exc.start}"
            ) from exc
        normal = PurePosixPath(posixpath.normpath(path))
        if normal.is_absolute():
            if not normal.is_relative_to(self.root):
                raise WorkspaceEscapeError(path, "is an absolute path outside the workspace")
            normal = normal.relative_to(self.root)
        if normal.parts[:1] == ("..",):
            raise WorkspaceEscapeError(path, "uses '..' to leave the workspace")
        return normal.parts

    @contextlib.contextmanager
    def _folder(self, path: str, names: Sequence[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``names`` below the root, opened without following."""
        try:
            with _nofollow.opened_folder(self.root) as root_fd:
                folder = _nofollow.open_folder(root_fd, names, create=create)
        except _nofollow.SymlinkOnTheWay:
            raise self._symlink_error(path) from None
        with _nofollow.closing_fd(folder):
            yield folder

    def _open_for_reading(self, path: str, names: Sequence[str]) -> tuple[int, os.stat_result]:
        """Open the regular file at ``path`` for reading; return its descriptor and fstat."""
        missing = f"there is no file {path!r} in the workspace"
        try:
            with self._folder(path, names[:-1]) as folder:
                # Looking first keeps a FIFO or a socket from being opened at all; the fstat
                # below decides, for whatever the name is by the time it is opened.
                entry = _nofollow.entry_at(folder, names[-1])
                if entry is None:
                    raise ToolInputError(f"{missing}. {self._listing()}")
                self._check_readable(path, entry)
                fd = os.open(names[-1], _nofollow.READ_FLAGS, dir_fd=folder)
        except (FileNotFoundError, NotADirectoryError):
            raise ToolInputError(f"{missing}. {self._listing()}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # It became a symlink after it was looked at.
                raise self._symlink_error(path) from None
            raise ToolInputError(f"cannot read {path!r}: {exc.strerror or exc}") from exc
        try:
            info = os.fstat(fd)
            self._check_readable(path, info)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def _check_readable(self, path: str, info: os.stat_result) -> None:
        if stat.S_ISLNK(info.st_mode):
            raise self._symlink_error(path)
        if stat.S_ISDIR(info.st_mode):
            raise ToolInputError(f"{path!r} is a folder, not a file. {self._listing()}")
        if problem := _not_a_plain_file(info):
            raise ToolInputError(f"{path!r} {problem}")

    def _symlink_error(self, path: str) -> WorkspaceEscapeError:
        return WorkspaceEscapeError(
            path, "goes through a symlink, and the workspace tools do not follow symlinks"
        )

    def _folder_error(self, path: str) -> ToolInputError:
        example = f"{path.rstrip('/')}/notes.txt"
        return ToolInputError(
            f"{path!r} is a folder; give a file path inside it, such as {example!r}"
        )

    def _listing(self) -> str:
        with contextlib.closing(_FileWalk(self.root)) as walk:
            files = _first(walk, _LISTED_FILES)
        if walk.stopped:
            more = f" and more (the listing stopped after {walk.entries:,} entries)"
        elif walk.files > len(files):
            more = f" and {walk.files - len(files)} more"
        else:
            more = ""
        if not files:
            return "The workspace has no files yet." if not more else f"No files found{more}."
        return f"Files in the workspace: {', '.join(files)}{more}."


def _first(paths: Iterable[str], limit: int | None) -> list[str]:
    # nsmallest keeps only ``limit`` names while the walk streams past it.
    return sorted(paths) if limit is None else heapq.nsmallest(limit, paths)


class _FileWalk:
    """The files below a folder, streamed depth first with a descriptor per open folder.

    Each folder is opened relative to the one above it with ``O_NOFOLLOW | O_DIRECTORY``, so
    a folder swapped for a symlink is skipped, never followed; at most 17 folders are open.
    The walk ends early at the limits above, and says so in ``stopped``.

    Attributes:
        entries: Entries looked at so far.
        files: Files found so far.
        stopped: The walk ended at a limit before it saw everything.
    """

    def __init__(self, root: Path) -> None:
        self.entries = 0
        self.files = 0
        self.stopped = False
        self._chars = 0
        self._open: list[tuple[tuple[str, ...], int, os._ScandirIterator[str]]] = []
        fd = os.open(root, _nofollow.FOLDER_FLAGS)
        self._push((), fd)

    def _push(self, names: tuple[str, ...], fd: int) -> None:
        try:
            entries = os.scandir(fd)
        except BaseException:
            os.close(fd)
            raise
        self._open.append((names, fd, entries))

    def _pop(self) -> None:
        _, fd, entries = self._open.pop()
        entries.close()
        os.close(fd)

    def __iter__(self) -> Iterator[str]:
        while self._open:
            names, fd, entries = self._open[-1]
            try:
                entry = next(entries, None)
            except OSError:
                entry = None  # Changed while being listed.
            if entry is None:
                self._pop()
                continue
            self.entries += 1
            if self.entries > _MAX_LISTED_ENTRIES or self._chars > _MAX_LISTED_CHARS:
                self.stopped = True
                return
            if entry.is_dir(follow_symlinks=False):
                if len(names) < _MAX_LISTED_DEPTH:
                    try:
                        child = os.open(entry.name, _nofollow.FOLDER_FLAGS, dir_fd=fd)
                    except OSError:
                        continue  # Changed while being listed.
                    self._push((*names, entry.name), child)
                continue
            path = "/".join((*names, entry.name))
            self.files += 1
            self._chars += len(path)
            yield path

    def close(self) -> None:
        while self._open:
            self._pop()


@dataclass(frozen=True, kw_only=True, slots=True)
class Artifact:
    """A saved deliverable of a task."""

    name: str
    """The plain file name it was saved under."""
    path: Path
    size_bytes: int
    """Its size on disk, in bytes of UTF-8."""


class ArtifactStore(_TaskFolder):
    """A flat folder of a task's deliverables, each under a plain file name.

    The folder is not mounted in the sandbox, but it is written the same way as the
    workspace (through a descriptor of the folder, a new file renamed into place), and only
    regular files are listed, so a symlink that got there somehow is never followed.

    Args:
        root: The folder; created if missing.
        max_bytes: Largest content ``save`` accepts, in UTF-8 bytes.
        quota: What the task's files may hold: a save past it is refused. None: no quota.
        counted: The task's other folders that count against ``quota`` (its workspace).
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = MAX_WRITE_BYTES,
        quota: WorkspaceQuota | None = None,
        counted: Sequence[Path] = (),
    ) -> None:
        super().__init__(root, quota=quota, counted=counted)
        self.max_bytes = max_bytes

    def save(self, name: str, content: str) -> Artifact:
        """Save ``content`` under ``name``, replacing an artifact of the same name.

        Raises:
            ToolInputError: ``name`` is not a plain file name, or the content is too large.
            WorkspaceQuotaExceeded: The save would take the task's files past their quota.
        """
        if not _ARTIFACT_NAME.fullmatch(name):
            raise ToolInputError(
                f"artifact name {name!r} is not allowed; use a plain file name of up to 100 "
                "letters, digits, '.', '_' or '-', not starting with '.', such as 'report.md'"
            )
        size = _utf8_size(content)
        if size > self.max_bytes:
            raise ToolInputError(
                f"artifact {name!r} is {size:,} bytes; the limit is {self.max_bytes:,} bytes; "
                "shorten it or split it into several artifacts"
            )
        # The temporary file's hidden name never matches _ARTIFACT_NAME, so list() skips a
        # leftover one.
        with _nofollow.opened_folder(self.root) as folder:
            existing = _nofollow.entry_at(folder, name)
            self._check_quota(f"save_artifact {name!r} ({size:,} bytes)", size, existing)
            _nofollow.replace_file(folder, name, content.encode("utf-8"))
        return Artifact(name=name, path=self.root / name, size_bytes=size)

    def list(self) -> builtins.list[Artifact]:
        """Every artifact saved so far, sorted by name."""
        artifacts: builtins.list[Artifact] = []
        with _nofollow.opened_folder(self.root) as folder:
            for name in sorted(os.listdir(folder)):
                entry = _nofollow.entry_at(folder, name) if _ARTIFACT_NAME.fullmatch(name) else None
                if entry and stat.S_ISREG(entry.st_mode):
                    artifacts.append(
                        Artifact(name=name, path=self.root / name, size_bytes=entry.st_size)
                    )
        return artifacts


def delete_folder(path: Path) -> TaskFilesUsage:
    """Delete a task's folder (its workspace, its artifacts) and return what it held.

    Sandboxed code may have planted symlinks in it: none is followed, in the measure or in
    the deletion (``_nofollow.remove_tree``: from descriptors, without recursion), so a
    link to the ledger or a host folder is removed, never what it points to.
    """
    usage = task_files_usage([path], stop_after_files=_EVERY_FILE)
    _nofollow.remove_tree(path)
    return usage


_EVERY_FILE = 1 << 62
"""No bound on the measure of a folder that is deleted: every file of it is visited anyway."""
