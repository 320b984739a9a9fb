"""Budgets: usage totals and the checks made before each model call and each tool call.

Pure values and functions; the agent middleware and the team graph call them. Usage is always
derived from the checkpointed record (usage records and transcripts), never kept in a counter
of this process, so a re-run super-step cannot count anything twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, cast

from relaygraph.events import UsageFigures
from relaygraph.policies._policy import AgentLimits, Price, TeamLimits, TeamPolicy

__all__ = [
    "DAY_BUDGET_KEY",
    "BudgetHit",
    "ProjectDayBudget",
    "UsageTotals",
    "check_agent_budget",
    "check_team_budget",
    "cost_usd",
    "day_budget_of",
    "seconds_left",
]

DAY_BUDGET_KEY = "relaygraph_day_budget"
"""``config["configurable"]`` key of the run's :class:`ProjectDayBudget`, if its project
has a daily budget: set by the runner once per run, never in state a model could write."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageTotals:
    """What was spent, by one agent or by the team."""

    model_calls: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    """Wall-clock seconds spent running (waiting for a person's approval is not counted)."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def figures(self) -> UsageFigures:
        """Its figures, as a :class:`~relaygraph.events.Usage` record carries them."""
        return cast(UsageFigures, asdict(self))

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> UsageTotals:
        """Sum usage records (dicts with the same field names; missing fields count 0)."""
        total = cls()
        for record in records:
            total = total + cls(**{f.name: record.get(f.name, 0) or 0 for f in fields(cls)})
        return total


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetHit:
    """A limit that is reached: the next call would go over it."""

    scope: Literal["agent", "team", "project"]
    agent: str | None
    """The agent (scope ``agent``) or the project (scope ``project``) whose limit it is."""
    limit: str
    """The limit's key in the policy file, e.g. ``max_model_calls``."""
    used: float
    allowed: float

    @property
    def stop_reason(self) -> str:
        """``budget:agent:coder:max_model_calls``, ``budget:team:max_tokens`` or
        ``budget:project:daily_cost_usd``."""
        who = f"agent:{self.agent}" if self.scope == "agent" else self.scope
        return f"budget:{who}:{self.limit}"

    @property
    def message(self) -> str:
        """E.g. ``agent 'coder' used 6 of 6 model calls``."""
        if self.scope == "project":
            return (
                f"project {self.agent!r} spent {_num(self.used)} of its daily budget of "
                f"{_num(self.allowed)} USD today (UTC)"
            )
        what = {
            "max_model_calls": "model calls",
            "max_tool_calls": "tool calls",
            "max_tokens": "tokens",
            "max_cost_usd": "USD",
            "max_seconds": "seconds",
            "max_agent_runs": "agent visits",
            "recursion_limit": "graph steps",
            "daily_cost_usd": "USD",
        }[self.limit]
        who = f"agent {self.agent!r}" if self.scope == "agent" else "the team"
        return f"{who} used {_num(self.used)} of {_num(self.allowed)} {what}"

    def to_json(self) -> dict[str, Any]:
        """Its fields, as the refusal's message and the violation record carry them."""
        return asdict(self)


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) and not value.is_integer() else str(int(value))


def _first_hit(
    checks: Iterable[tuple[str, float, float | None]],
    scope: Literal["agent", "team"],
    agent: str | None,
) -> BudgetHit | None:
    for limit, used, allowed in checks:
        if allowed is not None and used >= allowed:
            return BudgetHit(scope=scope, agent=agent, limit=limit, used=used, allowed=allowed)
    return None


def check_agent_budget(
    agent: str, limits: AgentLimits, used: UsageTotals, *, before: Literal["model", "tool"]
) -> BudgetHit | None:
    """The agent limit that stops the next model (or tool) call, if any."""
    calls = (
        ("max_model_calls", used.model_calls, limits.max_model_calls)
        if before == "model"
        else ("max_tool_calls", used.tool_calls, limits.max_tool_calls)
    )
    return _first_hit(
        [
            calls,
            ("max_tokens", used.tokens, limits.max_tokens),
            ("max_cost_usd", used.cost_usd, limits.max_cost_usd),
            ("max_seconds", used.seconds, limits.max_seconds),
        ],
        "agent",
        agent,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ProjectDayBudget:
    """What a project may still spend today, as one run's cost cap: the run stops when
    its own spend reaches what was left when it started (so it stops at the tighter of
    this and the team's ``max_cost_usd``). Read once when the run starts, never per call."""

    project: str
    """The project's name."""
    daily_usd: float
    """Its budget per UTC day, in USD."""
    spent_elsewhere_usd: float
    """What its other tasks had spent today when this run started."""

    def check(self, used: UsageTotals) -> BudgetHit | None:
        """The hit, if the run's spend ``used`` takes the project to its daily budget."""
        spent = self.spent_elsewhere_usd + used.cost_usd
        if spent < self.daily_usd:
            return None
        return BudgetHit(
            scope="project",
            agent=self.project,
            limit="daily_cost_usd",
            used=round(spent, 9),
            allowed=self.daily_usd,
        )


def check_team_budget(
    limits: TeamLimits, used: UsageTotals, day: ProjectDayBudget | None = None
) -> BudgetHit | None:
    """The team limit (tokens, cost, time), or the project's day budget (``day``), that
    stops the next call, if any."""
    return _first_hit(
        [
            ("max_tokens", used.tokens, limits.max_tokens),
            ("max_cost_usd", used.cost_usd, limits.max_cost_usd),
            ("max_seconds", used.seconds, limits.max_seconds),
        ],
        "team",
        None,
    ) or (day.check(used) if day is not None else None)


def day_budget_of(configurable: Mapping[str, Any]) -> ProjectDayBudget | None:
    """The run's day budget in its ``config["configurable"]``, if its project has one."""
    found = configurable.get(DAY_BUDGET_KEY)
    return found if isinstance(found, ProjectDayBudget) else None


def seconds_left(*limits: tuple[float | None, UsageTotals]) -> float | None:
    """The wall time a next call may take: the least that each ``(max_seconds, used)`` pair
    leaves (an agent's and the team's), never below 0; None when none sets a limit.

    A model call gets it as its deadline (:func:`relaygraph._deadline.due_within`): a check
    before each call alone would let one call of a hung server run the task far past its
    limit."""
    left = [allowed - used.seconds for allowed, used in limits if allowed is not None]
    return max(min(left), 0.0) if left else None


def cost_usd(policy: TeamPolicy, model_name: str, input_tokens: int, output_tokens: int) -> float:
    """Cost of one call from the policy's price table; a model without a price costs 0."""
    price: Price | None = policy.price_of(model_name)
    if price is None:
        return 0.0
    return (input_tokens * price.input + output_tokens * price.output) / 1_000_000
