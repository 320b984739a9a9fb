"""8. The embedded default on held-out questions: the knowledge-base evaluation of issue 45.

The questions are in ``evals/kb/`` (``dev.jsonl`` to tune on, ``test.jsonl`` never looked at
question by question), over two corpora: the shipped sample corpus and a folder of runbooks
the code was never tuned on (``evals/kb/corpora/runbooks``). Each question is run the way a
user runs it: the runbooks folder added to the knowledge base (which already holds the
samples), then ``run_task(question)`` on the embedded default with the built-in team. A
question counts as answered when the run ``succeeded``, its answer contains every key fact
(case and line breaks aside) and cites the document that holds them.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_kb.py dev -v   # tune: every answer
    .venv/bin/python benchmarks/run.py --only kb                     # the test part's score
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import REPO, Section, Verdict, log, table

EVALS = REPO / "evals" / "kb"
RUNBOOKS = EVALS / "corpora" / "runbooks"
TARGET_SCORE = 0.85
TARGET_SECONDS = 20.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    case: dict[str, Any]
    status: str
    answer: str
    seconds: float

    @property
    def answered(self) -> bool:
        return answered(self.case, self.status, self.answer)


def _flat(text: str) -> str:
    return " ".join(text.split()).lower()


def answered(case: dict[str, Any], status: str, answer: str) -> bool:
    """Whether a run answered ``case``: succeeded, every key fact, the right citation."""
    flat = _flat(answer)
    return (
        status == "succeeded"
        and all(_flat(fact) in flat for fact in case["facts"])
        and f"[{case['doc']}]" in answer
    )


def load(part: str) -> list[dict[str, Any]]:
    path = EVALS / f"{part}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def prepare(home: Path) -> None:
    """A knowledge base as a user has it: the samples, then their own folder added."""
    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus

    home.mkdir(parents=True, exist_ok=True)
    with KnowledgeBase(home / "kb.sqlite") as kb:
        ensure_sample_corpus(kb)
        kb.add_folder(RUNBOOKS)


def evaluate(
    part: str, home: Path, *, verbose: bool = False, only: str | None = None
) -> list[Outcome]:
    from relaygraph.runner import run_task

    prepare(home)
    outcomes = []
    for case in load(part):
        if only and only not in case["id"]:
            continue
        started = time.perf_counter()
        result = run_task(case["question"], model="local:smollm2", home=home)
        outcome = Outcome(
            case=case,
            status=result.status,
            answer=result.answer or "",
            seconds=time.perf_counter() - started,
        )
        outcomes.append(outcome)
        mark = "ok  " if outcome.answered else "MISS"
        log(f"  {mark} {case['id']} {outcome.seconds:.1f}s {' → '.join(result.agents_run)}")
        if verbose:
            log(f"       {case['question']}  facts={case['facts']} doc={case['doc']}")
            log(f"       [{result.status}] {' '.join(outcome.answer.split())[:400]}")
    return outcomes


def run(home: Path, *, part: str = "test") -> Section:
    section = Section("8. The embedded default on held-out questions")
    if importlib.util.find_spec("llama_cpp") is None:
        section.add("**Skipped:** `llama_cpp` is not importable here.", "")
        section.verdicts.append(Verdict("8. kb eval", "≥ 85% answered", "skipped", None))
        return section
    outcomes = evaluate(part, home)
    # The first question also loads the model; it counts, as a user's first run would.
    rows = []
    for corpus in sorted({o.case["corpus"] for o in outcomes}):
        some = [o for o in outcomes if o.case["corpus"] == corpus]
        rows.append(_row(corpus, some))
    rows.append(_row("all", outcomes))
    section.add(
        f"The {part} part of `evals/kb/` ({len(outcomes)} questions, never looked at one by "
        f"one while tuning), on {len(os.sched_getaffinity(0))} core(s): each question a "
        "`run_task` on the embedded default with the built-in team, over a knowledge base "
        "holding the sample corpus and the runbooks folder. Answered: `succeeded`, every key "
        "fact in the answer, and the document that holds them cited.",
        "",
        *table(["corpus", "questions", "answered", "score", "s / question"], rows),
        "",
    )
    score = sum(o.answered for o in outcomes) / len(outcomes)
    per_question = sum(o.seconds for o in outcomes) / len(outcomes)
    section.verdicts.append(
        Verdict(
            "8. kb eval",
            f"≥ {TARGET_SCORE:.0%} answered, ≤ {TARGET_SECONDS:.0f} s / question",
            f"{score:.0%}, {per_question:.1f} s",
            score >= TARGET_SCORE and per_question <= TARGET_SECONDS,
            issue=45,
        )
    )
    return section


def _row(label: str, outcomes: list[Outcome]) -> list[Any]:
    hits = sum(o.answered for o in outcomes)
    seconds = sum(o.seconds for o in outcomes) / len(outcomes)
    return [label, len(outcomes), hits, f"{hits / len(outcomes):.0%}", f"{seconds:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["dev", "test"])
    parser.add_argument("-v", "--verbose", action="store_true", help="show every answer")
    parser.add_argument("--only", help="run only the case ids containing this text")
    args = parser.parse_args()
    if args.part == "test" and args.verbose:
        parser.error("the test part is scored, never read answer by answer")
    with tempfile.TemporaryDirectory(prefix="rg-kb-eval-") as tmp:
        outcomes = evaluate(args.part, Path(tmp), verbose=args.verbose, only=args.only)
    hits = sum(o.answered for o in outcomes)
    seconds = sum(o.seconds for o in outcomes) / len(outcomes)
    print(f"{args.part}: {hits}/{len(outcomes)} answered, {seconds:.1f} s / question")


if __name__ == "__main__":
    main()
