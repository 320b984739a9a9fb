"""The ledger of a data directory, opened once per process."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relaygraph.store import Ledger

__all__ = ["ledger_for"]

_LEDGERS: OrderedDict[str, Ledger] = OrderedDict()
_LEDGERS_LOCK = threading.Lock()
_LEDGERS_KEPT = 4


def ledger_for(home: Path) -> Ledger:
    """The ledger: ``$RELAYGRAPH_DATABASE_URL`` if set, else SQLite in the data directory.

    Opened with its schema brought up to date, so a first run needs no set-up step, and
    kept for the process (the last few databases used): opening one (an engine, a schema
    check, a cold statement cache) cost each ``run_task`` about 8 ms. A caller may still
    ``close()`` it: that only empties its connection pool, which refills on the next use.
    """
    from relaygraph.store import DATABASE_URL_ENV, Ledger

    env_url = os.environ.get(DATABASE_URL_ENV)
    url = None if env_url else f"sqlite:///{home / 'ledger.sqlite'}"
    key = url or f"env:{env_url}"
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get(key)
        if ledger is not None:
            _LEDGERS.move_to_end(key)
            return ledger
    ledger = Ledger(url)
    if not ledger.is_current():
        ledger.upgrade()
    with _LEDGERS_LOCK:
        kept = _LEDGERS.setdefault(key, ledger)
        _LEDGERS.move_to_end(key)
        while len(_LEDGERS) > _LEDGERS_KEPT:
            _LEDGERS.popitem(last=False)[1].close()
    if kept is not ledger:  # Another thread opened it meanwhile.
        ledger.close()
    return kept
