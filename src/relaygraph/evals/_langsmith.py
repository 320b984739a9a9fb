"""``--langsmith-dataset``: the golden set as a LangSmith dataset, an eval run as an experiment.

The cases run through the team first, exactly as without the flag; the experiment then
replays each run's recorded outputs through ``langsmith.evaluate`` and records every check
as feedback, so the numbers in LangSmith are the numbers in ``report.json``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relaygraph.evals._report import EvalReport
from relaygraph.evals._results import CaseResult, TrialResult


def _example(case: CaseResult) -> dict[str, Any]:
    return {
        "inputs": {"case_id": case.id, "input": case.input},
        "outputs": {"expect": case.expect.to_json()},
        "metadata": {"case_id": case.id, "tags": list(case.tags)},
    }


def _outputs(trial: TrialResult) -> dict[str, Any]:
    observed = trial.observed.to_json() if trial.observed is not None else {}
    return {
        "answer": observed.get("answer"),
        "status": observed.get("status"),
        "passed": trial.passed,
        "task_id": trial.task_id,
        "thread_id": trial.thread_id,
        "error": trial.error,
        "observed": observed,
        "checks": [check.to_json() for check in trial.checks],
        "usage": trial.usage,
        "latency_seconds": trial.latency_seconds,
    }


def _reference_key() -> str:
    """What a new example's expected outputs are called: recent LangSmith clients read
    ``reference_outputs`` and warn on ``outputs``; older ones know only ``outputs``."""
    from langsmith.schemas import ExampleCreate

    fields: Any = getattr(ExampleCreate, "model_fields", None) or ExampleCreate.__fields__
    return "reference_outputs" if "reference_outputs" in fields else "outputs"


def sync_dataset(
    client: Any, name: str, cases: tuple[CaseResult, ...], *, golden: str
) -> tuple[Any, list[Any]]:
    """Create dataset ``name`` or bring it up to date: one example per case, keyed by case id.

    Examples of cases that are not in ``cases`` (other tags, removed cases) are left alone.

    Returns:
        The dataset, and its examples for ``cases`` in their order.
    """
    if client.has_dataset(dataset_name=name):
        dataset = client.read_dataset(dataset_name=name)
    else:
        dataset = client.create_dataset(
            name, description=f"relaygraph golden set {Path(golden).name}"
        )
    existing = {
        (example.inputs or {}).get("case_id"): example
        for example in client.list_examples(dataset_id=dataset.id)
    }
    new = []
    for case in cases:
        wanted = _example(case)
        example = existing.get(case.id)
        if example is None:
            reference = wanted.pop("outputs")
            new.append({**wanted, _reference_key(): reference})
        elif (
            example.inputs != wanted["inputs"]
            or example.outputs != wanted["outputs"]
            or {k: (example.metadata or {}).get(k) for k in wanted["metadata"]}
            != wanted["metadata"]
        ):
            client.update_example(example.id, dataset_id=dataset.id, **wanted)
    if new:
        client.create_examples(dataset_id=dataset.id, examples=new)
    ids = {case.id for case in cases}
    examples = {
        (example.inputs or {}).get("case_id"): example
        for example in client.list_examples(dataset_id=dataset.id)
        if (example.inputs or {}).get("case_id") in ids
    }
    return dataset, [examples[case.id] for case in cases]


def record_experiment(report: EvalReport, *, dataset: str, client: Any = None) -> dict[str, Any]:
    """Sync ``dataset`` with the report's cases and record the report as an experiment.

    Returns:
        The dataset name and id, the experiment name and its URL, for the report.

    Raises:
        Exception: Whatever the LangSmith client raises (no key, refused, unreachable).
    """
    from langsmith import Client, evaluate

    client = client or Client()
    ls_dataset, examples = sync_dataset(client, dataset, report.cases, golden=report.golden)
    trials: dict[str, Iterator[TrialResult]] = {c.id: iter(c.trials) for c in report.cases}
    lock = threading.Lock()

    def replay(inputs: dict[str, Any]) -> dict[str, Any]:
        # Each repetition of an example takes the case's next recorded run.
        with lock:
            trial = next(trials[inputs["case_id"]])
        return _outputs(trial)

    def checks(outputs: dict[str, Any]) -> dict[str, Any]:
        results = [
            {
                "key": check["name"],
                "score": int(check["passed"]),
                "comment": check.get("message") or None,
            }
            for check in outputs.get("checks", [])
        ]
        results.append({"key": "passed", "score": int(bool(outputs.get("passed")))})
        return {"results": results}

    results = evaluate(
        replay,
        data=examples,
        evaluators=[checks],
        experiment_prefix=f"relaygraph-eval-{Path(report.golden).stem}",
        description=f"relaygraph eval of {report.golden}",
        metadata={
            "golden": report.golden,
            "model": report.model or "scripted",
            "agent_models": report.agent_models,
            "team": report.team,
            "repeat": report.repeat,
            "tags": list(report.tags),
        },
        num_repetitions=report.repeat,
        max_concurrency=0,
        client=client,
    )
    # The experiment's runs go out from a background thread: send them before returning,
    # so a command that exits next loses none.
    client.flush()
    experiment = getattr(results, "experiment_name", None)
    return {
        "dataset": dataset,
        "dataset_id": str(ls_dataset.id),
        "experiment": experiment,
        "url": getattr(ls_dataset, "url", None),
    }
