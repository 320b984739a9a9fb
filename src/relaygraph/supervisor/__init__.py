"""The supervisor: a team graph that routes with a validated structured :class:`Route`.

The supervisor node asks its model for ``Route(next, task, reason)``; the chosen agent runs
as a subgraph on a scoped input; agents may hand work straight to a peer; when the route
says ``FINISH`` a finalize node writes the answer.
"""

from relaygraph._names import FINALIZE, FINISH, SUPERVISOR
from relaygraph.supervisor._graph import build_team, draw_team
from relaygraph.supervisor._route import Route, RouteDecision, route_model, route_next_agent
from relaygraph.supervisor._state import TeamState, Usage, Visit
from relaygraph.supervisor._usage import in_flight_records
from relaygraph.supervisor._verdict import non_answer

__all__ = [
    "FINALIZE",
    "FINISH",
    "SUPERVISOR",
    "Route",
    "RouteDecision",
    "TeamState",
    "Usage",
    "Visit",
    "build_team",
    "draw_team",
    "in_flight_records",
    "non_answer",
    "route_model",
    "route_next_agent",
]
