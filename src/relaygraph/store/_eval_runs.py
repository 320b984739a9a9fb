"""Eval runs and their cases."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from relaygraph.errors import ConfigError
from relaygraph.store import _validate as check
from relaygraph.store._errors import RecordConflict, RecordNotFound
from relaygraph.store._models import (
    EvalCaseRow,
    EvalRunRow,
    TaskRow,
)
from relaygraph.store._records import (
    EvalCaseRecord,
    EvalRunRecord,
    snapshot,
)
from relaygraph.store._repository import Repository
from relaygraph.store._task_rows import utc_now


class EvalRunRepository(Repository):
    """Eval runs and their cases."""

    def record_eval_run(
        self,
        *,
        golden: str,
        models: Mapping[str, Any],
        options: Mapping[str, Any],
        case_count: int,
        run_count: int,
        started_at: datetime | None = None,
    ) -> str:
        """Record the start of an eval run; returns its id for its case results.

        Args:
            golden: The golden file's path.
            models: ``{"model": spec or None, "agent_models": {role: spec}}``.
            options: How it runs: ``repeat``, ``concurrency``, ``tags``, ``baseline``.
            case_count: Cases selected to run.
            run_count: Case runs planned (cases times ``repeat``).
            started_at: When it started; now when None.

        Raises:
            ConfigError: A bad field, named in the message.
        """
        row = EvalRunRow(
            id=str(uuid.uuid4()),
            golden=check.text(golden, "golden"),
            models=check.json_object(models, "models"),
            options=check.json_object(options, "options"),
            case_count=check.whole(case_count, "case_count"),
            run_count=check.whole(run_count, "run_count"),
            started_at=check.aware(started_at, "started_at") or utc_now(),
        )
        with self._core.write() as session:
            session.add(row)
        return row.id

    def record_eval_case(
        self,
        eval_run_id: str,
        *,
        case_id: str,
        trial: int,
        passed: bool,
        checks: Sequence[Mapping[str, Any]],
        task_id: str | None = None,
        usage: Mapping[str, Any] | None = None,
        latency_seconds: float = 0.0,
        error: str | None = None,
    ) -> EvalCaseRecord:
        """Record one run of one case of an eval run.

        Args:
            eval_run_id: What :meth:`record_eval_run` returned.
            case_id: The golden case's id.
            trial: Which run of the case, from 1.
            passed: Whether every check passed.
            checks: Each check as a JSON object with ``name``, ``passed``, ``expected`` and
                ``actual``; the first with a false ``passed`` is kept as ``first_failure``.
            task_id: The ledger task the run was; None when the case failed before it had one.
            usage: The team's usage totals for the run.
            latency_seconds: Wall-clock seconds of the run.
            error: Why the case could not run at all.

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such eval run or task.
            RecordConflict: This trial of this case was recorded already.
        """
        if not isinstance(passed, bool):
            raise ConfigError(f"passed {passed!r} must be True or False")
        stored = check.json_list(checks, "checks", scrub=True)
        for n, each in enumerate(stored):
            if not isinstance(each, dict) or not isinstance(each.get("passed"), bool):
                raise ConfigError(f"checks[{n}] {each!r} must be an object with a bool 'passed'")
        key = f"{case_id}#{trial}"
        row = EvalCaseRow(
            eval_run_id=eval_run_id,
            case_id=check.text(case_id, "case_id", max_chars=255),
            trial=check.whole(trial, "trial", minimum=1),
            passed=passed,
            checks=stored,
            first_failure=next((each for each in stored if not each["passed"]), None),
            usage=check.json_object(usage or {}, "usage", scrub=True),
            latency_seconds=check.amount(latency_seconds, "latency_seconds"),
            error=None if error is None else str(error).replace(check.NUL, check.REPLACEMENT),
            task_id=check.optional_text(task_id, "task_id", max_chars=36),
            created_at=utc_now(),
        )
        try:
            with self._core.write() as session:
                if session.get(EvalRunRow, eval_run_id) is None:
                    raise RecordNotFound("eval run", eval_run_id)
                if task_id is not None and session.get(TaskRow, task_id) is None:
                    raise RecordNotFound("task", task_id)
                earlier = session.scalar(
                    select(EvalCaseRow.id).where(
                        EvalCaseRow.eval_run_id == eval_run_id,
                        EvalCaseRow.case_id == row.case_id,
                        EvalCaseRow.trial == row.trial,
                    )
                )
                if earlier is not None:
                    raise RecordConflict("eval case", key, "this trial was recorded already")
                session.add(row)
        except IntegrityError:
            raise RecordConflict("eval case", key, "this trial was recorded already") from None
        return snapshot(EvalCaseRecord, row)

    def finish_eval_run(
        self,
        eval_run_id: str,
        *,
        metrics: Mapping[str, Any],
        finished_at: datetime | None = None,
    ) -> EvalRunRecord:
        """Record an eval run's end: its metrics, pass rate and the passed counts.

        The pass rate is ``metrics["pass_rate"]``; the passed counts are those of the case
        results recorded for the run (a case passes when all its runs passed).

        Raises:
            ConfigError: A bad field, named in the message.
            RecordNotFound: No such eval run.
            RecordConflict: It was finished already.
        """
        stored = check.json_object(metrics, "metrics")
        pass_rate = check.share(stored.get("pass_rate"), "metrics.pass_rate")
        when = check.aware(finished_at, "finished_at") or utc_now()
        with self._core.write() as session:
            row = session.get(EvalRunRow, eval_run_id, with_for_update=True)
            if row is None:
                raise RecordNotFound("eval run", eval_run_id)
            if row.finished_at is not None:
                raise RecordConflict("eval run", eval_run_id, "it was finished already")
            outcomes = session.execute(
                select(EvalCaseRow.case_id, EvalCaseRow.passed).where(
                    EvalCaseRow.eval_run_id == eval_run_id
                )
            ).all()
            by_case: dict[str, bool] = {}
            for case_id, passed in outcomes:
                by_case[case_id] = by_case.get(case_id, True) and bool(passed)
            row.metrics, row.pass_rate, row.finished_at = stored, pass_rate, when
            row.passed_run_count = sum(bool(passed) for _, passed in outcomes)
            row.passed_case_count = sum(by_case.values())
            session.flush()
            return self._eval_records(session, [row])[0]

    def eval_runs(self, limit: int = 20) -> list[EvalRunRecord]:
        """The latest eval runs, newest first, each with its case results.

        Raises:
            ConfigError: A limit outside 1..200.
        """
        check.page_limit(limit)
        query = (
            select(EvalRunRow)
            .order_by(EvalRunRow.started_at.desc(), EvalRunRow.id.desc())
            .limit(limit)
        )
        with self._core.read() as session:
            return self._eval_records(session, list(session.scalars(query)))

    def eval_run(self, eval_run_id: str) -> EvalRunRecord:
        """One eval run with every case result, by case id and trial.

        Raises:
            RecordNotFound: No such eval run.
        """
        with self._core.read() as session:
            row = session.get(EvalRunRow, eval_run_id)
            if row is None:
                raise RecordNotFound("eval run", eval_run_id)
            return self._eval_records(session, [row])[0]

    def _eval_records(self, session: Session, rows: list[EvalRunRow]) -> list[EvalRunRecord]:
        cases: dict[str, list[EvalCaseRecord]] = {row.id: [] for row in rows}
        if rows:
            query = (
                select(EvalCaseRow)
                .where(EvalCaseRow.eval_run_id.in_(list(cases)))
                .order_by(EvalCaseRow.case_id, EvalCaseRow.trial)
            )
            for case in session.scalars(query):
                cases[case.eval_run_id].append(snapshot(EvalCaseRecord, case))
        return [snapshot(EvalRunRecord, row, cases=tuple(cases[row.id])) for row in rows]
