"""Async tools (issue 43): ``async def`` functions and coroutine-only LangChain tools run
wherever a team runs, and ``arun_task`` runs a team without blocking the caller's loop.

Each test runs on the scripted model, whose turns call the tool.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import StructuredTool

from relaygraph import arun_task
from relaygraph.agents import Agent, builtin
from relaygraph.runner import RunResult, run_task
from relaygraph.store import LOCAL_PROJECT_ID, Ledger
from relaygraph.team import Team
from relaygraph.topology import Topology

from ._scripts import call, say
from ._service import in_process_service

Script = Callable[[dict[str, Any]], str]

SEEN: list[str] = []
STARTED = threading.Event()
STOPPED: list[str] = []


async def shout(text: str) -> str:
    """Shout a text.

    Args:
        text: What to shout.
    """
    await asyncio.sleep(0)
    SEEN.append(text)
    return text.upper() + "!"


async def fail(text: str) -> str:
    """A tool that always fails.

    Args:
        text: Anything.
    """
    await asyncio.sleep(0)
    raise ValueError(f"cannot take {text!r}")


def fail_sync(text: str) -> str:
    """The same tool, sync.

    Args:
        text: Anything.
    """
    raise ValueError(f"cannot take {text!r}")


async def wait_long(seconds: float) -> str:
    """Wait a while.

    Args:
        seconds: How long.
    """
    STARTED.set()
    try:
        await asyncio.sleep(seconds)
    finally:
        STOPPED.append("finally")
    return "waited"


async def _shout_coroutine(text: str) -> str:
    SEEN.append(text)
    return text.upper() + "!"


# What langchain-mcp-adapters makes of each MCP tool: a StructuredTool with only a coroutine.
coroutine_only = StructuredTool.from_function(
    coroutine=_shout_coroutine, name="shout", description="Shout a text."
)


def route(next: str) -> dict[str, Any]:
    return {"route": {"next": next, "task": f"{next}: do it", "reason": "because"}}


def turns(kind: str, tool_turn: dict[str, Any]) -> dict[str, Any]:
    """A script in which the shouter calls a tool once, in topology ``kind``."""
    shouter = [tool_turn, say("done")]
    if kind == "structured":
        return {
            "supervisor": [route("shouter"), route("FINISH")],
            "shouter": shouter,
            "finalize": [say("done")],
        }
    if kind == "swarm":
        return {"shouter": shouter}  # The swarm starts at the first agent.
    return {
        "supervisor": [call("transfer_to_shouter", task="shout it", reason="shouting"), say("ok")],
        "shouter": shouter,
    }


def team_with(*tools: Any) -> Team:
    shouter = Agent(name="shouter", description="shouts", prompt="You shout.", tools=tools)
    return Team(agents=[shouter, builtin.writer()], name="shouters")


def tool_results(home: Path, task_id: str) -> list[Any]:
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        return [c for c in ledger.tool_calls(task_id) if not c.tool.startswith("transfer_to_")]


TOPOLOGIES = ["structured", "swarm", "supervisor-tools"]


@pytest.mark.parametrize("kind", TOPOLOGIES)
@pytest.mark.parametrize("tool", [shout, coroutine_only], ids=["async-def", "coroutine-only"])
def test_an_async_tool_runs_in_each_topology(
    home: Path, script: Script, kind: str, tool: Any
) -> None:
    SEEN.clear()
    result = run_task(
        "Shout",
        team=team_with(tool),
        model=script(turns(kind, call("shout", text="hi"))),
        topology=Topology.parse(kind),
    )
    assert result.status == "succeeded", result.stop_reason
    assert SEEN == ["hi"]  # It ran, once.
    assert result.usage["shouter"]["tool_calls"] == 1
    [recorded] = tool_results(home, result.task_id)
    assert recorded.agent == "shouter" and "HI!" in (recorded.result_preview or "")


@pytest.mark.parametrize("tool", [fail, fail_sync], ids=["async", "sync"])
def test_a_tool_that_raises_answers_the_model_naming_the_tool(
    home: Path, script: Script, tool: Any
) -> None:
    result = run_task(
        "Fail",
        team=team_with(tool),
        model=script(turns("structured", call(tool.__name__, text="x"))),
    )
    assert result.status == "succeeded", result.stop_reason
    [recorded] = tool_results(home, result.task_id)
    assert recorded.status == "error"
    assert f"tool '{tool.__name__}' failed: ValueError: cannot take 'x'" in (
        recorded.result_preview or ""
    )


def test_a_policy_refuses_an_async_tool_before_it_runs(home: Path, script: Script) -> None:
    SEEN.clear()
    team = team_with(shout)
    policy = {"agents": {"shouter": {"tools": []}}}
    result = run_task(
        "Shout",
        team=Team(agents=team.agents, name=team.name, policy=policy),
        model=script(turns("structured", call("shout", text="hi"))),
    )
    assert SEEN == []
    assert any(v["kind"] == "tool_not_allowed" for v in result.violations), result.violations


def test_cancel_stops_a_slow_async_tool(home: Path, script: Script) -> None:
    STARTED.clear()
    STOPPED.clear()
    cancel = threading.Event()

    def cancel_once_started() -> None:
        STARTED.wait(30)
        cancel.set()

    threading.Thread(target=cancel_once_started, daemon=True).start()
    began = time.monotonic()
    result = run_task(
        "Wait",
        team=team_with(wait_long),
        model=script(turns("structured", call("wait_long", seconds=60))),
        cancel=cancel,
    )
    assert result.status == "cancelled", result.stop_reason
    assert time.monotonic() - began < 20  # Not the tool's 60 s.
    assert STOPPED == ["finally"]  # The coroutine was cancelled, not left running.


async def started_waiting(script: Script, seconds: float) -> asyncio.Task[RunResult]:
    """``arun_task`` of a team whose shouter calls ``wait_long(seconds)``, running on the
    loop, once the tool has started."""
    run = asyncio.create_task(
        arun_task(
            "Wait",
            team=team_with(wait_long),
            model=script(turns("structured", call("wait_long", seconds=seconds))),
        )
    )
    await asyncio.to_thread(STARTED.wait, 30)
    return run


async def test_arun_task_leaves_the_loop_free(home: Path, script: Script) -> None:
    STARTED.clear()
    ticks = 0
    stop = asyncio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    run = await started_waiting(script, 0.5)
    before = ticks
    result = await run
    stop.set()
    await ticker
    assert result.status == "succeeded", result.stop_reason
    assert ticks - before >= 10  # The loop kept running while the tool waited.


async def test_a_cancelled_arun_task_cancels_its_task(home: Path, script: Script) -> None:
    STARTED.clear()
    STOPPED.clear()
    run = await started_waiting(script, 60)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert STOPPED == ["finally"]
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        tasks, _ = ledger.list_tasks(project_id=LOCAL_PROJECT_ID, limit=10)
    assert [t.status for t in tasks] == ["cancelled"]


SHOUT_SERVER = """
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("shouter")


@mcp.tool()
def shout(text: str) -> str:
    \"\"\"Shout a text.\"\"\"
    return text.upper() + "!"


mcp.run()
"""


def test_a_langchain_mcp_adapters_tool_runs_in_a_team(
    home: Path, script: Script, tmp_path: Path
) -> None:
    from langchain_mcp_adapters.client import MultiServerMCPClient

    (tmp_path / "shout_server.py").write_text(SHOUT_SERVER, encoding="utf-8")
    client = MultiServerMCPClient(
        {
            "shouter": {
                "transport": "stdio",
                "command": sys.executable,
                "args": [str(tmp_path / "shout_server.py")],
            }
        }
    )
    [tool] = asyncio.run(client.get_tools())
    assert tool.func is None  # Coroutine-only, as the adapters make every tool.
    result = run_task(
        "Shout",
        team=team_with(tool),
        model=script(turns("structured", call("shout", text="hi"))),
    )
    assert result.status == "succeeded", result.stop_reason
    [recorded] = tool_results(home, result.task_id)
    assert recorded.status == "success" and "HI!" in (recorded.result_preview or "")


TOOLS_PY = '''
import asyncio


async def shout(text: str) -> str:
    """Shout a text.

    Args:
        text: What to shout.
    """
    await asyncio.sleep(0)
    return text.upper() + "!"
'''


def shouters_team(folder: Path, tools: str) -> Path:
    """The team file ``shouters`` in ``folder``: the built-in writer and a shouter whose
    tool is ``shout`` of ``tools``, a module's source written beside it as ``tools.py``."""
    (folder / "tools.py").write_text(tools, encoding="utf-8")
    team_file = folder / "team.toml"
    team_file.write_text(
        'name = "shouters"\n[agents.writer]\nuse = "builtin:writer"\n'
        '[agents.shouter]\ndescription = "shouts"\nprompt = "You shout."\n'
        'tools = ["./tools.py:shout"]\n',
        encoding="utf-8",
    )
    return team_file


async def test_an_async_tool_of_a_team_file_runs_on_the_service(home: Path, tmp_path: Path) -> None:
    import json

    team_file = shouters_team(tmp_path, TOOLS_PY)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "s.json").write_text(
        json.dumps(turns("structured", call("shout", text="hi"))), encoding="utf-8"
    )
    async with in_process_service(
        home,
        default_model=f"scripted:{scripts / 's.json'}",
        scripts_dir=scripts,
        team_files=[team_file],
    ) as api:
        key = api.key("acme")
        made = await api.submit(key, input="Shout", team="shouters", model="scripted:s.json")
        assert made.status_code == 202, made.text
        task = await api.wait(made.json()["id"], key)
    assert task["status"] == "succeeded", task
    [recorded] = tool_results(home, task["id"])
    assert "HI!" in (recorded.result_preview or "")
