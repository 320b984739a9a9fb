"""The names the team graph, the ledger, the tracers and the models share, defined once.

Stdlib only, so that the lightest modules (the ledger, a model's tool-call grammar) read
them without importing the team graph. A name here is part of what is stored: events, ledger
rows and checkpoints hold these strings, so changing one changes the record.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANSWER_NAME",
    "BEGIN",
    "CITATION_PATTERN",
    "CUT_RESULT_CITES",
    "FINALIZE",
    "FINISH",
    "HANDOFF_PREFIX",
    "NO_CITED_ANSWER",
    "NO_RESULT",
    "PRIOR_CALLS_KEY",
    "REPLAYS_BY_POSITION",
    "RESERVED_NAMES",
    "SUPERVISOR",
    "USAGE_ESTIMATED_KEY",
]

SUPERVISOR: Final = "supervisor"
"""The supervisor's node and role: it routes work (``route`` events name it as the source)."""
FINALIZE: Final = "finalize"
"""The node and role that writes the team's answer."""
BEGIN: Final = "begin"
"""The node that opens each request of a thread (a new turn)."""
FINISH: Final = "FINISH"
"""The route that sends no more work: the request is done."""
HANDOFF_PREFIX: Final = "transfer_to_"
"""Every transfer tool is named ``transfer_to_<agent>``."""
ANSWER_NAME: Final = "relaygraph"
"""The ``name`` of the team's answer message in the thread's conversation."""
NO_RESULT: Final = "The team produced no result"
"""How the placeholder answer of a request no agent gave a result for begins: an answer
that begins so is no answer (``relaygraph.supervisor._verdict.non_answer``)."""
NO_CITED_ANSWER: Final = "No agent cited a document it read"
"""How the embedded model's answer begins when no agent's result cited a document the team
read: it quotes only what was read, so without a citation it has no answer to give, and an
answer that begins so is no answer (``relaygraph.supervisor._verdict.non_answer``)."""
CITATION_PATTERN: Final = r"\[([A-Za-z0-9][\w./@-]*)\]"
"""A ``[doc_id]`` cited in a text; the group is the id."""
CUT_RESULT_CITES: Final = " [...] (the cut text cites "
"""How an agent's result clipped in a team prompt ends when the cut text cited documents the
kept text does not: the marker, then those ``[doc_id]`` and ``)``. Who found a document
(finalize's ``found by``) survives the clip, and no cut sentence is quoted as if whole."""
RESERVED_NAMES = frozenset({SUPERVISOR, FINALIZE, FINISH, BEGIN, "__start__", "__end__"})
"""Names an agent may not take: the team graph's own nodes and routes, LangGraph's ends."""

REPLAYS_BY_POSITION: Final = "relaygraph_replays_by_position"
"""The attribute by which a chat model says it picks each reply by its position in its
role's history (the scripted model does): only such a model is told
:data:`PRIOR_CALLS_KEY`; every other model's calls carry nothing of it."""
PRIOR_CALLS_KEY: Final = "relaygraph_prior_calls"
"""``config["metadata"]`` and ``config["configurable"]`` key of the model calls the team
graph makes for a model that replays by position (:data:`REPLAYS_BY_POSITION`): how many
model calls the calling role (an agent, ``supervisor``, ``finalize``) made earlier in the
thread, as its usage records say. With the role's own AI messages in the conversation a call
is given, it is the call's index in the role's history, the same in a re-run step or a new
process."""
USAGE_ESTIMATED_KEY: Final = "relaygraph_usage_estimated"
"""The ``response_metadata`` key, True on a model reply whose ``usage_metadata`` relaygraph
estimated because the server reported none (the scripted model's, a stream without usage)."""
