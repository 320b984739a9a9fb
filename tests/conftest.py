"""Shared fixtures: an isolated data directory and no way to reach a real model by accident."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_RELAY = REPO / "examples" / "scripts" / "relay.json"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every test gets its own data directory, no API key, and a dead OpenAI endpoint.

    A test that reaches for a real model by mistake fails with a connection error instead
    of spending money or waiting on the network.
    """
    home = tmp_path / "home"
    monkeypatch.setenv("RELAYGRAPH_HOME", str(home))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.delenv("LANGCHAIN_TRACING_V2", raising=False)
    return home


@pytest.fixture
def home(_offline: Path) -> Path:
    return _offline


@pytest.fixture
def script(tmp_path: Path) -> Callable[[dict[str, Any]], str]:
    """Write a scripted-model file and return its model spec."""
    counter = iter(range(1000))

    def write(turns: dict[str, Any]) -> str:
        path = tmp_path / f"script-{next(counter)}.json"
        path.write_text(json.dumps(turns), encoding="utf-8")
        return f"scripted:{path}"

    return write
