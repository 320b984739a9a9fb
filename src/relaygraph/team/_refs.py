"""Tool references of a team file: a built-in name, ``./file.py:function``,
``package.module:function`` or ``mcp:SERVER/TOOL`` (``mcp:SERVER/*`` for all its tools)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from relaygraph.team._errors import TeamFileError

__all__ = ["ToolRef", "parse_tool_ref", "resolve_python_ref"]

RefKind = Literal["builtin", "file", "module", "mcp"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"{_IDENT}(\.{_IDENT})*")
_MCP = re.compile(rf"mcp:(?P<server>{_IDENT})/(?P<tool>\*|[A-Za-z0-9_.-]+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolRef:
    """One entry of an agent's ``tools`` list, parsed."""

    text: str
    """As written in the file."""
    kind: RefKind
    target: str
    """The built-in name, the file (relative as written), the module, or the MCP server."""
    attribute: str | None = None
    """The function of a file or module; the MCP tool (``*`` for all)."""


def parse_tool_ref(text: str, *, where: str, table: str) -> ToolRef:
    """Parse a tool reference.

    Raises:
        TeamFileError: The text is none of the four forms; the message shows them.
    """
    if not isinstance(text, str) or not text.strip():
        raise _error(table, f"{where}: a tool reference must be a non-empty string, got {text!r}")
    if text.startswith("mcp:"):
        match = _MCP.fullmatch(text)
        if match is None:
            raise _error(
                table,
                f"{where}: {text!r} is not an MCP tool reference; write mcp:SERVER/TOOL or "
                "mcp:SERVER/*",
            )
        return ToolRef(text=text, kind="mcp", target=match["server"], attribute=match["tool"])
    if ":" in text:
        target, _, attribute = text.rpartition(":")
        if not re.fullmatch(_IDENT, attribute):
            raise _error(table, f"{where}: {text!r}: {attribute!r} is not a function name")
        if target.endswith(".py"):
            return ToolRef(text=text, kind="file", target=target, attribute=attribute)
        if _MODULE.fullmatch(target):
            return ToolRef(text=text, kind="module", target=target, attribute=attribute)
        raise _error(
            table, f"{where}: {text!r} names neither a .py file nor an importable module before ':'"
        )
    if re.fullmatch(_IDENT, text):
        return ToolRef(text=text, kind="builtin", target=text)
    raise _error(
        table,
        f"{where}: {text!r} is not a tool reference; write a built-in tool name (search_docs), "
        "./file.py:function, package.module:function, or mcp:SERVER/TOOL",
    )


def resolve_python_ref(
    ref: ToolRef, *, base: Path, where: str, table: str
) -> tuple[Any, str | None]:
    """The object a ``file`` or ``module`` reference names, and for a file its digest.

    A file is loaded from ``base`` (the team file's folder) under a module name of its own,
    so two team files with a ``tools.py`` each do not meet in ``sys.modules``.

    Raises:
        TeamFileError: The file is missing, fails to import (with the import error), or has
            no such function.
    """
    if ref.kind == "file":
        path = (base / ref.target).resolve()
        if not path.is_file():
            raise _error(table, f"{where}: tool file {ref.target!r} does not exist ({path})")
        data = path.read_bytes()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        name = f"relaygraph_team_tools_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        module = _load_file(path, name, where=where, table=table, digest=digest)
    else:
        digest = None
        try:
            module = importlib.import_module(ref.target)
        except Exception as exc:
            raise _error(
                table,
                f"{where}: tool {ref.text!r}: module {ref.target!r} cannot be imported: "
                f"{type(exc).__name__}: {exc}",
            ) from None
    assert ref.attribute is not None
    found = getattr(module, ref.attribute, None)
    if found is None:
        raise _error(table, f"{where}: tool {ref.text!r}: {ref.target!r} has no {ref.attribute!r}")
    return found, digest


_LOADED: dict[str, tuple[str, Any]] = {}


def _load_file(path: Path, name: str, *, where: str, table: str, digest: str) -> Any:
    """Import ``path`` as module ``name``, again only if its content changed."""
    kept = _LOADED.get(name)
    if kept is not None and kept[0] == digest:
        return kept[1]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _error(table, f"{where}: tool file {str(path)!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _error(
            table, f"{where}: tool file {str(path)!r} fails to import: {type(exc).__name__}: {exc}"
        ) from None
    _LOADED[name] = (digest, module)
    return module


def allowed_module(module: str, patterns: Mapping[str, Any] | list[str] | tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``patterns`` or inside one (``mytools`` allows
    ``mytools.style``)."""
    return any(module == p or module.startswith(p + ".") for p in patterns)


def _error(table: str, message: str) -> TeamFileError:
    """A mistake in the ``tools`` key of the agent table ``table``."""
    return TeamFileError(message, table=table, key="tools")
