"""The files a knowledge base indexes: which are found in a folder, how each is read, its title.

Markdown and text files are found in sorted order, hidden files and folders left out; one
that is too large or not UTF-8 is skipped with the reason, for the index report.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INDEXED_SUFFIXES",
    "MAX_FILE_BYTES",
    "LoadedFile",
    "candidate_files",
    "load_file",
    "title_of",
]

MAX_FILE_BYTES = 2 * 1024 * 1024
"""Size in bytes above which a file is skipped: such files are rarely notes, and crowd the index."""

INDEXED_SUFFIXES = frozenset({".md", ".markdown", ".txt"})


_HEADING = re.compile(r"^#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedFile:
    """A file read for indexing: where it is, its text and the hash of its bytes."""

    path: Path
    relative: Path
    text: str
    content_hash: str


def candidate_files(root: Path) -> Iterator[Path]:
    """The Markdown and text files under ``root``, a folder's own files before its subfolders."""
    # os.walk lets hidden directories (.git, .venv) be pruned without descending into them,
    # and does not follow directory symlinks, so a link cycle cannot loop forever.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if not name.startswith(".") and path.suffix.lower() in INDEXED_SUFFIXES:
                yield path


def load_file(path: Path, root: Path) -> LoadedFile | str:
    """Read one file, or return the reason it is skipped."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MB ({size} bytes)"
        data = path.read_bytes()
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    try:
        # utf-8-sig drops the byte-order mark some editors write, which would end up in titles.
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start} cannot be decoded)"
    return LoadedFile(
        path=path,
        relative=path.relative_to(root),
        text=text,
        content_hash=hashlib.sha256(data).hexdigest(),
    )


def title_of(text: str, path: Path) -> str:
    """The first level-1 Markdown heading outside code fences, else the file stem."""
    fence: str | None = None
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if opening:
            if fence is None:
                fence = opening.group(1)
            elif opening.group(1) == fence:
                fence = None
            continue
        if fence is None and (heading := _HEADING.match(line)):
            return heading.group(1).strip()
    return path.stem
