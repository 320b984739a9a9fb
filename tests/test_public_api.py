"""Every package's public names import, as its ``__all__`` promises."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "relaygraph",
    "relaygraph.agents",
    "relaygraph.team",
    "relaygraph.handoffs",
    "relaygraph.models",
    "relaygraph.policies",
    "relaygraph.supervisor",
    "relaygraph.runner",
    "relaygraph.cli",
    "relaygraph.models.local",
    "relaygraph.store",
    "relaygraph.api",
    "relaygraph.client",
    "relaygraph.tracing",
    "relaygraph.evals",
    "relaygraph.worker",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_import(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__, f"{name} exports nothing"
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public} is in __all__ but missing"


def test_error_hierarchy() -> None:
    from relaygraph import ConfigError, ModelSpecError, RelaygraphError, RunError, ScriptError

    assert issubclass(ModelSpecError, ConfigError)
    assert issubclass(ScriptError, RunError)
    assert issubclass(ConfigError, RelaygraphError)
    err = ScriptError("coder", 3, "ran out")
    assert (err.agent, err.turn) == ("coder", 3)
    assert "'coder', turn 3" in str(err)
    from relaygraph import TaskBusy

    busy = TaskBusy("t-1", "runner r-2 holds it")
    assert isinstance(busy, RunError) and busy.task_id == "t-1"
    assert str(busy) == "task 't-1' is being run elsewhere: runner r-2 holds it"


def test_teams_are_importable_from_the_top() -> None:
    from relaygraph import Agent, Team, builtin

    team = Team(agents=[builtin.researcher(), builtin.writer()])
    assert isinstance(team.agents[0], Agent) and team.agent_names == ("researcher", "writer")
