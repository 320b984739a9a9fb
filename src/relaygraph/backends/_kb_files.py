"""The files a knowledge base indexes: which are found in a folder, how each is read, its title.

Markdown and text files are found in sorted order, a folder's own files before its
subfolders, hidden files and folders left out. Only regular files that lie inside the folder
are read. The walk works on descriptors, with the helpers of :mod:`._nofollow`: each folder
and file is opened by one name relative to a descriptor of the folder above it, with
``O_NOFOLLOW``, so no symlink is followed, whether it names a file or a folder and whether it
leads inside the folder or out (a clone of someone's repository may hold a link to
``~/.ssh``). A file is looked at before it is opened and opened with ``O_NONBLOCK``, then
checked again with ``fstat``, so a FIFO, socket or device is never read and never blocks the
indexer. What is skipped (such entries, a file too large or not UTF-8, one that cannot be
read) is returned with the reason, for the index report.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from relaygraph.backends._nofollow import (
    MAX_SCAN_DEPTH,
    READ_FLAGS,
    SymlinkOnTheWay,
    entry_at,
    open_folder,
    opened_folder,
    special_kind,
)

__all__ = [
    "INDEXED_SUFFIXES",
    "MAX_FILE_BYTES",
    "SYMLINK_REASON",
    "FolderFiles",
    "LoadedFile",
    "read_folder",
    "title_of",
]

MAX_FILE_BYTES = 2 * 1024 * 1024
"""Size in bytes above which a file is skipped: such files are rarely notes, and crowd the index."""

INDEXED_SUFFIXES = frozenset({".md", ".markdown", ".txt"})

SYMLINK_REASON = "a symlink, which the knowledge base never follows"
"""Why a symlink in a folder is skipped, whatever it points to."""

_TOO_DEEP = "more than {levels} folders below the indexed folder, not looked into"

_HEADING = re.compile(r"^#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedFile:
    """A file read for indexing: where it is, its text and the hash of its bytes."""

    path: Path
    relative: Path
    text: str
    content_hash: str


_Found = tuple[Path, LoadedFile | str]
"""A file or folder met by the walk, with the file read from it or the reason it is skipped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FolderFiles:
    """What :func:`read_folder` found in a folder, in the order it was walked."""

    found: tuple[LoadedFile, ...]
    skipped: tuple[tuple[Path, str], ...]
    """Files and folders not indexed, each with the reason."""


def read_folder(root: Path) -> FolderFiles:
    """Read the Markdown and text files under the folder ``root``, recursively.

    Args:
        root: An absolute path without symlinks (a resolved path), chosen by a person.

    Raises:
        OSError: ``root`` itself cannot be opened as a folder.
    """
    found: list[LoadedFile] = []
    skipped: list[tuple[Path, str]] = []
    with opened_folder(root) as top:
        for path, loaded in _walk(top, root):
            if isinstance(loaded, str):
                skipped.append((path, loaded))
            else:
                found.append(loaded)
    return FolderFiles(found=tuple(found), skipped=tuple(skipped))


def _walk(top: int, root: Path) -> Iterator[_Found]:
    """Depth first without recursing, one descriptor open per level of the folder walked."""
    # Each level: a folder's descriptor, its path, and its subfolders still to walk, last
    # first so that pop() takes the next in sorted order.
    levels: list[tuple[int, Path, list[str]]] = []
    try:
        levels.append((os.dup(top), root, []))
        levels[-1][2].extend(reversed((yield from _read_files(levels[-1][0], root, root))))
        while levels:
            fd, folder, pending = levels[-1]
            if not pending:
                os.close(fd)
                levels.pop()
                continue
            path = folder / pending.pop()
            if len(levels) > MAX_SCAN_DEPTH:
                yield path, _TOO_DEEP.format(levels=MAX_SCAN_DEPTH)
                continue
            try:
                sub = open_folder(fd, [path.name])
            except SymlinkOnTheWay:
                # It was a folder when listed and was replaced by a symlink since.
                yield path, SYMLINK_REASON
                continue
            except OSError as exc:
                yield path, f"folder cannot be read: {exc.strerror or exc}"
                continue
            levels.append((sub, path, []))
            levels[-1][2].extend(reversed((yield from _read_files(sub, path, root))))
    finally:
        for fd, _, _ in levels:
            os.close(fd)


def _read_files(dir_fd: int, folder: Path, root: Path) -> Generator[_Found, None, list[str]]:
    """Read the indexed files of one folder, in sorted order; return its subfolders' names."""
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        yield folder, f"folder cannot be listed: {exc.strerror or exc}"
        return []
    subfolders: list[str] = []
    for name in names:
        if name.startswith("."):
            continue
        path = folder / name
        try:
            info = entry_at(dir_fd, name)
        except OSError as exc:
            yield path, f"cannot be read: {exc.strerror or exc}"
            continue
        if info is None:
            continue  # Removed since the folder was listed.
        if stat.S_ISDIR(info.st_mode):
            subfolders.append(name)
        elif stat.S_ISLNK(info.st_mode):
            # Reported whatever its name: it may stand for a folder of notes.
            yield path, SYMLINK_REASON
        elif path.suffix.lower() in INDEXED_SUFFIXES:
            yield path, _load(dir_fd, name, path, root, info)
    return subfolders


def _load(
    dir_fd: int, name: str, path: Path, root: Path, entry: os.stat_result
) -> LoadedFile | str:
    """Read the file ``name`` of the folder ``dir_fd``, or return the reason it is skipped."""
    # Looking first keeps a FIFO or a device from being opened at all; the fstat below
    # decides for whatever the name is by the time it is opened.
    if problem := _not_a_regular_file(entry):
        return problem
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # It became a symlink after it was looked at.
            return SYMLINK_REASON
        return f"cannot be read: {exc.strerror or exc}"
    # O_NONBLOCK does nothing to reads of a regular file, the only kind read here.
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        if problem := _not_a_regular_file(info):
            return problem
        if info.st_size > MAX_FILE_BYTES:
            return _too_large(info.st_size)
        try:
            data = file.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            return f"cannot be read: {exc.strerror or exc}"
    if len(data) > MAX_FILE_BYTES:  # It grew since the fstat.
        return _too_large(len(data))
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


def _not_a_regular_file(info: os.stat_result) -> str | None:
    """Why an entry with this (l)stat is not read as a file, or None if it is read."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return SYMLINK_REASON
    return f"{special_kind(mode)}, not a regular file"


def _too_large(size: int) -> str:
    return f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MB ({size} bytes)"


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
