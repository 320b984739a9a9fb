"""The supervisor's node helpers under one name, for the two modules that still call them
as ``acc.<name>``.

TODO(#47): the team graph's node functions (``_graph.py``, ``_agent_node.py``) are being
rewritten for asyncio (issue 44); they are to import from :mod:`._node_config`,
:mod:`._usage` and :mod:`._refusals` as the other modules do, and this module to go.
"""

from relaygraph.supervisor._node_config import (
    call_config,
    replays_by_position,
    step_of,
    task_ns,
)
from relaygraph.supervisor._refusals import (
    add_bar,
    announce_violation,
    bars_now,
    earlier_results,
    transcript_violations,
    violation,
)
from relaygraph.supervisor._usage import (
    agent_tokens,
    announce_usage,
    in_flight_records,
    turn_usage,
    usage_record,
)

__all__ = [
    "add_bar",
    "agent_tokens",
    "announce_usage",
    "announce_violation",
    "bars_now",
    "call_config",
    "earlier_results",
    "in_flight_records",
    "replays_by_position",
    "step_of",
    "task_ns",
    "transcript_violations",
    "turn_usage",
    "usage_record",
    "violation",
]
