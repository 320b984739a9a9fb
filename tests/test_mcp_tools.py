"""Tools from MCP servers: real stdio and streamable-HTTP servers written with the `mcp` package.

Every wait polls with a deadline, so a loaded machine makes a test slower, not flaky.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from mcp.server.fastmcp import Context, FastMCP

from relaygraph.errors import ConfigError
from relaygraph.team import TeamFileError, load_team
from relaygraph.team._mcp import McpServer, close_mcp_servers, mcp_tools

from ._scripts import one_visit

DEADLINE = 60.0

LINT_SERVER = """
import os
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("lint")


@mcp.tool()
def check(text: str) -> str:
    \"\"\"Check a text.\"\"\"
    return f"ok: {text}"


@mcp.tool()
def count(text: str) -> int:
    \"\"\"Count the words of a text.\"\"\"
    return len(text.split())


@mcp.tool()
def pid() -> int:
    \"\"\"The server's process id.\"\"\"
    return os.getpid()


@mcp.tool()
def fail(text: str) -> str:
    \"\"\"Always fails.\"\"\"
    raise ValueError(f"cannot lint {text!r}")


@mcp.tool()
def crash() -> str:
    \"\"\"Ends the server in the middle of the call.\"\"\"
    os._exit(1)


if __name__ == "__main__":
    mcp.run()
"""


def wait_until(condition: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"{what} within {deadline:g}s")
        time.sleep(0.02)


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def call(tool: BaseTool, **args: Any) -> ToolMessage:
    """Invoke as LangChain's ToolNode does (a tool call), which gives the whole ToolMessage."""
    message = tool.invoke({"type": "tool_call", "id": "call-1", "name": tool.name, "args": args})
    assert isinstance(message, ToolMessage)
    return message


@pytest.fixture(scope="module")
def lint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServer]:
    """One stdio server value for the module, so that its tests share one session."""
    folder = tmp_path_factory.mktemp("lint")
    (folder / "lint_server.py").write_text(LINT_SERVER, encoding="utf-8")
    yield McpServer(name="lint", command=(sys.executable, "lint_server.py"), cwd=folder)
    close_mcp_servers()


@pytest.fixture
def tools(lint: McpServer) -> dict[str, BaseTool]:
    return {t.name: t for t in mcp_tools(lint)}


def test_tools_are_named_after_their_server(lint: McpServer) -> None:
    assert [t.name for t in mcp_tools(lint)] == [
        "lint_check",
        "lint_count",
        "lint_pid",
        "lint_fail",
        "lint_crash",
    ]
    assert [t.name for t in mcp_tools(lint, ["count", "check"])] == ["lint_count", "lint_check"]


def test_tools_answer_synchronously_in_text(tools: dict[str, BaseTool]) -> None:
    assert tools["lint_check"].invoke({"text": "hello"}) == "ok: hello"
    counted = call(tools["lint_count"], text="one two three")
    assert counted.content == "3"
    assert counted.status == "success"
    assert counted.artifact == {"structured_content": {"result": 3}}


def test_a_tool_that_raises_gives_an_error_result(tools: dict[str, BaseTool]) -> None:
    failed = call(tools["lint_fail"], text="draft")
    assert failed.status == "error"
    assert "cannot lint 'draft'" in str(failed.content)
    assert tools["lint_check"].invoke({"text": "after"}) == "ok: after"


def test_calls_from_many_threads_share_one_server_process(tools: dict[str, BaseTool]) -> None:
    def work(i: int) -> tuple[str, Any]:
        return tools["lint_check"].invoke({"text": str(i)}), tools["lint_pid"].invoke({})

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(40)))
    assert [checked for checked, _ in results] == [f"ok: {i}" for i in range(40)]
    assert len({pid for _, pid in results}) == 1
    assert int(results[0][1]) != os.getpid()


def test_a_synchronous_graph_runs_the_tools_in_its_tool_node(tools: dict[str, BaseTool]) -> None:
    # What create_agent does: a ToolNode in a graph streamed synchronously, calling tool.invoke
    # (an async-only MCP tool refuses it) for parallel tool calls in its own threads.
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode(list(tools.values())))
    builder.add_edge(START, "tools")
    calls = [
        {"name": "lint_check", "args": {"text": "x"}, "id": "a"},
        {"name": "lint_fail", "args": {"text": "y"}, "id": "b"},
        {"name": "lint_count", "args": {"text": "p q"}, "id": "c"},
    ]
    state = builder.compile().invoke({"messages": [AIMessage(content="", tool_calls=calls)]})
    answers = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
    assert (answers["a"].content, answers["a"].status) == ("ok: x", "success")
    assert answers["b"].status == "error"
    assert (answers["c"].content, answers["c"].name) == ("2", "lint_count")


def test_ainvoke_works_from_another_event_loop(tools: dict[str, BaseTool]) -> None:
    async def both() -> list[Any]:
        check, count = tools["lint_check"], tools["lint_count"]
        return list(
            await asyncio.gather(check.ainvoke({"text": "a"}), count.ainvoke({"text": "b c"}))
        )

    assert asyncio.run(both()) == ["ok: a", "2"]


def test_an_unknown_tool_is_refused_with_the_tools_the_server_lists(lint: McpServer) -> None:
    with pytest.raises(ConfigError) as caught:
        mcp_tools(lint, ["check", "spellcheck"])
    message = str(caught.value)
    assert "'lint'" in message and "'spellcheck'" in message
    assert "check, count, pid, fail, crash" in message


GIT_LIKE_SERVER = """
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("git")


@mcp.tool()
def git_log() -> str:
    \"\"\"The log, named as mcp-server-git names its tools.\"\"\"
    return "log"


@mcp.tool()
def status() -> str:
    \"\"\"The status.\"\"\"
    return "clean"


@mcp.tool()
def log() -> str:
    \"\"\"Would be named git_log too.\"\"\"
    return "other log"


mcp.run()
"""


def test_a_tool_named_after_its_server_gets_no_second_prefix(tmp_path: Path) -> None:
    (tmp_path / "git_server.py").write_text(GIT_LIKE_SERVER, encoding="utf-8")
    git = McpServer(name="git", command=(sys.executable, "git_server.py"), cwd=tmp_path)
    try:
        log, status = mcp_tools(git, ["git_log", "status"])
        assert (log.name, status.name) == ("git_log", "git_status")
        assert log.invoke({}) == "log"
        with pytest.raises(ConfigError, match="'git_log' and 'log' would both be named 'git_log'"):
            mcp_tools(git)
    finally:
        close_mcp_servers()


def test_a_tool_name_typo_names_the_file_the_agent_and_the_reference(tmp_path: Path) -> None:
    (tmp_path / "lint_server.py").write_text(LINT_SERVER, encoding="utf-8")
    (tmp_path / "team.toml").write_text(
        '[agents.reviewer]\ndescription = "reviews"\nprompt = "You review."\n'
        'tools = ["mcp:lint/check", "mcp:lint/spellcheck"]\n'
        '[mcp.lint]\ncommand = ["python", "lint_server.py"]\n',
        encoding="utf-8",
    )
    try:
        with pytest.raises(TeamFileError) as raised:
            load_team(tmp_path / "team.toml")
    finally:
        close_mcp_servers()
    assert (raised.value.table, raised.value.key) == ("agents.reviewer", "tools")
    assert str(raised.value) == (
        f"team file {str(tmp_path / 'team.toml')!r}: [agents.reviewer] tools: "
        "'mcp:lint/spellcheck': MCP server 'lint' lists no tool 'spellcheck'; "
        "it lists: check, count, pid, fail, crash"
    )


def test_a_server_killed_between_calls_is_started_again(tools: dict[str, BaseTool]) -> None:
    first = int(tools["lint_pid"].invoke({}))
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: process_gone(first), "the killed server is reaped")
    # Its session may not have seen the death yet when the call is sent: that one call then
    # fails with a message naming the server, and the next one starts it again.
    answer = call(tools["lint_pid"])
    if answer.status == "error":
        assert "MCP server 'lint'" in str(answer.content)
        answer = call(tools["lint_pid"])
    assert answer.status == "success"
    assert int(str(answer.content)) not in (first, os.getpid())


def test_a_server_that_dies_during_a_call_gives_an_error_result(
    tools: dict[str, BaseTool],
) -> None:
    first = int(tools["lint_pid"].invoke({}))
    crashed = call(tools["lint_crash"])
    assert crashed.status == "error"
    assert "MCP server 'lint' ended during the call to 'crash'" in str(crashed.content)
    second = int(tools["lint_pid"].invoke({}))
    assert second != first


def test_close_stops_the_stdio_server_and_a_later_call_starts_it_again(
    tools: dict[str, BaseTool],
) -> None:
    first = int(tools["lint_pid"].invoke({}))
    close_mcp_servers()
    wait_until(lambda: process_gone(first), "close_mcp_servers() stops the server")
    second = int(tools["lint_pid"].invoke({}))
    assert second != first


def test_interpreter_exit_stops_the_stdio_server(lint: McpServer) -> None:
    # The check is an exit handler registered before the module's own, so it runs after it
    # and while this process still holds the server's stdin (which alone would stop it).
    script = textwrap.dedent(
        f"""
        import atexit, os, sys, time

        def check():
            end = time.monotonic() + {DEADLINE}
            while time.monotonic() < end:
                try:
                    os.kill(PID, 0)
                except ProcessLookupError:
                    print("stopped", flush=True)
                    return
                time.sleep(0.02)
            print("still running", flush=True)

        atexit.register(check)
        from relaygraph.team._mcp import McpServer, mcp_tools
        server = McpServer(name="lint", command={lint.command!r}, cwd={str(lint.cwd)!r})
        (pid,) = mcp_tools(server, ["pid"])
        PID = int(pid.invoke({{}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=2 * DEADLINE
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (("relaygraph-no-such-program",), "relaygraph-no-such-program"),
        ((sys.executable, "-c", "import sys; sys.exit('bad config here')"), "bad config here"),
        ((sys.executable, "-c", "import time; time.sleep(120)"), "no answer within 2s"),
    ],
    ids=["missing", "exits-at-once", "never-answers"],
)
def test_a_server_that_does_not_start_is_named(command: tuple[str, ...], expected: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        mcp_tools(McpServer(name="broken", command=command, timeout_seconds=2))
    assert time.monotonic() - started < DEADLINE
    assert "MCP server 'broken'" in str(caught.value)
    assert "did not start" in str(caught.value)
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    "settings",
    [
        {"name": "lint server", "command": ("x",)},
        {"name": "9lint", "command": ("x",)},
        {"name": "lint"},
        {"name": "lint", "command": ("x",), "url": "http://127.0.0.1:9/mcp"},
        {"name": "lint", "command": ()},
        {"name": "lint", "url": "ftp://127.0.0.1/mcp"},
        {"name": "lint", "url": "127.0.0.1:9000/mcp"},
        {"name": "lint", "url": "http:///mcp"},
        {"name": "lint", "url": "http://127.0.0.1:9/mcp", "env": {"A": "b"}},
        {"name": "lint", "command": ("x",), "headers": {"A": "b"}},
        {"name": "lint", "command": ("x",), "env": {"A": 1}},
        {"name": "lint", "command": ("x",), "timeout_seconds": 0},
        {"name": "lint", "command": ("x",), "timeout_seconds": float("nan")},
    ],
)
def test_a_bad_server_value_is_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="MCP server"):
        McpServer(**settings)


def test_equal_server_values_are_one_key() -> None:
    env = {"TOKEN": "a"}
    one = McpServer(name="lint", command=["python", "s.py"], env=env)  # type: ignore[arg-type]
    env["TOKEN"] = "b"  # the value keeps its own copy
    two = McpServer(name="lint", command=("python", "s.py"), env={"TOKEN": "a"})
    assert one == two and hash(one) == hash(two)
    assert "TOKEN" not in repr(one)


# Streamable HTTP


class HttpServer:
    """A FastMCP streamable-HTTP server under uvicorn in a thread, on a loopback port."""

    def __init__(self, port: int = 0) -> None:
        app = FastMCP("docs", host="127.0.0.1")

        @app.tool()
        def search(query: str) -> list[str]:
            """Search the docs."""
            return [f"{query}: first", f"{query}: second"]

        @app.tool()
        def header(name: str, ctx: Context) -> str:
            """A header of the request that made this call."""
            request = ctx.request_context.request
            return str(request.headers.get(name) if request is not None else None)

        @app.tool(name="fix.all")
        def fix_all() -> str:
            """A name a model API refuses once prefixed."""
            return "fixed"

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        config = uvicorn.Config(app.streamable_http_app(), log_level="critical", ws="none")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        wait_until(lambda: self.server.started, "the HTTP MCP server starts")

    def stop(self) -> None:
        # Forced: a client's open event stream would hold a graceful shutdown.
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(DEADLINE)
        self.sock.close()


@pytest.fixture(scope="module")
def docs() -> Iterator[McpServer]:
    running = HttpServer()
    yield McpServer(name="docs", url=running.url, headers={"X-Team": "docs-review"})
    close_mcp_servers()
    running.stop()


def test_http_tools_are_named_and_answer_from_many_threads(docs: McpServer) -> None:
    search, header = mcp_tools(docs, ["search", "header"])
    assert (search.name, header.name) == ("docs_search", "docs_header")
    with ThreadPoolExecutor(max_workers=6) as pool:
        found = list(pool.map(lambda i: search.invoke({"query": f"q{i}"}), range(24)))
    assert found == [f"q{i}: first\nq{i}: second" for i in range(24)]
    assert header.invoke({"name": "x-team"}) == "docs-review"


def test_an_http_tool_whose_name_a_model_refuses_is_named(docs: McpServer) -> None:
    with pytest.raises(ConfigError, match=r"'fix\.all' makes the name 'docs_fix\.all'"):
        mcp_tools(docs, ["fix.all"])


def test_an_http_server_that_does_not_listen_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"MCP server 'web' \(http://127\.0\.0\.1:\d+/mcp\)"):
            mcp_tools(McpServer(name="web", url=f"http://127.0.0.1:{port}/mcp", timeout_seconds=5))
    assert time.monotonic() - started < DEADLINE


def test_an_http_server_restarted_between_calls_gets_a_new_session() -> None:
    running = HttpServer()
    try:
        (search,) = mcp_tools(McpServer(name="restarts", url=running.url), ["search"])
        assert search.invoke({"query": "before"}) == "before: first\nbefore: second"
        running.stop()
        running = HttpServer(port=running.port)  # it knows nothing of the old session
        assert search.invoke({"query": "after"}) == "after: first\nafter: second"
    finally:
        close_mcp_servers()
        running.stop()


# The public API: relaygraph.team.mcp_server, the [mcp.NAME] table in Python.


def test_mcp_server_is_the_team_files_table_in_python(tmp_path: Path) -> None:
    from relaygraph.agents import Agent
    from relaygraph.team import mcp_server

    (tmp_path / "lint_server.py").write_text(LINT_SERVER, encoding="utf-8")
    lint = mcp_server("lint", command="python", args=["lint_server.py"], cwd=tmp_path)
    # The same value a team file's [mcp.lint] makes: one session for both.
    (tmp_path / "team.toml").write_text(
        '[agents.a]\ndescription = "d"\nprompt = "p"\ntools = ["mcp:lint/pid"]\n'
        '[mcp.lint]\ncommand = ["python", "lint_server.py"]\n',
        encoding="utf-8",
    )
    try:
        from_file = load_team(tmp_path / "team.toml").tools["lint_pid"]
        assert lint == McpServer(
            name="lint", command=(sys.executable, "lint_server.py"), cwd=tmp_path
        )
        (pid,) = lint.tools("pid")
        assert pid.invoke({}) == from_file.invoke({})  # one server process for both
        whole = Agent(name="a", description="d", prompt="p", tools=[lint])
        assert whole.tool_names == (
            "lint_check",
            "lint_count",
            "lint_pid",
            "lint_fail",
            "lint_crash",
        )
        assert whole.origins["lint_count"] == "mcp:lint"
        some = Agent(name="b", description="d", prompt="p", tools=[*lint.tools("count")])
        assert some.tool_names == ("lint_count",) and some.origins == {"lint_count": "mcp:lint"}
    finally:
        close_mcp_servers()


def test_mcp_server_over_http_sends_its_headers(docs: McpServer) -> None:
    from relaygraph.team import mcp_server

    server = mcp_server("docs", url=docs.url or "", headers={"X-Team": "from-python"})
    (header,) = server.tools("header")
    assert header.invoke({"name": "x-team"}) == "from-python"


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"command": ["python", "x.py"]}, "put its arguments in args"),
        ({"url": "http://127.0.0.1/mcp", "args": ["x"]}, "args apply to a stdio server"),
        ({"command": "python", "args": "x.py"}, "a list of strings"),
        ({"url": "http://127.0.0.1/mcp", "env": {"A": "b"}}, "env and cwd apply to a stdio"),
        ({"command": "python", "headers": {"A": "b"}}, "headers apply to an HTTP server"),
        ({}, "exactly one of command"),
    ],
)
def test_a_bad_mcp_server_call_is_refused(settings: dict[str, Any], said: str) -> None:
    from relaygraph.team import mcp_server

    with pytest.raises(ConfigError, match=said):
        mcp_server("lint", **settings)


def test_sessions_run_on_the_loop_that_async_tools_share(lint: McpServer) -> None:
    from relaygraph.agents import background_loop
    from relaygraph.team._mcp import _REGISTRY

    async def loop_of(_connection: Any) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert _REGISTRY.run(lint, loop_of) is background_loop()
    assert not [t for t in threading.enumerate() if t.name == "relaygraph-mcp"]


def test_close_ends_only_mcp_calls_not_the_async_tools_on_the_shared_loop(
    tools: dict[str, BaseTool],
) -> None:
    from relaygraph.agents._async_tools import run_coroutine

    async def slow() -> str:
        await asyncio.sleep(0.5)
        return "done"

    tools["lint_pid"].invoke({})
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_coroutine, slow())
        time.sleep(0.1)
        close_mcp_servers()
        assert running.result(timeout=DEADLINE) == "done"
    assert run_coroutine(slow()) == "done"  # The loop still runs.
    assert tools["lint_check"].invoke({"text": "a"}) == "ok: a"  # And starts the server again.


def test_a_sync_call_from_the_tools_loop_is_refused_not_left_to_hang(
    tools: dict[str, BaseTool],
) -> None:
    from relaygraph.agents._async_tools import run_coroutine

    async def sync_inside() -> ToolMessage:
        return call(tools["lint_check"], text="a")

    answer = run_coroutine(sync_inside())
    assert answer.status == "error"
    assert "await its ainvoke instead" in str(answer.content)


def test_the_reference_time_server_from_pypi_lists_and_runs_its_tools_in_a_team(
    home: Path, script: Callable[[dict[str, Any]], str], tmp_path: Path
) -> None:
    """``mcp-server-time`` (the dev extra installs it) from a team file, as a user brings it."""
    pytest.importorskip(
        "mcp_server_time", reason="mcp-server-time is not installed (pip install -e '.[dev]')"
    )
    from relaygraph.runner import run_task
    from relaygraph.store import Ledger

    (tmp_path / "team.toml").write_text(
        'name = "clocks"\n[agents.writer]\nuse = "builtin:writer"\n'
        '[agents.clock]\ndescription = "tells the time"\nprompt = "You tell the time."\n'
        'tools = ["mcp:time/*"]\n'
        "[mcp.time]\n"
        'command = ["python", "-m", "mcp_server_time", "--local-timezone", "UTC"]\n',
        encoding="utf-8",
    )
    convert = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    turns = one_visit(
        "clock",
        "convert",
        "a time",
        {"tool_calls": [{"name": "time_convert_time", "args": convert, "id": "c"}]},
        {"content": "21:00 in Tokyo."},
        final="21:00 in Tokyo.",
    )
    try:
        team = load_team(tmp_path / "team.toml")
        assert {"time_get_current_time", "time_convert_time"} <= set(team.tools)
        result = run_task("Convert", team=team, model=script(turns))
    finally:
        close_mcp_servers()
    assert result.status == "succeeded", result.stop_reason
    with Ledger(f"sqlite:///{home / 'ledger.sqlite'}") as ledger:
        [called] = [c for c in ledger.tool_calls(result.task_id) if c.tool == "time_convert_time"]
    assert called.status == "success", called.result_preview
    # The server answered: Tokyo is UTC+9 all year.
    assert '"datetime": "' in (called.result_preview or "")
    assert "T21:00:00+09:00" in (called.result_preview or ""), called.result_preview
