"""The policy a task ran under, as the text of a policy file, each line keyed so the page
can mark the rule that refused a call.

The task keeps its policy as ``policies.policy_to_mapping`` writes it; this writes that
mapping back in the policy file's TOML shape. Python's standard library reads TOML but does
not write it, and the mapping holds only tables of numbers, strings, booleans and lists of
strings, whose TOML is the JSON of each value: a dozen lines here beat a dependency.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from relaygraph.api._schemas import without_paths

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyLine:
    text: str
    rule: str | None
    """The key this line sets (``agents.coder.tools``), None for a section header."""


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def policy_lines(policy: dict[str, Any]) -> tuple[PolicyLine, ...]:
    """The policy as policy-file lines: ``[team]``, its keys, ``[agents.coder]``, ..."""
    lines: list[PolicyLine] = []

    def table(path: tuple[str, ...], values: dict[str, Any]) -> None:
        if lines:
            lines.append(PolicyLine(text="", rule=None))
        lines.append(PolicyLine(text=f"[{'.'.join(_key(p) for p in path)}]", rule=None))
        for key, value in values.items():
            text = f"{_key(key)} = {json.dumps(value, ensure_ascii=False)}"
            lines.append(PolicyLine(text=text, rule=".".join((*path, key))))

    for section in ("team", "ping_pong", "finalize"):
        if policy.get(section):
            table((section,), policy[section])
    for group in ("agents", "prices"):
        for name, values in (policy.get(group) or {}).items():
            table((group, name), values)
    return tuple(lines)


def policy_origin(source: str | None) -> str:
    """Where the policy came from, as ``GET /v1/tasks/{id}`` says (without the server's
    paths), ``default`` when the task recorded nothing."""
    return without_paths(source) or "default"
