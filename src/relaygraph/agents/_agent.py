"""An agent of a team, as its user declares it: a name, what it is for, a prompt, tools."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph._names import RESERVED_NAMES
from relaygraph.errors import ConfigError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

__all__ = ["RESERVED_NAMES", "Agent", "check_agent_name", "to_tool", "tool_name"]

# OpenAI-compatible servers accept tool names of [A-Za-z0-9_-]{1,64}; an agent's name is in
# its peers' ``transfer_to_<name>`` tools, so it follows that rule with room to spare.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


def check_agent_name(name: object, *, where: str = "agent") -> str:
    """``name`` if it can name an agent.

    Raises:
        ConfigError: Not a string of letters, digits, ``_`` and ``-`` starting with a letter
            (at most 40), or a reserved name (``supervisor``, ``finalize``, ``FINISH``).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: name {name!r} must be letters, digits, '_' or '-', starting with a "
            "letter, at most 40 characters"
        )
    if name in RESERVED_NAMES:
        raise ConfigError(
            f"{where}: name {name!r} is reserved for the team graph "
            f"({', '.join(sorted(RESERVED_NAMES))})"
        )
    return name


@dataclass(frozen=True, kw_only=True, slots=True)
class Agent:
    """One agent of a team.

    Example:
        reviewer = Agent(
            name="reviewer",
            description="checks a draft against the docs and lists concrete problems",
            prompt="You are the reviewer. ...",
            tools=[check_style, "search_docs"],
            handoffs=["writer"],
        )

    Raises:
        ConfigError: A bad name, an empty description or prompt, or a tool given twice.
    """

    name: str
    description: str
    """One line the supervisor reads when it chooses who works next."""
    prompt: str
    """The agent's system prompt."""
    tools: tuple[Any, ...] = ()
    """LangChain tools, plain typed functions with a docstring (made tools with LangChain's
    ``tool()``), names of built-in tools, or MCP servers (``relaygraph.team.mcp_server``:
    all of a server's tools, its server started now). A tool may take LangGraph's ``ToolRuntime`` to
    reach the task's context (workspace, artifacts, knowledge base)."""
    handoffs: tuple[str, ...] | None = None
    """Peers it may transfer work to directly; None: every other agent of the team."""
    model: str | BaseChatModel | None = None
    """A model spec or chat model for this agent; None: the team's default model."""
    kb: tuple[Path, ...] = ()
    """Folders indexed into the task's knowledge base for its ``search_docs`` and
    ``read_doc`` (the whole team reads one knowledge base)."""
    origins: Mapping[str, str] = field(default_factory=dict)
    """Where each tool came from, by tool name (``builtin``, ``tools.py:word_count``,
    ``mcp:lint``), for ``relaygraph team check`` and audits."""

    def __post_init__(self) -> None:
        where = f"agent {self.name!r}"
        check_agent_name(self.name, where=where)
        for key in ("description", "prompt"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise ConfigError(f"{where}: {key} is missing (a non-empty text)")
        tools, origins = _with_mcp_tools(_as_tuple(self.tools, f"{where}: tools"))
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "origins", {**origins, **self.origins})
        if self.handoffs is not None:
            handoffs = _as_tuple(self.handoffs, f"{where}: handoffs")
            for peer in handoffs:
                if not isinstance(peer, str):
                    raise ConfigError(f"{where}: handoffs holds {peer!r}, not an agent name")
            object.__setattr__(self, "handoffs", handoffs)
        kb = _as_tuple(self.kb, f"{where}: kb")
        object.__setattr__(self, "kb", tuple(Path(folder) for folder in kb))
        names = [tool_name(t) for t in self.tools]
        doubled = sorted(name for name, count in Counter(names).items() if count > 1)
        if doubled:
            raise ConfigError(f"{where}: tool(s) {', '.join(map(repr, doubled))} given twice")

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool_name(t) for t in self.tools)


def _as_tuple(value: Any, where: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes | Path) or not isinstance(value, Iterable):
        if isinstance(value, str | Path) and where.endswith("kb"):
            return (value,)
        raise ConfigError(f"{where} must be a list, got {value!r}")
    return tuple(value)


def _with_mcp_tools(tools: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, str]]:
    """``tools`` with each MCP server replaced by all its tools, and the origin
    (``mcp:SERVER``) of every MCP tool among them."""
    import sys

    from langchain_core.tools import BaseTool

    # No server value exists before its module is imported, and importing it (mcp) for
    # every agent would slow every start.
    mcp = sys.modules.get("relaygraph.team._mcp")
    expanded: list[Any] = []
    for value in tools:
        is_server = mcp is not None and isinstance(value, mcp.McpServer)
        expanded.extend(value.tools() if is_server else [value])
    origins = {
        tool.name: f"mcp:{(tool.metadata or {})['mcp_server']}"
        for tool in expanded
        if isinstance(tool, BaseTool) and "mcp_server" in (tool.metadata or {})
    }
    return tuple(expanded), origins


def tool_name(value: Any) -> str:
    """The name a tool-like value gives its tool."""
    from langchain_core.tools import BaseTool

    if isinstance(value, str):
        return value
    if isinstance(value, BaseTool):
        return value.name
    name = getattr(value, "__name__", None)
    if isinstance(name, str):
        return name
    raise ConfigError(f"{value!r} is not a tool: give a LangChain tool, a function or a name")


def to_tool(value: Any, builtins: Mapping[str, BaseTool], *, where: str) -> BaseTool:
    """A LangChain tool for a tool-like value (see :class:`Agent`'s ``tools``), callable
    from the team graph's threads whether it is sync or has only a coroutine, with its
    contract checked (:func:`~relaygraph.agents._contracts.check_tool_contract`).

    Raises:
        ConfigError: An unknown built-in name, a function LangChain cannot make a tool of,
            or a tool whose arguments give the model no complete JSON schema.
    """
    from relaygraph.agents._async_tools import sync_capable
    from relaygraph.agents._contracts import check_tool_contract

    made = _as_tool(value, builtins, where=where)
    if not any(made is builtin for builtin in builtins.values()):
        check_tool_contract(made, where=where)
    return sync_capable(made)


def _as_tool(value: Any, builtins: Mapping[str, BaseTool], *, where: str) -> BaseTool:
    from langchain_core.tools import BaseTool, tool

    if isinstance(value, BaseTool):
        return value
    if isinstance(value, str):
        found = builtins.get(value)
        if found is None:
            raise ConfigError(
                f"{where}: unknown tool {value!r}; built-in tools: {', '.join(builtins)}"
            )
        return found
    if callable(value):
        if not (getattr(value, "__doc__", None) or "").strip():
            raise ConfigError(
                f"{where}: function {tool_name(value)!r} has no docstring; the model reads "
                "it as the tool's description"
            )
        try:
            made: BaseTool = tool(value)
        except Exception as exc:  # LangChain's own message names what is wrong.
            raise ConfigError(
                f"{where}: function {tool_name(value)!r} cannot be a tool: {exc}"
            ) from None
        return made
    raise ConfigError(
        f"{where}: {value!r} is not a tool: give a LangChain tool, a function or a name"
    )
