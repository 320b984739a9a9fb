"""Scoring one run against a case's expectations: one :class:`Check` per ``expect`` key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from relaygraph.evals._golden import AgentsMatch, Expectation
from relaygraph.evals._json import fields_json


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What a run did, as the checks see it."""

    status: str
    answer: str | None = None
    stop_reason: str | None = None
    first_agent: str | None = None
    """The agent the supervisor routed the request to first (even if it has not finished)."""
    agents: tuple[str, ...] = ()
    """The agents that ran, one entry per finished visit, in order."""
    handoffs: tuple[tuple[str, str], ...] = ()
    """Direct handoffs between agents, ``(from, to)``, in order."""
    tools: tuple[str, ...] = ()
    """Tools that ran, one entry per call, in order (calls the policy refused are left out)."""
    refused_tools: tuple[str, ...] = ()
    """Tools an agent called that were not run: refused by the policy or by a person."""
    violations: tuple[str, ...] = ()
    """The kind of each violation, in order."""
    tokens: int = 0
    """Input plus output tokens of the whole team."""
    cost_usd: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """One expectation checked against a run."""

    name: str
    """The ``expect`` key (``agents`` covers ``agents_match``); ``run`` when it could not run."""
    passed: bool
    expected: Any
    actual: Any
    message: str = ""
    """Why it failed, in words; empty when it passed."""
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Its fields; ``message`` and ``details`` only when they say something."""
        empty = {name for name in ("message", "details") if not getattr(self, name)}
        return fields_json(self, leave_out=empty)


def check_expectations(expect: Expectation, observed: Observation) -> list[Check]:
    """Check ``observed`` against every key ``expect`` names, in the golden format's order.

    Args:
        expect: The case's expectations; keys not in ``expect.given`` are not checked.
        observed: What the run did.

    Returns:
        One :class:`Check` per named key (``agents_match`` is part of the ``agents`` check).
    """
    return [check(expect, observed) for name, check in _CHECKS if name in expect.given]


def _first_agent(expect: Expectation, observed: Observation) -> Check:
    return _same("first_agent", expect.first_agent, observed.first_agent)


def _agents(expect: Expectation, observed: Observation) -> Check:
    expected = list(expect.agents or ())
    mode = expect.agents_match
    passed = agents_match(list(observed.agents), expected, mode)
    return _check(
        "agents",
        passed,
        expected,
        list(observed.agents),
        f"the agents {list(observed.agents)} do not match {expected} ({mode})",
        details={"match": mode},
    )


def _handoffs(expect: Expectation, observed: Observation) -> Check:
    expected = [list(pair) for pair in expect.handoffs or ()]
    actual = [list(pair) for pair in observed.handoffs]
    return _check(
        "handoffs",
        actual == expected,
        expected,
        actual,
        f"the direct handoffs were {_pairs(actual)}, expected {_pairs(expected)}",
    )


def _pairs(pairs: list[list[str]]) -> str:
    return ", ".join(f"{a}→{b}" for a, b in pairs) or "none"


def _tools_used(expect: Expectation, observed: Observation) -> Check:
    expected = list(expect.tools_used or ())
    ran = _unique(observed.tools)
    missing = [tool for tool in expected if tool not in ran]
    refused = [tool for tool in missing if tool in observed.refused_tools]
    note = f" ({', '.join(refused)} called but not run)" if refused else ""
    return _check(
        "tools_used",
        not missing,
        expected,
        ran,
        f"{', '.join(missing)} did not run{note}",
        details={"refused": _unique(observed.refused_tools)} if observed.refused_tools else None,
    )


def _tools_not_used(expect: Expectation, observed: Observation) -> Check:
    expected = list(expect.tools_not_used or ())
    ran = _unique(observed.tools)
    present = [tool for tool in expected if tool in ran]
    return _check("tools_not_used", not present, expected, ran, f"{', '.join(present)} ran")


def _answer_parts(expect: Expectation, observed: Observation, *, wanted: bool) -> Check:
    """``answer_contains`` (``wanted``: each part must be in the answer) or
    ``answer_not_contains`` (none may be), case aside."""
    expected = list((expect.answer_contains if wanted else expect.answer_not_contains) or ())
    text = (observed.answer or "").casefold()
    wrong = [part for part in expected if (part.casefold() in text) != wanted]
    return _check(
        "answer_contains" if wanted else "answer_not_contains",
        not wrong,
        expected,
        observed.answer,
        f"the answer {'lacks' if wanted else 'contains'} " + ", ".join(map(repr, wrong)),
    )


def _status(expect: Expectation, observed: Observation) -> Check:
    note = f" (stop reason: {observed.stop_reason})" if observed.stop_reason else ""
    return _same("status", expect.status, observed.status, note=note)


def _stop_reason(expect: Expectation, observed: Observation) -> Check:
    return _same("stop_reason", expect.stop_reason, observed.stop_reason)


def _same(name: str, expected: Any, actual: Any, *, note: str = "") -> Check:
    """The check that the run's ``name`` (``first_agent``) is the one expected."""
    message = f"the {name.replace('_', ' ')} was {actual!r}, expected {expected!r}{note}"
    return _check(name, actual == expected, expected, actual, message)


def _violations(expect: Expectation, observed: Observation) -> Check:
    expected = sorted(set(expect.violations or ()))
    actual = sorted(set(observed.violations))
    return _check(
        "violations",
        actual == expected,
        expected,
        actual,
        f"the violations were {actual or 'none'}, expected {expected or 'none'}",
    )


def _max_tokens(expect: Expectation, observed: Observation) -> Check:
    limit = expect.max_tokens or 0
    return _check(
        "max_tokens",
        observed.tokens <= limit,
        limit,
        observed.tokens,
        f"the team used {observed.tokens} tokens, more than {limit}",
    )


def _max_cost_usd(expect: Expectation, observed: Observation) -> Check:
    limit = expect.max_cost_usd if expect.max_cost_usd is not None else 0.0
    return _check(
        "max_cost_usd",
        observed.cost_usd <= limit,
        limit,
        observed.cost_usd,
        f"the team spent ${observed.cost_usd:.6f}, more than ${limit:.6f}",
    )


_CHECKS: tuple[tuple[str, Callable[[Expectation, Observation], Check]], ...] = (
    ("first_agent", _first_agent),
    ("agents", _agents),
    ("handoffs", _handoffs),
    ("tools_used", _tools_used),
    ("tools_not_used", _tools_not_used),
    ("answer_contains", partial(_answer_parts, wanted=True)),
    ("answer_not_contains", partial(_answer_parts, wanted=False)),
    ("status", _status),
    ("stop_reason", _stop_reason),
    ("violations", _violations),
    ("max_tokens", _max_tokens),
    ("max_cost_usd", _max_cost_usd),
)


def _check(
    name: str,
    passed: bool,
    expected: Any,
    actual: Any,
    message: str,
    *,
    details: dict[str, Any] | None = None,
) -> Check:
    return Check(
        name=name,
        passed=passed,
        expected=expected,
        actual=actual,
        message="" if passed else message,
        details=details or {},
    )


def _unique(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def agents_match(actual: list[str], expected: list[str], mode: AgentsMatch) -> bool:
    """Whether the agents that ran match ``expected`` under agentevals' trajectory ``mode``.

    Each agent visit is given to agentevals' trajectory match as one tool call named after
    the agent, arguments ignored, so the four modes mean exactly what they mean there, each
    visit counting once: ``strict`` (the same sequence), ``unordered`` (the same visits in any
    order), ``subset`` (every visit is among ``expected``) and ``superset`` (every entry of
    ``expected`` was visited).
    """
    from agentevals.trajectory.match import create_trajectory_match_evaluator

    evaluator = create_trajectory_match_evaluator(
        trajectory_match_mode=mode, tool_args_match_mode="ignore"
    )
    result: Any = evaluator(outputs=_trajectory(actual), reference_outputs=_trajectory(expected))
    return bool(result["score"])


def _trajectory(agents: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": f"visit_{n}",
                    "type": "function",
                    "function": {"name": agent, "arguments": "{}"},
                }
            ],
        }
        for n, agent in enumerate(agents, start=1)
    ]
