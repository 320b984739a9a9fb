"""Running a golden set through the team, case by case, and scoring every run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relaygraph._home import data_home
from relaygraph.errors import ConfigError
from relaygraph.evals._checks import Check, Observation, check_expectations
from relaygraph.evals._golden import GoldenCase, load_golden
from relaygraph.evals._metrics import compute_metrics
from relaygraph.evals._report import EvalReport, compare, load_baseline, write_report
from relaygraph.evals._results import CaseResult, TrialResult
from relaygraph.topology import Topology

if TYPE_CHECKING:
    from relaygraph.team import Team

ProgressHandler = Callable[[int, int, TrialResult], None]
"""Called after each run with (runs done, runs in all, the run's result)."""


class _ToolLog:
    """Collects a run's tool calls from its events (which ran, which were refused), and the
    agent that started first."""

    def __init__(self) -> None:
        self._calls: list[tuple[str, str]] = []
        self._ran: dict[str, bool] = {}
        self.first_agent: str | None = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "agent_started" and self.first_agent is None:
            self.first_agent = str(event.get("agent"))
        key = str(event.get("tool_call_id") or f"{event.get('agent')}:{event.get('tool')}")
        if kind == "tool_call":
            self._calls.append((key, str(event["tool"])))
        elif kind == "tool_result":
            # The event says whether the tool ran: a policy refusal or a person's rejection
            # answers the call without running it.
            self._ran[key] = bool(event.get("ran", True))

    def split(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(tools that ran, tools called but not run), one entry per call, in order."""
        ran: list[str] = []
        not_run: list[str] = []
        for key, tool in self._calls:
            (ran if self._ran.get(key, False) else not_run).append(tool)
        return tuple(ran), tuple(not_run)


@contextmanager
def _langsmith_tracing(enabled: bool) -> Iterator[None]:
    """Turn LangSmith tracing off for the block unless ``enabled``.

    ``langsmith.evaluate(upload_results=False)`` alone would still post LangGraph's inner
    runs when ``LANGSMITH_TRACING`` is set; the tracing context is per thread, so each
    worker enters it itself.
    """
    if enabled:
        yield
        return
    from langsmith import tracing_context

    with tracing_context(enabled=False):
        yield


def _observe(result: Any, tools: _ToolLog) -> Observation:
    ran, not_run = tools.split()
    team = result.team_usage
    return Observation(
        status=result.status,
        answer=result.answer,
        stop_reason=result.stop_reason,
        # The agent that started first (the supervisor's first route, or a swarm's starting
        # agent); a run paused inside that visit has it although the visit has not finished.
        first_agent=tools.first_agent or (result.agents_run[0] if result.agents_run else None),
        agents=tuple(result.agents_run),
        handoffs=tuple((h["from"], h["to"]) for h in result.handoffs if h["kind"] == "direct"),
        tools=ran,
        refused_tools=not_run,
        violations=tuple(v["kind"] for v in result.violations),
        tokens=int(team.get("input_tokens", 0)) + int(team.get("output_tokens", 0)),
        cost_usd=float(team.get("cost_usd", 0.0)),
    )


def run_case(
    case: GoldenCase,
    *,
    trial: int = 1,
    model: str | None = None,
    agent_models: Mapping[str, str] | None = None,
    home: Path | None = None,
    trace: bool = False,
    topology: Topology | None = None,
    team: Team | None = None,
) -> TrialResult:
    """Run ``case`` once through ``team`` (:func:`relaygraph.runner.run_task`) and score it.

    The case's script plays every role unless ``model`` is given; ``agent_models`` still
    overrides single roles. The run gets a thread of its own. A case that cannot run at all
    fails with a ``run`` check that says why; it never raises. In another ``topology`` than
    the structured team, the case's script is played as that topology's
    (:mod:`relaygraph.evals._translate`).

    Args:
        team: The team; when None, the case's own team file, else the built-in team.
        topology: How the agents are arranged; the team's own when None.
    """
    from relaygraph.runner import run_task
    from relaygraph.team import default_team, load_team

    tools = _ToolLog()
    started = time.perf_counter()
    try:
        team = team or (load_team(case.team) if case.team is not None else default_team())
    except ConfigError as exc:
        return _not_run(case, trial, None, str(exc), started)
    topology = topology or team.arrangement
    spec = model or (f"scripted:{case.script}" if case.script is not None else None)
    if model is None and case.script is not None and topology.kind != "structured":
        # The case's script is the structured team's; it is played as this topology's.
        from relaygraph.evals._translate import translate_script

        path, start = translate_script(
            case.script, topology.kind, data_home(home) / "eval-scripts", team.agent_names
        )
        spec = f"scripted:{path}"
        if topology.kind == "swarm" and topology.start_agent is None:
            topology = replace(topology, start_agent=start)
    try:
        with _langsmith_tracing(trace):
            result = run_task(
                case.input,
                team=team,
                model=spec,
                agent_models=agent_models,
                policy=case.policy,
                home=home,
                on_event=tools,
                topology=topology,
            )
            observed = _observe(result, tools)
            checks = check_expectations(case.expect, observed)
    except Exception as exc:  # One broken case is reported; the rest of the set still runs.
        error = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        return _not_run(case, trial, spec, error, started)
    latency = round(time.perf_counter() - started, 3)
    return TrialResult(
        case_id=case.id,
        trial=trial,
        passed=all(check.passed for check in checks),
        checks=tuple(checks),
        observed=observed,
        task_id=result.task_id,
        thread_id=result.thread_id,
        latency_seconds=latency,
        usage={k: v for k, v in result.team_usage.items() if k != "limits"},
        usage_by_role={
            role: {k: v for k, v in usage.items() if k != "limits"}
            for role, usage in result.usage.items()
        },
        model=spec,
    )


def _not_run(
    case: GoldenCase, trial: int, spec: str | None, error: str, started: float
) -> TrialResult:
    """The result of a case that could not run: one failed ``run`` check saying why."""
    check = Check(
        name="run",
        passed=False,
        expected="the case runs",
        actual=error,
        message=f"the case could not run: {error}",
    )
    return TrialResult(
        case_id=case.id,
        trial=trial,
        passed=False,
        checks=(check,),
        latency_seconds=round(time.perf_counter() - started, 3),
        model=spec,
        error=error,
    )


def _check_models(
    model: str | None,
    agent_models: Mapping[str, str],
    topology: Topology | None,
    teams: Sequence[Team],
) -> None:
    """Refuse a bad ``--model``, ``--agent-model`` or ``--start-agent`` before any case runs:
    each must fit every team the cases run with (its agents and roles)."""
    from relaygraph.runner import resolve_model_specs

    for team in teams:
        arranged = topology or team.arrangement
        try:
            arranged.check_agents(team.agent_names)
            resolve_model_specs(model, agent_models, arranged.roles(team.agent_names))
        except ConfigError as exc:
            if len(teams) == 1:
                raise
            raise ConfigError(f"team {team.name!r}: {exc}") from None


def _prepare_home(home: Path | None) -> None:
    """Create the data directory's shared stores before runs start side by side.

    The first run in a new data directory creates the knowledge base's sample corpus and the
    ledger's schema; several first runs at once would each try to, and collide.
    """
    import os

    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus
    from relaygraph.store import DATABASE_URL_ENV, Ledger

    folder = data_home(home)
    with KnowledgeBase(folder / "kb.sqlite") as kb:
        ensure_sample_corpus(kb)
    url = None if os.environ.get(DATABASE_URL_ENV) else f"sqlite:///{folder / 'ledger.sqlite'}"
    with Ledger(url) as ledger:
        if not ledger.is_current():
            ledger.upgrade()


def _record(report: EvalReport, dataset: str) -> dict[str, Any]:
    """The experiment's details, or the error that kept it from being recorded.

    The runs are done by now: a LangSmith failure is reported beside them, never instead.
    """
    from relaygraph.evals._langsmith import record_experiment

    try:
        return record_experiment(report, dataset=dataset)
    except Exception as exc:  # No key, refused, unreachable: the client's own exceptions.
        return {"dataset": dataset, "error": f"{type(exc).__name__}: {exc}"}


def _record_trial(ledger: Any, eval_run_id: str, trial: TrialResult) -> None:
    """Store one run's result in the ledger, linked to the run's task (if it got one)."""
    ledger.record_eval_case(
        eval_run_id,
        case_id=trial.case_id,
        trial=trial.trial,
        passed=trial.passed,
        checks=[check.to_json() for check in trial.checks],
        task_id=trial.task_id,
        usage=trial.usage,
        latency_seconds=trial.latency_seconds,
        error=trial.error,
    )


def _run_jobs(
    jobs: Sequence[tuple[GoldenCase, int]],
    results: dict[tuple[str, int], TrialResult],
    *,
    ledger: Any,
    eval_run_id: str,
    model: str | None,
    agent_models: Mapping[str, str],
    concurrency: int,
    home: Path | None,
    trace: bool,
    on_progress: ProgressHandler | None,
    topology: Topology | None,
    team_for_case: Callable[[GoldenCase], Team],
) -> None:
    """Run every (case, trial) job, ``concurrency`` at once, recording each as it ends."""
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="relaygraph-eval") as pool:
        pending: set[Future[TrialResult]] = {
            pool.submit(
                run_case,
                case,
                trial=n,
                model=model,
                agent_models=agent_models,
                home=home,
                trace=trace,
                topology=topology,
                team=team_for_case(case),
            )
            for case, n in jobs
        }
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    trial = future.result()
                    results[(trial.case_id, trial.trial)] = trial
                    _record_trial(ledger, eval_run_id, trial)
                    if on_progress is not None:
                        on_progress(len(results), len(jobs), trial)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def run_eval(
    golden: str | Path,
    *,
    model: str | None = None,
    agent_models: Mapping[str, str] | None = None,
    concurrency: int = 1,
    repeat: int = 1,
    tags: Sequence[str] = (),
    out: str | Path | None = None,
    baseline: str | Path | None = None,
    on_progress: ProgressHandler | None = None,
    langsmith_dataset: str | None = None,
    home: Path | None = None,
    topology: Topology | None = None,
    team: Team | str | Path | None = None,
) -> EvalReport:
    """Run a golden set through a team and score every case.

    Args:
        golden: The golden file (JSON Lines; see ``docs/evals.md``).
        model: Model spec for every role of every case; each case's ``script`` when None
            (the default model for a case without one).
        agent_models: Per-role specs, as ``relaygraph run --agent-model``.
        concurrency: Runs at once, each in a worker thread.
        repeat: Runs per case; with more than one the report has pass@k and pass^k.
        tags: Run only the cases carrying at least one of these tags.
        out: Write ``report.json`` and ``report.md`` into this folder.
        baseline: An earlier ``report.json`` (or its folder): cases that passed there and
            fail now are listed as regressions.
        on_progress: Called after each run with (runs done, runs in all, its result).
        langsmith_dataset: Create or update this LangSmith dataset from the cases and record
            the runs as an experiment. Without it nothing is sent to LangSmith.
        home: The data directory (``$RELAYGRAPH_HOME`` when None).
        topology: How the agents are arranged; each case's team's own when None. Run the
            set once per topology to compare them.
        team: The team evaluated (a :class:`~relaygraph.team.Team` or a team file), for
            every case that names no ``team`` file of its own; the built-in team when None.

    Raises:
        ConfigError: A bad argument (a model, a role or start agent a case's team does not
            have), an unreadable team file, golden file or baseline, a golden file without a
            single valid case, or tags no case carries — before anything runs. Invalid lines
            alone do not raise: they are in ``invalid_lines``.
    """
    from relaygraph.team import Team, default_team, load_team

    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
    if repeat < 1:
        raise ConfigError(f"repeat must be at least 1, got {repeat}")
    agent_models = dict(agent_models or {})
    the_team = team if isinstance(team, Team) else load_team(team) if team else default_team()
    golden_set = load_golden(golden, team=the_team)
    if not golden_set.cases:
        problems = "; ".join(map(str, golden_set.errors)) or "the file has no cases"
        raise ConfigError(f"golden file {str(golden_set.path)!r} has no valid case: {problems}")
    selected = golden_set.with_tags(tuple(tags))
    if not selected.cases:
        known = sorted({tag for case in golden_set.cases for tag in case.tags})
        raise ConfigError(
            f"no case in {str(golden_set.path)!r} has the tag(s) {', '.join(map(repr, tags))}; "
            f"tags in the file: {', '.join(known) or 'none'}"
        )
    teams = list({id(t): t for t in map(golden_set.team_for_case, selected.cases)}.values())
    _check_models(model, agent_models, topology, teams)
    earlier = load_baseline(baseline) if baseline is not None else None
    if out is not None and Path(out).expanduser().exists() and not Path(out).expanduser().is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; name a folder for the report")

    if concurrency > 1:
        _prepare_home(home)
    started_at = datetime.now(UTC)
    clock = time.perf_counter()
    jobs = [(case, n) for n in range(1, repeat + 1) for case in selected.cases]
    results: dict[tuple[str, int], TrialResult] = {}
    trace = langsmith_dataset is not None
    from relaygraph.runner import ledger_for

    ledger = ledger_for(data_home(home))
    try:
        eval_run_id = ledger.record_eval_run(
            golden=str(golden_set.path),
            models={"model": model, "agent_models": agent_models},
            options={
                "repeat": repeat,
                "concurrency": concurrency,
                "tags": list(tags),
                "baseline": None if baseline is None else str(baseline),
                "langsmith_dataset": langsmith_dataset,
                "topology": (topology or the_team.arrangement).to_mapping(),
            },
            case_count=len(selected.cases),
            run_count=len(jobs),
            started_at=started_at,
        )
        _run_jobs(
            jobs,
            results,
            ledger=ledger,
            eval_run_id=eval_run_id,
            model=model,
            agent_models=agent_models,
            concurrency=concurrency,
            home=home,
            trace=trace,
            on_progress=on_progress,
            topology=topology,
            team_for_case=golden_set.team_for_case,
        )
        cases = tuple(
            CaseResult(
                id=case.id,
                input=case.input,
                expect=case.expect,
                tags=case.tags,
                line=case.line,
                team=golden_set.team_for_case(case).name,
                trials=tuple(results[(case.id, n)] for n in range(1, repeat + 1)),
            )
            for case in selected.cases
        )
        regressions, fixed = compare(earlier, cases) if earlier is not None else ((), ())
        report = EvalReport(
            golden=str(golden_set.path),
            cases=cases,
            metrics=compute_metrics(cases),
            invalid_lines=golden_set.errors,
            model=model,
            agent_models=agent_models,
            topology=(topology or the_team.arrangement).to_mapping(),
            team=the_team.record(),
            repeat=repeat,
            concurrency=concurrency,
            tags=tuple(tags),
            started_at=started_at.isoformat(timespec="seconds"),
            seconds=round(time.perf_counter() - clock, 3),
            baseline=None if baseline is None else str(baseline),
            regressions=regressions,
            fixed=fixed,
            eval_run_id=eval_run_id,
        )
        ledger.finish_eval_run(eval_run_id, metrics=report.metrics.to_json())
    finally:
        ledger.close()
    if langsmith_dataset is not None:
        report = replace(report, langsmith=_record(report, langsmith_dataset))
    if out is not None:
        write_report(report, out)
    return report
