"""A team whose reviewer uses the tools of an MCP server, built in Python.

    python examples/mcp/mcp_team.py

It runs offline on a scripted model (examples/scripts/mcp-team.json); give a real model
(``model="openai:gpt-4o-mini"``) to see one choose the tools itself.
"""

from pathlib import Path

from relaygraph import Agent, Team, builtin, run_task
from relaygraph.team import mcp_server

HERE = Path(__file__).resolve().parent

# As a team file's [mcp.words]: "python" is the interpreter relaygraph runs on.
words = mcp_server("words", command="python", args=["words_server.py"], cwd=HERE)

reviewer = Agent(
    name="reviewer",
    description="checks a draft: counts its words and finds its longest one",
    prompt="You are the reviewer. Use your tools on the draft and report what they say.",
    # All the server's tools: words_count (its name and the tool's), and words_longest
    # (already starting with the server's name, so not words_words_longest).
    tools=[words],
    # Or some of them: tools=[*words.tools("count")]
)
team = Team(agents=[builtin.writer(), reviewer], name="mcp-review")

if __name__ == "__main__":
    print("tools:", ", ".join(team.tools))
    result = run_task(
        "Review: checkpoints are written after every super-step",
        team=team,
        model=f"scripted:{HERE.parent / 'scripts' / 'mcp-team.json'}",
    )
    print(result.status, "-", result.answer)
