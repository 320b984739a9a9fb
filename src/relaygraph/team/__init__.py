"""Teams of your own: agents, their tools and MCP servers, in Python or a team file.

    from relaygraph import Agent, Team, builtin, run_task

    team = Team(agents=[builtin.researcher(kb="./docs"), builtin.writer(), reviewer])
    result = run_task("Review the handoff docs", team=team, model="openai:gpt-4o-mini")

:func:`load_team` reads a team file (TOML, docs/teams.md); :meth:`Team.default` is the
built-in researcher, coder and writer, made through the same public path. :func:`mcp_server`
is a team file's ``[mcp.NAME]`` in Python: ``Agent(tools=[mcp_server("lint", ...)])``.
"""

from typing import TYPE_CHECKING

from relaygraph._lazy import lazy_imports
from relaygraph.team._bounds import TeamBounds, check_bounds, check_tool_counts, read_toml
from relaygraph.team._errors import TeamFileError
from relaygraph.team._file import OPERATOR, TeamTrust, load_mcp_file, load_team, parse_team
from relaygraph.team._team import DEFAULT_TEAM_NAME, Team, default_team

if TYPE_CHECKING:
    from relaygraph.team._mcp import McpServer, close_mcp_servers, mcp_server

__all__ = [
    "DEFAULT_TEAM_NAME",
    "OPERATOR",
    "McpServer",
    "Team",
    "TeamBounds",
    "TeamFileError",
    "TeamTrust",
    "check_bounds",
    "check_tool_counts",
    "close_mcp_servers",
    "default_team",
    "load_mcp_file",
    "load_team",
    "mcp_server",
    "parse_team",
    "read_toml",
]


# Imported on first use: the mcp package is a good part of a team's import time, and most
# teams use no MCP server.
__getattr__ = lazy_imports(
    __name__,
    dict.fromkeys(("McpServer", "close_mcp_servers", "mcp_server"), "._mcp"),
)
