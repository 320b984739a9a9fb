"""Checks a command makes of its surroundings before it starts, so that a data directory,
a ledger, an address or a folder it cannot use is one error line naming it, not a
traceback from deep inside a run (or a run's worth of work lost at the end).

Each check raises :class:`~relaygraph.errors.ConfigError`, which ``relaygraph`` prints as
``relaygraph: error: ...`` with exit code 2. Heavy modules are imported inside the checks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from pathlib import Path

from relaygraph.errors import ConfigError

__all__ = ["check_bind", "check_folder", "check_ledger", "data_directory", "ledger_url"]

HOME_ENV = "RELAYGRAPH_HOME"


def data_directory(home: Path | None) -> Path:
    """The data directory (``--home``, else ``$RELAYGRAPH_HOME``, else ``~/.relaygraph``),
    made if needed.

    Raises:
        ConfigError: It cannot be made or used (a file, a folder that cannot be made, one
            whose tasks folder cannot be); the message says where the path came from.
    """
    from relaygraph._home import DEFAULT_HOME, data_home

    try:
        return data_home(home)
    except OSError as exc:
        chosen = home if home is not None else os.environ.get(HOME_ENV) or DEFAULT_HOME
        if home is not None:
            where = f"--home {str(home)!r}"
        elif os.environ.get(HOME_ENV):
            where = f"${HOME_ENV} {str(chosen)!r}"
        else:
            where = repr(str(chosen))
        path = Path(chosen).expanduser()
        reason = "it is not a folder" if path.exists() and not path.is_dir() else _reason(exc)
        raise ConfigError(f"cannot use the data directory {where}: {reason}") from None


def ledger_url(home: Path | None) -> str | None:
    """The ledger's URL for the CLI: None when ``$RELAYGRAPH_DATABASE_URL`` names it, else
    SQLite in the data directory (made if needed)."""
    from relaygraph.store import DATABASE_URL_ENV

    if os.environ.get(DATABASE_URL_ENV):
        return None
    return f"sqlite:///{data_directory(home) / 'ledger.sqlite'}"


def check_ledger(url: str | None) -> None:
    """Connect to the ledger at ``url`` (None: ``$RELAYGRAPH_DATABASE_URL``) once.

    Raises:
        ConfigError: ``cannot reach the ledger at URL: reason`` (the URL without its
            password): the server is down, the database missing, the SQLite file's folder
            cannot be made; or the URL itself is invalid.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from relaygraph.store import Ledger, database_url

    resolved = database_url(url)
    shown = make_url(resolved).render_as_string(hide_password=True)
    try:
        with Ledger(resolved) as ledger:
            ledger.is_current()
    except DBAPIError as exc:
        reason = " ".join(str(exc.orig).split("\n", 1)[0].split())
        raise ConfigError(f"cannot reach the ledger at {shown}: {reason}") from None
    except OSError as exc:
        raise ConfigError(f"cannot reach the ledger at {shown}: {_reason(exc)}") from None


def check_bind(host: str, port: int) -> None:
    """Bind ``host``:``port`` for a moment, as the server will, so that an address that is
    not this host's or a port in use is refused before the server says it serves there.

    Every address the host resolves to is tried, with ``SO_REUSEADDR`` as asyncio's server
    sets it (a port whose last connections linger in TIME_WAIT is free to it).

    Raises:
        ConfigError: The host does not resolve or is not this machine's, or the port is
            in use or not allowed.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(f"cannot serve on --host {host!r}: {reason}") from None
    for family, kind, protocol, _name, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise ConfigError(
                        f"cannot serve on --port {port} of {host!r}: {exc.strerror}"
                    ) from None
                raise ConfigError(f"cannot serve on --host {host!r}: {exc.strerror}") from None


def check_folder(folder: Path, flag: str, *, holds: str) -> None:
    """Make ``folder`` and write a file in it, then remove both again, so that a folder
    that cannot hold ``holds`` (the output) is refused before the work that fills it.

    Raises:
        ConfigError: It is a file, cannot be made, or cannot be written.
    """
    path = folder.expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {str(folder)!r} is a file; name a folder for {holds}")
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".relaygraph-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{flag} {str(folder)!r} cannot be written, so {holds} could not be: {_reason(exc)}"
        ) from None
    finally:
        # The check leaves nothing behind: the command makes the folder when it writes.
        for made in missing:
            with contextlib.suppress(OSError):
                made.rmdir()


def _reason(exc: OSError) -> str:
    """``No such file or directory: '/proc/nope'``: the error without its errno."""
    if exc.strerror is None:
        return str(exc)
    return f"{exc.strerror}: {exc.filename!r}" if exc.filename else exc.strerror
