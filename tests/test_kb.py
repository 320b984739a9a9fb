"""The researcher's knowledge base: indexing, re-indexing, search and reading."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from relaygraph.backends import kb as kb_module
from relaygraph.backends.kb import (
    MAX_FILE_BYTES,
    Document,
    DocumentNotFoundError,
    IndexReport,
    KnowledgeBase,
    SearchHit,
    ensure_sample_corpus,
    sample_corpus_path,
)
from relaygraph.errors import ConfigError, ToolInputError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    write(
        folder / "checkpoints.md",
        "# Checkpoints and durability\n\nA checkpoint is saved after every super-step. "
        "Durability modes are exit, async and sync.\n",
    )
    write(
        folder / "guides" / "handoffs.md",
        "Intro line\n\n# Handoffs between agents\n\nReturn Command with graph PARENT.\n",
    )
    write(folder / "plain.txt", "No heading here, only words about routing.\n")
    return folder


def test_add_folder_indexes_markdown_and_text_files(kb: KnowledgeBase, notes: Path) -> None:
    write(notes / "ignored.rst", "# Not indexed\n")

    report = kb.add_folder(notes)

    assert sorted(report.added) == ["checkpoints", "guides/handoffs", "plain"]
    assert report.updated == report.unchanged == report.removed == report.skipped == ()
    assert kb.count() == 3
    assert kb.list_documents() == [
        ("checkpoints", "Checkpoints and durability"),
        ("guides/handoffs", "Handoffs between agents"),
        ("plain", "plain"),
    ]
    assert report.summary() == "3 added, 0 updated, 0 unchanged, 0 removed, 0 skipped"


def test_markdown_suffix_is_indexed(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "f" / "Long Notes.markdown", "# Long\n")

    assert kb.add_folder(tmp_path / "f").added == ("long-notes",)


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("# Simple title\nbody", "Simple title"),
        ("intro\n## Second level\n#   Spaced   \n", "Spaced"),
        ("# Closed heading ##\n", "Closed heading"),
        ("```bash\n# a shell comment\n```\n# Real title\n", "Real title"),
        ("~~~\n# inside tilde fence\n~~~\ntext\n", "doc-stem"),
        ("#hashtag is not a heading\n", "doc-stem"),
        ("\ufeff# After a byte-order mark\n", "After a byte-order mark"),
    ],
)
def test_title_is_first_h1_outside_code_fences_else_stem(
    kb: KnowledgeBase, tmp_path: Path, text: str, title: str
) -> None:
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "doc-stem.md").write_bytes(text.encode("utf-8"))

    kb.add_folder(tmp_path / "f")

    assert kb.read("doc-stem").title == title


def test_doc_ids_are_readable_slugs_and_never_clash(kb: KnowledgeBase, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "Guides" / "Check Points!.md", "a")
    write(first / "notes.md", "b")
    write(first / "notes.txt", "c")
    write(second / "notes.md", "d")
    write(second / "notes.txt", "e")

    ids_first = kb.add_folder(first).added
    ids_second = kb.add_folder(second).added

    assert ids_first == ("notes", "notes.txt", "guides/check-points")
    tag = hashlib.sha256(str(second.resolve()).encode()).hexdigest()[:6]
    # "notes" is taken, so the second folder's notes.md keeps its extension; "notes.txt" is
    # taken too, so its notes.txt gets the folder tag.
    assert ids_second == ("notes.md", f"notes.txt@{tag}")
    assert kb.read(f"notes.txt@{tag}").text == "e"
    assert all(" " not in doc_id for doc_id, _ in kb.list_documents())


def test_doc_ids_fall_back_to_a_counter_when_names_normalise_alike(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    # In two folders, "a b.md" and "a-b.md" both slug to "a-b", "a-b.md" and "a-b.md@<tag>".
    for name in ("one", "two"):
        write(tmp_path / name / "a b.md", name)
        write(tmp_path / name / "a-b.md", name)
        kb.add_folder(tmp_path / name)

    ids = [doc_id for doc_id, _ in kb.list_documents()]

    assert len(ids) == len(set(ids)) == 4
    assert any(doc_id.endswith("-2") for doc_id in ids)


def test_readding_updates_changed_keeps_unchanged_removes_missing(
    kb: KnowledgeBase, notes: Path
) -> None:
    kb.add_folder(notes)
    write(notes / "checkpoints.md", "# Renamed title\n\nNow about thread identifiers.\n")
    (notes / "plain.txt").unlink()
    write(notes / "new.md", "# New doc\n")

    report = kb.add_folder(notes)

    assert report.added == ("new",)
    assert report.updated == ("checkpoints",)
    assert report.unchanged == ("guides/handoffs",)
    assert report.removed == ("plain",)
    assert kb.read("checkpoints").title == "Renamed title"
    # The index follows the update: the old words are gone, the new ones are found.
    assert [h.doc_id for h in kb.search("identifiers")] == ["checkpoints"]
    assert kb.search("durability") == []
    assert [h.doc_id for h in kb.search("routing")] == []
    assert kb.count() == 3


def test_readding_one_folder_leaves_other_folders_alone(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "a" / "one.md", "alpha")
    write(tmp_path / "b" / "two.md", "beta")
    kb.add_folder(tmp_path / "a")
    kb.add_folder(tmp_path / "b")
    (tmp_path / "a" / "one.md").unlink()

    assert kb.add_folder(tmp_path / "a").removed == ("one",)
    assert kb.list_documents() == [("two", "two")]


def test_file_that_becomes_undecodable_is_removed_and_reported(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    doc = write(tmp_path / "f" / "doc.md", "fine")
    kb.add_folder(tmp_path / "f")
    doc.write_bytes(b"\xff\xfe broken")

    report = kb.add_folder(tmp_path / "f")

    assert report.removed == ("doc",)
    assert [path for path, _ in report.skipped] == [doc]


def test_hidden_dirs_and_files_are_skipped(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "f" / ".git" / "notes.md", "hidden dir")
    write(tmp_path / "f" / "sub" / ".cache" / "x.md", "nested hidden dir")
    write(tmp_path / "f" / ".draft.md", "hidden file")
    write(tmp_path / "f" / "sub" / "visible.md", "visible")

    report = kb.add_folder(tmp_path / "f")

    assert report.added == ("sub/visible",)
    assert report.skipped == ()


def test_big_and_undecodable_files_are_skipped_with_a_reason(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    folder = tmp_path / "f"
    big = folder / "big.md"
    folder.mkdir()
    big.write_bytes(b"a" * (MAX_FILE_BYTES + 1))
    latin1 = folder / "latin1.txt"
    latin1.write_bytes("caf\xe9".encode("latin-1"))
    write(folder / "ok.md", "ok")

    report = kb.add_folder(folder)

    assert report.added == ("ok",)
    reasons = dict(report.skipped)
    assert "larger than 2 MB" in reasons[big]
    assert "not UTF-8" in reasons[latin1]


def test_unreadable_file_is_skipped(
    kb: KnowledgeBase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = write(tmp_path / "f" / "locked.md", "secret")
    real_open = os.open

    # Files are opened by name relative to their folder's descriptor (see _kb_files); as
    # root a chmod would not refuse, so the refusal is made here.
    def refusing_open(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "locked.md":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)

    report = kb.add_folder(tmp_path / "f")

    assert report.skipped == ((doc, "cannot be read: Permission denied"),)


@pytest.mark.parametrize("make", ["missing", "file"])
def test_add_folder_rejects_a_bad_folder(kb: KnowledgeBase, tmp_path: Path, make: str) -> None:
    target = tmp_path / "target"
    if make == "file":
        target.write_text("x")

    with pytest.raises(ConfigError, match=r"'.*target'.*(does not exist|is not a directory)"):
        kb.add_folder(target)


def test_search_ranks_the_matching_doc_first(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    hits = kb.search("handoffs between agents")

    assert hits[0].doc_id == "guides/handoffs"
    assert hits[0].title == "Handoffs between agents"
    assert isinstance(hits[0], SearchHit)


def test_search_ors_terms_so_partial_matches_rank(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    hits = kb.search("durability zebra quasar")

    assert [h.doc_id for h in hits] == ["checkpoints"]


def test_search_weights_titles_above_bodies(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "f" / "title.md", "# Interrupts\n\nSomething else entirely, at length.\n")
    write(tmp_path / "f" / "body.md", "# Other\n\nInterrupts and interrupts, in the body.\n")
    kb.add_folder(tmp_path / "f")

    hits = kb.search("interrupts")

    assert [h.doc_id for h in hits] == ["title", "body"]
    assert hits[0].score > hits[1].score


def test_search_stems_words(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    assert kb.search("checkpointing")[0].doc_id == "checkpoints"


def test_snippet_highlights_matches_in_one_line(kb: KnowledgeBase, tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(60))
    write(tmp_path / "f" / "long.md", f"# Long\n\n{words} durability\n{words}\n")
    kb.add_folder(tmp_path / "f")

    (hit,) = kb.search("durability")

    assert "**durability**" in hit.snippet
    assert "\n" not in hit.snippet
    assert "…" in hit.snippet
    assert len(hit.snippet.split()) < 20


@pytest.mark.parametrize(
    "query",
    [
        '"checkpoint AND (',
        "NEAR",
        "NEAR(checkpoint durability, 2)",
        "*",
        "check*",
        '"unbalanced',
        "'single' \"double\"",
        "title: checkpoint",
        "-durability +sync ^exit",
        "AND OR NOT",
        "checkpoint)) OR ((",
        "{title body}: sync",
        "🙂 ∑ ™",
    ],
)
def test_search_never_raises_on_fts_syntax(kb: KnowledgeBase, notes: Path, query: str) -> None:
    kb.add_folder(notes)

    hits = kb.search(query)

    assert isinstance(hits, list)


def test_fts_operators_are_searched_as_words(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "f" / "near.md", "The NEAR operator and the word and.\n")
    write(tmp_path / "f" / "other.md", "Nothing relevant.\n")
    kb.add_folder(tmp_path / "f")

    assert [h.doc_id for h in kb.search("NEAR")] == ["near"]
    assert kb.search("checkpoint AND (")[0].doc_id == "near"


def test_punctuation_only_query_finds_nothing(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    assert kb.search("*** ()") == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_is_refused(kb: KnowledgeBase, query: str) -> None:
    with pytest.raises(ToolInputError, match="search query is empty"):
        kb.search(query)


@pytest.mark.parametrize(("k", "expected"), [(-3, 1), (0, 1), (1, 1), (7, 7), (500, 20)])
def test_k_is_clamped_to_1_through_20(
    kb: KnowledgeBase, tmp_path: Path, k: int, expected: int
) -> None:
    for i in range(25):
        write(tmp_path / "f" / f"doc{i:02}.md", f"# Doc {i}\n\nshared word\n")
    kb.add_folder(tmp_path / "f")

    assert len(kb.search("shared", k=k)) == expected


def test_read_returns_the_document(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    doc = kb.read("guides/handoffs")

    assert doc == Document(
        doc_id="guides/handoffs",
        title="Handoffs between agents",
        source=(notes / "guides" / "handoffs.md").resolve(),
        text="Intro line\n\n# Handoffs between agents\n\nReturn Command with graph PARENT.\n",
        truncated=False,
    )


@pytest.mark.parametrize(
    "written",
    [" guides/handoffs ", "`guides/handoffs`", "'guides/handoffs'", "Guides/Handoffs.md"],
)
def test_read_forgives_how_a_model_copies_ids(kb: KnowledgeBase, notes: Path, written: str) -> None:
    kb.add_folder(notes)

    assert kb.read(written).doc_id == "guides/handoffs"


def test_read_truncates_to_max_chars(kb: KnowledgeBase, tmp_path: Path) -> None:
    write(tmp_path / "f" / "long.md", "x" * 50)
    kb.add_folder(tmp_path / "f")

    cut = kb.read("long", max_chars=10)
    whole = kb.read("long", max_chars=50)

    assert (cut.text, cut.truncated) == ("x" * 10, True)
    assert (len(whole.text), whole.truncated) == (50, False)


def test_read_refuses_max_chars_below_one(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    with pytest.raises(ToolInputError, match="max_chars must be at least 1, got 0"):
        kb.read("plain", max_chars=0)


def test_read_unknown_id_suggests_close_ids(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    with pytest.raises(DocumentNotFoundError) as caught:
        kb.read("handoff")

    error = caught.value
    assert isinstance(error, ToolInputError)
    assert error.doc_id == "handoff"
    assert error.suggestions[0] == "guides/handoffs"
    assert str(error).startswith("no document with id 'handoff'; did you mean 'guides/handoffs'")


def test_read_unknown_id_without_close_ids_says_to_search(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    with pytest.raises(DocumentNotFoundError, match="search first and copy a doc_id") as caught:
        kb.read("zzzzzzzzzz")

    assert caught.value.suggestions == []


def test_read_on_empty_kb_says_it_is_empty(kb: KnowledgeBase) -> None:
    with pytest.raises(DocumentNotFoundError, match="knowledge base is empty"):
        kb.read("anything")


def test_read_refuses_an_empty_id(kb: KnowledgeBase) -> None:
    with pytest.raises(ToolInputError, match="doc_id is empty"):
        kb.read(' "" ')


def test_index_persists_across_connections_in_wal_mode(tmp_path: Path, notes: Path) -> None:
    path = tmp_path / "kb.sqlite"
    with KnowledgeBase(path) as first:
        first.add_folder(notes)

    with KnowledgeBase(path) as second:
        assert second.count() == 3
        assert second.search("durability")[0].doc_id == "checkpoints"
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_kb_can_be_used_from_other_threads(kb: KnowledgeBase, notes: Path) -> None:
    # LangGraph runs sync tools in a thread pool, so one KnowledgeBase must work across threads.
    kb.add_folder(notes)
    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(kb.search("durability")[0].doc_id))
    worker.start()
    worker.join()

    assert results == ["checkpoints"]


def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_bytes(b"# Not a database\n" * 100)

    with pytest.raises(ConfigError, match=r"cannot use .*notes\.md.* as a knowledge base"):
        KnowledgeBase(path)


def test_a_newer_schema_version_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "kb.sqlite"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()

    with pytest.raises(ConfigError, match="schema version 99"):
        KnowledgeBase(path)


def test_missing_fts5_is_a_clear_config_error() -> None:
    class NoFts5:
        def execute(self, sql: str) -> None:
            raise sqlite3.OperationalError("no such module: fts5")

    with pytest.raises(ConfigError, match=r"no FTS5 full-text search.*no such module: fts5"):
        kb_module._require_fts5(NoFts5())  # type: ignore[arg-type]


def test_sample_corpus_ships_in_the_package() -> None:
    corpus = sample_corpus_path()

    names = sorted(p.name for p in corpus.glob("*.md"))
    assert len(names) >= 6
    for path in corpus.glob("*.md"):
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# "), path.name
        assert 200 <= len(text.split()) <= 500, path.name


def test_sample_corpus_path_refuses_a_non_directory_resource(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kb_module, "files", lambda package: tmp_path / "zipped.zip")

    with pytest.raises(ConfigError, match="sample corpus is not a folder on disk"):
        sample_corpus_path()


def test_ensure_sample_corpus_indexes_once_and_finds_checkpoints(kb: KnowledgeBase) -> None:
    ensure_sample_corpus(kb)
    indexed = kb.count()

    hits = kb.search("checkpoint durability")

    assert indexed >= 6
    assert hits[0].doc_id == "checkpoints"
    assert {"handoffs", "interrupts", "budgets", "tracing", "sandbox"} <= {
        doc_id for doc_id, _ in kb.list_documents()
    }


@pytest.mark.parametrize(
    ("query", "doc_id"),
    [
        ("Command graph PARENT handoff", "handoffs"),
        ("resume after interrupt", "interrupts"),
        ("recursion limit runaway", "budgets"),
        ("OpenTelemetry GenAI attributes", "tracing"),
        ("run Python code timeout", "sandbox"),
        ("supervisor routing structured", "supervisors"),
    ],
)
def test_sample_corpus_answers_first_questions(kb: KnowledgeBase, query: str, doc_id: str) -> None:
    ensure_sample_corpus(kb)

    assert kb.search(query)[0].doc_id == doc_id


def test_ensure_sample_corpus_leaves_a_non_empty_kb_alone(kb: KnowledgeBase, notes: Path) -> None:
    kb.add_folder(notes)

    ensure_sample_corpus(kb)

    assert kb.count() == 3


def test_index_report_defaults_are_empty() -> None:
    assert IndexReport().summary() == "0 added, 0 updated, 0 unchanged, 0 removed, 0 skipped"


def test_first_runs_at_once_index_the_samples_once(tmp_path: Path) -> None:
    import threading

    from relaygraph.backends.kb import KnowledgeBase, ensure_sample_corpus

    errors: list[BaseException] = []

    def first_run() -> None:
        try:
            with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
                ensure_sample_corpus(kb)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        assert kb.count() == len(list(sample_corpus_path().glob("*.md")))
