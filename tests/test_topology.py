"""The team graph's topology is pinned: a change to it shows up as a snapshot diff."""

from __future__ import annotations

import os
from pathlib import Path

from relaygraph.supervisor import draw_team
from relaygraph.team import default_team
from tests.builtin_team import default_policy

SNAPSHOT = Path(__file__).parent / "snapshots" / "team.mmd"


def test_topology_matches_snapshot() -> None:
    drawn = draw_team(team=default_team())
    if os.environ.get("RELAYGRAPH_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(drawn)
    assert drawn == SNAPSHOT.read_text(), (
        "the team topology changed; if intended, rerun with RELAYGRAPH_UPDATE_SNAPSHOTS=1"
    )


def test_no_fixed_edge_from_agents_back_to_the_supervisor() -> None:
    """langgraph-supervisor adds agent → supervisor edges, so a handoff also wakes the
    supervisor in the same step. Here every way out of an agent is a Command, chosen at
    run time: the drawing shows them as conditional (dotted) edges only."""
    drawn = draw_team(team=default_team())
    for agent in default_policy().agents:
        assert f"{agent} --> supervisor;" not in drawn
        assert f"{agent} -.-> supervisor;" in drawn


def test_ascii_drawing_names_every_node() -> None:
    drawn = draw_team(team=default_team(), ascii=True)
    for node in ("begin", "supervisor", "researcher", "coder", "writer", "finalize"):
        assert node in drawn
