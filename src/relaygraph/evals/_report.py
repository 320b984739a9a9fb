"""The eval report, and on disk: ``report.json`` for machines and baselines, ``report.md`` for
people."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from relaygraph.errors import ConfigError, read_config_file
from relaygraph.evals._golden import InvalidGoldenLine
from relaygraph.evals._json import fields_json
from relaygraph.evals._metrics import EvalMetrics
from relaygraph.evals._results import CaseResult

REPORT_JSON = "report.json"
REPORT_MD = "report.md"


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalReport:
    """The outcome of ``relaygraph eval``: every case, the metrics, and what regressed.

    The fields are ``report.json``'s keys, in its order.
    """

    eval_run_id: str | None = None
    """The ledger's record of this run (``Ledger.eval_run``), with every case result."""
    golden: str
    """The golden file's path."""
    started_at: str = ""
    """ISO 8601, UTC."""
    seconds: float = 0.0
    model: str | None = None
    agent_models: dict[str, str] = field(default_factory=dict)
    topology: dict[str, Any] = field(default_factory=lambda: {"kind": "structured"})
    """How the agents were arranged (``relaygraph eval --topology``)."""
    team: dict[str, Any] | None = None
    """The team evaluated (``relaygraph eval --team``): name, digest, file
    (:meth:`~relaygraph.team.Team.record`); cases naming a team file of their own ran with
    that one (:attr:`CaseResult.team`)."""
    repeat: int = 1
    concurrency: int = 1
    tags: tuple[str, ...] = ()
    metrics: EvalMetrics
    baseline: str | None = None
    """The earlier report compared with, if any."""
    regressions: tuple[str, ...] = ()
    """Ids of cases that passed in the baseline and fail now."""
    fixed: tuple[str, ...] = ()
    """Ids of cases that failed in the baseline and pass now."""
    invalid_lines: tuple[InvalidGoldenLine, ...] = ()
    """Lines of the golden file that could not be read; the other cases ran."""
    langsmith: dict[str, Any] | None = None
    """The LangSmith dataset and experiment, with ``--langsmith-dataset``."""
    cases: tuple[CaseResult, ...]

    @property
    def failed(self) -> tuple[CaseResult, ...]:
        return tuple(case for case in self.cases if not case.passed)

    def gate(self, *, min_pass_rate: float | None = None) -> list[str]:
        """Why a pipeline should stop on this report; empty when it may go on.

        A pass rate under ``min_pass_rate`` and any regression against the baseline stop it.
        """
        reasons = []
        rate = self.metrics.pass_rate or 0.0
        if min_pass_rate is not None and rate < min_pass_rate:
            reasons.append(f"pass rate {rate:.1%} is under the minimum {min_pass_rate:.1%}")
        if self.regressions:
            reasons.append(
                f"{len(self.regressions)} case(s) passed in the baseline and fail now: "
                + ", ".join(self.regressions)
            )
        return reasons

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)


class _BaselineCase(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str
    passed: bool


class _Baseline(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    cases: list[_BaselineCase]


def load_baseline(path: str | Path) -> dict[str, bool]:
    """Which cases passed in an earlier report: ``report.json``, or the folder that holds it.

    Raises:
        ConfigError: The file is missing, not JSON, or not an eval report.
    """
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / REPORT_JSON
    file, text = read_config_file(file, "baseline report")
    try:
        baseline = _Baseline.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ConfigError(
            f"baseline report {str(file)!r} is not an eval report.json ({where}: {first['msg']})"
        ) from None
    return {case.id: case.passed for case in baseline.cases}


def compare(
    baseline: Mapping[str, bool], cases: Sequence[CaseResult]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Regressions (passed before, fail now) and fixes (failed before, pass now), by case id.

    Cases in only one of the two reports are neither.
    """
    regressions = tuple(c.id for c in cases if baseline.get(c.id) is True and not c.passed)
    fixed = tuple(c.id for c in cases if baseline.get(c.id) is False and c.passed)
    return regressions, fixed


def write_report(report: EvalReport, out: str | Path) -> tuple[Path, Path]:
    """Write ``out/report.json`` and ``out/report.md``; returns their paths."""
    folder = Path(out).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        json_path, md_path = folder / REPORT_JSON, folder / REPORT_MD
        json_path.write_text(
            json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        md_path.write_text(render_markdown(report), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {str(folder)!r}: {exc}") from None
    return json_path, md_path


def _number(value: Any, *, percent: bool = False) -> str:
    if value is None:
        return "–"
    if percent:
        return f"{value:.1%}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def metric_rows(report: EvalReport) -> list[tuple[str, str]]:
    """The metrics as (name, value) pairs, as the CLI and ``report.md`` show them."""
    m = report.metrics
    rows = [
        ("pass_rate", f"{_number(m.pass_rate, percent=True)} ({m.passed_runs}/{m.runs} runs)"),
        ("routing_accuracy", _number(m.routing_accuracy, percent=True)),
        ("trajectory_match", _number(m.trajectory_match, percent=True)),
        ("handoff_match", _number(m.handoff_match, percent=True)),
        ("answer_match", _number(m.answer_match, percent=True)),
        ("budget_adherence", _number(m.budget_adherence, percent=True)),
        ("tokens", f"{m.total_tokens} ({m.input_tokens} in, {m.output_tokens} out)"),
        ("cost_usd", f"{m.total_cost_usd:.6f}"),
        ("latency_p50", f"{_number(m.latency_p50)} s"),
        ("latency_p95", f"{_number(m.latency_p95)} s"),
    ]
    for k in m.pass_at_k:
        rows.append((f"pass@{k}", _number(m.pass_at_k[k], percent=True)))
    for k in m.pass_hat_k:
        rows.append((f"pass^{k}", _number(m.pass_hat_k[k], percent=True)))
    return rows


def case_outcome(case: CaseResult) -> str:
    """``passed``, or the first failed check in words (with the run, when repeated)."""
    if case.passed:
        return "passed"
    failure = case.first_failure
    if failure is None:
        return "failed"
    trial, check = failure
    run = f" (run {trial.trial}/{len(case.trials)})" if len(case.trials) > 1 else ""
    return f"{check.name}: {check.message}{run}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _json(value: Any) -> str:
    return _cell(json.dumps(value, ensure_ascii=False))


def render_markdown(report: EvalReport) -> str:
    """The report for people: metrics, regressions, every case, then what failed in detail."""
    m = report.metrics
    lines = [
        f"# Eval report: {report.golden}",
        "",
        f"{m.cases} cases, {m.runs} runs, started {report.started_at}, {report.seconds:g} s"
        + (f", model `{report.model}`" if report.model else ", scripted models")
        + f", topology {report.topology.get('kind', 'structured')}"
        + (f", team {report.team['name']}" if report.team else "")
        + (f", tags {', '.join(report.tags)}" if report.tags else ""),
        "",
        "## Metrics",
        "",
        "| metric | value |",
        "| --- | --- |",
        *(f"| {name} | {value} |" for name, value in metric_rows(report)),
        "",
    ]
    if report.baseline is not None:
        lines += [f"## Compared with {report.baseline}", ""]
        lines.append(
            "Regressions: " + (", ".join(report.regressions) if report.regressions else "none")
        )
        lines.append("Fixed: " + (", ".join(report.fixed) if report.fixed else "none"))
        lines.append("")
    if report.invalid_lines:
        lines += ["## Lines that could not be read", ""]
        lines += [f"- line {e.line}: {_cell(e.message)}" for e in report.invalid_lines]
        lines.append("")
    lines += ["## Cases", "", "| case | result | task |", "| --- | --- | --- |"]
    for case in report.cases:
        tasks = ", ".join(f"`{t.task_id}`" for t in case.trials if t.task_id) or "–"
        lines.append(f"| {_cell(case.id)} | {_cell(case_outcome(case))} | {tasks} |")
    lines.append("")
    failed = report.failed
    if failed:
        lines += ["## Failures", ""]
        for case in failed:
            lines += [f"### {case.id}", "", f"Input: {_cell(case.input)}", ""]
            for trial in case.trials:
                if trial.passed:
                    continue
                where = (
                    f"run {trial.trial}, task `{trial.task_id}`"
                    if trial.task_id
                    else (f"run {trial.trial}")
                )
                lines.append(f"- {where}")
                for check in trial.checks:
                    if not check.passed:
                        lines.append(
                            f"  - **{check.name}**: expected {_json(check.expected)}, "
                            f"actual {_json(check.actual)}"
                        )
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
