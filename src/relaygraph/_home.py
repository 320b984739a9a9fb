"""The data directory: everything relaygraph writes lives under ``$RELAYGRAPH_HOME``."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path("~/.relaygraph")


def data_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the data directory, creating it if needed.

    Args:
        explicit: A directory chosen by the caller; wins over ``$RELAYGRAPH_HOME``.
    """
    raw = explicit if explicit is not None else os.environ.get("RELAYGRAPH_HOME") or DEFAULT_HOME
    home = Path(raw).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home
