"""What a run's result says, read from the team graph's state: who ran, the transfers of
work, usage per role beside its limits, violations, and what nodes still in progress spent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from relaygraph.events import USAGE_AMOUNTS, USAGE_COUNTS, handoff_result
from relaygraph.policies import TeamPolicy


def waiting_violations(snapshot: Any) -> list[dict[str, Any]]:
    """The ping-pongs a paused task waits on a person for: violations already, though the
    step that detected them has not finished (it runs again on the decision)."""
    return [
        {"agent": i.value.get("next"), "kind": "ping_pong", "detail": i.value.get("detail")}
        for i in snapshot.interrupts
        if isinstance(i.value, dict) and i.value.get("type") == "ping_pong"
    ]


def summarize(
    state: dict[str, Any],
    policy: TeamPolicy,
    roles: tuple[str, ...],
    in_flight: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]] = ((), ()),
) -> dict[str, Any]:
    from relaygraph.policies import LIMIT_NAMES

    turn = state.get("turn", 0)
    visits = [v for v in state.get("visits", []) if v["turn"] == turn]
    handoffs = [handoff_result(h) for h in state.get("handoffs", []) if h.get("turn") == turn]
    fields = (*USAGE_COUNTS, *USAGE_AMOUNTS)
    usage: dict[str, dict[str, Any]] = {}
    team: dict[str, Any] = dict.fromkeys(fields, 0)
    current = [r for r in state.get("usage", []) if r["turn"] == turn]
    for record in [*current, *in_flight[0]]:
        totals = usage.setdefault(record["agent"], {**dict.fromkeys(fields, 0), "estimated": False})
        for key in fields:
            totals[key] += record.get(key, 0)
            team[key] += record.get(key, 0)
        totals["estimated"] = totals["estimated"] or record.get("estimated", False)
    for role, totals in usage.items():
        totals["cost_usd"] = round(totals["cost_usd"], 6)
        totals["seconds"] = round(totals["seconds"], 3)
        if role in policy.agents:
            limits = asdict(policy.agents[role].limits)
            totals["limits"] = {name: limits[name] for name in LIMIT_NAMES}
    team["cost_usd"], team["seconds"] = round(team["cost_usd"], 6), round(team["seconds"], 3)
    team["agent_runs"] = len(visits)
    team["limits"] = {k: v for k, v in asdict(policy.team).items() if k != "on_exhausted"}
    violations = [
        {"agent": v["agent"], "kind": v["kind"], "detail": v["detail"]}
        for v in [*(v for v in state.get("violations", []) if v["turn"] == turn), *in_flight[1]]
    ]
    return {
        "agents_run": [v["agent"] for v in visits],
        "handoffs": handoffs,
        "usage": {role: usage[role] for role in roles if role in usage},
        "team_usage": team,
        "violations": violations,
    }


def citations_checked(policy: TeamPolicy, models: Mapping[str, str]) -> bool:
    """Whether the run's answer to a docs question must cite what its tools showed: the
    policy's ``finalize.citations`` is ``required``, or ``auto`` with some role on the
    embedded model (``local:``), whose answers are built to cite."""
    if policy.finalize.citations == "required":
        return True
    return any(spec.startswith("local:") for spec in models.values())


def honest_status(
    status: str,
    stop_reason: str | None,
    summary: Mapping[str, Any],
    answer: str | None = None,
    *,
    request: str = "",
    transcripts: Sequence[Any] = (),
    grounding: bool = False,
) -> tuple[str, str | None]:
    """``succeeded`` only for a run that did real work and answered: some agent ran, and
    the team's answer is an answer (``relaygraph.supervisor.non_answer``: not empty, not
    the placeholder of no result). A supervisor that says FINISH at once, or a prebuilt
    supervisor that answers itself, did no work the team exists for. Either is
    ``degraded``, with the reason. (A cut or broken final reply was judged where the reply
    was in hand, by the topology's closing step, with the same function.)

    With ``grounding`` (:func:`citations_checked`), a request about the docs must also be
    answered with a citation of a document the run's tools showed
    (``models.local.ungrounded_reason``), else ``degraded`` with ``ungrounded: ...``.
    """
    from relaygraph.supervisor import non_answer

    if status != "succeeded":
        return status, stop_reason
    if not summary.get("agents_run"):
        return "degraded", "no agent ran: the team answered without doing any work"
    if (why := non_answer(answer)) is not None:
        return "degraded", why
    if grounding:
        from relaygraph.models.local import ungrounded_reason

        why = ungrounded_reason(request, answer, transcripts)
        if why is not None:
            return "degraded", why
    return status, stop_reason
