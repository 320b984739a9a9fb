"""Compiled team graphs, kept for the process: one per topology, policy and model specs."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.errors import ConfigError
from relaygraph.models import parse_model_spec
from relaygraph.policies import TeamPolicy, policy_to_mapping
from relaygraph.topology import Topology

__all__ = ["TeamCache", "team_cache"]


def _spec_fingerprint(spec: Any) -> tuple[Any, ...]:
    """What else, beside the spec string, decides the model ``load_model`` builds (a chat
    model object given instead of a spec is itself)."""
    if not isinstance(spec, str):
        return ("object", id(spec))
    parsed = parse_model_spec(spec)
    if parsed.provider == "scripted":
        try:
            stat = Path(parsed.name).expanduser().stat()
        except OSError:
            return (spec, None)  # load_model reports the missing file; nothing is cached.
        return (spec, stat.st_mtime_ns, stat.st_size)
    if parsed.provider in ("openai", "openai-responses"):
        key = os.environ.get("OPENAI_API_KEY", "")
        return (
            spec,
            os.environ.get("OPENAI_BASE_URL"),
            hashlib.sha256(key.encode()).hexdigest() if key else None,
        )
    return (spec,)


def _check_script_keys(models: Mapping[str, Any], policy: TeamPolicy) -> None:
    """A script's keys name roles; one that names none (a typo, an agent this team lacks)
    would only fail later, at the first call of a role whose turns it should have held."""
    from relaygraph.models.scripted import ScriptedChatModel

    roles = (*policy.agents, SUPERVISOR, FINALIZE)
    for model in models.values():
        if isinstance(model, ScriptedChatModel):
            unknown = sorted(set(model.script.turns) - set(roles))
            if unknown:
                raise ConfigError(
                    f"script file {str(model.script.path)!r} has turns for "
                    f"{', '.join(map(repr, unknown))}, which is no role of this team; "
                    f"roles: {', '.join(roles)}"
                )


class TeamCache:
    """Compiled team graphs and their models, least recently used dropped first.

    Compiling the team (three ``create_agent`` subgraphs and the team graph) would cost
    each task the same work for the same graph (benchmarks/RESULTS.md). LangGraph's
    compiled graphs hold no run state, so one serves every task of its key, concurrently
    too; each run binds a copy to its own checkpointer. The key is the topology, the
    policy and each role's model spec, with what else decides the model: a script file's
    modification time and size, the OpenAI environment.
    """

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._graphs: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self,
        specs: Mapping[str, Any],
        *,
        team: Any,
        policy: TeamPolicy,
        topology: Topology,
    ) -> Any:
        """The compiled team for these specs (or chat models), team, policy and topology,
        with no checkpointer: bind one with ``graph.copy({"checkpointer": saver})``.

        Raises:
            ConfigError: As :func:`relaygraph.models.load_model` and
                :func:`relaygraph.supervisor.build_team` do.
        """
        key = (
            # The digest says what the team is; the object, which of its tools' code runs
            # (a function's body is not in the digest). The cache keeps the team alive, so
            # its id is not reused while the key is here.
            team.digest,
            id(team),
            json.dumps(topology.to_mapping(), sort_keys=True),
            json.dumps(policy_to_mapping(policy), sort_keys=True, default=str),
            tuple(sorted((role, _spec_fingerprint(spec)) for role, spec in specs.items())),
        )
        with self._lock:
            kept = self._graphs.get(key)
            graph = kept[1] if kept is not None else None
            if kept is not None:
                self._graphs.move_to_end(key)
        if graph is None:
            from relaygraph.models import load_model
            from relaygraph.supervisor import build_team

            models = {
                role: load_model(spec, agent=role) if isinstance(spec, str) else spec
                for role, spec in specs.items()
            }
            _check_script_keys(models, policy)
            graph = build_team(models, team=team, policy=policy, topology=topology)
            with self._lock:
                self._graphs[key] = (team, graph)
                while len(self._graphs) > self._size:
                    self._graphs.popitem(last=False)
        return graph

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()


team_cache = TeamCache()
"""The process's cache, which every :class:`~relaygraph.runner.TaskRunner` uses."""
