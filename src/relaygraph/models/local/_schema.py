"""JSON schemas the embedded model decodes under: capped copies of a tool's or a caller's
schema that llama.cpp's grammar converter compiles, the decision between tools and an
answer, and the one value a schema may admit (then no model call is needed)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.utils.json_schema import dereference_refs
from pydantic import BaseModel

from relaygraph._names import HANDOFF_PREFIX

__all__ = [
    "ANSWER_CHARS",
    "ARG_CHARS",
    "HANDOFF_PREFIX",
    "answer_schema",
    "args_schema",
    "bounded",
    "build_decision_schema",
    "compiles",
    "grammar_safe",
    "single_value",
    "structured_schema",
]

ANSWER_CHARS = 600
ARG_CHARS = 200
TASK_CHARS = 300
REASON_CHARS = 160
MAX_ITEMS = 8

_GRAMMAR_FORMATS = ("date", "time", "date-time", "uuid")
"""String formats the grammar converter enforces; others become capped plain strings."""


def bounded(schema: Any, *, string_cap: int) -> Any:
    """A copy of a JSON schema that llama.cpp's grammar converter compiles, with every
    string and array capped.

    The converter understands type, properties, required, items, enum, const, anyOf/oneOf,
    min/maxLength, min/maxItems and a few formats; it ignores descriptions and defaults, and
    asserts on regex features it lacks, so ``pattern`` is dropped (the tool validates its
    arguments anyway). Without ``additionalProperties`` no extra keys are generated.
    """
    if isinstance(schema, list):
        return [bounded(s, string_cap=string_cap) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "allOf" in schema and len(schema["allOf"]) == 1:
        merged = {k: v for k, v in schema.items() if k != "allOf"} | schema["allOf"][0]
        return bounded(merged, string_cap=string_cap)
    out: dict[str, Any] = {}
    for key in ("type", "enum", "const", "required", "minItems", "minLength"):
        if key in schema:
            out[key] = schema[key]
    if schema.get("format") in _GRAMMAR_FORMATS:
        out["format"] = schema["format"]
    if "oneOf" in schema or "anyOf" in schema:
        out["anyOf"] = bounded(schema.get("oneOf") or schema["anyOf"], string_cap=string_cap)
    if "allOf" in schema:
        out["allOf"] = bounded(schema["allOf"], string_cap=string_cap)
    if "properties" in schema:
        out["properties"] = {
            k: bounded(v, string_cap=string_cap) for k, v in schema["properties"].items()
        }
    for key in ("items", "prefixItems"):
        if key in schema:
            out[key] = bounded(schema[key], string_cap=string_cap)
    declared = out.get("type")
    kinds: list[Any] = declared if isinstance(declared, list) else [declared]
    if "string" in kinds and not {"enum", "const", "format"} & out.keys():
        out["maxLength"] = min(schema.get("maxLength", string_cap), string_cap)
    if "array" in kinds:
        out["maxItems"] = min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    return out


_UNSAFE = str.maketrans({'"': "'", "\\": "/", "\n": " ", "\r": " ", "\t": " "})


def grammar_safe(text: str) -> str:
    """``text`` as a value llama-cpp-python's converter can put in a grammar literal.

    Its converter escapes a JSON value's quotes but not its backslashes, so a value whose
    JSON has an escape (a double quote, a backslash, a control or non-ASCII character)
    breaks the grammar. Double quotes become single ones, accents are dropped, and other
    characters outside ASCII go.
    """
    plain = unicodedata.normalize("NFKD", text.translate(_UNSAFE))
    return plain.encode("ascii", "ignore").decode("ascii")


def compiles(schema: Mapping[str, Any]) -> bool:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # the converter raises bare AssertionErrors and KeyErrors
        return False
    return True


def args_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The grammar of a tool's arguments, from its OpenAI-format function spec."""
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
    capped = bounded(params, string_cap=ARG_CHARS)
    capped.setdefault("properties", {})
    # A schema the converter cannot compile still gets a JSON object; the tool validates it.
    return capped if compiles(capped) else {"type": "object"}


def answer_schema(*, const: str | None = None) -> dict[str, Any]:
    """The answer alternative: free text, or the one text ``const``."""
    content = (
        {"const": const}
        if const is not None
        else {"type": "string", "minLength": 1, "maxLength": ANSWER_CHARS}
    )
    return {
        "type": "object",
        "properties": {"action": {"const": "answer"}, "content": content},
        "required": ["action", "content"],
    }


def build_decision_schema(
    tools: Sequence[Mapping[str, Any]], *, allow_answer: bool = True
) -> dict[str, Any]:
    """The JSON schema of one decision: call one of ``tools`` (with its arguments) or answer.

    Args:
        tools: OpenAI-format function specs (``{"name", "description", "parameters"}``);
            empty to allow only an answer.
        allow_answer: Offer the answer alternative; ignored when ``tools`` is empty.

    Returns:
        ``{"anyOf": [call alternatives..., answer]}``. ``anyOf`` rather than ``oneOf``:
        llama.cpp treats both as a plain alternation, and the alternatives are disjoint by
        ``action`` / ``tool`` anyway. (With narrowing declared, the local provider builds
        the same shape from the narrowed arguments.)
    """
    calls = [
        {
            "type": "object",
            "properties": {
                "action": {"const": "call"},
                "tool": {"const": tool["name"]},
                "args": args_schema(tool),
            },
            "required": ["action", "tool", "args"],
        }
        for tool in tools
    ]
    answer = [answer_schema()] if allow_answer or not calls else []
    return {"anyOf": [*calls, *answer]}


def structured_schema(
    schema: dict[str, Any] | type,
) -> tuple[dict[str, Any], dict[str, Any], type[BaseModel] | None]:
    """The grammar-ready schema, the resolved schema (with descriptions, for the prompt),
    and the pydantic class to validate with (if one was given)."""
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
    capped = bounded(resolved, string_cap=ARG_CHARS)
    if not compiles(capped):
        raise ValueError(
            f"the schema {raw.get('title', '(untitled)')!r} cannot be turned into a grammar "
            "for the local model; simplify it (no regex patterns, no nested allOf)"
        )
    return capped, resolved, cls


_NO_VALUE = object()


def single_value(schema: Any) -> Any:
    """The one JSON value ``schema`` admits, or :data:`NotImplemented` when it admits more.

    A choice with one option is no choice: decoding it would only spend the model's time
    on forced tokens. Recognised: ``const``, a one-value ``enum``, an object whose
    properties are all required and single-valued, an array of fixed length whose items
    are, and an ``anyOf`` with one alternative.
    """
    value = _single(schema)
    return NotImplemented if value is _NO_VALUE else value


def _single(schema: Any) -> Any:
    if not isinstance(schema, Mapping):
        return _NO_VALUE
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0] if len(schema["enum"]) == 1 else _NO_VALUE
    if "anyOf" in schema:
        return _single(schema["anyOf"][0]) if len(schema["anyOf"]) == 1 else _NO_VALUE
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        props = schema["properties"]
        if set(schema.get("required", [])) != set(props):
            return _NO_VALUE
        out = {k: _single(v) for k, v in props.items()}
        return _NO_VALUE if any(v is _NO_VALUE for v in out.values()) else out
    if kind == "array" and schema.get("minItems") == schema.get("maxItems") is not None:
        item = _single(schema.get("items"))
        return _NO_VALUE if item is _NO_VALUE else [item] * int(schema["minItems"])
    return _NO_VALUE
