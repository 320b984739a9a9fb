"""LeaseKeeper tells the run of a cancel it finds in the ledger (no watcher thread needed)."""

from __future__ import annotations

import threading

from relaygraph.runner._lease import LeaseKeeper


class _Ledger:
    def __init__(self) -> None:
        self.cancel = threading.Event()

    def renew_lease(self, task_id: str, runner_id: str, *, seconds: float) -> bool:
        return True

    def cancel_requested(self, task_id: str) -> bool:
        return self.cancel.is_set()


def test_a_cancel_found_in_the_ledger_calls_back_once() -> None:
    ledger = _Ledger()
    cancel = threading.Event()
    heard = threading.Event()
    calls: list[str] = []
    keeper = LeaseKeeper(ledger, "task-1", "runner-1", seconds=0.03, cancel=cancel)
    try:
        keeper.when_cancelled(lambda: (calls.append("cancel"), heard.set()))
        ledger.cancel.set()
        assert heard.wait(2)
        assert cancel.is_set()
    finally:
        keeper.close()
    assert calls == ["cancel"]


def test_a_cancel_set_before_is_told_at_once() -> None:
    cancel = threading.Event()
    cancel.set()
    keeper = LeaseKeeper(_Ledger(), "task-1", "runner-1", seconds=30, cancel=cancel)
    calls: list[str] = []
    try:
        keeper.when_cancelled(lambda: calls.append("cancel"))
    finally:
        keeper.close()
    assert calls == ["cancel"]
