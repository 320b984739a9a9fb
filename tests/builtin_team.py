"""Policy helpers over the built-in team, for tests that exercise the default trio.

A policy is always over a team's agents (``relaygraph.policies`` takes the team's roster);
these bind the built-in team's, as ``relaygraph run`` without ``--team`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaygraph.policies import TeamPolicy
from relaygraph.policies import parse_policy as _parse_policy
from relaygraph.team import default_team


def parse_policy(data: Mapping[str, Any], *, source: str = "<policy>") -> TeamPolicy:
    """A policy over the built-in researcher, coder and writer."""
    return _parse_policy(data, roster=default_team().roster, source=source)


def default_policy() -> TeamPolicy:
    """The built-in team's default policy."""
    return default_team().resolved_policy


def load_policy(path: str | Path) -> TeamPolicy:
    """A policy file over the built-in team."""
    return default_team().policy_from(Path(path))
