"""Teams of your own: agents, their tools and MCP servers, in Python or a team file.

    from relaygraph import Agent, Team, builtin, run_task

    team = Team(agents=[builtin.researcher(kb="./docs"), builtin.writer(), reviewer])
    result = run_task("Review the handoff docs", team=team, model="openai:gpt-4o-mini")

:func:`load_team` reads a team file (TOML, docs/teams.md); :meth:`Team.default` is the
built-in researcher, coder and writer, made through the same public path.
"""

from relaygraph.team._bounds import TeamBounds, check_bounds, check_tool_counts, read_toml
from relaygraph.team._errors import TeamFileError
from relaygraph.team._file import OPERATOR, TeamTrust, load_team, parse_team
from relaygraph.team._team import DEFAULT_TEAM_NAME, Team, default_team

__all__ = [
    "DEFAULT_TEAM_NAME",
    "OPERATOR",
    "Team",
    "TeamBounds",
    "TeamFileError",
    "TeamTrust",
    "check_bounds",
    "check_tool_counts",
    "default_team",
    "load_team",
    "parse_team",
    "read_toml",
]
