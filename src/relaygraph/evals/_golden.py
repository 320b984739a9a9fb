"""Golden sets: JSON Lines of cases, each a request and what the team is expected to do.

Pydantic parses each line (the file is a boundary); the result is frozen values. A line that
does not parse is kept as a :class:`InvalidGoldenLine` with its line number, so one typo does
not stop the rest of the set from running.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relaygraph.errors import ConfigError, read_config_file
from relaygraph.evals._json import fields_json
from relaygraph.events import VIOLATION_KINDS as VIOLATION_KINDS  # the one list, re-exported
from relaygraph.events import ViolationKind

if TYPE_CHECKING:
    from relaygraph.team import Team

AgentsMatch = Literal["strict", "unordered", "subset", "superset"]
AGENTS_MATCH_MODES: tuple[AgentsMatch, ...] = ("strict", "unordered", "subset", "superset")
"""How ``agents`` is compared with the agents that ran: agentevals' trajectory match modes."""

RunStatus = Literal["succeeded", "degraded", "failed", "interrupted", "cancelled"]

EXPECT_KEYS = (
    "first_agent",
    "agents",
    "agents_match",
    "handoffs",
    "tools_used",
    "tools_not_used",
    "answer_contains",
    "answer_not_contains",
    "status",
    "stop_reason",
    "violations",
    "max_tokens",
    "max_cost_usd",
)

# Strict: a typo in a key or a number written as a string is refused, never silently
# ignored; an expectation that is not checked would let every run pass.
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class _Expect(BaseModel):
    model_config = _STRICT
    first_agent: str | None = None
    agents: list[str] | None = None
    agents_match: AgentsMatch = "strict"
    handoffs: list[tuple[str, str]] | None = None
    tools_used: list[str] | None = None
    tools_not_used: list[str] | None = None
    answer_contains: list[str] | None = None
    answer_not_contains: list[str] | None = None
    status: RunStatus | None = None
    stop_reason: str | None = None
    violations: list[ViolationKind] | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _agents_match_needs_agents(self) -> _Expect:
        if "agents_match" in self.model_fields_set and self.agents is None:
            raise ValueError("agents_match is given without agents")
        nullable = ("first_agent", "stop_reason")
        for name in self.model_fields_set - set(nullable):
            if getattr(self, name) is None:
                raise ValueError(f"{name} is null; leave the key out to not check it")
        return self


class _Case(BaseModel):
    model_config = _STRICT
    id: str = Field(min_length=1)
    input: str = Field(min_length=1)
    script: str | None = None
    policy: str | None = None
    team: str | None = None
    expect: _Expect = Field(default_factory=_Expect)
    tags: list[str] = Field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """What a case expects of a run. Only the keys in :attr:`given` are checked."""

    given: frozenset[str] = frozenset()
    """The ``expect`` keys the case names; ``stop_reason: null`` checks for no stop reason."""
    first_agent: str | None = None
    agents: tuple[str, ...] | None = None
    agents_match: AgentsMatch = "strict"
    handoffs: tuple[tuple[str, str], ...] | None = None
    """Direct handoffs as ``(from, to)`` pairs, in order; supervisor routes are not listed."""
    tools_used: tuple[str, ...] | None = None
    tools_not_used: tuple[str, ...] | None = None
    answer_contains: tuple[str, ...] | None = None
    answer_not_contains: tuple[str, ...] | None = None
    status: RunStatus | None = None
    stop_reason: str | None = None
    violations: tuple[ViolationKind, ...] | None = None
    max_tokens: int | None = None
    """Input plus output tokens of the whole team (supervisor and finalize included)."""
    max_cost_usd: float | None = None
    """US dollars for the whole team, priced from the policy's ``[prices]``."""

    def to_json(self) -> dict[str, Any]:
        """The given keys, as the golden file writes them."""
        values = fields_json(self, leave_out={"given"})
        return {key: values[key] for key in EXPECT_KEYS if key in self.given}


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenCase:
    """One case of a golden set."""

    id: str
    input: str
    """The request the team gets."""
    expect: Expectation
    script: Path | None = None
    """The scripted model's file (resolved against the golden file); used without ``--model``."""
    policy: Path | None = None
    """The policy file (resolved against the golden file); the team's own policy when None."""
    team: Path | None = None
    """The team file (resolved against the golden file); the eval's team (``--team``, else
    the built-in team) when None."""
    tags: tuple[str, ...] = ()
    line: int = 0
    """Line number in the golden file, from 1."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidGoldenLine:
    """A line of the golden file that is not a valid case; the other lines still run."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenSet:
    """The cases of a golden file, and the lines that could not be read."""

    path: Path
    cases: tuple[GoldenCase, ...] = ()
    errors: tuple[InvalidGoldenLine, ...] = field(default=())
    team: Team | None = None
    """The team of the cases that name none (the built-in team when None)."""
    teams: Mapping[Path, Team] = field(default_factory=lambda: MappingProxyType({}))
    """The team files the cases name, each read once."""

    def team_for_case(self, case: GoldenCase) -> Team:
        """The team ``case`` runs with: its own team file's, else the set's."""
        if case.team is not None:
            return self.teams[case.team]
        if self.team is not None:
            return self.team
        from relaygraph.team import default_team

        return default_team()

    def with_tags(self, tags: tuple[str, ...] | list[str]) -> GoldenSet:
        """Only the cases that carry at least one of ``tags`` (all of them when empty)."""
        if not tags:
            return self
        wanted = set(tags)
        kept = tuple(case for case in self.cases if wanted & set(case.tags))
        return GoldenSet(
            path=self.path, cases=kept, errors=self.errors, team=self.team, teams=self.teams
        )


def load_golden(path: str | Path, *, team: Team | None = None) -> GoldenSet:
    """Read a golden set (JSON Lines, one case per line; blank lines are skipped).

    ``script``, ``policy`` and ``team`` paths are relative to the golden file's folder. A
    line that is not a valid case (bad JSON, an unknown key, a missing or invalid file, a
    policy over other agents than its team's, a duplicate id) becomes a
    :class:`InvalidGoldenLine` naming its line number; the other cases are still returned.

    Args:
        path: The golden file.
        team: The team of the cases that name no ``team`` file; the built-in team when None.
            Each case's policy is checked against the team it runs with.

    Raises:
        ConfigError: The file itself is missing or cannot be read.
    """
    file, text = read_config_file(path, "golden file")
    cases: list[GoldenCase] = []
    errors: list[InvalidGoldenLine] = []
    seen: dict[str, int] = {}
    teams = _TeamFiles(team)
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            case = _parse_line(raw, number, folder=file.parent, team_from_file=teams.team_from_file)
        except ValueError as exc:
            errors.append(InvalidGoldenLine(line=number, message=str(exc)))
            continue
        if case.id in seen:
            message = f"case id {case.id!r} is already used on line {seen[case.id]}"
            errors.append(InvalidGoldenLine(line=number, message=message))
            continue
        seen[case.id] = number
        cases.append(case)
    return GoldenSet(
        path=file,
        cases=tuple(cases),
        errors=tuple(errors),
        team=team,
        teams=MappingProxyType(teams.read),
    )


class _TeamFiles:
    """The teams of a golden set's cases: each team file read once (a bad one is reported
    on every line naming it), the set's team for a case naming none."""

    def __init__(self, team: Team | None) -> None:
        self.team = team
        self.read: dict[Path, Team] = {}
        self.failed: dict[Path, ConfigError] = {}

    def team_from_file(self, path: Path | None) -> Team:
        """Raises: ConfigError: The team file cannot be read or built."""
        from relaygraph.team import default_team, load_team

        if path is None:
            return self.team or default_team()
        if path in self.failed:
            raise self.failed[path]
        if path not in self.read:
            try:
                self.read[path] = load_team(path)
            except ConfigError as exc:
                self.failed[path] = exc
                raise
        return self.read[path]


def _parse_line(
    raw: str, number: int, *, folder: Path, team_from_file: Callable[[Path | None], Team]
) -> GoldenCase:
    """One case from one line; ``ValueError`` with a message naming what is wrong."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    try:
        # JSON mode: strict still reads a JSON array as a (from, to) pair.
        parsed = _Case.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'case'}: {err['msg']}"
            + (f" (got {err['input']!r})" if err["type"] != "missing" else "")
            for err in exc.errors()
        )
        name = f"case {data['id']!r}: " if isinstance(data.get("id"), str) else ""
        raise ValueError(f"{name}{problems}") from None
    script = _resolve(folder, parsed.script, what="script", case=parsed.id)
    policy = _resolve(folder, parsed.policy, what="policy", case=parsed.id)
    team_file = _resolve(folder, parsed.team, what="team", case=parsed.id)
    expect = parsed.expect
    # A broken script, team or policy is refused here, on its case's line, not midway
    # through a run.
    try:
        if script is not None:
            from relaygraph.models.scripted import load_script

            load_script(script)
        team = team_from_file(team_file)
        if policy is not None:
            team.policy_from(policy)
    except ConfigError as exc:
        raise ValueError(f"case {parsed.id!r}: {exc}") from None
    return GoldenCase(
        id=parsed.id,
        input=parsed.input,
        script=script,
        policy=policy,
        team=team_file,
        tags=tuple(parsed.tags),
        line=number,
        expect=Expectation(
            given=frozenset(expect.model_fields_set),
            # The parsed lists become tuples: an expectation is a frozen value.
            **{key: _tuple(getattr(expect, key)) for key in EXPECT_KEYS},
        ),
    )


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _resolve(folder: Path, value: str | None, *, what: str, case: str) -> Path | None:
    if value is None:
        return None
    path = (folder / Path(value).expanduser()).resolve()
    if not path.is_file():
        raise ValueError(f"case {case!r}: {what} {value!r} does not exist (looked at {path})")
    return path
