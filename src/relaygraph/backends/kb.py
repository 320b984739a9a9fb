"""The researcher's knowledge base: local Markdown and text files in a SQLite FTS5 index.

A :class:`KnowledgeBase` is one SQLite file holding a ``documents`` table (the text and where
it came from) and a ``documents_fts`` full-text index over each document's title and body.
Search ranks with BM25, weighting the title ten times the body, and the Porter stemmer lets
"checkpoints" match "checkpoint".

Document ids are meant to be copied by a model from search results into ``read``, so they are
short, readable and contain no spaces. The rule, applied once when a file is first indexed:

1. Take the file's path relative to the indexed folder, with ``/`` separators and without
   its extension, lowercased; replace each run of characters other than letters, digits,
   ``_``, ``.``, ``/`` and ``-`` by ``-``. ``Guides/Check Points.md`` becomes
   ``guides/check-points``.
2. If another document already has that id, keep the extension: ``notes.txt`` next to
   ``notes.md``.
3. If that is taken too (the same file name in another indexed folder), append ``@`` and the
   first six hex digits of the SHA-256 of the folder's absolute path: ``notes.txt@3fa2c1``.
4. In the rare case that this is taken as well (names that normalise alike, such as
   ``a b.md`` and ``a-b.md``), append ``-2``, ``-3``, ...

Files are visited in sorted order, a folder's own files before its subfolders, so the same
folder indexed into a new knowledge base gets the same ids.

An id never changes while its file stays in place, even when the file's content does.

Only regular files that lie inside a folder are indexed: no symlink below it is followed,
wherever it leads, and no FIFO, socket or device is read or waited on; each is skipped with a
reason in the :class:`IndexReport` (docs/knowledge-base.md).

This module holds the index and its search; ``_kb_files`` finds and reads the files of a
folder, ``_kb_ids`` applies the id rule, and ``_kb_documents`` defines what the knowledge base
returns.
"""

from __future__ import annotations

import difflib
import re
import sqlite3
import threading
import time
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from types import TracebackType

from relaygraph.backends._kb_documents import (
    Document,
    DocumentNotFoundError,
    IndexReport,
    SearchHit,
)
from relaygraph.backends._kb_files import (
    MAX_FILE_BYTES,
    LoadedFile,
    read_folder,
    title_of,
)
from relaygraph.backends._kb_ids import drop_suffix, new_doc_id, slug
from relaygraph.errors import ConfigError, ToolInputError

__all__ = [
    "MAX_FILE_BYTES",
    "Document",
    "DocumentNotFoundError",
    "IndexReport",
    "KnowledgeBase",
    "SearchHit",
    "ensure_sample_corpus",
    "sample_corpus_path",
]

_SCHEMA_VERSION = 1
_OPEN_SECONDS = 30.0
"""How long opening a knowledge base waits for another first run that holds the file."""
_TITLE_WEIGHT = 10.0
_BODY_WEIGHT = 1.0
_MAX_K = 20
_MAX_QUERY_TERMS = 32
_SNIPPET_TOKENS = 12

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    source TEXT NOT NULL UNIQUE,
    folder TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    text TEXT NOT NULL,
    indexed_at TEXT NOT NULL,
    fts_rowid INTEGER NOT NULL UNIQUE
);
CREATE INDEX IF NOT EXISTS documents_folder ON documents (folder);
CREATE VIRTUAL TABLE IF NOT EXISTS documents_fts USING fts5(
    title, body, tokenize = 'porter unicode61 remove_diacritics 2'
);
"""
# The FTS rows are linked through an explicit ``fts_rowid`` rather than the documents table's
# implicit rowid: a table whose primary key is TEXT may get new rowids from VACUUM, while the
# rowids of an FTS5 table are stored values and never move.

_TERM = re.compile(r"\w+")


class KnowledgeBase:
    """A full-text index of local documents in one SQLite file.

    The connection is shared by the threads of one process (LangGraph runs sync tools in a
    thread pool), so every use of it holds a lock. Several processes may open the same file:
    it is in WAL mode and writers wait for each other for up to five seconds.

    Args:
        path: The database file; created, with its parent directories, if missing.

    Raises:
        ConfigError: The file is not a knowledge base, or this Python's SQLite lacks FTS5.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        # The probe uses its own in-memory database so that a missing FTS5 is reported as
        # such even when ``path`` is not a database at all.
        probe = sqlite3.connect(":memory:")
        try:
            _require_fts5(probe)
        finally:
            probe.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A generous wait for the lock: first runs side by side (server workers, eval cases)
        # each open the file while one of them switches it to WAL and indexes the samples.
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=_OPEN_SECONDS)
        try:
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    def _init_schema(self) -> None:
        try:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise ConfigError(
                    f"knowledge base {str(self.path)!r} has schema version {version}, but this "
                    f"relaygraph reads version {_SCHEMA_VERSION}; index the folders into a new "
                    "file."
                )
            self._conn.execute("PRAGMA busy_timeout = 30000")
            self._switch_to_wal()
            # BEGIN IMMEDIATE takes the write lock before the schema is read: a connection
            # that read first and then asked to write while another first run held the
            # write lock was refused at once ("database is locked", SQLite's deadlock rule
            # does not wait), which two first runs side by side hit now and then.
            self._conn.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {_SCHEMA_VERSION}; COMMIT;"
            )
        except sqlite3.DatabaseError as exc:
            if self._conn.in_transaction:
                self._conn.rollback()
            raise ConfigError(
                f"cannot use {str(self.path)!r} as a knowledge base ({exc}); "
                "give the path of a new file or of an existing knowledge base."
            ) from exc

    def _switch_to_wal(self) -> None:
        """Put the file in WAL mode (once per file; it stays). The switch needs the file to
        itself; should another first run hold it past the busy wait's rules (SQLite refuses
        some waits at once), try again for up to :data:`_OPEN_SECONDS`."""
        deadline = time.monotonic() + _OPEN_SECONDS
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def add_folder(self, folder: Path) -> IndexReport:
        """Index the ``.md``, ``.markdown`` and ``.txt`` files under ``folder``, recursively.

        Only regular files that lie inside ``folder`` are read. Hidden files and directories
        (names starting with ``.``) are not looked at. Symlinks below ``folder``, to files or
        folders, inside it or out, are never followed, and FIFOs, sockets and devices are
        never read (nor waited on); each is skipped with a reason, as are files over
        :data:`MAX_FILE_BYTES` and files that are not UTF-8. ``folder`` itself may be a
        symlink: it is resolved once, as the person named it. Adding a folder again
        re-indexes changed files, keeps unchanged ones, and removes documents whose file is
        gone or now skipped.

        Args:
            folder: A directory given by a person.

        Raises:
            ConfigError: ``folder`` does not exist, is not a directory or cannot be opened.
        """
        root = Path(folder).expanduser()
        if not root.is_dir():
            problem = "is not a directory" if root.exists() else "does not exist"
            raise ConfigError(
                f"knowledge base folder {str(folder)!r} {problem}; "
                "give a directory that holds .md, .markdown or .txt files."
            )
        root = root.resolve()
        try:
            files = read_folder(root)
        except OSError as exc:
            raise ConfigError(
                f"knowledge base folder {str(folder)!r} cannot be opened: "
                f"{exc.strerror or exc}; give a directory you can read."
            ) from exc
        # Files are read before the transaction starts so the write lock is held only briefly.
        with self._lock, self._conn:
            return self._apply(root, files.found, files.skipped)

    def _apply(
        self,
        root: Path,
        found: tuple[LoadedFile, ...],
        skipped: tuple[tuple[Path, str], ...],
    ) -> IndexReport:
        conn = self._conn
        known = {
            source: (doc_id, content_hash, fts_rowid)
            for doc_id, source, content_hash, fts_rowid in conn.execute(
                "SELECT doc_id, source, content_hash, fts_rowid FROM documents WHERE folder = ?",
                (str(root),),
            )
        }
        now = datetime.now(UTC).isoformat(timespec="seconds")
        added: list[str] = []
        updated: list[str] = []
        unchanged: list[str] = []
        seen: set[str] = set()
        for file in found:
            source = str(file.path)
            seen.add(source)
            title = title_of(file.text, file.path)
            if source in known:
                doc_id, old_hash, fts_rowid = known[source]
                if old_hash == file.content_hash:
                    unchanged.append(doc_id)
                    continue
                conn.execute(
                    "UPDATE documents SET title = ?, content_hash = ?, text = ?, indexed_at = ? "
                    "WHERE doc_id = ?",
                    (title, file.content_hash, file.text, now, doc_id),
                )
                conn.execute(
                    "UPDATE documents_fts SET title = ?, body = ? WHERE rowid = ?",
                    (title, file.text, fts_rowid),
                )
                updated.append(doc_id)
                continue
            doc_id = self._new_doc_id(file, root)
            cursor = conn.execute(
                "INSERT INTO documents_fts (title, body) VALUES (?, ?)", (title, file.text)
            )
            conn.execute(
                "INSERT INTO documents (doc_id, title, source, folder, content_hash, text, "
                "indexed_at, fts_rowid) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    doc_id,
                    title,
                    source,
                    str(root),
                    file.content_hash,
                    file.text,
                    now,
                    cursor.lastrowid,
                ),
            )
            added.append(doc_id)
        removed: list[str] = []
        for source, (doc_id, _, fts_rowid) in known.items():
            if source not in seen:
                conn.execute("DELETE FROM documents WHERE doc_id = ?", (doc_id,))
                conn.execute("DELETE FROM documents_fts WHERE rowid = ?", (fts_rowid,))
                removed.append(doc_id)
        return IndexReport(
            added=tuple(added),
            updated=tuple(updated),
            unchanged=tuple(unchanged),
            removed=tuple(removed),
            skipped=skipped,
        )

    def _new_doc_id(self, file: LoadedFile, root: Path) -> str:
        return new_doc_id(file.relative, root, taken=self._id_taken)

    def _id_taken(self, doc_id: str) -> bool:
        row = self._conn.execute("SELECT 1 FROM documents WHERE doc_id = ?", (doc_id,))
        return row.fetchone() is not None

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """Find the documents that best match free text, best first.

        The query's words are searched for separately and any of them may match, so a
        question phrased loosely still finds documents that share some of its words. FTS5
        operators and punctuation in the query are treated as plain text, never as syntax.

        Args:
            query: Free text, e.g. ``"how are checkpoints saved?"``.
            k: How many hits to return; clamped to 1..20.

        Raises:
            ToolInputError: The query is empty or only whitespace.
        """
        if not query.strip():
            raise ToolInputError(
                "the search query is empty; pass a few words that describe what you need, "
                "e.g. 'checkpoint durability modes'."
            )
        match = _match_expression(query)
        if match is None:
            # Only punctuation: nothing can match, and there is nothing to correct either.
            return []
        limit = max(1, min(_MAX_K, int(k)))
        with self._lock:
            rows = self._conn.execute(
                "SELECT d.doc_id, d.title, "
                "snippet(documents_fts, 1, '**', '**', '…', ?), "
                "bm25(documents_fts, ?, ?) AS rank "
                "FROM documents_fts JOIN documents AS d ON d.fts_rowid = documents_fts.rowid "
                "WHERE documents_fts MATCH ? ORDER BY rank LIMIT ?",
                (_SNIPPET_TOKENS, _TITLE_WEIGHT, _BODY_WEIGHT, match, limit),
            ).fetchall()
        # bm25() is lower-is-better; negating it gives callers the usual higher-is-better score.
        return [
            SearchHit(doc_id=doc_id, title=title, snippet=" ".join(snippet.split()), score=-rank)
            for doc_id, title, snippet, rank in rows
        ]

    def read(self, doc_id: str, max_chars: int = 12000) -> Document:
        """Return a document's text, cut to ``max_chars`` characters.

        Ids are matched leniently, because a model copies them: surrounding quotes and
        spaces are ignored, and an id written with different case or with the file's
        extension still finds its document.

        Args:
            doc_id: An id from :meth:`search` or :meth:`list_documents`.
            max_chars: The most characters of text to return; at least 1.

        Raises:
            DocumentNotFoundError: No document has this id; the message suggests close ids.
            ToolInputError: ``max_chars`` is less than 1.
        """
        if max_chars < 1:
            raise ToolInputError(
                f"max_chars must be at least 1, got {max_chars}; omit it to read up to 12000 "
                "characters."
            )
        wanted = doc_id.strip().strip("`'\"").strip()
        if not wanted:
            raise ToolInputError(
                "the doc_id is empty; pass an id exactly as search results show it."
            )
        with self._lock:
            row = None
            for candidate in dict.fromkeys((wanted, slug(wanted), slug(drop_suffix(wanted)))):
                row = self._conn.execute(
                    "SELECT doc_id, title, source, text FROM documents WHERE doc_id = ?",
                    (candidate,),
                ).fetchone()
                if row is not None:
                    break
            if row is None:
                ids = [r[0] for r in self._conn.execute("SELECT doc_id FROM documents")]
                raise DocumentNotFoundError(
                    doc_id,
                    difflib.get_close_matches(slug(drop_suffix(wanted)), ids, n=3, cutoff=0.5),
                    empty=not ids,
                )
        found_id, title, source, text = row
        return Document(
            doc_id=found_id,
            title=title,
            source=Path(source),
            text=text[:max_chars],
            truncated=len(text) > max_chars,
        )

    def list_documents(self) -> list[tuple[str, str]]:
        """All documents as ``(doc_id, title)`` pairs, sorted by id."""
        with self._lock:
            return list(self._conn.execute("SELECT doc_id, title FROM documents ORDER BY doc_id"))

    def count(self) -> int:
        """How many documents are indexed."""
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM documents").fetchone()[0])


def sample_corpus_path() -> Path:
    """The folder of sample documents shipped inside the ``relaygraph.backends`` package.

    Raises:
        ConfigError: The package is not installed as plain files (e.g. imported from a zip).
    """
    corpus = files("relaygraph.backends") / "corpus"
    if not isinstance(corpus, Path) or not corpus.is_dir():
        raise ConfigError(
            f"the sample corpus is not a folder on disk ({corpus}); install relaygraph as "
            "plain files (not zipped) or index your own folder instead."
        )
    return corpus


def ensure_sample_corpus(kb: KnowledgeBase) -> None:
    """Index the shipped sample corpus into ``kb`` if ``kb`` holds no documents yet.

    A knowledge base that already has documents is left alone, so a user's own folders are
    never mixed with the samples behind their back.
    """
    # Two first runs at once (API workers, eval cases, two processes) must not both index
    # the samples: one lock within the process; across processes the loser of the race
    # sees the winner's rows through the unique constraint and stands back.
    with _SAMPLE_LOCK:
        if kb.count() != 0:
            return
        try:
            kb.add_folder(sample_corpus_path())
        except sqlite3.IntegrityError:
            if kb.count() == 0:
                raise


_SAMPLE_LOCK = threading.Lock()


def _require_fts5(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(x)")
        conn.execute("DROP TABLE temp.fts5_probe")
    except sqlite3.OperationalError as exc:
        raise ConfigError(
            f"the SQLite library of this Python (version {sqlite3.sqlite_version}) has no "
            f"FTS5 full-text search ({exc}); use a Python whose sqlite3 includes FTS5, "
            "such as the python.org or uv-managed builds."
        ) from exc


def _match_expression(query: str) -> str | None:
    """An FTS5 MATCH expression that ORs the query's words, each quoted as a plain string.

    Quoting makes every word a string token, so ``AND``, ``NEAR``, ``*``, parentheses and
    stray quotes in a model's query are searched as text (or dropped, for punctuation)
    instead of being parsed as FTS5 syntax.
    """
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(query)))[:_MAX_QUERY_TERMS]
    if not terms:
        return None
    return " OR ".join(f'"{term}"' for term in terms)
