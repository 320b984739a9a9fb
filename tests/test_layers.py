"""The layering in docs/architecture.md holds: each layer imports only the layers beneath it.

Every import counts, function-level ones too, so the package graph has no circle and no
upward edge. ``ALLOWED`` is the drawing in docs/architecture.md as data: a layer may import
itself and the relaygraph layers listed for it, nothing else of relaygraph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "relaygraph"

# The bottom: stdlib only (the shared names and typed records every layer may read).
BASE = ("errors", "_names", "events", "_deadline", "_calls", "_lazy")
MODEL_FREE = (*BASE, "_home", "topology")

ALLOWED: dict[str, tuple[str, ...]] = {
    "errors": (),
    "_names": (),
    "events": ("_names",),
    "_home": (),
    "_deadline": (),
    "_calls": (),
    "_lazy": (),
    "topology": BASE,
    "client": BASE,
    "backends": BASE,
    "models": BASE,
    "policies": BASE,
    "handoffs": BASE,
    "policies.middleware": (*BASE, "policies", "handoffs"),
    "agents": (*BASE, "_home", "backends", "handoffs", "policies", "policies.middleware"),
    "supervisor": (*MODEL_FREE, "agents", "handoffs", "models", "policies", "policies.middleware"),
    "team": (*MODEL_FREE, "agents", "models", "policies", "supervisor"),
    "store": (*BASE, "_home"),
    "tracing": (*BASE, "store"),
    "runner": (
        *MODEL_FREE,
        *("backends", "models", "policies", "policies.middleware", "handoffs", "agents"),
        *("supervisor", "team", "store", "tracing"),
    ),
    "evals": (
        *MODEL_FREE,
        *("backends", "models", "policies", "handoffs", "agents", "supervisor", "team"),
        *("store", "tracing", "runner"),
    ),
    # A Celery worker runs the runner; the API publishes to it and listens for its events.
    "worker": (
        *MODEL_FREE,
        *("backends", "models", "policies", "handoffs", "agents", "supervisor", "team"),
        *("store", "tracing", "runner"),
    ),
    # LangGraph's own server's entry point: an edge, like the API.
    "langgraph_app": (*MODEL_FREE, "backends", "agents", "team", "runner"),
    "api": (
        *MODEL_FREE,
        *("backends", "models", "policies", "handoffs", "agents", "supervisor", "team"),
        *("store", "tracing", "runner", "evals", "worker"),
    ),
    # The CLI starts the API (``serve``) and talks to a remote one through the client.
    "cli": (
        *MODEL_FREE,
        *("backends", "models", "policies", "handoffs", "agents", "supervisor", "team"),
        *("store", "tracing", "runner", "evals", "worker", "api", "client", "__init__"),
    ),
    # ``import relaygraph`` names the public values lazily.
    "__init__": (*BASE, "agents", "team", "runner"),
}


def layer_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    if rel.parts[:2] == ("policies", "middleware.py"):
        return "policies.middleware"
    return rel.parts[0].removesuffix(".py")


def layer_of_module(name: str) -> str:
    if name == "relaygraph":
        return "__init__"
    parts = name.split(".")
    if parts[1:3] == ["policies", "middleware"]:
        return "policies.middleware"
    return parts[1]


def imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


MODULES = sorted(SRC.rglob("*.py"))


def test_every_layer_is_drawn() -> None:
    assert {layer_of(path) for path in MODULES} <= set(ALLOWED)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_upward_imports(path: Path) -> None:
    layer = layer_of(path)
    allowed = {layer, *ALLOWED[layer]}
    bad = [
        name
        for name in imports(path)
        if (name == "relaygraph" or name.startswith("relaygraph."))
        and layer_of_module(name) not in allowed
    ]
    assert not bad, f"{path.relative_to(SRC)} ({layer}) imports {bad}"


def test_the_drawing_has_no_circle() -> None:
    seen: dict[str, str] = {}

    def visit(layer: str, trail: tuple[str, ...]) -> None:
        assert layer not in trail, f"circle: {' -> '.join((*trail, layer))}"
        if seen.get(layer) == "done":
            return
        for lower in ALLOWED[layer]:
            visit(lower, (*trail, layer))
        seen[layer] = "done"

    for layer in ALLOWED:
        visit(layer, ())


@pytest.mark.parametrize("module", ["errors", "_names", "events", "_home", "_deadline", "_lazy"])
def test_the_base_is_stdlib_only(module: str) -> None:
    path = SRC / f"{module}.py"
    third_party = [
        name
        for name in imports(path)
        if name.split(".")[0] not in {"relaygraph", "__future__"}
        and name.split(".")[0] not in __import__("sys").stdlib_module_names
    ]
    assert not third_party, f"{module} imports {third_party}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_module_of_another_package_is_imported(path: Path) -> None:
    """A package's ``_module`` is its own: other packages import what its ``__init__``
    exports (``from relaygraph.agents import to_tool``, not ``relaygraph.agents._agent``)."""
    own = path.relative_to(SRC).parts[0] if len(path.relative_to(SRC).parts) > 1 else None
    bad = []
    for name in imports(path):
        parts = name.split(".")
        if parts[0] != "relaygraph" or len(parts) < 3 or parts[1] == own:
            continue
        if any(part.startswith("_") for part in parts[2:]):
            bad.append(name)
    assert not bad, f"{path.relative_to(SRC)} imports another package's private modules {bad}"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_NAMES = {module_name(path): path for path in MODULES}


def module_imports(path: Path) -> set[str]:
    """The relaygraph modules ``path`` imports, function-level and ``TYPE_CHECKING`` ones
    too: ``from relaygraph.a import b`` is module ``a.b`` when that is a module, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULE_NAMES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULE_NAMES and name != module_name(path)}


def package_of(module: str) -> str:
    """The top package a module belongs to (``relaygraph.api`` for ``relaygraph.api.ui._x``)."""
    return ".".join(module.split(".")[:2])


# Circles inside a package that are still there, each in code another change is rewriting.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The circles of a graph: its strongly connected components (Tarjan) of more than one
    node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def connect(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for dep in sorted(graph.get(name, ())):
            if dep not in index:
                connect(dep)
                low[name] = min(low[name], low[dep])
            elif dep in stack:
                low[name] = min(low[name], index[dep])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return found


def test_no_circle_inside_a_package() -> None:
    graph = {
        name: {dep for dep in module_imports(path) if package_of(dep) == package_of(name)}
        for name, path in MODULE_NAMES.items()
    }
    found = set(circles(graph))
    assert found <= KNOWN_CIRCLES, f"import circles: {[sorted(c) for c in found - KNOWN_CIRCLES]}"
    # A circle that is gone leaves the list too, so that the list never hides a new one.
    gone = KNOWN_CIRCLES - found
    assert not gone, f"no longer circles, take them off KNOWN_CIRCLES: {[sorted(c) for c in gone]}"


def test_the_circle_check_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"x": {"y"}, "y": {"x"}}) == [frozenset({"x", "y"})]


def test_module_imports_count_function_level_imports() -> None:
    # models/_doctor.py parses a spec only when the doctor runs: a function-level import.
    doctor = MODULE_NAMES["relaygraph.models._doctor"]
    assert module_name(SRC / "api" / "ui" / "__init__.py") == "relaygraph.api.ui"
    assert "relaygraph.models._spec" in module_imports(doctor)
