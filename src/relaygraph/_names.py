"""The names the team graph, the ledger, the tracers and the models share, defined once.

Stdlib only, so that the lightest modules (the ledger, a model's tool-call grammar) read
them without importing the team graph. A name here is part of what is stored: events, ledger
rows and checkpoints hold these strings, so changing one changes the record.
"""

from __future__ import annotations

__all__ = [
    "ANSWER_NAME",
    "BEGIN",
    "FINALIZE",
    "FINISH",
    "HANDOFF_PREFIX",
    "RESERVED_NAMES",
    "SUPERVISOR",
]

SUPERVISOR = "supervisor"
"""The supervisor's node and role: it routes work (``route`` events name it as the source)."""
FINALIZE = "finalize"
"""The node and role that writes the team's answer."""
BEGIN = "begin"
"""The node that opens each request of a thread (a new turn)."""
FINISH = "FINISH"
"""The route that sends no more work: the request is done."""
HANDOFF_PREFIX = "transfer_to_"
"""Every transfer tool is named ``transfer_to_<agent>``."""
ANSWER_NAME = "relaygraph"
"""The ``name`` of the team's answer message in the thread's conversation."""
RESERVED_NAMES = frozenset({SUPERVISOR, FINALIZE, FINISH, BEGIN, "__start__", "__end__"})
"""Names an agent may not take: the team graph's own nodes and routes, LangGraph's ends."""
