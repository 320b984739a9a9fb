"""What the embedded model reads in the team's prompts, and the team decisions it narrows:
the supervisor's route (keyword hints) and finalize's answer (quoted, never invented).

The team's prompts are written by ``relaygraph.supervisor._prompts``; this module reads the
markers they use (``Request:``, ``Task:`` or ``Task (from ...):``, ``Results so far:`` with
its ``- name (task: ...): `` entries, or ``- name: `` in an agent's input, the roster's
``- name: description`` lines). The model layer may not import the supervisor, so the
markers are repeated here and ``tests/test_local_team.py`` builds real prompts with the
supervisor's functions to check that they still match.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relaygraph._names import CUT_RESULT_CITES, FINISH, NO_CITED_ANSWER, NO_RESULT
from relaygraph.models.local._grounding import (
    Passage,
    citations,
    cited_passages,
    keywords,
    rank_passages,
)
from relaygraph.models.local._schema import grammar_safe

__all__ = [
    "FinalAnswer",
    "RouteHint",
    "TeamInput",
    "final_answer",
    "in_document_order",
    "narrow_route",
    "no_cited_answer",
    "numbered",
    "picked",
    "quotes_schema",
    "render_quotes",
]

# The older markers (``The user's request:``, ``Your task (from ...):``) are still read: a
# thread checkpointed before they changed resumes with its scoped message as it was.
_REQUEST = re.compile(
    r"^(?:The user's request|Request): (.*?)(?:\n\nResults so far:|\Z)", re.M | re.S
)
_TASK = re.compile(r"^(?:Your task|Task)(?: \(from [^)]*\))?: (.*)$", re.M)
_RESULTS = "Results so far:"
_RESULT_ENTRY = re.compile(r"^- ([\w.@-]+)(?: \(task: .*?\))?: ", re.M)
_RESULTS_END = re.compile(r"\n\n(?:You may not route to: |The team stopped early: )", re.S)
_STOPPED = re.compile(r"\n\nThe team stopped early: (.*)\Z", re.S)
_ROSTER = re.compile(r"^- ([\w.@-]+): (.+)$", re.M)


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamInput:
    """The parts of a team prompt (an agent's scoped input, the supervisor's or finalize's
    input); a message in no team format is its own request and task."""

    request: str
    task: str
    results: tuple[tuple[str, str], ...] = ()
    """(agent, output) of each result shown, in order."""
    stopped: str | None = None
    """Why the team stopped early, when finalize is told so."""
    in_team: bool = False
    """The message carries the team's ``Results so far:`` section."""

    @classmethod
    def parse(cls, text: str) -> TeamInput:
        request_match = _REQUEST.search(text)
        task_match = _TASK.search(text)
        request = request_match.group(1).strip() if request_match else text.strip()
        task = task_match.group(1).strip() if task_match else request
        if _RESULTS not in text:
            return cls(request=request, task=task)
        section = text.split(_RESULTS, 1)[1]
        stopped = _STOPPED.search(section)
        section = _RESULTS_END.split(section, maxsplit=1)[0]
        entries = _RESULT_ENTRY.split(section)
        results = tuple((entries[i], entries[i + 1].strip()) for i in range(1, len(entries) - 1, 2))
        return cls(
            request=request,
            task=task,
            results=results,
            stopped=stopped.group(1).strip() if stopped else None,
            in_team=True,
        )

    @property
    def focus(self) -> str:
        """What keywords and ranking read: the user's own words first, then the task."""
        return self.request if self.task == self.request else f"{self.request} {self.task}"

    def cited(self) -> list[tuple[str, Passage]]:
        """The cited sentences of the results, with the agent that reported each; not the
        sentence a clipped result was cut in, which would be quoted as if whole."""
        return [
            (agent, p)
            for agent, output in self.results
            for p in cited_passages(output.split(CUT_RESULT_CITES, 1)[0])
        ]

    def finders(self) -> dict[str, str]:
        """Each document id the results cite, and the first agent whose result cites it
        (in its kept text or in the note of its cut text): the agent that found it, even
        when a later agent quoted its sentences whole."""
        found: dict[str, str] = {}
        for agent, output in self.results:
            for doc in citations(output):
                found.setdefault(doc, agent)
        return found


def quotes_schema(passages: Sequence[Passage], most: int) -> dict[str, Any]:
    """A choice of 1 to ``most`` of ``passages``, by their numbers in the prompt's list.

    By number, not by text: a model as small as SmolLM2-135M, choosing among the sentences'
    texts, picks mostly on how a sentence begins, not on whether it answers; by number it
    keeps to the ranking's order unless the sentences give it a reason, and decodes a digit
    instead of a sentence.
    """
    return {
        "type": "array",
        "items": {"enum": list(range(1, len(passages) + 1))},
        "minItems": 1,
        "maxItems": min(most, len(passages)),
    }


def numbered(passages: Sequence[Passage]) -> str:
    """The prompt's list of the sentences to choose from."""
    return "\n".join(f"{i}. {grammar_safe(p.text)}" for i, p in enumerate(passages, 1))


ALWAYS_QUOTED = 2
"""The best ranked sentences an answer always quotes; the model's choice adds to them."""


def picked(passages: Sequence[Passage], chosen: Any) -> list[Passage]:
    """The best ranked passages and those a choice names by number, in document order.

    The :data:`ALWAYS_QUOTED` best ranked are always kept: the sentence that answers is
    often the second best match ("It lasts 20 minutes." after the sentence that names the
    stage), the model adds the sentences it finds to answer too, and the answer reads as
    the document does (:func:`in_document_order`).
    """
    numbers = {n for n in chosen if isinstance(n, int)} if isinstance(chosen, list) else set()
    numbers.update(range(1, ALWAYS_QUOTED + 1))
    quoted = [p for i, p in enumerate(passages, 1) if i in numbers]
    # A list's item is offered alone and with its lead-in: quoted once, in the lead-in.
    whole = [
        p for p in quoted if not any(p.text.rstrip(".;") in q.text and p is not q for q in quoted)
    ]
    return in_document_order(whole)


def in_document_order(passages: Sequence[Passage]) -> list[Passage]:
    """``passages`` grouped by source (the source of the best ranked first), each source's
    in the order its document gives them: a sentence that says "it" follows the one it
    refers to."""
    sources = list(dict.fromkeys(p.source for p in passages))
    return sorted(passages, key=lambda p: (sources.index(p.source), p.position))


def render_quotes(passages: Sequence[Passage]) -> str:
    """Quoted sentences as an answer shows them: each run of one source ends with its id."""
    parts: list[str] = []
    for i, passage in enumerate(passages):
        parts.append(passage.text)
        if i + 1 == len(passages) or passages[i + 1].source != passage.source:
            parts[-1] += f" [{passage.source}]"
    return " ".join(parts)


# --- the supervisor's route ----------------------------------------------------------------

Intent = str
"""``docs``, ``compute`` or ``write``."""

_INTENTS: tuple[tuple[Intent, re.Pattern[str]], ...] = (
    (
        "docs",
        re.compile(
            r"\b(docs?|documentation|documents?|knowledge base|according to|manual|guide)\b"
            r"|\bwhat do(?:es)? .{1,60} say\b",
            re.I,
        ),
    ),
    (
        "compute",
        re.compile(
            r"\b(compute|calculate|run_python)\b"
            r"|(?<![\w./-])\d+(?:\.\d+)?\s*[-+*/×^%]\s*\d+(?:\.\d+)?(?![\w./-])"
            r"|\b(?:write|run|execute)\s+(?:\w+\s+)?(?:python|code|script|program)\b",
            re.I,
        ),
    ),
    (
        "write",
        re.compile(
            r"\b(?:write|draft|compose|prepare)\s+(?:a|an|the|up|me|some|short|brief|one|two|"
            r"three|\d+)\b|\b(?:report|summary|summari[sz]e|release note|deliverable|essay|memo)\b",
            re.I,
        ),
    ),
)
_COUNT = re.compile(r"\bhow (?:many|much)\b|\b(?:python|code|script|program)\b", re.I)
"""Words of a computation that may as well be what a docs question is about: they count
only when the request does not name the docs."""
_QUESTION = re.compile(r"\?|^\s*(?:what|which|why|how|when|where|who|does|do|is|are|can)\b", re.I)


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


_SIGNALS: Mapping[Intent, frozenset[str]] = {
    "docs": _word_set(
        "knowledge docs doc documents search search_docs read_doc facts research researcher "
        "cites sources"
    ),
    "compute": _word_set(
        "python code sandbox run_python compute computes calculates coder program"
    ),
    "write": _word_set(
        "deliverable report reports prose draft drafts artifact save_artifact writer summary "
        "summaries"
    ),
}
"""Words of an agent's name and description that make it the agent for an intent."""

_TEMPLATES: Mapping[Intent, tuple[str, str]] = {
    "docs": ("Find what the docs say about {topic}.", "The request asks what the docs say."),
    "compute": (
        "Compute with Python and print the result: {clause}",
        "The request needs a computation.",
    ),
    "write": (
        "Write a short report on {topic} from the results, citing doc ids.",
        "The request asks for a written deliverable.",
    ),
}
FINISH_REASON = "The results so far answer the request."


def intents(request: str) -> list[Intent]:
    """What a request asks for, in the order the work is done: docs, compute, write.

    A plain question whose only sign of a computation is "how many" or a word such as
    "program" is asked of the documents first ("How many tool rounds does a limit of 40
    allow?"); the computation follows only if the documents did not answer it
    (:func:`route_hint`)."""
    found = [name for name, pattern in _INTENTS if pattern.search(request)]
    if "docs" not in found and "compute" not in found and _COUNT.search(request):
        found.insert(0, "compute")
        if _QUESTION.search(request):
            found.insert(0, "docs")
    if not ({"docs", "compute"} & set(found)) and _QUESTION.search(request):
        found.insert(0, "docs")  # A plain question is answered from the knowledge base.
    return found


def agent_for(intent: Intent, roster: Mapping[str, str]) -> list[str]:
    """The agents whose name and description best match an intent (several on a tie)."""
    scores: dict[str, int] = {}
    for name, description in roster.items():
        words = {w.lower() for w in re.findall(r"\w+", f"{name} {description}")}
        scores[name] = len(words & _SIGNALS[intent])
    best = max(scores.values(), default=0)
    return [name for name, score in scores.items() if score == best] if best else []


@dataclass(frozen=True, kw_only=True, slots=True)
class RouteHint:
    """What the keyword hints leave of a route: the agents to choose among, and the tasks."""

    agents: tuple[str, ...]
    tasks: tuple[str, ...]
    reasons: tuple[str, ...]


def route_hint(
    options: Sequence[str], roster: Mapping[str, str], team: TeamInput, finish: str = FINISH
) -> RouteHint | None:
    """The route the request's keywords call for, or None when they name no agent.

    Each intent of the request (docs, then compute, then write) names the agent whose
    description matches it best; the first of those that has not worked yet is next, and
    FINISH comes once all have worked. Without a matching intent the model chooses the
    agent, among ``options``, with a short task made of the request's keywords.
    """
    topic = " ".join(keywords(team.request, limit=4)) or "the request"
    ran = {agent for agent, _ in team.results}
    plan: list[tuple[Intent, list[str]]] = []
    for intent in intents(team.request):
        agents = [a for a in agent_for(intent, roster) if a in options]
        if agents:
            plan.append((intent, agents))
    answered = any(cited_passages(output) for agent, output in team.results)
    for intent, agents in plan:
        pending = [a for a in agents if a not in ran]
        if not pending:
            continue
        if intent == "compute" and answered and not _computes(team.request):
            continue  # A question the documents answered needs no code.
        task, reason = _TEMPLATES[intent]
        if intent == "write" and plan[0][0] == "write":
            task = "{clause}"  # Nothing to report on: the sentence that asks is the task.
        text = task.format(topic=topic, clause=_clause(team.request, intent))
        return RouteHint(agents=tuple(pending), tasks=(text,), reasons=(reason,))
    if plan and finish in options:
        return RouteHint(agents=(finish,), tasks=("",), reasons=(FINISH_REASON,))
    if ran and finish in options:
        return None  # Work was done without a hint: the model says whether it is enough.
    return RouteHint(
        agents=tuple(o for o in options if o != finish) or tuple(options),
        tasks=(f"Work on the request about {topic}.",),
        reasons=("No keyword of the request names an agent.",),
    )


def _computes(request: str) -> bool:
    """Whether a request asks for a computation in so many words, not only by "how many"."""
    return any(p.search(request) for name, p in _INTENTS if name == "compute")


def _clause(request: str, intent: Intent) -> str:
    """The request's sentence that asks for ``intent`` (cut short): the part of the prompt
    an agent needs, not all of it."""
    patterns = [p for name, p in _INTENTS if name == intent]
    if intent == "compute":
        patterns.append(_COUNT)
    sentences = re.split(r"(?<=[.?!])\s+", request.strip())
    for sentence in sentences:
        if any(p.search(sentence) for p in patterns):
            return sentence[:160]
    return sentences[0][:160]


PLAN_FIELD = "then"
"""The route's plan (``supervisor._route.Route.then``): later steps the supervisor already
knows. The embedded model never fills it: a 135M model plans nothing, and each of its
routes is a constrained choice made on what the results show at that step."""


def without_plan(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` without the route's optional plan field, so the grammar never offers it;
    any other schema unchanged."""
    props = schema.get("properties") or {}
    if PLAN_FIELD not in props or "next" not in props or PLAN_FIELD in schema.get("required", ()):
        return dict(schema)
    return {**schema, "properties": {k: v for k, v in props.items() if k != PLAN_FIELD}}


def narrow_route(schema: Mapping[str, Any], system: str, human: str) -> dict[str, Any] | None:
    """The supervisor's route schema narrowed by the keyword hints, or None when ``schema``
    is not a route (an object with a ``next`` choice and a ``task``) or no hint applies.
    The narrowed route never has the plan field (:func:`without_plan`)."""
    schema = without_plan(schema)
    props = schema.get("properties") or {}
    nxt = props.get("next") or {}
    options = nxt.get("enum") or ([nxt["const"]] if "const" in nxt else None)
    if not options or "task" not in props:
        return None
    roster = dict(_ROSTER.findall(system))
    hint = route_hint([str(o) for o in options], roster, TeamInput.parse(human))
    if hint is None:
        return None
    narrowed = {**props, "next": _choice(hint.agents), "task": _choice(hint.tasks)}
    if "reason" in props:
        narrowed["reason"] = _choice(hint.reasons)
    return {**schema, "properties": narrowed}


def _choice(values: Sequence[str]) -> dict[str, Any]:
    safe = list(dict.fromkeys(grammar_safe(v) for v in values))
    return {"const": safe[0]} if len(safe) == 1 else {"enum": safe}


# --- finalize --------------------------------------------------------------------------------

MAX_FINAL_QUOTES = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class FinalAnswer:
    """Finalize's answer: quoted from the agents' cited results, or their results restated.

    With more candidate sentences than an answer holds, ``schema`` is the choice the model
    makes (``{"quotes": [...]}``) and :meth:`render` builds the answer from it; otherwise
    ``schema`` is None and :meth:`render` needs no choice.
    """

    team: TeamInput
    candidates: tuple[tuple[str, Passage], ...]

    @property
    def schema(self) -> dict[str, Any] | None:
        if len(self.candidates) <= MAX_FINAL_QUOTES:
            return None
        passages = [p for _, p in self.candidates]
        return {
            "type": "object",
            "properties": {"quotes": quotes_schema(passages, MAX_FINAL_QUOTES)},
            "required": ["quotes"],
        }

    def render(self, choice: str | None = None) -> str:
        passages = [p for _, p in self.candidates]
        if self.schema is not None:
            passages = picked(passages, _chosen(choice))
        else:
            passages = in_document_order(passages)
        chosen = [next(c for c in self.candidates if c[1] is p) for p in passages]
        team = self.team
        if chosen:
            answer = render_quotes([p for _, p in chosen])
            finders = team.finders()
            found: dict[str, str] = {}
            for agent, passage in chosen:
                found.setdefault(passage.source, finders.get(passage.source, agent))
            where = "; ".join(f"[{doc}] found by the {agent}" for doc, agent in found.items())
            text = f"{answer}\n\nSource: {where}, in the knowledge base."
        elif any(output for _, output in team.results):
            text = no_cited_answer(team.results)
        else:
            text = f"{NO_RESULT} for this request."
        if team.stopped:
            text += f"\n\nThe team stopped early: {team.stopped}"
        return text


def no_cited_answer(results: Sequence[tuple[str, str]]) -> str:
    """The answer when no agent cited a document it read: a non-answer that says so, names
    the agents that worked and what the researcher searched for, and never passes on an
    agent's own text (a small model's code or its error output is no answer to a user)."""
    agents = ", ".join(dict.fromkeys(agent for agent, _ in results))
    searched = [m.group(1) for _, output in results if (m := _SEARCHED.search(output))]
    text = f"{NO_CITED_ANSWER} for this, so there is no answer from the knowledge base."
    text += f"\n\nAgents that worked: {agents}."
    if searched:
        text += f" Searched the knowledge base for: {'; '.join(searched)}."
    return text


_SEARCHED = re.compile(r"\(searched for: ([^)\n]{1,200})\)")
"""The researcher's own note of its searches when it found nothing (``_offer``)."""


def _chosen(choice: str | None) -> Any:
    try:
        value = json.loads(choice or "")
    except json.JSONDecodeError:
        return None
    return value.get("quotes") if isinstance(value, dict) else None


def final_answer(human: str) -> FinalAnswer | None:
    """Finalize's answer for a finalize input (the request and the results), or None for a
    message in another format."""
    team = TeamInput.parse(human)
    if not team.in_team:
        return None
    cited = team.cited()
    ranked = rank_passages([p for _, p in cited], team.request, limit=MAX_FINAL_QUOTES + 1)
    by_text = {p.text: agent for agent, p in reversed(cited)}
    return FinalAnswer(team=team, candidates=tuple((by_text[p.text], p) for p in ranked))
