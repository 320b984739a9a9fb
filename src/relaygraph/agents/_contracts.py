"""A tool's contract with the model, checked when its team is built.

The model sees a tool as a JSON schema of its arguments. LangChain builds that schema from a
function's signature only at the first model call, so a parameter whose type has no JSON
schema (a plain class) fails there, mid-run, with pydantic's ``PydanticInvalidForJsonSchema``;
and an untyped parameter, or ``*args``/``**kwargs``, gives the model a schema that says
nothing. :func:`check_tool_contract` builds the schema when the team is built and refuses
both, naming the agent, the tool, the parameter and the fix. A schema given explicitly
(``args_schema=`` a pydantic model or a JSON schema, as an MCP server's tools have) is
taken as it is: whoever wrote it chose what it says.
"""

from __future__ import annotations

import inspect
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from relaygraph.errors import ConfigError

__all__ = ["check_tool_contract", "tool_arguments"]

# The module of the pydantic models LangChain makes from a function's signature: a schema
# from there was inferred, not given.
_INFERRED_MODULE = "langchain_core.utils.pydantic"
# Parameters LangChain fills in itself, never the model.
_INJECTED = {"self", "cls", "callbacks", "run_manager"}


def tool_arguments(tool: BaseTool) -> dict[str, Any]:
    """The JSON schema of what the model gives ``tool`` (its ``properties`` and
    ``required``); raises what building it raises."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    return schema.model_json_schema()  # type: ignore[union-attr]


def check_tool_contract(tool: BaseTool, *, where: str) -> None:
    """Check that ``tool`` gives the model a complete JSON schema of its arguments.

    Args:
        tool: The tool.
        where: Who has it, for the message (``agent 'reviewer'``).

    Raises:
        ConfigError: An untyped parameter, ``*args``/``**kwargs`` in a function whose schema
            LangChain infers, or a parameter whose type has no JSON schema. The message names
            ``where``, the tool, the parameter and the fix.
    """
    at = f"{where}: tool {tool.name!r}"
    function = _inferred_from(tool)
    if function is not None:
        _check_signature(function, at)
    try:
        tool_arguments(tool)
    except Exception as exc:
        parameter = _failing_parameter(tool)
        if parameter is None:
            raise ConfigError(
                f"{at}: its arguments have no JSON schema: {_first_line(exc)}"
            ) from None
        name, annotation = parameter
        raise ConfigError(
            f"{at}: parameter {name!r} has type {_type_name(annotation)}, which has no JSON "
            f"schema for the model ({_first_line(exc)}); give it a type the model can write "
            "(str, int, a list, a TypedDict or a pydantic model), or give the tool an "
            "explicit args_schema"
        ) from None


def _inferred_from(tool: BaseTool) -> Any:
    """The function whose signature LangChain made ``tool``'s schema of; None when the
    schema was given (or the tool is no function's)."""
    if not isinstance(tool, StructuredTool):
        return None
    schema = tool.args_schema
    if isinstance(schema, dict) or getattr(schema, "__module__", None) != _INFERRED_MODULE:
        return None
    return tool.func or tool.coroutine


def _check_signature(function: Any, at: str) -> None:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return
    for parameter in parameters:
        if parameter.name in _INJECTED:
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            stars = "*" if parameter.kind is parameter.VAR_POSITIONAL else "**"
            raise ConfigError(
                f"{at}: takes {stars}{parameter.name}, which tells the model nothing of what "
                "to give; list the arguments as typed parameters, or give the tool an "
                "explicit args_schema=(a pydantic model)"
            )
        if parameter.annotation is parameter.empty:
            raise ConfigError(
                f"{at}: parameter {parameter.name!r} has no type, so the model is told "
                f"nothing of it; annotate it (for example {parameter.name}: str), or give the "
                "tool an explicit args_schema=(a pydantic model)"
            )


def _failing_parameter(tool: BaseTool) -> tuple[str, Any] | None:
    """The first argument of ``tool``'s schema whose type has no JSON schema."""
    from pydantic import BaseModel, TypeAdapter

    schema = tool.tool_call_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return None
    for name, field in schema.model_fields.items():
        try:
            # Without arbitrary types, which have no JSON schema either way.
            TypeAdapter(Any if field.annotation is None else field.annotation).json_schema()
        except Exception:
            return name, field.annotation
    return None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__qualname__", None) or repr(annotation)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
