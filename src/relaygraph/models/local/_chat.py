"""The chat adapter and loader of the embedded model (see the package docstring)."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.json import parse_partial_json
from pydantic import BaseModel, ValidationError

from relaygraph.errors import ModelSpecError, RunError
from relaygraph.models.local._engine import (
    LOCAL_WEIGHTS,
    MAX_TOKENS,
    N_CTX,
    SEED,
    Completion,
    Engine,
    close_llama_devnull,
    load_llama,
)
from relaygraph.models.local._narrow import (
    NARROW_KEY,
    FromResults,
    ToolNarrowing,
)
from relaygraph.models.local._offer import Conversation, Offer, offer, text_of
from relaygraph.models.local._prompt import (
    chat_messages,
    decision_instruction,
    render,
    schema_instruction,
    with_instruction,
)
from relaygraph.models.local._schema import (
    single_value,
    structured_schema,
)
from relaygraph.models.local._team import final_answer, narrow_route, numbered, without_plan

__all__ = ["LocalChatModel", "load_local_model"]


def load_local_model(name: str, *, spec: str) -> BaseChatModel:
    """Load an embedded model (once per process) and return a chat model that runs it.

    Args:
        name: The local model name, ``smollm2``.
        spec: The spec string the user gave, named in errors.

    Raises:
        ModelSpecError: The model is unknown, or ``llama_cpp`` / the weights package is not
            installed or cannot load; the message says how to install it or what to use.
    """
    weights = LOCAL_WEIGHTS.get(name)
    if weights is None:
        known = ", ".join(LOCAL_WEIGHTS)
        raise ModelSpecError(spec, f"unknown local model {name!r}; known: {known}")
    _engine(name, spec=spec)
    return LocalChatModel(model=name)


# --- the loaded model ----------------------------------------------------------------------

_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()
"""Guards ``_ENGINES``: two agents built at once must not load the weights twice."""


def _engine(name: str, *, spec: str | None = None) -> Engine:
    with _ENGINES_LOCK:
        engine = _ENGINES.get(name)
        if engine is None:
            llama = load_llama(name, spec=spec or f"local:{name}")
            # Freed by its finalizer at interpreter teardown, llama_cpp's module globals are
            # already gone and it prints a TypeError traceback; closing at exit avoids that.
            atexit.register(llama.close)
            engine = _ENGINES[name] = Engine(llama)
        return engine


# Registered at import: llama_cpp may be imported by anything in this process.
atexit.register(close_llama_devnull)


def _structured_schema(
    schema: dict[str, Any] | type,
) -> tuple[dict[str, Any], str, type[BaseModel] | None]:
    """The grammar-ready schema, the prompt instruction describing it, and the pydantic
    class to validate with (if one was given)."""
    capped, resolved, cls = structured_schema(schema)
    # Described from the resolved schema: the grammar copy has no descriptions.
    return capped, schema_instruction(resolved), cls


def _fit(engine: Engine, chat: list[tuple[str, str]]) -> tuple[str, list[int]]:
    """Render ``chat`` to prompt tokens that leave room for the answer, dropping the oldest
    turns after the first system and user turns (the role and the task) if needed."""
    budget = N_CTX - MAX_TOKENS
    dropped = 0
    while True:
        kept = list(chat)
        if dropped:
            head = 2 if len(chat) > 1 and chat[1][0] == "user" else 1
            kept = [
                *chat[:head],
                ("user", f"[{dropped} earlier messages omitted]"),
                *chat[head + dropped :],
            ]
        prompt = render(kept)
        tokens = engine.tokenize(prompt)
        if len(tokens) <= budget:
            return prompt, tokens
        if len(kept) <= 3:
            raise RunError(
                f"the prompt for local model needs {len(tokens)} tokens even after dropping "
                f"{dropped} messages; its context holds {budget}"
            )
        dropped += 1


def _narrowings(tools: Sequence[ToolLike]) -> dict[str, dict[str, Any]]:
    """Each bound tool's declared narrowing (plain data, checked here), by tool name.

    Raises:
        ConfigError: A malformed declaration, or one naming an argument the tool lacks.
    """
    from relaygraph.errors import ConfigError

    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        raw = (getattr(tool, "metadata", None) or {}).get(NARROW_KEY)
        if not isinstance(tool, BaseTool) or raw is None:
            continue
        parsed = ToolNarrowing.from_metadata(raw, tool=tool.name)
        params = convert_to_openai_tool(tool)["function"].get("parameters") or {}
        unknown = set(parsed.args) - set(params.get("properties") or {})
        if unknown:
            raise ConfigError(
                f"tool {tool.name!r}: metadata[{NARROW_KEY!r}] narrows "
                f"{', '.join(sorted(map(repr, unknown)))}, which it does not take"
            )
        out[tool.name] = parsed.to_metadata()
    return out


# --- the chat model ------------------------------------------------------------------------

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
_SCHEMA_KWARG = "relaygraph_output_schema"
_INSTRUCTION_KWARG = "relaygraph_output_instruction"
_NARROW_KWARG = "relaygraph_narrowing"


class LocalChatModel(BaseChatModel):
    """Chat model for an embedded model; every output is a grammar-constrained choice.

    With tools bound, the model emits one decision: call one offered tool with arguments
    that match its (narrowed) schema, or answer. What is offered follows the conversation
    (:func:`relaygraph.models.local._offer.offer`): its first decision after a human
    message is one of its work tools; after :data:`MAX_TOOL_RESULTS` tool results only an
    answer; an answer after reading documents is made of their sentences.
    ``with_structured_output`` constrains the output to the given schema (a team's route
    narrowed by keyword hints). A plain call on the team's finalize input quotes the
    agents' cited results. Load it with :func:`load_local_model`.
    """

    model: str = "smollm2"

    writes_final_answer: ClassVar[bool] = True
    """Its finalize call writes the answer even when the last agent replied: it quotes the
    agents' cited results with their sources, which an agent's own reply lacks (read by the
    team graph's finalize, under any ``[finalize] answer``)."""

    @property
    def _llm_type(self) -> str:
        return "relaygraph-local"

    @property
    def model_name(self) -> str:
        return f"local:{self.model}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "n_ctx": N_CTX,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "seed": SEED,
        }

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; ``tool_choice`` may be ``auto``, ``none``, ``any``/``required`` or a
        tool name, and narrows the choices the grammar offers. The grammar allows one tool
        call per message, so ``parallel_tool_calls`` is always off in effect. A tool's
        ``metadata[NARROW_KEY]`` narrows its arguments (:class:`ToolNarrowing`).

        Raises:
            ValueError: An unknown ``tool_choice``.
            ConfigError: A tool's narrowing is malformed.
        """
        specs = [convert_to_openai_tool(t) for t in tools]
        names = [s["function"]["name"] for s in specs]
        chosen = tool_choice
        if isinstance(chosen, dict):  # {"type": "function", "function": {"name": ...}}
            chosen = chosen.get("function", {}).get("name")
        if chosen not in (None, "auto", "none", "any", "required", *names):
            raise ValueError(
                f"tool_choice {tool_choice!r} is not 'auto', 'none', 'any', 'required' or a "
                f"bound tool ({', '.join(names) or 'none bound'})"
            )
        return self.bind(
            tools=specs, tool_choice=tool_choice, **{_NARROW_KWARG: _narrowings(tools)}, **kwargs
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # Fetched only when a choice is left to decode: a forced one needs no model.
        engine = functools.partial(_engine, self.model)
        output_schema: dict[str, Any] | None = kwargs.get(_SCHEMA_KWARG)
        tools = [t["function"] for t in kwargs.get("tools") or []]
        if output_schema is not None:
            done = self._structured(engine, messages, output_schema, kwargs)
            message = AIMessage(content=done.text.strip())
        elif tools:
            narrowings = {
                name: ToolNarrowing.from_metadata(raw, tool=name)
                for name, raw in (kwargs.get(_NARROW_KWARG) or {}).items()
            }
            choices = offer(tools, narrowings, kwargs.get("tool_choice"), Conversation.of(messages))
            sources = {name for name, n in narrowings.items() if n.sources}
            # The tools whose results gave the ids the sources tools read (the search).
            feeders = {
                rule.tool
                for name in sources
                for rule in narrowings[name].args.values()
                if isinstance(rule, FromResults)
            }
            chat = chat_messages(
                messages,
                compact=sources if choices.passages else (),
                ids_only=feeders if choices.passages else (),
            )
            chat = with_instruction(chat, decision_instruction(choices))
            done, prompt = _complete(engine, chat, choices.schema())
            message = self._decision(done.text, prompt, choices)
        else:
            done = self._plain(engine, messages)
            message = AIMessage(content=done.text.strip())
        message.usage_metadata = {
            "input_tokens": done.prompt_tokens,
            "output_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
        }
        message.response_metadata = {
            "model_name": self.model_name,
            "finish_reason": done.finish_reason,
        }
        return ChatResult(generations=[ChatGeneration(message=message)])

    @staticmethod
    def _structured(
        engine: Callable[[], Engine],
        messages: list[BaseMessage],
        schema: dict[str, Any],
        kwargs: Any,
    ) -> Completion:
        system = next((text_of(m) for m in messages if isinstance(m, SystemMessage)), "")
        human = next((text_of(m) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        schema = without_plan(schema)
        route = narrow_route(schema, system, human)
        if route is not None:
            instruction = schema_instruction(schema, route["properties"])
            schema = route
        else:
            instruction = kwargs.get(_INSTRUCTION_KWARG) or schema_instruction(schema)
        return _complete(engine, with_instruction(chat_messages(messages), instruction), schema)[0]

    @staticmethod
    def _plain(engine: Callable[[], Engine], messages: list[BaseMessage]) -> Completion:
        human = next((text_of(m) for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        final = final_answer(human) if human is not None else None
        if final is None:
            loaded = engine()
            _, tokens = _fit(loaded, chat_messages(messages))
            return loaded.complete(tokens, schema=None)
        # The team's finalize: the answer quotes what the agents cited, never new text.
        if final.schema is None:
            return Completion(
                text=final.render(), prompt_tokens=0, completion_tokens=0, finish_reason="forced"
            )
        instruction = (
            'Choose the sentences that answer the request: {"quotes": [<their numbers>]}. '
            "Sentences:\n" + numbered([p for _, p in final.candidates])
        )
        chat = with_instruction(chat_messages(messages), instruction)
        done, _ = _complete(engine, chat, final.schema)
        return Completion(
            text=final.render(done.text),
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
            finish_reason=done.finish_reason,
        )

    @staticmethod
    def _decision(text: str, prompt: str, choices: Offer) -> AIMessage:
        try:
            decision = json.loads(text)
        except json.JSONDecodeError:
            # Only a hit max_tokens cuts the grammar short; close what was generated.
            decision = parse_partial_json(text)
        if not isinstance(decision, dict):
            return AIMessage(content=text.strip())
        if decision.get("action") == "call" and isinstance(decision.get("tool"), str):
            # Derived from prompt and output: the same run replayed gets the same id.
            digest = hashlib.sha256(f"{prompt}\0{text}".encode()).hexdigest()[:24]
            args = decision.get("args")
            args = args if isinstance(args, dict) else {}
            offered = next((t for t in choices.tools if t.name == decision["tool"]), None)
            if offered is not None:
                args = offered.arguments(args)
            return AIMessage(
                content="",
                tool_calls=[{"name": decision["tool"], "args": args, "id": f"call_{digest}"}],
            )
        return AIMessage(content=choices.answer_text(decision))

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Constrain the output to ``schema`` (a JSON-schema dict or a pydantic class).

        Returns the parsed dict (or pydantic instance). With ``include_raw``, returns
        ``{"raw": AIMessage, "parsed": ... | None, "parsing_error": None | exception}`` and
        never raises for a parse error.
        """
        capped, instruction, cls = _structured_schema(schema)
        bound = self.bind(**{_SCHEMA_KWARG: capped, _INSTRUCTION_KWARG: instruction})

        def parse(message: AIMessage) -> Any:
            text = text_of(message)
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                # A hit max_tokens is the only way to cut the grammar short.
                value = parse_partial_json(text)
                if value is None:
                    raise ValueError(f"the local model's output is not JSON: {text!r}") from None
            return cls.model_validate(value) if cls is not None else value

        if not include_raw:
            return bound | RunnableLambda(parse, name="local_structured_output")

        def parse_with_raw(message: AIMessage) -> dict[str, Any]:
            try:
                return {"raw": message, "parsed": parse(message), "parsing_error": None}
            except (ValueError, ValidationError) as exc:
                return {"raw": message, "parsed": None, "parsing_error": exc}

        return bound | RunnableLambda(parse_with_raw, name="local_structured_output")


def _complete(
    engine: Callable[[], Engine], chat: list[tuple[str, str]], schema: dict[str, Any]
) -> tuple[Completion, str]:
    """A constrained completion of ``chat``, and the prompt it was rendered to.

    A schema that admits one value is answered without the model: decoding forced tokens
    only spends time, and the engine is not even loaded for it.
    """
    value = single_value(schema)
    if value is not NotImplemented:
        forced = Completion(
            text=json.dumps(value, ensure_ascii=False),
            prompt_tokens=0,
            completion_tokens=0,
            finish_reason="forced",
        )
        return forced, render(chat)
    loaded = engine()
    prompt, tokens = _fit(loaded, chat)
    return loaded.complete(tokens, schema=schema), prompt
