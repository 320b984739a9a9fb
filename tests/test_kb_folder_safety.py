"""Indexing a folder reads only the regular files inside it: no symlink is followed, and no
FIFO, socket or device is read or waited on (``relaygraph kb add`` and team ``kb`` folders)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from relaygraph.backends import _kb_files
from relaygraph.backends._kb_files import SYMLINK_REASON
from relaygraph.backends.kb import IndexReport, KnowledgeBase
from relaygraph.errors import ConfigError

from .test_kb import write

SECRET = "quetzalsecret7731"
"""A word found only in files outside the indexed folder."""

_JOIN_SECONDS = 30.0
"""How long a test waits for indexing that must not block; it takes milliseconds."""


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    write(folder / "intro.md", "# Intro\n\nCheckpoints are saved after every step.\n")
    write(folder / "guides" / "deep" / "routing.md", "# Routing\n\nThe supervisor routes.\n")
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    write(folder / "secret.md", f"# Private\n\nThe word {SECRET} must never be indexed.\n")
    return folder


def add_without_blocking(kb: KnowledgeBase, folder: Path, *fifos: Path) -> IndexReport:
    """``kb.add_folder(folder)`` in a thread, failing the test if it does not finish.

    A reader blocked on opening a FIFO is released (by opening the FIFO's write end) before
    failing, so a regression fails this test instead of hanging the whole run.
    """
    outcome: list[IndexReport | BaseException] = []

    def index() -> None:
        try:
            outcome.append(kb.add_folder(folder))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=index, daemon=True)
    worker.start()
    worker.join(_JOIN_SECONDS)
    blocked = worker.is_alive()
    if blocked:
        for fifo in fifos:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(_JOIN_SECONDS)
    assert not blocked, f"indexing {folder} blocked for {_JOIN_SECONDS} s"
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def test_a_fifo_named_like_a_note_is_skipped_without_blocking(
    kb: KnowledgeBase, docs: Path
) -> None:
    fifo = docs / "x.md"
    os.mkfifo(fifo)

    report = add_without_blocking(kb, docs, fifo)

    assert sorted(report.added) == ["guides/deep/routing", "intro"]
    assert report.skipped == ((fifo, "a named pipe (FIFO), not a regular file"),)


def test_a_socket_named_like_a_note_is_skipped(kb: KnowledgeBase, docs: Path) -> None:
    sock = docs / "agent.md"
    try:
        os.mknod(sock, stat.S_IFSOCK | 0o600)
    except OSError as exc:  # pragma: no cover - depends on the kernel
        pytest.skip(f"cannot make a socket node here: {exc}")

    report = add_without_blocking(kb, docs)

    assert "agent" not in report.added
    assert report.skipped == ((sock, "a socket, not a regular file"),)


def test_a_symlink_to_a_file_outside_is_not_indexed(
    kb: KnowledgeBase, docs: Path, outside: Path
) -> None:
    link = docs / "link.md"
    link.symlink_to(outside / "secret.md")

    report = kb.add_folder(docs)

    assert kb.search(SECRET) == []
    assert "link" not in report.added
    assert (link, SYMLINK_REASON) in report.skipped


def test_a_symlinked_folder_pointing_outside_is_not_walked(
    kb: KnowledgeBase, docs: Path, outside: Path
) -> None:
    link = docs / "shared"
    link.symlink_to(outside, target_is_directory=True)

    report = kb.add_folder(docs)

    assert kb.search(SECRET) == []
    assert sorted(report.added) == ["guides/deep/routing", "intro"]
    assert report.skipped == ((link, SYMLINK_REASON),)


def test_symlinks_that_stay_inside_the_folder_are_not_followed_either(
    kb: KnowledgeBase, docs: Path
) -> None:
    (docs / "alias.md").symlink_to("intro.md")
    (docs / "guides-again").symlink_to("guides", target_is_directory=True)

    report = kb.add_folder(docs)

    # Each file is indexed once, under its own name; the links are reported, not followed.
    assert sorted(report.added) == ["guides/deep/routing", "intro"]
    assert sorted(path.name for path, _ in report.skipped) == ["alias.md", "guides-again"]


def test_regular_files_in_subfolders_are_still_indexed(kb: KnowledgeBase, docs: Path) -> None:
    write(docs / "guides" / "handoffs.txt", "Handoffs return a Command.\n")

    report = kb.add_folder(docs)

    assert report.added == ("intro", "guides/handoffs", "guides/deep/routing")
    assert report.skipped == ()
    assert kb.search("supervisor routes")[0].doc_id == "guides/deep/routing"
    assert kb.read("guides/deep/routing").source == docs.resolve() / "guides/deep/routing.md"


def test_the_folder_named_may_itself_be_a_symlink(
    kb: KnowledgeBase, docs: Path, tmp_path: Path
) -> None:
    named = tmp_path / "docs-link"
    named.symlink_to(docs, target_is_directory=True)

    report = kb.add_folder(named)

    assert sorted(report.added) == ["guides/deep/routing", "intro"]
    assert kb.read("intro").source == docs.resolve() / "intro.md"


def test_a_note_replaced_by_a_symlink_is_removed_from_the_index(
    kb: KnowledgeBase, docs: Path, outside: Path
) -> None:
    kb.add_folder(docs)
    (docs / "intro.md").unlink()
    (docs / "intro.md").symlink_to(outside / "secret.md")

    report = kb.add_folder(docs)

    assert report.removed == ("intro",)
    assert report.skipped == ((docs / "intro.md", SYMLINK_REASON),)
    assert kb.search(SECRET) == []


def lstat_as_if(kind: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the walk see ``name`` as ``kind`` when it looks, as if it changed just after."""
    real_entry_at = _kb_files.entry_at

    def entry_at(dir_fd: int, entry: str) -> os.stat_result | None:
        if entry == name:
            return os.stat(kind, follow_symlinks=False)
        return real_entry_at(dir_fd, entry)

    monkeypatch.setattr(_kb_files, "entry_at", entry_at)


def test_a_file_swapped_for_a_symlink_after_it_was_looked_at_is_not_followed(
    kb: KnowledgeBase, docs: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = docs / "swapped.md"
    link.symlink_to(outside / "secret.md")
    lstat_as_if(docs / "intro.md", "swapped.md", monkeypatch)

    report = kb.add_folder(docs)

    assert kb.search(SECRET) == []
    assert report.skipped == ((link, SYMLINK_REASON),)


def test_a_file_swapped_for_a_fifo_after_it_was_looked_at_is_refused_by_fstat(
    kb: KnowledgeBase, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = docs / "swapped.md"
    os.mkfifo(fifo)
    lstat_as_if(docs / "intro.md", "swapped.md", monkeypatch)

    report = add_without_blocking(kb, docs, fifo)

    assert report.skipped == ((fifo, "a named pipe (FIFO), not a regular file"),)


def test_a_folder_swapped_for_a_symlink_after_it_was_looked_at_is_not_walked(
    kb: KnowledgeBase, docs: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = docs / "shared"
    link.symlink_to(outside, target_is_directory=True)
    lstat_as_if(docs / "guides", "shared", monkeypatch)

    report = kb.add_folder(docs)

    assert kb.search(SECRET) == []
    assert report.skipped == ((link, SYMLINK_REASON),)


def test_an_unreadable_file_is_skipped_with_the_reason(
    kb: KnowledgeBase, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = write(docs / "locked.md", "secret")
    real_open: Callable[..., int] = os.open

    def refusing_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if path == "locked.md":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)

    report = kb.add_folder(docs)

    assert report.skipped == ((locked, "cannot be read: Permission denied"),)
    assert "locked" not in report.added


def test_a_folder_that_cannot_be_opened_is_a_config_error_not_an_empty_folder(
    kb: KnowledgeBase, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb.add_folder(docs)
    real_open: Callable[..., int] = os.open

    def refusing_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if Path(path) == docs.resolve():
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)

    with pytest.raises(ConfigError, match=r"'.*docs' cannot be opened: Permission denied"):
        kb.add_folder(docs)
    # Its documents stay: a folder that cannot be read is not a folder that became empty.
    assert kb.count() == 2


def test_folders_deeper_than_the_limit_are_reported_not_walked(
    kb: KnowledgeBase, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_kb_files, "MAX_SCAN_DEPTH", 1)

    report = kb.add_folder(docs)

    assert report.added == ("intro",)
    deep = docs / "guides" / "deep"
    assert report.skipped == (
        (deep, "more than 1 folders below the indexed folder, not looked into"),
    )


def test_kb_add_reports_fifos_and_symlinks_and_finishes(
    home: Path, docs: Path, outside: Path
) -> None:
    """The review's reproduction, through the command a user runs."""
    os.mkfifo(docs / "x.md")
    (docs / "link.md").symlink_to(outside / "secret.md")
    env = {**os.environ, "RELAYGRAPH_HOME": str(home), "COLUMNS": "200"}

    def relaygraph(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "relaygraph.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    added = relaygraph("kb", "add", str(docs))
    found = relaygraph("kb", "search", SECRET)

    assert added.returncode == 0, added.stderr
    assert "2 added, 0 updated, 0 unchanged, 0 removed, 2 skipped" in added.stdout
    assert f"skipped {docs / 'link.md'}: {SYMLINK_REASON}" in added.stderr
    assert "x.md: a named pipe (FIFO), not a regular file" in added.stderr
    assert found.returncode == 0
    assert found.stdout == ""


def test_a_teams_folder_tells_what_it_skips_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A team's ``kb`` folders are brought up to date at every run: a file its knowledge
    base skips (here a symlink) is logged for whoever runs the team, once per process."""
    import logging
    from dataclasses import replace

    from relaygraph.runner._teams import prepare_knowledge_base
    from relaygraph.team import default_team

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "note.md").write_text("# Note\n\nkept", encoding="utf-8")
    (docs / "link.md").symlink_to(tmp_path / "elsewhere.md")
    team = default_team()
    researcher = replace(team.agent("researcher"), kb=(docs,))
    team = replace(
        team, agents=tuple(researcher if a.name == "researcher" else a for a in team.agents)
    )
    with caplog.at_level(logging.WARNING, logger="relaygraph.runner"):
        prepare_knowledge_base(team, tmp_path / "home")
        prepare_knowledge_base(team, tmp_path / "home")
    told = [r.getMessage() for r in caplog.records if "knowledge base: skipped" in r.getMessage()]
    assert len(told) == 1, told
    assert "link.md" in told[0] and "symlink" in told[0]
