"""The data directory: everything relaygraph writes lives under ``$RELAYGRAPH_HOME``."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DEFAULT_HOME = Path("~/.relaygraph")
TASKS_FOLDER = "tasks"
"""Every task's files (``tasks/<id>/workspace``, ``.../artifacts``) lie under this folder of
the data directory."""
PRIVATE_MODE = 0o700
"""The mode of a data directory relaygraph makes, and always of its tasks folder."""


def data_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory, creating it if needed.

    A data directory relaygraph makes is its owner's alone (mode 0700): it holds every
    tenant's tasks, the ledger and the checkpoints. Its tasks folder is made so, or made
    so again, whatever the data directory's own mode: code run in the sandbox writes files
    there with the server's user as their owner on the host (a copy of a setuid program,
    say), which no other user of the host may reach.

    Args:
        explicit: A directory chosen by the caller; wins over ``$RELAYGRAPH_HOME``.
    """
    raw = explicit if explicit is not None else os.environ.get("RELAYGRAPH_HOME") or DEFAULT_HOME
    home = Path(raw).expanduser().resolve()
    if not home.is_dir():
        home.parent.mkdir(parents=True, exist_ok=True)
        # Another process may have made it a moment ago (or it is no folder: the next fails).
        with contextlib.suppress(FileExistsError):
            home.mkdir(mode=PRIVATE_MODE)
    private_folder(home / TASKS_FOLDER)
    return home


def private_folder(path: Path) -> None:
    """Make ``path`` a folder only its owner may enter (mode 0700), or make it so."""
    try:
        path.mkdir(mode=PRIVATE_MODE)
    except FileExistsError:
        if stat.S_IMODE(path.lstat().st_mode) != PRIVATE_MODE and path.is_dir():
            path.chmod(PRIVATE_MODE)
