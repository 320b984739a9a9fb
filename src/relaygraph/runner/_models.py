"""Which model each role of a task runs on: one rule for the CLI, the Python API, the HTTP
API and the golden sets.

A role takes, in order: the request's model for that role, the agent's own in the team, the
request's model for every role, the team's model, else the default (the embedded model,
or the server's default).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph._names import FINALIZE, SUPERVISOR
from relaygraph.errors import ConfigError, ModelNotAllowed
from relaygraph.models import DEFAULT_MODEL, parse_model_spec
from relaygraph.runner._errors import RequestRefused

if TYPE_CHECKING:
    from relaygraph.team import Team

__all__ = [
    "ModelGate",
    "ModelRules",
    "RoleModels",
    "check_model_spec",
    "check_roles",
    "check_script_roles",
    "choose_models",
    "model_record",
    "resolve_model_specs",
]

ModelGate = Callable[[str], str]
"""Checks a model spec that a request names and returns the spec to record (a server's
allowlist: ``ServiceSettings.request_model``).

Raises ``ModelNotAllowed`` for a valid spec the caller may not name, ``ConfigError`` for an
invalid one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRules:
    """Which models the requests of a caller may name. The defaults are a user's own: any
    valid spec or chat model, the embedded model when none is named."""

    default: str = DEFAULT_MODEL
    """The spec of a role that nothing else names; never checked by ``allow``."""
    allow: ModelGate | None = None
    """The check of every spec a request names (and a team that is not trusted); None:
    any valid spec."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RoleModels:
    """Each role's model: what the ledger records, and what a run in this process uses."""

    recorded: dict[str, str]
    """Per role: its spec, or for a chat model object its class and model name."""
    chosen: dict[str, Any]
    """Per role: the spec, or the chat model object the caller passed."""


def check_roles(agent_models: Mapping[str, Any], roles: Sequence[str]) -> None:
    """Refuse per-role models for roles the topology does not have.

    Raises:
        RequestRefused: ``invalid_model``, naming the first unknown role's field
            (``agent_models.pilot``); the message lists every unknown one.
    """
    unknown = [role for role in agent_models if role not in roles]
    if unknown:
        raise RequestRefused(
            f"agent_models names unknown agent(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(roles)}",
            field=f"agent_models.{unknown[0]}",
            code="invalid_model",
        )


def choose_models(
    team: Team,
    roles: Sequence[str],
    *,
    model: Any = None,
    agent_models: Mapping[str, Any] | None = None,
    rules: ModelRules | None = None,
    trust_team: bool = True,
    inherited: Mapping[str, str] | None = None,
) -> RoleModels:
    """Each role's model (the module's rule), every spec checked.

    Args:
        team: The team whose agents may name their own models.
        roles: The roles that need a model (``Topology.roles``).
        model: The request's model for every role: a spec or a chat model.
        agent_models: The request's model per role.
        rules: What the caller's requests may name; a user's own rules when None.
        trust_team: Whether the team's own specs skip ``rules.allow`` (a user's own team,
            a server's); a project's registered team names only what a request could.
        inherited: A replay's models: the spec each role of the task it replays ran on,
            taken where the request and the team's agents name none (before the team's
            model). Not checked again: the ledger recorded them once checked.

    Raises:
        RequestRefused: An unknown role (``invalid_model``); a spec that is invalid
            (``invalid_model``) or not allowed (``model_not_allowed``), naming its field:
            ``agent_models.ROLE``, ``model``, or ``team`` for the team's own; a script with
            turns for a role the team lacks (``invalid_model``, see
            :func:`check_script_roles`).
    """
    rules = rules or ModelRules()
    per_role = dict(agent_models or {})
    check_roles(per_role, roles)
    own = {agent.name: agent.model for agent in team.agents if agent.model is not None}
    checked: dict[str, str] = {}

    def check(spec: str, field: str, gated: bool) -> str:
        # One check per spec: a model every role shares is loaded (an OpenAI key checked)
        # once, and refused under the first field that names it.
        if spec not in checked:
            checked[spec] = check_model_spec(spec, field, rules.allow if gated else None)
        return checked[spec]

    recorded: dict[str, str] = {}
    chosen: dict[str, Any] = {}
    fields: dict[str, str] = {}  # Each spec to record, and the first field that named it.
    for role in roles:
        if role in per_role:
            value, field, gated = per_role[role], f"agent_models.{role}", True
        elif role in own:
            value, field, gated = own[role], "team", not trust_team
        elif model is not None:
            value, field, gated = model, "model", True
        elif inherited and role in inherited:
            recorded[role] = chosen[role] = inherited[role]
            continue
        elif team.model is not None:
            value, field, gated = team.model, "team", not trust_team
        else:
            recorded[role] = chosen[role] = rules.default
            fields.setdefault(rules.default, "model")
            continue
        if isinstance(value, str):
            recorded[role] = chosen[role] = check(value, field, gated)
            fields.setdefault(recorded[role], field)
        else:
            recorded[role], chosen[role] = model_record(value), value
    for spec, field in fields.items():
        check_script_roles(spec, field, team)
    return RoleModels(recorded=recorded, chosen=chosen)


def check_script_roles(spec: str, field: str, team: Team) -> None:
    """Refuse a scripted model whose script has turns for a role ``team`` lacks (a script
    written for another team): the run would fail at its first model call otherwise, after
    the task was accepted. ``spec`` is one to record, already checked: a request's script
    is a file of the server's scripts folder (or the server's default), never a path the
    request chose. A script that cannot be read is left to the run to report.

    Raises:
        RequestRefused: ``invalid_model``, naming ``field``, the script's unknown roles
            and the team's roles.
    """
    from relaygraph.models.scripted import load_script

    parsed = parse_model_spec(spec)
    if parsed.provider != "scripted":
        return
    try:
        script = load_script(parsed.name)
    except ConfigError:
        return
    roles = (SUPERVISOR, *team.agent_names, FINALIZE)
    unknown = sorted(set(script.turns) - set(roles))
    if unknown:
        raise RequestRefused(
            f"script {Path(parsed.name).name!r} has turns for "
            f"{', '.join(map(repr, unknown))}, which is no role of team {team.name!r}; "
            f"its roles: {', '.join(roles)}",
            field=field,
            code="invalid_model",
        )


def check_model_spec(spec: str, field: str, allow: ModelGate | None = None) -> str:
    """The spec to record for a model named in ``field``: ``allow``'s answer, or the spec
    itself once it parses.

    Raises:
        RequestRefused: ``model_not_allowed`` or ``invalid_model``, naming ``field``.
    """
    try:
        if allow is not None:
            return allow(spec)
        parse_model_spec(spec)
        return spec
    except ModelNotAllowed as exc:
        raise RequestRefused(str(exc), field=field, code="model_not_allowed") from exc
    except ConfigError as exc:  # An invalid spec, a broken script, no OpenAI key.
        raise RequestRefused(str(exc), field=field, code="invalid_model") from exc


def resolve_model_specs(
    model: str | None, agent_models: Mapping[str, str], roles: tuple[str, ...]
) -> dict[str, str]:
    """Which spec each role uses when no team names models of its own: its own
    ``agent_models`` entry, else ``model``, else the embedded model.

    Raises:
        RequestRefused: ``agent_models`` names an unknown role, or a spec is invalid.
    """
    check_roles(agent_models, roles)
    specs = {role: agent_models.get(role) or model or DEFAULT_MODEL for role in roles}
    for role, spec in specs.items():
        field = f"agent_models.{role}" if role in agent_models else "model"
        check_model_spec(spec, field, None)
    return specs


def model_record(spec: Any) -> str:
    """How the ledger names a role's model: its spec, or for a chat model object its class
    and model name (an object cannot be stored; the process that runs it passes it)."""
    if isinstance(spec, str):
        return spec
    name = getattr(spec, "model_name", None) or getattr(spec, "model", None) or ""
    return f"object:{type(spec).__name__}:{name}"
