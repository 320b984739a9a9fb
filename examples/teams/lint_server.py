"""A tiny MCP server (stdio) with one tool, `check`: the docs-review team's linter."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("lint")


@server.tool()
def check(text: str) -> str:
    """Lint a draft: report lines over 100 characters and doubled words."""
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) > 100:
            problems.append(f"line {number}: {len(line)} characters (over 100)")
        words = line.lower().split()
        for first, second in zip(words, words[1:], strict=False):
            if first == second:
                problems.append(f"line {number}: doubled word {first!r}")
    return "\n".join(problems) or "no problems found"


if __name__ == "__main__":
    server.run()
