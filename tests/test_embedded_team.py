"""A whole team task on the embedded model (SmolLM2 in llama.cpp): slow, and CI runs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

# find_spec, not importorskip: importing llama_cpp opens files it never closes.
if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("the embedded model needs relaygraph[local]", allow_module_level=True)


@pytest.mark.slow
def test_team_completes_a_task_on_the_embedded_model(home: Path) -> None:
    from relaygraph.run import run_task

    events: list[dict[str, Any]] = []
    result = run_task(
        "What do the docs say about checkpoint durability? Write a short report.",
        on_event=events.append,
    )
    # Every role ran on the embedded default, with no key and no server.
    assert set(result.models.values()) == {"local:smollm2"}
    assert result.status in ("succeeded", "degraded"), result.stop_reason
    assert result.agents_run, "the supervisor routed to at least one agent"
    assert result.answer
    # Agents used real tools, chosen by the model under a constrained schema.
    assert any(e["type"] == "tool_result" for e in events)
    assert result.usage["supervisor"]["model_calls"] >= 1
    assert result.usage[result.agents_run[0]]["input_tokens"] > 0
