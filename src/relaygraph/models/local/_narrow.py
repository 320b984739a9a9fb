"""How a tool's arguments are narrowed from the conversation, for the embedded model.

A tool declares it in its LangChain ``metadata`` under :data:`NARROW_KEY`, as plain data so
that a tool module needs nothing of the model layer::

    search_docs.metadata = {"relaygraph_narrow": {"args": {"query": {"keywords": 4}}}}
    read_doc.metadata = {"relaygraph_narrow": {
        "args": {"doc_id": {"from_tool": "search_docs", "limit": 3}},
        "sources": True,
    }}

or with the typed values here (:class:`ToolNarrowing` and :func:`narrowed`). What each
argument may be, in the grammar the model decodes under:

- ``{"keywords": N}`` (:class:`Keywords`): a few words of the request's own content words
  (at most N), offered as a short list of queries, each used at most once a visit;
  ``{"keywords": N, "queries": Q}`` offers only the Q best of them (with 1, the query not
  yet used that holds the most words, decided without a model call when nothing else is
  offered);
- ``{"from_tool": NAME, "match": REGEX, "limit": N}`` (:class:`FromResults`): one of the
  values that results of tool NAME in this visit showed (REGEX's first group, per line; by
  default a ``[doc_id]`` at the start of a line), not yet used, at most the first N. With no
  such value the tool is not offered;
- ``{"one_of": [...]}`` (:class:`OneOf`): one of these values;
- ``{"quotes": N}`` (:class:`Quotes`): a text made of 1 to N sentences, chosen among the
  ranked sentences of the documents read (or the cited sentences of the input), each with
  its ``[doc_id]``.

``"sources": true`` says the tool's results are documents to answer from (their first
``[doc_id]`` names them); ``"max_calls": N`` offers the tool at most N times a visit;
``"after": [NAME, ...]`` offers it only once one of these tools ran in the visit. A
tool's optional arguments that are not narrowed keep their defaults. Other model providers
ignore the metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relaygraph.errors import ConfigError

__all__ = [
    "DOC_ID_PATTERN",
    "MAX_QUERIES",
    "NARROW_KEY",
    "ArgNarrowing",
    "FromResults",
    "Keywords",
    "OneOf",
    "Quotes",
    "ToolNarrowing",
    "narrowed",
]

MAX_QUERIES = 5
"""Queries a :class:`Keywords` argument offers unless its rule says fewer."""
NARROW_KEY = "relaygraph_narrow"
"""The key of a tool's ``metadata`` that holds its narrowing."""
DOC_ID_PATTERN = r"^\[([^\]\s]+)\]"
"""A ``[doc_id]`` at the start of a line: how search_docs and read_doc show an id."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Keywords:
    """A string argument made of the request's content words: a short search query."""

    max_words: int = 4
    queries: int = MAX_QUERIES
    """At most this many queries are offered, best first (all the words, the first two,
    each word alone), among those not used yet in the visit."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FromResults:
    """An argument whose value one of this visit's results of another tool showed."""

    tool: str
    match: str = DOC_ID_PATTERN
    """A regular expression whose first group is a value, applied to each line of a result."""
    limit: int = 3
    """At most this many values are offered: the first ones, as the result ordered them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OneOf:
    """An argument that is one of a few fixed values."""

    values: tuple[Any, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Quotes:
    """A text argument made of sentences the conversation's documents hold, with citations."""

    max_items: int = 3


ArgNarrowing = Keywords | FromResults | OneOf | Quotes


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolNarrowing:
    """How the embedded model may call one tool, narrowed from the conversation."""

    args: Mapping[str, ArgNarrowing] = field(default_factory=dict)
    sources: bool = False
    """The tool's results are documents an answer may quote (cited by their ``[doc_id]``)."""
    max_calls: int | None = None
    """Offered at most this many times in one visit."""
    after: tuple[str, ...] = ()
    """Offered only once one of these tools ran in the visit (listing what was saved makes
    sense after saving)."""

    def to_metadata(self) -> dict[str, Any]:
        """The plain-data form kept in a tool's ``metadata[NARROW_KEY]``."""
        args: dict[str, Any] = {}
        for name, rule in self.args.items():
            if isinstance(rule, Keywords):
                args[name] = {"keywords": rule.max_words}
                if rule.queries != MAX_QUERIES:
                    args[name]["queries"] = rule.queries
            elif isinstance(rule, FromResults):
                args[name] = {"from_tool": rule.tool, "match": rule.match, "limit": rule.limit}
            elif isinstance(rule, OneOf):
                args[name] = {"one_of": list(rule.values)}
            else:
                args[name] = {"quotes": rule.max_items}
        out: dict[str, Any] = {"args": args}
        if self.sources:
            out["sources"] = True
        if self.max_calls is not None:
            out["max_calls"] = self.max_calls
        if self.after:
            out["after"] = list(self.after)
        return out

    @classmethod
    def from_metadata(cls, raw: Any, *, tool: str) -> ToolNarrowing:
        """Parse the plain-data form.

        Raises:
            ConfigError: The declaration is malformed; the message names the tool and key.
        """
        where = f"tool {tool!r}: metadata[{NARROW_KEY!r}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {raw!r}")
        unknown = set(raw) - {"args", "sources", "max_calls", "after"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(repr, unknown)))}")
        args_raw = raw.get("args", {})
        if not isinstance(args_raw, Mapping):
            raise ConfigError(f"{where}['args'] must map argument names to rules")
        args = {
            str(name): _parse_rule(rule, f"{where}['args'][{name!r}]")
            for name, rule in args_raw.items()
        }
        max_calls = raw.get("max_calls")
        if max_calls is not None and (not isinstance(max_calls, int) or max_calls < 1):
            raise ConfigError(f"{where}['max_calls'] must be a positive integer, got {max_calls!r}")
        after = raw.get("after", [])
        if isinstance(after, str) or not isinstance(after, Sequence):
            raise ConfigError(f"{where}['after'] must be a list of tool names, got {after!r}")
        return cls(
            args=args,
            sources=bool(raw.get("sources", False)),
            max_calls=max_calls,
            after=tuple(str(name) for name in after),
        )


def _parse_rule(rule: Any, where: str) -> ArgNarrowing:
    if not isinstance(rule, Mapping) or not rule:
        raise ConfigError(f"{where} must be a mapping such as {{'keywords': 4}}, got {rule!r}")
    if "keywords" in rule:
        return Keywords(
            max_words=_positive(rule["keywords"], where),
            queries=_positive(rule.get("queries", MAX_QUERIES), f"{where}['queries']"),
        )
    if "from_tool" in rule:
        pattern = str(rule.get("match", DOC_ID_PATTERN))
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{where}['match'] is not a regular expression: {exc}") from None
        if compiled.groups < 1:
            raise ConfigError(f"{where}['match'] needs a group that captures the value")
        return FromResults(
            tool=str(rule["from_tool"]), match=pattern, limit=_positive(rule.get("limit", 3), where)
        )
    if "one_of" in rule:
        values = rule["one_of"]
        if not isinstance(values, Sequence) or isinstance(values, str) or not values:
            raise ConfigError(f"{where}['one_of'] must be a non-empty list, got {values!r}")
        return OneOf(values=tuple(values))
    if "quotes" in rule:
        return Quotes(max_items=_positive(rule["quotes"], where))
    raise ConfigError(
        f"{where}: no known rule in {sorted(rule)}; use keywords, from_tool, one_of or quotes"
    )


def _positive(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def narrowed(tool: Any, narrowing: ToolNarrowing) -> Any:
    """Declare ``narrowing`` on a LangChain tool (in its ``metadata``) and return the tool.

    Example::

        from relaygraph.models.local import FromResults, ToolNarrowing, narrowed

        open_ticket = narrowed(open_ticket, ToolNarrowing(
            args={"ticket_id": FromResults(tool="find_tickets", match=r"^#(\\d+)")}))
    """
    tool.metadata = {**(tool.metadata or {}), NARROW_KEY: narrowing.to_metadata()}
    return tool
