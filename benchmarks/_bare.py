"""The baseline: a bare ``langgraph_supervisor.create_supervisor`` team.

Workers are ``langchain.agents.create_agent`` graphs with relaygraph's own tools (the same
functions, reading the same :class:`~relaygraph.agents.TaskContext`) and the same system
prompts; the supervisor is the prebuilt tool-calling supervisor with ``transfer_to_<agent>``
tools. Models are either :class:`TurnModel` (in process, for timing) or ``ChatOpenAI`` against
the local Chat Completions server (for counting prompt tokens).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import PrivateAttr

AGENT_NAMES = ("researcher", "coder", "writer")
SUPERVISOR_PROMPT = (
    "You are the supervisor of a team of agents. You decide who works next; you do no work "
    "yourself.\n\nThe agents:\n{roster}\n\nTransfer the work to one agent at a time with its "
    "transfer_to_<agent> tool. When the results answer the request, reply with the final "
    "answer to the user."
)

_ids = itertools.count()


def _estimate(text: str) -> int:
    return math.ceil(len(text) / 4) if text else 0


class TurnModel(BaseChatModel):
    """Plays a list of turns in order (``content`` or ``tool_calls``), like relaygraph's
    scripted model: usage estimated at four characters per token, tools bound as a no-op."""

    role: str
    turns: list[dict[str, Any]]
    _cursor: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "bench-turns"

    def reset(self) -> None:
        self._cursor = 0

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self._cursor >= len(self.turns):
            raise RuntimeError(f"{self.role}: the script ran out at turn {self._cursor + 1}")
        turn = self.turns[self._cursor]
        self._cursor += 1
        calls = [
            {"name": c["name"], "args": c.get("args", {}), "id": f"call_{next(_ids)}"}
            for c in turn.get("tool_calls") or []
        ]
        content = turn.get("content") or ""
        prompt = "\n".join(m.text for m in messages)
        out = content + json.dumps([c["args"] for c in calls])
        message = AIMessage(
            content=content,
            tool_calls=calls,
            usage_metadata={
                "input_tokens": _estimate(prompt),
                "output_tokens": _estimate(out),
                "total_tokens": _estimate(prompt) + _estimate(out),
            },
            response_metadata={"model_name": f"bench:{self.role}"},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self


def build_bare_team(
    models: Mapping[str, BaseChatModel],
    *,
    output_mode: str = "full_history",
    checkpointer: Any = None,
) -> Any:
    """Compile the bare team: ``models`` has ``supervisor`` and the agents that take part."""
    from langchain.agents import create_agent
    from langgraph_supervisor import create_supervisor

    from relaygraph.agents import TaskContext, builtin, to_tool

    agents = {agent.name: agent for agent in builtin.agents()}
    names = [a for a in AGENT_NAMES if a in models]
    tools = builtin.tools()
    workers = [
        create_agent(
            models[name],
            [to_tool(t, tools, where=f"agent {name!r}") for t in agents[name].tools],
            system_prompt=agents[name].prompt,
            context_schema=TaskContext,
            name=name,
        )
        for name in names
    ]
    roster = "\n".join(f"- {n}: {agents[n].description}" for n in names)
    workflow = create_supervisor(
        # A compiled create_agent graph is a Pregel; langgraph-supervisor's annotation asks
        # for a Pregel with no context schema, which these (on TaskContext) are not.
        workers,  # type: ignore[arg-type]
        model=models["supervisor"],
        prompt=SUPERVISOR_PROMPT.format(roster=roster),
        output_mode=output_mode,  # type: ignore[arg-type]
        context_schema=TaskContext,
    )
    return workflow.compile(checkpointer=checkpointer)


def turn_models(script: dict[str, list[dict[str, Any]]]) -> dict[str, TurnModel]:
    """A model per role of the script, and for every agent (the team always has all three)."""
    roles = dict.fromkeys(["supervisor", *AGENT_NAMES, *script])
    return {role: TurnModel(role=role, turns=script.get(role, [])) for role in roles}
