"""A worker publishes the next tasks one publish at a time: the asks that come while one
runs are answered by one more round of it, and none is lost."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from relaygraph.worker import WorkerRuntime

WAIT_SECONDS = 60


def test_publishes_asked_for_at_once_make_one_more_read_and_none_is_lost() -> None:
    entered, release = threading.Event(), threading.Event()
    reads: list[int] = []

    class Ledger:
        def tasks_to_publish(self, **_: Any) -> list[str]:
            reads.append(len(reads))
            if len(reads) == 1:  # The first publish reads while the others ask.
                entered.set()
                release.wait(WAIT_SECONDS)
            return []

    runtime = SimpleNamespace(
        publish=lambda task_id, dispatch: None,
        ledger=Ledger(),
        publish_ahead=None,
        max_running=None,
        _publishing=threading.Lock(),
        _publish_asked=threading.Event(),
    )
    first = threading.Thread(target=WorkerRuntime._publish_fair, args=(runtime, "first"))
    first.start()
    assert entered.wait(WAIT_SECONDS)
    others = [
        threading.Thread(target=WorkerRuntime._publish_fair, args=(runtime, f"task {n}"))
        for n in range(8)
    ]
    for thread in others:
        thread.start()
    for thread in others:  # They return at once: the publish under way goes round for them.
        thread.join(WAIT_SECONDS)
        assert not thread.is_alive()
    release.set()
    first.join(WAIT_SECONDS)
    assert reads == [0, 1]  # The first read, and one more for the eight asks after it.
    WorkerRuntime._publish_fair(runtime, "later")  # nothing runs: this one reads itself
    assert reads == [0, 1, 2]
