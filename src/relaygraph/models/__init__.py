"""Chat models named by spec strings: ``openai:MODEL``, ``scripted:PATH``, ``local:smollm2``.

A spec string names a model everywhere (CLI flags, config, the API), so a team can swap the
model of one agent without touching code. An ``openai:`` spec may carry options after ``?``
(:class:`OpenAIOptions`; docs/model-servers.md): ``openai:smollm2?structured=function_calling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaygraph.models._doctor import run_doctor
from relaygraph.models._errors import AnswerCut, ModelCallError
from relaygraph.models._options import (
    STRUCTURED_ENV,
    STRUCTURED_METHODS,
    OpenAIOptions,
    StructuredMethod,
)
from relaygraph.models._spec import (
    DEFAULT_MODEL,
    OPENAI_PROVIDERS,
    PROVIDERS,
    ModelSpec,
    parse_model_spec,
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
    "load_model",
    "parse_model_spec",
    "run_doctor",
]


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
