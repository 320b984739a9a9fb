"""A knowledge base document's id: made once, from the file's path, when it is first indexed.

The rule is described in :mod:`relaygraph.backends.kb`: the relative path without its
extension, then with it, then with a tag of the folder, then with a counter, the first one
not taken. A model copies ids from search results into ``read``, so :func:`slug` also turns
what a model wrote back into the id it meant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from relaygraph.backends._kb_files import INDEXED_SUFFIXES

__all__ = ["drop_suffix", "new_doc_id", "slug"]

_NOT_ID_CHAR = re.compile(r"[^\w./-]+")


def new_doc_id(relative: Path, root: Path, *, taken: Callable[[str], bool]) -> str:
    """The id of the file at ``relative`` inside the folder ``root``: the first not ``taken``."""
    base = slug(relative.with_suffix("").as_posix())
    with_suffix = slug(relative.as_posix())
    folder_tag = hashlib.sha256(str(root).encode()).hexdigest()[:6]
    candidates = [base, with_suffix, f"{with_suffix}@{folder_tag}"]
    for candidate in candidates:
        if not taken(candidate):
            return candidate
    # Only reachable when different names normalise alike (``a b.md`` and ``a-b.md`` in
    # two folders that each hold both); a counter keeps the id readable and unique.
    n = 2
    while taken(f"{candidates[-1]}-{n}"):
        n += 1
    return f"{candidates[-1]}-{n}"


def slug(text: str) -> str:
    """``text`` lowercased, each run of characters an id may not hold replaced by ``-``."""
    # A part made only of punctuation still needs a name, or ``a/!!!.md`` would become ``a/``.
    parts = [
        _NOT_ID_CHAR.sub("-", part.lower()).strip("-") or "doc" for part in text.split("/") if part
    ]
    return "/".join(parts) or "doc"


def drop_suffix(doc_id: str) -> str:
    """``doc_id`` without an indexed file's extension (``notes.md`` -> ``notes``)."""
    for suffix in INDEXED_SUFFIXES:
        if doc_id.lower().endswith(suffix):
            return doc_id[: -len(suffix)]
    return doc_id
