"""The eval runs and the usage chart: the pages about many tasks at once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from relaygraph.api._errors import ErrorAnswer
from relaygraph.api.ui._charts import Metric, usage_chart
from relaygraph.api.ui._dashboard import SECURITY_HEADERS, Dashboard, dashboard_router, form_day
from relaygraph.api.ui._queries import (
    DEFAULT_USAGE_DAYS,
    MAX_DAYS,
    EvalRunOut,
    daily_usage,
    eval_run,
    project_me,
)
from relaygraph.api.ui._sessions import DashboardSession
from relaygraph.store import EvalCaseRecord, EvalRunRecord

RUNS_SHOWN = 50


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """One golden case in one eval run: its runs (``--repeat``) taken together."""

    case_id: str
    passed: bool
    """Every run of it passed."""
    runs: tuple[EvalCaseRecord, ...]
    task_ids: tuple[str, ...]
    """Of its runs, the tasks the signed-in project may open."""

    @property
    def first_failure(self) -> dict[str, Any] | None:
        return next((r.first_failure for r in self.runs if r.first_failure), None)

    @property
    def error(self) -> str | None:
        return next((r.error for r in self.runs if r.error), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class CasePair:
    """A case in two runs side by side."""

    case_id: str
    change: str
    """``regressed`` (passed in the other run, fails here), ``fixed``, ``failing``,
    ``passing``, ``new`` or ``gone``."""
    this: CaseResult | None
    other: CaseResult | None


CHANGE_ORDER = ("regressed", "fixed", "failing", "new", "gone", "passing")


def report_router(dashboard: Dashboard) -> APIRouter:
    router = dashboard_router()

    def cases(session: DashboardSession, run: EvalRunRecord) -> list[CaseResult]:
        by_case: dict[str, list[EvalCaseRecord]] = {}
        for record in run.cases:
            by_case.setdefault(record.case_id, []).append(record)
        ledger = dashboard.ledger()
        return [
            CaseResult(
                case_id=case_id,
                passed=all(r.passed for r in runs),
                runs=tuple(runs),
                task_ids=tuple(
                    r.task_id
                    for r in runs
                    if r.task_id and ledger.get_task(r.task_id, project_id=session.project_id)
                ),
            )
            for case_id, runs in by_case.items()
        ]

    @router.get("/evals")
    def evals(request: Request) -> Response:
        session = dashboard.signed_in(request)
        runs = dashboard.ledger().eval_runs(RUNS_SHOWN) if dashboard.settings.show_evals else []
        # The newest run is compared by default with the one before it of the same golden
        # set and topology (or the one before it at all, when there is none such).
        alike = [r for r in runs[1:] if _alike(r, runs[0])]
        default = alike[0] if alike else (runs[1] if len(runs) > 1 else None)
        return dashboard.page(
            request,
            "evals.html",
            session,
            runs=[EvalRunOut.of(run, cases=False) for run in runs],
            default_against=default.id if default else None,
            shown=dashboard.settings.show_evals,
            nav="evals",
        )

    @router.get("/evals/compare")
    def compare(request: Request) -> Response:
        run, against = request.query_params.get("run"), request.query_params.get("against")
        if not run:
            return RedirectResponse("/ui/evals", status_code=303)
        target = f"/ui/evals/{quote(run, safe='')}"
        if against and against != run:
            target += f"?against={quote(against, safe='')}"
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)

    @router.get("/evals/{run_id}")
    def eval_page(run_id: str, request: Request) -> Response:
        session = dashboard.signed_in(request)
        if not dashboard.settings.show_evals:
            return dashboard.not_found(request, session, f"eval run {run_id}")
        try:
            run = eval_run(dashboard.ledger(), run_id)
            other_id = request.query_params.get("against")
            other = eval_run(dashboard.ledger(), other_id) if other_id else None
        except ErrorAnswer as exc:
            return dashboard.not_found(request, session, exc.message.removeprefix("no "))
        mine = cases(session, run)
        pairs = _pairs(mine, cases(session, other)) if other else []
        # The runs to compare against, those of the same golden set and topology first: a
        # swarm run compared with a structured one by default would read as regressions.
        runs = sorted(
            (r for r in dashboard.ledger().eval_runs(RUNS_SHOWN) if r.id != run.id),
            key=lambda r: (r.golden != run.golden, _topology(r) != _topology(run)),
        )
        return dashboard.page(
            request,
            "eval_run.html",
            session,
            run=EvalRunOut.of(run, cases=False),
            other=EvalRunOut.of(other, cases=False) if other else None,
            cases=mine,
            pairs=pairs,
            runs=[EvalRunOut.of(r, cases=False) for r in runs],
            nav="evals",
        )

    @router.get("/usage")
    def usage(request: Request) -> Response:
        session = dashboard.signed_in(request)
        query = request.query_params
        today = datetime.now(UTC).date()
        error = None
        try:
            first = form_day(query.get("since")) or today - timedelta(days=DEFAULT_USAGE_DAYS - 1)
            last = form_day(query.get("until")) or today
            if first > last:
                raise ValueError("the 'from' day is after the 'to' day")
            if (last - first).days >= MAX_DAYS:
                raise ValueError(f"choose at most {MAX_DAYS} days")
        except ValueError as exc:
            error = str(exc)
            first, last = today - timedelta(days=DEFAULT_USAGE_DAYS - 1), today
        since = datetime.combine(first, time(), UTC)
        until = datetime.combine(last + timedelta(days=1), time(), UTC)
        daily = daily_usage(dashboard.ledger(), session.project_id, since, until)
        metric: Metric = "cost_usd" if query.get("metric") == "cost" else "tokens"
        totals = dashboard.ledger().usage_for_project(session.project_id, since, until)
        standing = project_me(
            dashboard.ledger(),
            dashboard.quotas,
            project_id=session.project_id,
            name=session.project_name,
            streams=dashboard.streams,
        )
        return dashboard.page(
            request,
            "usage.html",
            session,
            chart=usage_chart(daily, metric),
            totals=totals,
            standing=standing,
            first=first,
            last=last,
            metric=metric,
            error=error,
            nav="usage",
        )

    return router


def _alike(run: EvalRunRecord, other: EvalRunRecord) -> bool:
    return run.golden == other.golden and _topology(run) == _topology(other)


def _topology(run: EvalRunRecord) -> str:
    return str((run.options.get("topology") or {}).get("kind", "structured"))


def _pairs(mine: list[CaseResult], theirs: list[CaseResult]) -> list[CasePair]:
    """The cases of two runs side by side, the regressions first."""
    other = {c.case_id: c for c in theirs}
    pairs = []
    for case in mine:
        before = other.pop(case.case_id, None)
        if before is None:
            change = "new"
        elif before.passed and not case.passed:
            change = "regressed"
        elif not before.passed and case.passed:
            change = "fixed"
        else:
            change = "passing" if case.passed else "failing"
        pairs.append(CasePair(case_id=case.case_id, change=change, this=case, other=before))
    pairs += [
        CasePair(case_id=c.case_id, change="gone", this=None, other=c) for c in other.values()
    ]
    return sorted(pairs, key=lambda p: (CHANGE_ORDER.index(p.change), p.case_id))
