"""The held-out evaluation of the embedded default (issue 45, ``evals/kb/``) is well formed:
enough questions, over both corpora, each key fact in the document the question names, and
the dev and test parts apart."""

from __future__ import annotations

import json
from pathlib import Path

from relaygraph.backends.kb import sample_corpus_path

EVALS = Path(__file__).resolve().parents[1] / "evals" / "kb"
CORPORA = {"sample": sample_corpus_path(), "runbooks": EVALS / "corpora" / "runbooks"}


def _cases(part: str) -> list[dict[str, object]]:
    lines = (EVALS / f"{part}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line]


def test_the_evaluation_has_sixty_questions_over_both_corpora_split_apart() -> None:
    dev, test = _cases("dev"), _cases("test")
    assert len(dev) + len(test) >= 60
    assert not {c["id"] for c in dev} & {c["id"] for c in test}
    for part in (dev, test):
        assert {c["corpus"] for c in part} == set(CORPORA)


def test_every_key_fact_stands_in_the_document_the_question_names() -> None:
    for case in [*_cases("dev"), *_cases("test")]:
        path = CORPORA[str(case["corpus"])] / f"{case['doc']}.md"
        text = " ".join(path.read_text(encoding="utf-8").split()).lower()
        facts = case["facts"]
        assert isinstance(facts, list) and facts, case["id"]
        for fact in facts:
            assert " ".join(str(fact).split()).lower() in text, (case["id"], fact)
