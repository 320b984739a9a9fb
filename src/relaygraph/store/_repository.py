"""What every repository of the ledger starts from: the one core the facade gives them all."""

from __future__ import annotations

from relaygraph.store._core import LedgerCore


class Repository:
    """One job of the ledger (tasks, events, approvals, ...), done through the ledger's core.

    The :class:`~relaygraph.store.Ledger` facade makes one of each, all given its one
    :class:`LedgerCore`: the engines, the sessions and the ``NOTIFY`` channel are shared,
    so a repository holds no connection of its own.
    """

    def __init__(self, core: LedgerCore) -> None:
        self._core = core
