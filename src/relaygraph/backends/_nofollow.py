"""Opening paths below a folder without ever following a symlink.

The workspace tools run in the server on a folder that code in the sandbox can change at any
moment (see :mod:`relaygraph.backends.workspace`). Everything here works on descriptors: a path
is opened one name at a time, relative to a descriptor of the folder above it, and each name
with ``O_NOFOLLOW``, so there is no moment at which a symlink swapped in gets followed. The
kernel's ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` would do the walk in one call, but
Python has no binding for it; the walk gives the same guarantee on every kernel.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Generator, Iterator, Sequence
from typing import Any

# O_DIRECTORY makes the kernel refuse anything but a folder before opening it, so a FIFO or a
# device in a folder's place is never opened; O_NOFOLLOW refuses a symlink.
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer (fstat then
# refuses it); O_NOCTTY keeps a terminal from becoming the server's controlling terminal.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# O_EXCL with O_NOFOLLOW: the file is always new and ours, never an existing file, a symlink's
# target or another name of someone else's file.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def special_kind(mode: int) -> str:
    """What an entry that is not a regular file is, for a message: ``a socket``, ..."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a special file"


class SymlinkOnTheWay(Exception):
    """A folder on the way to a path is a symlink, which is never followed.

    Only raised inside the walk; the workspace turns it into a message for the model.
    """


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_folder(path: os.PathLike[str] | str) -> Iterator[int]:
    """A descriptor of the folder at ``path``, a path the server chose (not the sandbox)."""
    with closing_fd(os.open(path, FOLDER_FLAGS)) as fd:
        yield fd


def entry_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry ``name`` itself (a symlink is not followed), or None if there is none."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_folder(root_fd: int, names: Sequence[str], *, create: bool = False) -> int:
    """Open the folder ``names`` below ``root_fd``, one name at a time; return its descriptor.

    A descriptor stays on its folder even if the folder is moved, and the sandbox can move
    folders only within the workspace (a rename across its bind mount fails), so each step
    stays inside.

    Raises:
        SymlinkOnTheWay: A name on the way is a symlink.
        FileNotFoundError: A folder is missing (and ``create`` is false).
        NotADirectoryError: A name on the way is a file.
    """
    fd = os.dup(root_fd)
    try:
        for name in names:
            next_fd = _open_subfolder(fd, name, create=create)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_subfolder(dir_fd: int, name: str, *, create: bool) -> int:
    try:
        return os.open(name, FOLDER_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        # With O_DIRECTORY a symlink fails as "not a directory" (ELOOP on some kernels); look
        # at the entry itself only to say which it is. Nothing was followed either way.
        entry = entry_at(dir_fd, name)
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and entry and stat.S_ISLNK(entry.st_mode):
            raise SymlinkOnTheWay(name) from None
        raise
    # mkdirat, then open the new folder with O_NOFOLLOW again: if a symlink took its place
    # in between, the open fails instead of following it.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, dir_fd=dir_fd)
    return _open_subfolder(dir_fd, name, create=False)


def replace_file(dir_fd: int, name: str, data: bytes, *, mode: int | None = None) -> None:
    """Make ``name`` in the folder ``dir_fd`` a new regular file holding ``data``.

    The data goes to a fresh file under a random hidden name, which is then renamed to
    ``name``: whatever stood there (a file, a hard link, a symlink, a FIFO) is replaced, never
    written through, and a reader never sees half a file.

    Args:
        mode: Permission bits to give the file; by default those of a new file.
    """
    tmp = f".relaygraph-{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, CREATE_FLAGS, 0o666, dir_fd=dir_fd)
    try:
        with open(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def remove_tree(path: os.PathLike[str] | str) -> None:
    """Delete ``path`` and everything below it, following no symlink and never recursing.

    A symlink at ``path`` or anywhere below is removed, never followed. Instead of descending,
    each folder's subfolders are moved up into the top folder under fresh names, so the tree
    becomes flat and at most three descriptors are open however deep it was (``shutil.rmtree``
    recursed once per level and raised ``RecursionError`` in the server on a few thousand).
    What cannot be removed (a mount point, a file added while it runs) is left in place.
    """
    parent, name = os.path.split(os.path.abspath(path))
    with opened_folder(parent) as parent_fd:
        try:
            top = os.open(name, FOLDER_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            os.unlink(name, dir_fd=parent_fd)  # not a folder: a symlink or a file
            return
        with closing_fd(top):
            # A few passes, in case something was added while a pass ran.
            for _ in range(3):
                pending = _empty_folder(top, top)
                while pending:
                    folder = pending.pop()
                    try:
                        fd = os.open(folder, FOLDER_FLAGS, dir_fd=top)
                    except OSError:
                        with contextlib.suppress(OSError):
                            os.unlink(folder, dir_fd=top)
                        continue
                    with closing_fd(fd):
                        pending += _empty_folder(fd, top)
                    with contextlib.suppress(OSError):
                        os.rmdir(folder, dir_fd=top)
                if not os.listdir(top):
                    break
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=parent_fd)


def _empty_folder(fd: int, top: int) -> list[str]:
    """Unlink what is not a folder in ``fd``; move its folders into ``top``; return their names."""
    folders = []
    for entry in os.listdir(fd):
        info = entry_at(fd, entry)
        if info is None:
            continue
        if not stat.S_ISDIR(info.st_mode):
            with contextlib.suppress(OSError):
                os.unlink(entry, dir_fd=fd)
        elif fd == top:
            folders.append(entry)
        else:
            flat = f".rm-{secrets.token_hex(8)}"
            try:
                os.rename(entry, flat, src_dir_fd=fd, dst_dir_fd=top)
            except OSError:
                continue  # a mount point, or gone
            folders.append(flat)
    return folders


def walk_below(
    top: int, *, max_depth: int, max_entries: int | None = None
) -> Generator[tuple[int, str, os.stat_result], None, None]:
    """Every entry below the folder ``top`` (a descriptor, closed here), depth first: its
    folder's descriptor, its name and what it is, without following a symlink.

    Walks without recursing, a descriptor and a directory iterator open per level, folders
    at most ``max_depth`` levels deep, and stops after looking at ``max_entries`` entries
    (None: all). A folder is gone into after the caller had it, so the caller may give its
    owner the right to read it first. An entry that went away before it was looked at is
    passed over. Close the iterator (``contextlib.closing``) when stopping early, so that
    the descriptors are closed at once.
    """
    # The folders being walked, each with its iterator; closed as each is left.
    levels: list[tuple[int, Any]] = []

    def enter(fd: int) -> None:
        try:
            levels.append((fd, os.scandir(fd)))
        except OSError:
            os.close(fd)

    def leave() -> None:
        fd, entries = levels.pop()
        entries.close()
        os.close(fd)

    enter(top)
    seen = 0
    try:
        while levels and (max_entries is None or seen < max_entries):
            fd, entries = levels[-1]
            entry = next(entries, None)
            if entry is None:
                leave()
                continue
            seen += 1
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield fd, entry.name, info
            if stat.S_ISDIR(info.st_mode) and len(levels) <= max_depth:
                with contextlib.suppress(OSError):
                    enter(os.open(entry.name, FOLDER_FLAGS, dir_fd=fd))
    finally:
        while levels:
            leave()


SET_ID_BITS = stat.S_ISUID | stat.S_ISGID
MAX_SCAN_DEPTH = 256
"""Folders deeper than this below the top are not looked into by :func:`clear_set_id_bits`
(one descriptor is open per level)."""
MAX_SCAN_ENTRIES = 100_000
"""Entries :func:`clear_set_id_bits` looks at, at most: the walk runs after every sandboxed
run, and a workspace of millions of files must not make each run take minutes."""


def clear_set_id_bits(path: os.PathLike[str] | str) -> int:
    """Clear the setuid and setgid bits of what lies below ``path``; returns how many.

    Code in the sandbox runs as the server's user as far as the host sees, so a program it
    copies into the workspace and marks setuid would run as that user for anyone who can
    reach it. Call it once nothing of the sandbox runs any more. Walks depth first without
    following a symlink and without recursing, a descriptor and a directory iterator open
    per level (up to :data:`MAX_SCAN_DEPTH` levels and :data:`MAX_SCAN_ENTRIES` entries:
    a bound, not a guarantee; the data directory's private tasks folder is what keeps
    every other user away). A folder of the server's user that it may not read (the
    program took its own permissions away) is given them back first.
    """
    try:
        top = os.open(path, FOLDER_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    cleared = 0
    with contextlib.closing(
        walk_below(top, max_depth=MAX_SCAN_DEPTH, max_entries=MAX_SCAN_ENTRIES)
    ) as walk:
        for fd, name, info in walk:
            if stat.S_ISLNK(info.st_mode):
                continue
            mode = stat.S_IMODE(info.st_mode)
            wanted = mode & ~SET_ID_BITS
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
                # Its owner may walk it (and remove it) again: before the walk goes in.
                wanted |= stat.S_IRWXU
            if wanted != mode:
                with contextlib.suppress(OSError, NotImplementedError):
                    os.chmod(name, wanted, dir_fd=fd, follow_symlinks=False)
                    cleared += bool(mode & SET_ID_BITS)
    return cleared
