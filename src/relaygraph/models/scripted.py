"""A deterministic scripted chat model, for tests, demos and replaying scenarios.

The script is a JSON file whose keys are agent names (or ``supervisor`` / ``finalize``) and
whose values are the turns that agent's model plays, in order. The format is documented in
``docs/scripted-models.md``.

Which turn a call takes is derived from the run's checkpointed state, never from a counter
held in this process: the team graph says with each model call how many calls the role
made earlier in the thread, from its usage records (``relaygraph._names.PRIOR_CALLS_KEY``,
told only to a model that says it replays by position, as this one does), and the model
adds its own AI messages already in the conversation it is given. A run continued in a new
process, or a super-step re-run after an interrupt, therefore takes exactly the turn it would
have taken.
"""

from __future__ import annotations

import json
import math
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda
from langchain_core.runnables.config import ensure_config
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relaygraph._names import PRIOR_CALLS_KEY, USAGE_ESTIMATED_KEY
from relaygraph.errors import ConfigError, ModelNotAllowed, ScriptError

__all__ = [
    "MAX_SCRIPT_BYTES",
    "Script",
    "ScriptFolder",
    "ScriptTurn",
    "ScriptedChatModel",
    "estimate_tokens",
    "load_script",
    "parse_turns",
]

MAX_SCRIPT_BYTES = 1024 * 1024
"""The largest script file read."""

_TURN_KIND = "relaygraph_turn_kind"
"""The keyword a structured call passes to the chat path (``invoke(...,
relaygraph_turn_kind="route")``): which kind of turn it plays."""
_SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}\.json")


class _Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptTurn(BaseModel):
    """One turn of a script: exactly one of ``content``, ``tool_calls`` or ``route``."""

    model_config = ConfigDict(extra="forbid")
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    route: dict[str, Any] | None = None
    usage: _Usage | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptTurn:
        kinds = [k for k in ("content", "tool_calls", "route") if getattr(self, k) is not None]
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise ValueError(
                f"a turn needs exactly one of 'content', 'tool_calls', 'route' (found: {found})"
            )
        return self

    @property
    def kind(self) -> Literal["content", "tool_calls", "route"]:
        if self.route is not None:
            return "route"
        return "tool_calls" if self.tool_calls is not None else "content"


class Script(BaseModel):
    """A parsed script file: turns per agent."""

    model_config = ConfigDict(frozen=True)
    path: Path
    turns: dict[str, list[ScriptTurn]]


def load_script(path: str | Path) -> Script:
    """Read and validate a script file.

    Only a regular file whose name ends in ``.json`` and that holds at most
    :data:`MAX_SCRIPT_BYTES` is opened. The name rule keeps this reader away from the
    ledger's and the checkpointer's SQLite files (``*.sqlite``): SQLite's locks are POSIX
    advisory locks, which a process loses on *every* lock of a file as soon as it closes
    *any* descriptor of that file, so merely opening and closing a database in a process
    that holds it open lets another process checkpoint and delete its WAL under it
    (https://www.sqlite.org/howtocorrupt.html, section 2.2). The regular-file rule keeps it
    from devices and pipes (``/dev/zero`` would never end).

    Raises:
        ConfigError: The file is missing, not a regular ``.json`` file, too large, not
            JSON, or a turn is malformed; the message names the file, the agent and the
            turn number.
    """
    file = Path(path).expanduser()
    if file.suffix.lower() != ".json":
        raise ConfigError(f"script file {str(file)!r} must be a .json file")
    try:
        info = file.stat()  # stat, not open: see above.
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"script file {str(file)!r} is not a regular file")
        if info.st_size > MAX_SCRIPT_BYTES:
            raise ConfigError(
                f"script file {str(file)!r} holds {info.st_size:,} bytes; "
                f"the limit is {MAX_SCRIPT_BYTES:,}"
            )
        with file.open("rb") as handle:
            data = handle.read(MAX_SCRIPT_BYTES + 1)
        if len(data) > MAX_SCRIPT_BYTES:  # It grew since the stat.
            raise ConfigError(f"script file {str(file)!r} is over {MAX_SCRIPT_BYTES:,} bytes")
        raw = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"script file {str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"script file {str(file)!r} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"script file {str(file)!r} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    turns = parse_turns(raw, source=f"script file {str(file)!r}")
    return Script(path=file.resolve(), turns=turns)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScriptFolder:
    """The folder whose scripts a server's requests may name (``serve --scripts DIR``).

    A request names a script by its file name only (``scripted:relay.json``); nothing a
    request says can make the server open a file outside this folder.
    """

    path: Path
    """The folder, as the operator named it."""

    def resolve(self, name: str) -> Path:
        """The script file ``name`` names in this folder.

        Raises:
            ModelNotAllowed: ``name`` is not a plain ``.json`` file name (a path, ``..``,
                a hidden file), is a symlink, or is no regular file in the folder. The
                message says only that the spec is not allowed: it reveals nothing about
                the server's files.
        """
        spec = f"scripted:{name}"
        if not _SCRIPT_NAME.fullmatch(name):
            raise ModelNotAllowed(spec, "name a .json file of the server's scripts folder")
        root = self.path.expanduser().resolve()
        file = root / name
        try:
            info = file.lstat()  # A symlink is refused, wherever it leads.
        except OSError:
            raise ModelNotAllowed(spec, "no such script in the server's scripts folder") from None
        if not stat.S_ISREG(info.st_mode) or file.resolve().parent != root:
            raise ModelNotAllowed(spec, "no such script in the server's scripts folder")
        return file


def parse_turns(raw: Any, *, source: str) -> dict[str, list[ScriptTurn]]:
    """Validate a script's content: a mapping of script key to its list of turns.

    Raises:
        ConfigError: Not a mapping, a key without a list, or a malformed turn; the message
            starts with ``source`` and names the key and the turn number.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} must hold a JSON object of agent name -> list of turns")
    turns: dict[str, list[ScriptTurn]] = {}
    for agent, agent_turns in raw.items():
        if not isinstance(agent_turns, list):
            raise ConfigError(f"{source}: {agent!r} must be a list of turns")
        parsed = []
        for number, turn in enumerate(agent_turns, start=1):
            try:
                parsed.append(ScriptTurn.model_validate(turn))
            except ValidationError as exc:
                problem = "; ".join(
                    f"{'.'.join(str(p) for p in err['loc']) or 'turn'}: {err['msg']}"
                    for err in exc.errors()
                )
                raise ConfigError(
                    f"{source}: {agent!r} turn {number} is invalid: {problem}"
                ) from None
        turns[str(agent)] = parsed
    return turns


def estimate_tokens(text: str) -> int:
    """A provider-free token estimate: about four characters per token."""
    return math.ceil(len(text) / 4) if text else 0


def _text_of(messages: Sequence[BaseMessage]) -> str:
    return "\n".join(m.text if isinstance(m.content, list) else str(m.content) for m in messages)


class ScriptedChatModel(BaseChatModel):
    """Plays the turns of one script key (an agent, ``supervisor`` or ``finalize``).

    Works wherever a chat model does: ``bind_tools`` (tool calls come from the script) and
    ``with_structured_output`` (answered by ``route`` turns, returning the route as a dict,
    unvalidated, so the caller's validation and repair are exercised as with a real model).
    """

    script: Script
    agent: str
    relaygraph_replays_by_position: bool = True
    """Each call plays the turn at its position in the role's history, which the team graph
    tells a model that says so (:data:`relaygraph._names.REPLAYS_BY_POSITION`)."""

    @property
    def _llm_type(self) -> str:
        return "relaygraph-scripted"

    @property
    def model_name(self) -> str:
        return f"scripted:{self.script.path.name}"

    def _turn(
        self,
        messages: Sequence[BaseMessage],
        want: str,
        config: RunnableConfig | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
    ) -> tuple[int, ScriptTurn]:
        # A chat model's _generate sees the caller's config only through its callback
        # metadata; a structured-output call gets the config itself.
        cfg = ensure_config(config)
        metadata = run_manager.metadata if run_manager is not None else {}
        prior = int(
            metadata.get(PRIOR_CALLS_KEY, cfg.get("configurable", {}).get(PRIOR_CALLS_KEY, 0))
        )
        # Its own AI messages only: a tool-calling supervisor's input also holds the
        # agents' messages, each named by its agent.
        index = prior + sum(
            1 for m in messages if isinstance(m, AIMessage) and m.name in (None, self.agent)
        )
        turns = self.script.turns.get(self.agent)
        if turns is None:
            raise ScriptError(self.agent, index + 1, f"the script {self.model_name} has no turns")
        if index >= len(turns):
            raise ScriptError(
                self.agent, index + 1, f"the script has only {len(turns)} turn(s): it ran out"
            )
        turn = turns[index]
        allowed = {"route"} if want == "route" else {"content", "tool_calls"}
        if turn.kind not in allowed:
            expected = "a 'route' turn" if want == "route" else "a 'content' or 'tool_calls' turn"
            raise ScriptError(
                self.agent,
                index + 1,
                f"expected {expected} for this {want} request, found a {turn.kind!r} turn",
            )
        return index, turn

    def _message(self, messages: Sequence[BaseMessage], index: int, turn: ScriptTurn) -> AIMessage:
        tool_calls = [
            {"name": c.name, "args": c.args, "id": c.id or f"call_{self.agent}_{index + 1}_{i}"}
            for i, c in enumerate(turn.tool_calls or [])
        ]
        content = turn.content or ""
        if turn.usage is not None:
            usage, estimated = turn.usage, False
        else:
            out_text = content + json.dumps(turn.route or [c["args"] for c in tool_calls])
            usage = _Usage(
                input_tokens=estimate_tokens(_text_of(messages)),
                output_tokens=estimate_tokens(out_text),
            )
            estimated = True
        return AIMessage(
            content=content if turn.route is None else json.dumps(turn.route),
            tool_calls=tool_calls,
            usage_metadata={
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
            response_metadata={
                "model_name": self.model_name,
                USAGE_ESTIMATED_KEY: estimated,
                "relaygraph_script_turn": index + 1,
            },
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        want = "route" if kwargs.get(_TURN_KIND) == "route" else "chat"
        index, turn = self._turn(messages, want, run_manager=run_manager)
        return ChatResult(
            generations=[ChatGeneration(message=self._message(messages, index, turn))]
        )

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        # The script decides which tools are called; an unknown tool name reaches the
        # agent's tool node, which answers it with an error ToolMessage like any model's.
        # ``parallel_tool_calls=False`` is accepted and, as some providers do, not obeyed:
        # a script may still play two calls in one message, to test that case.
        return self

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        def answer(value: LanguageModelInput, config: RunnableConfig) -> Any:
            messages = self._convert_input(value).to_messages()
            # Through the chat model's own path, as a real model's structured call is: the
            # run's callbacks (the record of each model call, tracing) see it alike.
            raw = self.invoke(messages, config, relaygraph_turn_kind="route")
            parsed = dict(json.loads(raw.text or "{}"))
            return {"raw": raw, "parsed": parsed, "parsing_error": None} if include_raw else parsed

        return RunnableLambda(answer, name=f"scripted_route_{self.agent}")
