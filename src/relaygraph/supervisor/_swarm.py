"""The ``swarm`` topology: ``langgraph_swarm.create_swarm`` over the team's agents.

Agents pass control among themselves with their ``transfer_to_<peer>`` tools; there is no
supervisor and no finalize model: the agent that finishes answers. The swarm's
``active_agent`` is remembered in the thread, so the next request of the conversation goes
to the agent that was active last (langgraph-swarm's own router does that).

Each agent node is the same node the structured team runs (scoped input, budgets, ping-pong,
events, records); only where it goes next differs, in :class:`SwarmExits`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from langgraph.graph import START, StateGraph
from langgraph.types import Command

from relaygraph._names import BEGIN, FINALIZE
from relaygraph.agents import TaskContext
from relaygraph.handoffs import Assignment
from relaygraph.policies import TeamPolicy
from relaygraph.supervisor._agent_node import Exit
from relaygraph.supervisor._begin_node import begin_turn
from relaygraph.supervisor._prebuilt import PrebuiltTeam
from relaygraph.supervisor._state import SwarmTeamState, TeamState

USER = "user"


class SwarmExits:
    """Where a swarm agent's visit goes: to the peer it handed off to, else to the end.

    With no supervisor to pick another agent, an agent whose budget is spent ends the task
    (``degraded``, or ``failed`` with ``on_exhausted = "fail"``), and a ping-pong that the
    policy sends to the supervisor goes back to the agent that handed off, the pair barred.
    """

    entry_source = USER

    def __init__(self, policy: TeamPolicy) -> None:
        self.policy = policy

    def __call__(self, outcome: Exit, state: TeamState) -> Command[Any]:
        command, agent = outcome.command, outcome.agent
        update = dict(command.update or {})
        if outcome.kind == "handoff":
            return Command(goto=command.goto, update={**update, "active_agent": command.goto})
        update["active_agent"] = agent
        if outcome.kind == "bounced":
            refused = update["violations"][-1]["detail"]
            update["assignment"] = Assignment(
                agent=agent,
                task=outcome.assignment["task"],
                reason=f"your handoff was refused ({refused}); finish the task yourself",
                source=agent,
                kind="direct",
            )
            return Command(goto=agent, update=update)
        if outcome.kind == "spent" and outcome.hit is not None:
            status = "failed" if self.policy.team.on_exhausted == "fail" else "degraded"
            update |= {"status": status, "stop_reason": outcome.hit.stop_reason}
        return Command(goto=FINALIZE, update=update)


def build_swarm_team(parts: PrebuiltTeam) -> StateGraph[Any, Any, Any, Any]:
    """The swarm's graph over the team's agents, ready to compile."""
    from langgraph_swarm import create_swarm

    members = parts.members(SwarmExits(parts.policy))
    builder = create_swarm(
        members,  # type: ignore[arg-type]  # Any named runnable serves as a member.
        default_active_agent=parts.topology.start_agent or parts.agents[0],
        state_schema=SwarmTeamState,
        context_schema=TaskContext,
    )
    # create_swarm routes START straight to the active agent. A new request first goes
    # through ``begin`` (a new turn: fresh per-request fields), so the swarm's own router
    # moves behind it, unchanged.
    builder.branches[BEGIN] = builder.branches.pop(START)
    # The router reads what ``begin`` reads: the swarm's state, ``active_agent`` included.
    builder.add_node(BEGIN, begin_turn, input_schema=SwarmTeamState)
    builder.add_edge(START, BEGIN)
    for name in parts.agents:
        # The members return Command(goto=...) themselves; declaring where they may go
        # draws the handoff edges (create_swarm finds them only in a member's ToolNode).
        builder.nodes[name] = replace(
            builder.nodes[name], ends=(*parts.policy.agents[name].handoffs, FINALIZE)
        )
    return parts.close(builder)
