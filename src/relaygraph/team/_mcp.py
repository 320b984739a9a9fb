"""Tools from MCP servers, callable synchronously from any thread.

The team graph runs synchronously in worker threads, while an MCP session is asynchronous
and tied to the event loop that opened it. So this module opens one session per server on
the process's event loop for tools (:func:`relaygraph.agents.background_loop`, the one that
async tools run on; a stdio server is one child process for the whole process, not one per
call, which is what langchain-mcp-adapters does without a session), and gives each tool a
``func`` that hands the call to that loop and waits.

When a server goes away:

- a stdio server exited between calls, or an HTTP server restarted and forgot the session:
  the call never reached it, so a new session is opened (the stdio server started again)
  and the call is sent there;
- it died or the connection broke during a call: that call returns an error result naming
  the server (a ToolMessage with ``status="error"``, not an exception that ends the run),
  and the next call starts it again. The call is not repeated: it may have taken effect;
- it does not start again: the call returns an error result saying why.

``close_mcp_servers()`` (also run at interpreter exit) closes every session and stops every
stdio server, and leaves the loop running for async tools; a tool used afterwards starts its
server again.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import math
import os
import re
import shlex
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langchain_mcp_adapters.sessions import create_session
from langchain_mcp_adapters.tools import load_mcp_tools
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CONNECTION_CLOSED, ErrorData

from relaygraph.agents import background_loop
from relaygraph.errors import ConfigError

__all__ = [
    "McpServer",
    "close_mcp_servers",
    "interpreter_for",
    "mcp_server",
    "mcp_tools",
    "tool_name_of",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The server name is the first part of its tools' names and of ``mcp:SERVER/TOOL``, whose
# parser takes an identifier; '-' is left out so that a name reads the same in both places.
_SERVER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
# OpenAI-compatible servers accept tool names of [A-Za-z0-9_-]{1,64}.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_STDERR_LINES = 20
_STOP_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class McpServer:
    """An MCP server: a command run over stdio, or a streamable-HTTP URL.

    Two equal values share one session in a process. ``env`` and ``headers`` are left out of
    the repr, as they often carry tokens.
    """

    name: str
    """The ``[mcp.NAME]`` key: letters, digits and '_', not starting with a digit."""
    command: tuple[str, ...] | None = None
    """stdio: the program and its arguments. Exactly one of ``command`` and ``url``."""
    url: str | None = None
    """Streamable HTTP: an ``http://`` or ``https://`` URL."""
    cwd: Path | None = None
    """stdio: the working directory (a team file's folder)."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """stdio: variables added to the safe few the child inherits (HOME, PATH, ...)."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """HTTP: headers sent with every request."""
    timeout_seconds: float = 30.0
    """Limit on starting the server, listing its tools and each tool call."""
    session_scope: str = ""
    """Whose session this is: values that differ only here get sessions (for stdio,
    processes) of their own. The task service gives each project its own scope for the
    servers the operator offers (``serve --mcp``)."""

    def __post_init__(self) -> None:
        at = f"MCP server {self.name!r}"
        if not isinstance(self.name, str) or not _SERVER_NAME.fullmatch(self.name):
            raise ConfigError(
                f"{at}: the name must be letters, digits or '_', not starting with a digit, "
                "at most 32 characters"
            )
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"{at}: give exactly one of command (stdio) or url (HTTP)")
        if self.command is not None:
            command = tuple(self.command)
            if not command or not command[0] or not all(isinstance(a, str) for a in command):
                raise ConfigError(f"{at}: command must be a program and its arguments (strings)")
            object.__setattr__(self, "command", command)
            if self.headers:
                raise ConfigError(f"{at}: headers apply to an HTTP server (url), not to command")
        else:
            parts = urlsplit(self.url) if isinstance(self.url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"{at}: url {self.url!r} is not an http:// or https:// URL")
            if self.env or self.cwd is not None:
                raise ConfigError(f"{at}: env and cwd apply to a stdio server (command), not url")
        for label in ("env", "headers"):
            mapping = getattr(self, label)
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
                raise ConfigError(f"{at}: {label} must map strings to strings")
            # A private read-only copy: the value is a registry key, so it must not change.
            object.__setattr__(self, label, MappingProxyType(dict(mapping)))
        if self.cwd is not None:
            object.__setattr__(self, "cwd", Path(self.cwd))
        timeout = self.timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise ConfigError(f"{at}: timeout_seconds must be a number, got {timeout!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"{at}: timeout_seconds must be positive, got {timeout!r}")

    def __hash__(self) -> int:
        # The generated hash would hash the mappings, which are not hashable.
        mappings = (tuple(sorted(self.env.items())), tuple(sorted(self.headers.items())))
        where = (self.name, self.command, self.url, self.cwd)
        return hash((*where, mappings, self.timeout_seconds, self.session_scope))

    def describe(self) -> str:
        """``'lint' (python lint_server.py)`` or ``'lint' (http://...)``, for messages."""
        where = shlex.join(self.command) if self.command is not None else self.url
        return f"{self.name!r} ({where})"

    def tools(self, *names: str) -> list[BaseTool]:
        """The server's tools named ``names`` (all when none), as :func:`mcp_tools` makes them.

        Example:
            git = mcp_server("git", command="mcp-server-git", args=["--repository", "."])
            reviewer = Agent(..., tools=[*git.tools("git_log", "git_diff"), word_count])

        Raises:
            ConfigError: As :func:`mcp_tools`.
        """
        return mcp_tools(self, list(names) if names else None)


def mcp_server(
    name: str,
    *,
    command: str | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_seconds: float = 30.0,
) -> McpServer:
    """An MCP server, as a team file's ``[mcp.NAME]`` table describes one: a program run
    over stdio (``command`` and ``args``), or a streamable-HTTP ``url``.

    Give the value to an agent, ``Agent(tools=[server])`` for all its tools, or pick some
    with ``server.tools("check")``. As in a team file, a ``command`` of ``python`` or
    ``python3`` is the interpreter relaygraph runs on, and a stdio server inherits only
    ``HOME``, ``PATH``, ``LOGNAME``, ``SHELL``, ``TERM`` and ``USER`` besides ``env``.

    Example:
        lint = mcp_server("lint", command="python", args=["lint_server.py"], cwd="examples/mcp")
        docs = mcp_server("docs", url="http://127.0.0.1:9000/mcp", headers={"X-Key": key})
        reviewer = Agent(name="reviewer", description=..., prompt=..., tools=[lint])

    Args:
        name: Letters, digits and ``_``: the first part of its tools' names (``lint_check``).
        command: stdio: the program to run.
        args: stdio: its arguments.
        env: stdio: variables added to those the server inherits.
        cwd: stdio: the folder it runs in (default: this process's).
        url: streamable HTTP: the server's ``http://`` or ``https://`` URL.
        headers: streamable HTTP: headers sent with every request (a token).
        timeout_seconds: Limit on starting the server, listing its tools and each call.

    Raises:
        ConfigError: A bad name, both or neither of ``command`` and ``url``, or a setting of
            the other transport (``headers`` with ``command``; ``args``, ``env`` or ``cwd``
            with ``url``).
    """
    if command is not None and not isinstance(command, str):
        raise ConfigError(
            f"MCP server {name!r}: command is the program alone (a string); put its "
            "arguments in args"
        )
    if url is not None and args:
        raise ConfigError(f"MCP server {name!r}: args apply to a stdio server (command), not url")
    if isinstance(args, str):
        raise ConfigError(f"MCP server {name!r}: args must be a list of strings, not one string")
    return McpServer(
        name=name,
        command=(interpreter_for(command), *args) if command is not None else None,
        url=url,
        env=env or {},
        headers=headers or {},
        cwd=Path(cwd) if cwd is not None else None,
        timeout_seconds=timeout_seconds,
    )


def interpreter_for(program: str) -> str:
    """``program``, or for ``python`` and ``python3`` the interpreter relaygraph runs on,
    whose packages (``mcp`` among them) the server can import: ``python`` on PATH may be
    another one."""
    return sys.executable if program in ("python", "python3") else program


def mcp_tools(server: McpServer, names: Sequence[str] | None = None) -> list[BaseTool]:
    """LangChain tools for the server's tools named ``names`` (all when None).

    Each tool is named as :func:`tool_name_of` says, and can be called synchronously
    (``tool.invoke``) from any thread, or with ``ainvoke`` from any event loop. The server is
    started (or its session opened) now, so that a bad reference fails before any model runs.

    Raises:
        ConfigError: Naming the server (and the tool) when the server does not start, does not
            answer within its timeout, or lists no such tool (the message lists its tools).
    """
    try:
        listed = _REGISTRY.run(server, lambda c: c.tools())
    except (_StartError, ToolException) as exc:
        raise ConfigError(f"MCP server {server.describe()} did not start: {exc}") from exc
    wanted = list(dict.fromkeys(names)) if names is not None else list(listed)
    missing = [n for n in wanted if n not in listed]
    if missing:
        raise ConfigError(
            f"MCP server {server.name!r} lists no tool {', '.join(map(repr, missing))}; "
            f"it lists: {', '.join(listed) or 'no tools'}"
        )
    tools = []
    made: dict[str, str] = {}
    for mcp_name in wanted:
        name = tool_name_of(server.name, mcp_name)
        if name in made:
            raise ConfigError(
                f"MCP server {server.name!r}: tools {made[name]!r} and {mcp_name!r} would both be "
                f"named {name!r}; name the one you want instead of all"
            )
        made[name] = mcp_name
        if not _TOOL_NAME.fullmatch(name):
            raise ConfigError(
                f"MCP server {server.name!r}: tool {mcp_name!r} makes the name {name!r}, which a "
                "model API refuses (letters, digits, '_' and '-', at most 64 characters)"
                + ("; name the tools you want instead of all" if names is None else "")
            )
        tools.append(_wrap(server, mcp_name, name, listed[mcp_name]))
    return tools


def tool_name_of(server: str, tool: str) -> str:
    """The name the model, policies, the ledger and traces know an MCP tool by: the
    server's name, ``_`` and the tool's (``lint_check``), unless the tool's name already
    starts with the server's (``git_log`` of the server ``git`` stays ``git_log``, not
    ``git_git_log``)."""
    if tool == server or tool.startswith((f"{server}_", f"{server}-")):
        return tool
    return f"{server}_{tool}"


def close_mcp_servers() -> None:
    """Close every MCP session of this process and stop every stdio server it started.

    A tool used afterwards starts its server again.
    """
    _REGISTRY.close()


def _wrap(server: McpServer, mcp_name: str, name: str, listed: BaseTool) -> BaseTool:
    def call(**arguments: Any) -> tuple[Any, Any]:
        return _REGISTRY.run(server, lambda c: c.call(mcp_name, arguments))

    async def acall(**arguments: Any) -> tuple[Any, Any]:
        return await _REGISTRY.arun(server, lambda c: c.call(mcp_name, arguments))

    return StructuredTool(
        name=name,
        description=listed.description,
        args_schema=listed.args_schema or {},
        func=call,
        coroutine=acall,
        # (content, artifact): the artifact keeps the server's structured content.
        response_format="content_and_artifact",
        # The server's own error (isError) and our failures raise ToolException, which
        # LangChain turns into an error ToolMessage with its text, so the run goes on.
        handle_tool_error=True,
        metadata={**(listed.metadata or {}), "mcp_server": server.name, "mcp_tool": mcp_name},
    )


class _StartError(Exception):
    """The server did not start; the message says why, with the end of its stderr."""


class _Connection:
    """The session to one server. Lives in, and is used only from, the registry's loop."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self._listed: dict[str, StructuredTool] = {}
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self.calls: set[asyncio.Task[Any]] = set()
        """The calls running on this connection, which closing it ends."""

    async def track(self, use: _Use[T]) -> T:
        """``use(self)``, as one of :attr:`calls`."""
        task = asyncio.current_task()
        assert task is not None
        self.calls.add(task)
        try:
            return await use(self)
        finally:
            self.calls.discard(task)

    async def tools(self) -> dict[str, StructuredTool]:
        """langchain-mcp-adapters' tools on the open session, by MCP name. Starts the server
        if it is not running, or raises _StartError."""
        async with self._lock:
            if self._holder is None or self._holder.done():
                await self._start()
            return self._listed

    async def call(self, tool: str, arguments: dict[str, Any], retried: bool = False) -> Any:
        """(content, artifact), or ToolException with the text the model should see."""
        who = f"MCP server {self.server.name!r}"
        try:
            listed = await self.tools()
        except _StartError as exc:
            raise ToolException(f"{who} could not be started again: {exc}") from exc
        holder = self._holder
        assert holder is not None  # set by tools(), with no await since
        if tool not in listed:
            raise ToolException(f"{who} no longer lists the tool {tool!r}")
        try:
            content, artifact = await self._send(listed[tool], holder, arguments)
        except ToolException:
            raise  # the tool's own error (an isError result), in its words
        except Exception as exc:
            if _not_sent(exc):
                # The request never reached the server (a stdio server exited since the last
                # call; an HTTP server forgot our session): open a new session and send it.
                await self.stop(holder)
                if retried:
                    raise ToolException(f"{who} ended again as soon as it started") from exc
                return await self.call(tool, arguments, retried=True)
            if not holder.done() and not _connection_closed(exc):
                raise ToolException(f"{who}: {_explain(exc, self.server)}") from exc
            # Not sent again: the call may have taken effect before the server died.
            await self.stop(holder)
            raise ToolException(
                f"{who} ended during the call to {tool!r}: {_explain(exc, self.server)}; "
                "it is started again at the next call"
            ) from exc
        return _text_if_all_text(content), artifact

    async def _send(
        self, tool: StructuredTool, holder: asyncio.Task[None], arguments: dict[str, Any]
    ) -> Any:
        # The adapter's coroutine rather than its ainvoke, which would turn an error result
        # into plain content (losing status="error") and drop the artifact.
        assert tool.coroutine is not None
        call = asyncio.ensure_future(tool.coroutine(**arguments))
        try:
            # A session that fails cancels its own tasks, and a request already sent would
            # then wait out the read timeout: stop waiting when the session ends.
            await asyncio.wait({call, holder}, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                return await call
        finally:
            call.cancel()
        raise McpError(ErrorData(code=CONNECTION_CLOSED, message="Connection closed"))

    async def stop(self, holder: asyncio.Task[None] | None = None) -> None:
        """Close the session (only if it is still ``holder``'s) and stop a stdio server."""
        if holder is not None and holder is not self._holder:
            return  # another call has already started the server again
        holder, self._holder = self._holder, None
        if holder is not None:
            self._stop.set()
            await asyncio.wait({holder}, timeout=_STOP_SECONDS)

    async def _start(self) -> None:
        ready: asyncio.Future[dict[str, StructuredTool]]
        ready = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._stderr.clear()
        holder = self._holder = asyncio.create_task(self._hold(ready, self._stop))
        try:
            # The session's read timeout bounds each request; this bounds the whole start.
            timeout = self.server.timeout_seconds
            self._listed = await asyncio.wait_for(asyncio.shield(ready), timeout)
        except BaseException as exc:
            self._holder = None
            holder.cancel()
            await asyncio.wait({holder}, timeout=_STOP_SECONDS)
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved, so that asyncio does not log it as lost
            if not isinstance(exc, Exception):
                raise
            raise _StartError(_explain(exc, self.server, self._stderr.copy())) from exc

    async def _hold(
        self, ready: asyncio.Future[dict[str, StructuredTool]], stop: asyncio.Event
    ) -> None:
        # The session is opened and closed in this one task: the anyio task groups and cancel
        # scopes inside it must be exited by the task that entered them.
        try:
            async with self._session() as session:
                listed = await load_mcp_tools(session, server_name=self.server.name)
                ready.set_result({t.name: t for t in listed if isinstance(t, StructuredTool)})
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)  # now that the session is closed and stderr read
            else:
                logger.debug("MCP server %s ended: %r", self.server.describe(), exc)

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[ClientSession]:
        server = self.server
        read_timeout = timedelta(seconds=server.timeout_seconds)
        if server.command is None:
            connection: Any = {
                "transport": "streamable_http",
                "url": server.url,
                "headers": dict(server.headers),
                "timeout": server.timeout_seconds,
                "session_kwargs": {"read_timeout_seconds": read_timeout},
            }
            async with create_session(connection) as session:
                await session.initialize()
                yield session
            return
        params = StdioServerParameters(
            command=server.command[0],
            args=list(server.command[1:]),
            env=dict(server.env),
            cwd=server.cwd,
        )
        # The child's stderr goes to a pipe whose last lines a thread keeps (and logs at
        # DEBUG): they explain a server that does not start, and a chatty server does not
        # write over relaygraph's own output on the terminal.
        read_fd, write_fd = os.pipe()
        eof: concurrent.futures.Future[None] = concurrent.futures.Future()
        threading.Thread(target=self._drain, args=(read_fd, eof), daemon=True).start()
        try:
            with open(write_fd, "w", encoding="utf-8") as errlog:
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write, read_timeout_seconds=read_timeout) as session,
                ):
                    await session.initialize()
                    yield session
        finally:
            # stdio_client has waited for the child and our end is closed: EOF is near.
            await asyncio.wait({asyncio.wrap_future(eof)}, timeout=_STOP_SECONDS)

    def _drain(self, fd: int, eof: concurrent.futures.Future[None]) -> None:
        try:
            with open(fd, encoding="utf-8", errors="replace") as pipe:
                for line in pipe:
                    self._stderr.append(line.rstrip())
                    logger.debug("MCP server %r: %s", self.server.name, line.rstrip())
        finally:
            eof.set_result(None)


_Use = Callable[[_Connection], Coroutine[Any, Any, T]]


class _Registry:
    """One connection per server value, made on first use, on the process's tool loop
    (:func:`relaygraph.agents.background_loop`), which async tools share: a session opened
    by one is found again by every call, whichever path it takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[McpServer, _Connection] = {}

    def run(self, server: McpServer, use: _Use[T]) -> T:
        """``use(connection)``, run in the loop, waited for from this thread."""
        if _running_loop() is background_loop():
            # Waiting here would block the loop the call needs, until the timeout.
            raise ToolException(
                f"MCP server {server.name!r}: a tool called synchronously from a coroutine on "
                "the tools' event loop; await its ainvoke instead"
            )
        future = self._submit(server, use)
        try:
            return future.result(timeout=_limit(server))
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolException(f"MCP server {server.name!r} gave no answer in time") from None
        except concurrent.futures.CancelledError:
            raise ToolException(f"MCP server {server.name!r} was closed during the call") from None

    async def arun(self, server: McpServer, use: _Use[T]) -> T:
        """``use(connection)``, run in the loop, awaited from any loop (that one too)."""
        future = asyncio.wrap_future(self._submit(server, use))
        try:
            return await asyncio.wait_for(future, _limit(server))
        except TimeoutError:
            raise ToolException(f"MCP server {server.name!r} gave no answer in time") from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller is being cancelled
            raise ToolException(f"MCP server {server.name!r} was closed during the call") from None

    def _submit(self, server: McpServer, use: _Use[T]) -> concurrent.futures.Future[T]:
        with self._lock:
            connection = self._connections.get(server)
            if connection is None:
                connection = self._connections[server] = _Connection(server)
        return asyncio.run_coroutine_threadsafe(connection.track(use), background_loop())

    def forget(self) -> None:
        """In a forked child: the servers belong to the parent (and so does the loop's
        thread, which :func:`background_loop` makes again)."""
        self._lock = threading.Lock()
        self._connections = {}

    def close(self) -> None:
        """Stop this registry's connections and end their calls; the loop, which async
        tools share, keeps running."""
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        if not connections:
            return

        async def shutdown() -> None:
            await asyncio.gather(*(c.stop() for c in connections), return_exceptions=True)
            # Calls still waiting (on a server that would not stop) end as cancelled.
            calls = {call for c in connections for call in c.calls}
            for call in calls:
                call.cancel()
            if calls:
                await asyncio.wait(calls, timeout=_STOP_SECONDS)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), background_loop()).result(
                3 * _STOP_SECONDS
            )
        except Exception:
            logger.warning("MCP servers did not all stop in time", exc_info=True)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _limit(server: McpServer) -> float:
    # A call may have to start the server again (one timeout) and then run (another); the
    # margin lets the inner timeouts, whose messages say more, fire first.
    return 2 * server.timeout_seconds + _STOP_SECONDS


def _connection_closed(exc: BaseException) -> bool:
    return isinstance(exc, McpError) and exc.error.code == CONNECTION_CLOSED


def _not_sent(exc: BaseException) -> bool:
    # A send on a session whose streams are closed; or mcp's streamable-HTTP client's answer
    # to an HTTP 404 for our session id, which the MCP spec says to meet with a new session.
    closed = (anyio.ClosedResourceError, anyio.BrokenResourceError)
    return isinstance(exc, closed) or (isinstance(exc, McpError) and exc.error.code == 32600)


def _explain(exc: BaseException, server: McpServer, stderr: Sequence[str] = ()) -> str:
    """What went wrong, in a line, and the end of a stdio server's stderr."""
    causes = [e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)]
    cause = causes[0] if causes else exc
    # mcp's session reports its read timeout as an McpError with HTTP's 408.
    timed_out = isinstance(cause, McpError) and cause.error.code == httpx.codes.REQUEST_TIMEOUT
    if timed_out or isinstance(cause, TimeoutError | asyncio.CancelledError):
        text = f"no answer within {server.timeout_seconds:g}s"
    elif _connection_closed(cause):
        text = "it closed the connection (did it exit?)"
    elif isinstance(cause, McpError):
        text = cause.error.message
    else:
        text = f"{type(cause).__name__}: {cause}"
    lines = [line for line in stderr if line.strip()][-5:]
    return text + ("; its stderr ends with:\n  " + "\n  ".join(lines) if lines else "")


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _text_if_all_text(content: Any) -> Any:
    # Text is what the ledger, traces and scripted tests show best: a tool that answers with
    # text blocks only gives one string; images and files stay content blocks.
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "\n".join(b["text"] for b in content)
    return content


_REGISTRY = _Registry()
atexit.register(close_mcp_servers)
os.register_at_fork(after_in_child=_REGISTRY.forget)
