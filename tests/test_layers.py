"""The layering in docs/architecture.md holds: no module imports a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "relaygraph"

# Layer -> relaygraph modules it must not import (prefix match).
FORBIDDEN = {
    "errors": ["relaygraph."],
    "_home": ["relaygraph."],
    "topology": [
        "relaygraph.agents",
        "relaygraph.supervisor",
        "relaygraph.models",
        "relaygraph.policies",
        "relaygraph.run",
        "relaygraph.store",
        "langgraph",
    ],
    "models": [
        "relaygraph.agents",
        "relaygraph.supervisor",
        "relaygraph.run",
        "relaygraph.cli",
        "relaygraph.api",
    ],
    "handoffs": [
        "relaygraph.agents",
        "relaygraph.supervisor",
        "relaygraph.models",
        "relaygraph.run",
    ],
    "policies": [
        "relaygraph.agents",
        "relaygraph.supervisor",
        "relaygraph.models",
        "relaygraph.run",
        "relaygraph.store",
    ],
    "agents": [
        "relaygraph.supervisor",
        "relaygraph.team",
        "relaygraph.run",
        "relaygraph.cli",
        "relaygraph.api",
    ],
    # A team is built from agents, policies and the supervisor; ``Team.run`` is run_task's
    # method form (the one function-level import of run).
    "team": ["relaygraph.store", "relaygraph.api", "relaygraph.cli", "relaygraph.evals"],
    "supervisor": [
        "relaygraph.team",
        "relaygraph.run",
        "relaygraph.store",
        "relaygraph.cli",
        "relaygraph.api",
    ],
    "store": ["relaygraph.run", "relaygraph.supervisor", "relaygraph.api", "relaygraph.cli"],
    "tracing": ["relaygraph.run", "relaygraph.api", "relaygraph.cli"],
    "run": ["relaygraph.api", "relaygraph.cli", "relaygraph.evals"],
    "_summary": ["relaygraph.run", "relaygraph.api", "relaygraph.cli", "relaygraph.evals"],
    "_team_cache": ["relaygraph.run", "relaygraph.api", "relaygraph.cli", "relaygraph.evals"],
    # The ledger's writer only calls the ledger it is given: it imports nothing of ours.
    "_event_writer": ["relaygraph."],
    "_lease": ["relaygraph."],
    "evals": ["relaygraph.api", "relaygraph.cli"],
    # LangGraph's own server's entry point: an edge, like the API.
    "langgraph_app": ["relaygraph.api", "relaygraph.cli", "relaygraph.evals"],
}


def layer_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_upward_imports(path: Path) -> None:
    layer = layer_of(path)
    forbidden = FORBIDDEN.get(layer, [])
    own = f"relaygraph.{layer}"
    bad = [
        name
        for name in imports(path)
        if any(name.startswith(f) for f in forbidden) and not name.startswith(own)
    ]
    assert not bad, f"{path.relative_to(SRC)} ({layer}) imports {bad}"
