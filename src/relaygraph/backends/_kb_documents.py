"""What the knowledge base returns: :class:`IndexReport`, :class:`SearchHit`,
:class:`Document`, and :class:`DocumentNotFoundError` for an id it does not hold.

All are re-exported by :mod:`relaygraph.backends.kb`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relaygraph.errors import ToolInputError

__all__ = ["Document", "DocumentNotFoundError", "IndexReport", "SearchHit"]


@dataclass(frozen=True, kw_only=True, slots=True)
class IndexReport:
    """What :meth:`KnowledgeBase.add_folder` did; each field lists doc ids.

    Attributes:
        added: Documents indexed for the first time.
        updated: Documents whose file content changed and was indexed again.
        unchanged: Documents whose content hash was the same, left as they were.
        removed: Documents of this folder whose file is gone, or is now skipped.
        skipped: Files and folders not indexed, with the reason: symlinks (never followed),
            FIFOs, sockets and devices, files too large or not UTF-8, what cannot be read.
    """

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[tuple[Path, str], ...] = ()

    def summary(self) -> str:
        """One line for people, e.g. ``"7 added, 0 updated, 0 unchanged, 0 removed, 1 skipped"``."""
        return (
            f"{len(self.added)} added, {len(self.updated)} updated, "
            f"{len(self.unchanged)} unchanged, {len(self.removed)} removed, "
            f"{len(self.skipped)} skipped"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchHit:
    """One search result.

    Attributes:
        doc_id: Pass to :meth:`KnowledgeBase.read` for the full text.
        title: The document's title.
        snippet: A few words around the matches in the body, matches wrapped in ``**``.
        score: BM25 relevance, higher is better; comparable only within one search.
    """

    doc_id: str
    title: str
    snippet: str
    score: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """A document's text, possibly cut to the length the reader asked for.

    Attributes:
        doc_id: The document's id.
        title: The first ``# `` heading, else the file name without extension.
        source: The absolute path of the file it was read from.
        text: The text, at most ``max_chars`` characters.
        truncated: Whether ``text`` was cut short.
    """

    doc_id: str
    title: str
    source: Path
    text: str
    truncated: bool


class DocumentNotFoundError(ToolInputError):
    """``read`` was given an id that is not in the knowledge base.

    Attributes:
        doc_id: The id asked for.
        suggestions: Existing ids close to it, best first (possibly empty).
    """

    def __init__(self, doc_id: str, suggestions: list[str], *, empty: bool = False) -> None:
        self.doc_id = doc_id
        self.suggestions = suggestions
        if empty:
            hint = "the knowledge base is empty."
        elif suggestions:
            hint = "did you mean " + ", ".join(repr(s) for s in suggestions) + "?"
        else:
            hint = "search first and copy a doc_id from the results."
        super().__init__(f"no document with id {doc_id!r}; {hint}")
