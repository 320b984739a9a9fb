"""Grounding for the embedded model: the words a request is about, the sentences of what the
tools returned, and whether an answer cites what the team read.

Nothing here runs a model. The local provider uses it to offer the model only what the
conversation holds: keywords of the request as search queries, and sentences of the read
documents, ranked by their overlap with the task, as the body of an answer. The same
citation rules give :func:`ungrounded_reason`, the check that a run asked about the docs was
answered from them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from relaygraph._names import CITATION_PATTERN

__all__ = [
    "Passage",
    "answer_kinds",
    "asks_about_docs",
    "citations",
    "cited_passages",
    "keywords",
    "rank_passages",
    "source_passages",
    "ungrounded_reason",
]

_WORD = re.compile(r"\w[\w-]*\w|\w")
_CITATION = re.compile(CITATION_PATTERN)
_NOT_IDS = frozenset({"truncated", "x", "..."})
"""Bracketed words that are not document ids: read_doc's cut marker, a checkbox."""


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _word_set(
    """
    a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each either
    else etc ever every few for from further get gets give given go had has have having he her
    here hers him his how however i if in into is it its itself just let like may me might more
    most much must my no nor not now of off on once one only or other our ours out over own
    please per same shall she should so some such than that the their theirs them then there
    these they this those through to too under until up upon us use used uses using very via
    was we were what when where whether which while who whom whose why will with within would
    yes yet you your yours
    according answer briefly brief describe detail details doc docs documentation document
    documents explain find full knowledge base kb mention mentions paragraph report
    say says said short summarise summarize summary tell write page pages question questions
    manual guide show shows
    """
)
"""Words that say what kind of request it is, not what it is about: never search terms."""

_DOCS_REQUEST = re.compile(
    r"\b(docs?|documentation|documents|knowledge base|according to|the manual|the guide)\b",
    re.IGNORECASE,
)
"""Not "document": "summarize this document" brings its document along."""


def asks_about_docs(request: str) -> bool:
    """Whether a request names the docs (the knowledge base) as where the answer is."""
    return bool(_DOCS_REQUEST.search(request))


def keywords(text: str, *, limit: int = 6) -> list[str]:
    """The content words of ``text``, in order of first appearance, lower-cased.

    Function words and words that only say what kind of request it is ("docs", "explain",
    "report") are left out: they are what a tiny model pastes into a search and what makes
    every document match.
    """
    found: dict[str, None] = {}
    for word in _WORD.findall(text):
        lowered = word.lower().strip("_-")
        if len(lowered) < 2 or lowered in STOPWORDS:
            continue
        found.setdefault(lowered, None)
        if len(found) >= limit:
            break
    return list(found)


def _stem(word: str) -> str:
    word = word.lower()
    for suffix, repl in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)] + repl
    return word


def _same_word(a: str, b: str) -> bool:
    if a == b:
        return True
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common >= max(5, min(len(a), len(b)) - 2)


@dataclass(frozen=True, kw_only=True, slots=True)
class Passage:
    """A sentence that an answer may quote, and where it comes from."""

    text: str
    source: str
    """The document id the sentence is cited with."""
    heading: str = ""
    """The section heading the sentence stands under, when the source has sections."""
    position: int = 0
    """Where the sentence stands in its source: ties in rank go to the earlier sentence."""

    def cited(self) -> str:
        """The sentence with its citation, as an answer shows it."""
        return f"{self.text} [{self.source}]"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"*(\[_0-9])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.")
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
MIN_SENTENCE_CHARS = 25
MIN_LEAD_CHARS = 8
MAX_SENTENCE_CHARS = 320
MAX_LIST_CHARS = 480


def _sentences(paragraph: str, longest: int = MAX_SENTENCE_CHARS) -> list[str]:
    text = " ".join(paragraph.replace("**", "").split())
    for i, abbreviation in enumerate(_ABBREVIATIONS):
        text = text.replace(abbreviation + " ", f"\0{i}\0 ")
    out = []
    for sentence in _SENTENCE_END.split(text):
        for i, abbreviation in enumerate(_ABBREVIATIONS):
            sentence = sentence.replace(f"\0{i}\0", abbreviation)
        sentence = sentence.strip()
        # A short lead-in ("To start one, run:") is kept: the list or code it introduces
        # follows it into the passage.
        shortest = MIN_LEAD_CHARS if sentence.endswith(":") else MIN_SENTENCE_CHARS
        if shortest <= len(sentence) <= longest:
            out.append(sentence)
    return out


def source_passages(text: str, source: str) -> list[Passage]:
    """The sentences of one document (Markdown or plain text), with their section headings.

    Code blocks and headings are not sentences; each list item is a paragraph of its own. A
    sentence that introduces a list or a code block (it ends with a colon) is also offered
    with the list's items' first sentences, or the block's lines, after it, when that stays
    short: alone it says nothing.
    """
    passages: list[Passage] = []
    heading = ""
    paragraph: list[str] = []
    in_code = False
    lead: list[str] = []
    """A lead-in sentence, then the first sentences of the items after it."""

    def add(sentence: str) -> None:
        passages.append(
            Passage(text=sentence, source=source, heading=heading, position=len(passages))
        )

    def close_list() -> None:
        if len(lead) > 1:
            joined = f"{lead[0]} {'; '.join(s.rstrip('.;') for s in lead[1:])}."
            if len(joined) <= MAX_LIST_CHARS:
                alone = next(i for i, p in enumerate(passages) if p.text == lead[0])
                passages[alone] = replace(passages[alone], text=joined)
        lead.clear()

    def flush(item: bool = False) -> None:
        sentences = _sentences(" ".join(paragraph))
        paragraph.clear()
        if not sentences:
            return
        if item and lead:
            lead.append(sentences[0])
        else:
            close_list()
        for sentence in sentences:
            add(sentence)
        if not item and sentences[-1].endswith(":"):
            lead.append(sentences[-1])

    code: list[str] = []
    """The lines of the code block being read, when a lead-in sentence introduced it."""
    introduced: str | None = None

    def close_code() -> None:
        # A sentence that introduces a code block ("start one with:") says nothing alone:
        # the command or setting the reader needs is in the block, so the block's lines
        # become part of the sentence when they stay short.
        nonlocal introduced
        lines = [" ".join(c.split()) for c in code if c.strip()]
        if introduced is not None and lines:
            joined = f"{introduced} `{'; '.join(lines)}`"
            if len(joined) <= MAX_LIST_CHARS:
                alone = next(i for i, p in enumerate(passages) if p.text == introduced)
                passages[alone] = replace(passages[alone], text=joined)
        introduced = None
        code.clear()

    item = False
    # A comment is not text the document shows its readers (and where an injected
    # instruction hides): never a sentence to quote.
    for line in _COMMENT.sub("", text).splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            if in_code:
                close_code()
            else:
                flush(item)
                introduced = lead[0] if len(lead) == 1 else None
                close_list()
            in_code = not in_code
            continue
        if in_code:
            code.append(stripped)
            continue
        if stripped == "[truncated]":
            continue
        if stripped.startswith("#"):
            flush(item)
            close_list()
            heading = stripped.lstrip("#").strip()
            continue
        if not stripped:
            flush(item)
            item = False
            continue
        if _BULLET.match(line):
            flush(item)
            item = True
            stripped = _BULLET.sub("", line).strip()
        paragraph.append(stripped)
    flush(item)
    close_list()
    return passages


def citations(text: str) -> list[str]:
    """The document ids cited in ``text`` as ``[doc_id]``, in order, each once."""
    return list(dict.fromkeys(m for m in _CITATION.findall(text) if m.lower() not in _NOT_IDS))


def cited_passages(text: str) -> list[Passage]:
    """The sentences of ``text`` that carry a citation: each sentence before a ``[doc_id]``
    (up to the previous citation or line start) is attributed to that id."""
    passages: list[Passage] = []
    for line in text.splitlines():
        start = 0
        for match in _CITATION.finditer(line):
            source = match.group(1)
            segment, start = line[start : match.start()], match.end()
            if source.lower() in _NOT_IDS:
                continue
            # A quoted list (a lead-in and its items) is as long as a source gives it.
            for sentence in _sentences(segment, longest=MAX_LIST_CHARS):
                passages.append(Passage(text=sentence, source=source, position=len(passages)))
    return passages


def _matches(words: Sequence[str], text: str) -> set[str]:
    stems = {_stem(w) for w in _WORD.findall(text)}
    return {w for w in words if any(_same_word(_stem(w), s) for s in stems)}


_NUMBER_WORDS = (
    r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty"
    r"|thirty|forty|fifty|hundred|thousand|twice|once|half|dozen)\b"
)
_ANSWER_KINDS: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = (
    (
        re.compile(r"\bhow (?:long|often|soon|fast|quickly)\b|\bwhen\b|\bwhat time\b", re.I),
        re.compile(
            r"\b\d+(?:[.:]\d+)?\s*(?:ms|s|seconds?|minutes?|hours?|days?|weeks?|months?|years?"
            r")\b|\b\d{1,2}:\d{2}\b|\b(?:monday|tuesday|wednesday|thursday|friday"
            r"|saturday|sunday|daily|weekly|monthly|every|within|after|before|until)\b",
            re.I,
        ),
    ),
    (re.compile(r"\bwhy\b", re.I), re.compile(r"\b(?:because|so that|since|so)\b", re.I)),
    (
        re.compile(r"\bhow (?:many|much|big|large)\b|\bwhat (?:share|percentage|limit)\b", re.I),
        re.compile(_NUMBER_WORDS, re.I),
    ),
    (
        re.compile(
            r"\b(?:which|what)\s+(?:\w+\s+)?(?:command|variable|attribute|method|function|class"
            r"|exception|error|checkpointer|mode|flag|option|setting|field|argument|parameter"
            r"|key|tool|file|bucket|port|package|module|header|status|interpreter)s?\b"
            r"|\bhow (?:do|can|should) (?:i|you|we)\b",
            re.I,
        ),
        re.compile(r"`[^`]+`|\b[a-z]+[A-Z]\w+|\b[A-Z]\w*[a-z][A-Z]\w*|\b\w+_\w+\b"),
    ),
)
"""What kind of text answers a question, by its question words: a duration or a time, a
number, or a name of code (a command, a variable, a class). A sentence that holds such a text
is the likelier answer among those that share the question's words: the fact a user asks for
("It lasts 20 minutes") often shares fewer words with the question than the sentence that
introduces the topic does."""


_PRONOUN = re.compile(r"(?:It|Its|This|These|They|Their|That|Those)\b")
_HOW_WORD = re.compile(r"\bhow (long|often|soon|fast|quickly|many|much|big|large)\b", re.I)


def answer_kinds(question: str) -> list[re.Pattern[str]]:
    """The patterns of the text that would answer ``question`` (none for other questions)."""
    return [answer for asks, answer in _ANSWER_KINDS if asks.search(question)]


def rank_passages(passages: Iterable[Passage], task: str, *, limit: int = 4) -> list[Passage]:
    """The passages that best match ``task``, best first, each text once.

    A passage scores each keyword of the task it contains, weighted by how rare the word is
    among the passages (a word every sentence has tells nothing), half that for a keyword
    in its section heading, and as much again for holding the kind of text the question
    asks for (:func:`answer_kinds`); ties go to the earlier sentence. When no passage shares
    a word with the task, the first ones are returned: an answer from what was read beats
    an answer from nothing, and the check of the answer still sees what it cites.
    """
    # "long" in "how long" asks for a duration; a sentence that says "long" does not give one.
    asked = {m.lower() for m in _HOW_WORD.findall(task)}
    words = [w for w in keywords(task, limit=12) if w not in asked]
    unique = list({p.text: p for p in passages}.values())
    found = [(_matches(words, p.text), _matches(words, p.heading)) for p in unique]
    total = len(unique)
    weight = {w: math.log(1 + total / (1 + sum(w in body for body, _ in found))) for w in words}
    kinds = answer_kinds(task)
    holds = [[bool(k.search(p.text)) for k in kinds] for p in unique]
    kind_weight = [math.log(1 + total / (1 + sum(h[j] for h in holds))) for j in range(len(kinds))]

    def score(body: set[str], head: set[str], held: list[bool]) -> float:
        # The kind of answer counts only in a sentence that shares a word with the question:
        # a number alone says nothing about what was asked.
        kind = sum(w for w, h in zip(kind_weight, held, strict=True) if h) if body else 0.0
        return sum(weight[w] for w in body) + 0.5 * sum(weight[w] for w in head) + kind

    # A sentence that begins with a pronoun ("It lasts 20 minutes") is about what the
    # sentence before it names: it shares that sentence's words, at half their weight.
    before = {(p.source, p.position + 1): body for p, (body, _) in zip(unique, found, strict=True)}
    scored = [
        (
            -(
                score(body, head, held)
                + (
                    0.5 * sum(weight[w] for w in before.get((p.source, p.position), set()) - body)
                    if _PRONOUN.match(p.text)
                    else 0.0
                )
            ),
            i,
            p,
        )
        for i, (p, (body, head), held) in enumerate(zip(unique, found, holds, strict=True))
    ]
    scored.sort(key=lambda item: (item[0], item[1]))
    return [passage for _, _, passage in scored[:limit]]


def ungrounded_reason(request: str, answer: str | None, messages: Iterable[Any]) -> str | None:
    """Why an answer is not grounded in the documents the team read, or None when it is.

    A request that names the docs (:func:`asks_about_docs`) must be answered citing, as
    ``[doc_id]``, a document that a tool result of this run showed (a search hit or a
    document read). Any other answer that cites a document is held to the same rule: a
    plain question ("How long does the canary stage last?") answered "[canary]" from no
    document the run read claims a source it never had. An answer to a plain question that
    cites nothing is not checked: it claims no source. Any model, any team: the check reads
    the answer and the transcripts.

    Args:
        request: The user's request.
        answer: The run's final answer.
        messages: The transcripts of the run's agent visits (LangChain messages); tool
            results are the messages of type ``tool``.

    Returns:
        A stop reason starting ``ungrounded:``, or None.
    """
    cited = citations(answer or "")
    if not asks_about_docs(request):
        # A bare number in brackets in the answer to a plain request is a computed list or a
        # footnote ("[42]"), not a claim to have read a document.
        cited = [c for c in cited if not c.isdigit()]
        if not cited:
            return None
    if not cited:
        return "ungrounded: the request asks about the docs, but the answer cites no document"
    seen: set[str] = set()
    for message in messages:
        if getattr(message, "type", None) != "tool" or getattr(message, "status", "") == "error":
            continue
        content = message.content if isinstance(message.content, str) else str(message.content)
        seen.update(citations(content))
    shown = {c.lower() for c in seen}
    if not any(c.lower() in shown for c in cited):
        named = ", ".join(f"[{c}]" for c in cited)
        return f"ungrounded: the answer cites {named}, which no tool result of this run showed"
    return None
