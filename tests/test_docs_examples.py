"""The docs' examples do what the docs say, run as a reader would run them (from the
repository's root, word for word)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO

DOCS = REPO / "docs"


def python_block(doc: Path, heading: str, index: int = 0) -> str:
    """The ``index``-th fenced Python block under ``heading`` (up to the next heading)."""
    text = doc.read_text(encoding="utf-8")
    section = text[text.index(f"\n{heading}\n") + len(heading) + 2 :]
    following = re.search(r"^#{1,6} ", section, flags=re.MULTILINE)
    if following:
        section = section[: following.start()]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    return str(blocks[index])


def python_blocks() -> list[tuple[str, str]]:
    """Every fenced Python block of the README and docs/, named ``file#index``."""
    found = []
    for doc in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for index, code in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)):
            found.append((f"{doc.relative_to(REPO)}#{index}", code))
    return found


@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_python_example_is_a_program(where: str, code: str) -> None:
    """A reader pastes an example into a file and runs it: it must compile as a module (an
    ``async with`` or ``await`` at top level, or ``...`` in a dict, does not)."""
    compile(code, where, "exec")


def run_block(code: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(REPO)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, "<docs example>", "exec"), namespace)
    return namespace


def test_policies_from_python_runs_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = run_block(python_block(DOCS / "policies.md", "## From Python"), monkeypatch)
    policy = namespace["policy"]
    assert policy.agents["coder"].approval == ("run_python",)
    assert policy.team.max_cost_usd == 0.05


def test_compose_load_balancer_keeps_a_browser_on_one_api_server() -> None:
    """A dashboard session lives in one server process (docs/dashboard.md): with two API
    replicas, the nginx upstream must be sticky or /ui sends a signed-in browser back to
    /ui/login."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    assert compose["services"]["api"]["deploy"]["replicas"] > 1
    nginx = compose["configs"]["nginx-conf"]["content"]
    upstream = re.search(r"upstream relaygraph_api \{(.*?)\}", nginx, flags=re.DOTALL)
    assert upstream is not None, nginx
    directives = [line.split("#")[0].strip() for line in upstream.group(1).splitlines()]
    assert "ip_hash;" in directives, directives
