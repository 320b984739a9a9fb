"""A task's files: the coder's workspace folder and the writer's artifact store.

Every path a model passes in is resolved inside the folder, following symlinks, and refused
if it would land outside. The refusals are :class:`~relaygraph.errors.ToolInputError`, whose
message the model reads as the tool result, so each one says what to do instead.
"""

from __future__ import annotations

import builtins
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from relaygraph.errors import ToolInputError

__all__ = ["Artifact", "ArtifactStore", "Workspace", "WorkspaceEscapeError"]

MAX_WRITE_BYTES = 1_000_000
"""Largest text a tool may write in one call (1 MB), in UTF-8 bytes."""

_LISTED_FILES = 20
"""How many existing files a "no such file" message names."""

_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


class WorkspaceEscapeError(ToolInputError):
    """A path is empty, malformed, or resolves outside the task's workspace.

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


class Workspace:
    """The folder a task's coder may read and write; nothing outside it is reachable.

    Args:
        root: The folder; created if missing.
        max_write_bytes: Largest content ``write_text`` accepts, in UTF-8 bytes.

    Attributes:
        root: The folder, fully resolved (symlinks followed).
    """

    def __init__(self, root: Path, *, max_write_bytes: int = MAX_WRITE_BYTES) -> None:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        # Resolved once so containment checks compare real paths with a real root.
        self.root: Path = root.resolve()
        self.max_write_bytes = max_write_bytes

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, path: str) -> Path:
        """Return the real location of ``path`` (relative to the root), if it is inside.

        Absolute paths are accepted only when they point inside the root. Symlinks are
        followed, so a link inside the workspace that points outside is refused.

        Raises:
            WorkspaceEscapeError: ``path`` is empty, has a NUL byte, or lands outside.
        """
        if not path or not path.strip():
            raise WorkspaceEscapeError(path, "is empty")
        if "\x00" in path:
            raise WorkspaceEscapeError(path, "contains a NUL byte")
        # resolve() follows every symlink, including a final one that dangles, so the check
        # below sees where a read or write would really go.
        try:
            resolved = (self.root / path).resolve()
        except RuntimeError as exc:
            # Python 3.11 reports a symlink loop this way.
            raise WorkspaceEscapeError(path, "goes through a symlink loop") from exc
        if resolved.is_relative_to(self.root):
            return resolved
        if Path(path).is_absolute():
            raise WorkspaceEscapeError(path, "is an absolute path outside the workspace")
        if ".." in Path(path).parts:
            raise WorkspaceEscapeError(path, "uses '..' to leave the workspace")
        raise WorkspaceEscapeError(path, "goes through a symlink that leads outside")

    def write_text(self, path: str, content: str) -> Path:
        """Write ``content`` as UTF-8 to ``path``, creating parent folders; replace any file.

        Returns:
            The real path written.

        Raises:
            WorkspaceEscapeError: ``path`` is outside the workspace.
            ToolInputError: The content is too large, or ``path`` is a folder or lies
                under a file.
        """
        target = self.resolve(path)
        size = _utf8_size(content)
        if size > self.max_write_bytes:
            raise ToolInputError(
                f"content for {path!r} is {size:,} bytes; the limit is "
                f"{self.max_write_bytes:,} bytes per file; split it into smaller files"
            )
        if target == self.root or target.is_dir():
            example = f"{path.rstrip('/')}/notes.txt"
            raise ToolInputError(
                f"{path!r} is a folder; give a file path inside it, such as {example!r}"
            )
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except (NotADirectoryError, FileExistsError) as exc:
            raise ToolInputError(
                f"cannot write {path!r}: a part of the path is an existing file, not a folder"
            ) from exc
        return target

    def read_text(self, path: str, max_chars: int = 20000) -> str:
        """Read up to ``max_chars`` characters of a UTF-8 text file.

        A longer file is cut, with a note at the end saying so and how large it is.

        Raises:
            WorkspaceEscapeError: ``path`` is outside the workspace.
            ToolInputError: There is no such file, it is a folder, or it is not UTF-8 text.
        """
        target = self.resolve(path)
        if target.is_dir():
            raise ToolInputError(f"{path!r} is a folder, not a file. {self._listing()}")
        if not target.is_file():
            raise ToolInputError(f"there is no file {path!r} in the workspace. {self._listing()}")
        try:
            with target.open(encoding="utf-8", errors="strict") as f:
                # Read one character more than needed to learn whether the file is longer,
                # without loading a large file whole.
                text = f.read(max_chars + 1)
        except UnicodeDecodeError as exc:
            raise ToolInputError(
                f"{path!r} is not UTF-8 text (a binary file?); only text files can be read"
            ) from exc
        if "\x00" in text:
            raise ToolInputError(
                f"{path!r} contains NUL bytes, so it is binary; only text files can be read"
            )
        if len(text) <= max_chars:
            return text
        size = target.stat().st_size
        return (
            f"{text[:max_chars]}\n[truncated: showing the first {max_chars:,} characters "
            f"of {size:,} bytes]"
        )

    def list_files(self) -> list[str]:
        """Every file in the workspace as a relative POSIX path, sorted.

        Symlinks are listed but not followed into, so a link to a folder outside does not
        pull that folder into the listing.
        """
        found: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(self.root):
            base = Path(dirpath).relative_to(self.root)
            found.extend((base / name).as_posix() for name in filenames)
        return sorted(found)

    def _listing(self) -> str:
        files = self.list_files()
        if not files:
            return "The workspace has no files yet."
        shown = ", ".join(files[:_LISTED_FILES])
        more = f" and {len(files) - _LISTED_FILES} more" if len(files) > _LISTED_FILES else ""
        return f"Files in the workspace: {shown}{more}."


@dataclass(frozen=True, kw_only=True, slots=True)
class Artifact:
    """A saved deliverable of a task."""

    name: str
    """The plain file name it was saved under."""
    path: Path
    size_bytes: int
    """Its size on disk, in bytes of UTF-8."""


class ArtifactStore:
    """A flat folder of a task's deliverables, each under a plain file name.

    Args:
        root: The folder; created if missing.
        max_bytes: Largest content ``save`` accepts, in UTF-8 bytes.
    """

    def __init__(self, root: Path, *, max_bytes: int = MAX_WRITE_BYTES) -> None:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self.root: Path = root.resolve()
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r})"

    def save(self, name: str, content: str) -> Artifact:
        """Save ``content`` under ``name``, replacing an artifact of the same name.

        Raises:
            ToolInputError: ``name`` is not a plain file name, or the content is too large.
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
        target = self.root / name
        # Write to a hidden temporary file and rename, so a reader never sees half an
        # artifact; hidden names never match _ARTIFACT_NAME, so list() skips leftovers.
        tmp = self.root / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            tmp.write_text(content, encoding="utf-8")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return Artifact(name=name, path=target, size_bytes=size)

    def list(self) -> builtins.list[Artifact]:
        """Every artifact saved so far, sorted by name."""
        artifacts = [
            Artifact(name=entry.name, path=entry, size_bytes=entry.stat().st_size)
            for entry in self.root.iterdir()
            if _ARTIFACT_NAME.fullmatch(entry.name) and entry.is_file()
        ]
        return sorted(artifacts, key=lambda a: a.name)
