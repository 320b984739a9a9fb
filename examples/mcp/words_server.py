"""A tiny MCP server (stdio) written with the `mcp` package: two tools about words.

Run by `mcp_team.py` (or a team file's `[mcp.words]`); on its own it waits for a client on
stdin.
"""

from mcp.server.fastmcp import FastMCP

server = FastMCP("words")


@server.tool()
def count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


@server.tool()
def words_longest(text: str) -> str:
    """The longest word of a text (the first of equals)."""
    return max(text.split(), key=len, default="")


if __name__ == "__main__":
    server.run()
