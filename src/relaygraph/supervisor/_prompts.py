"""What the supervisor, each agent and finalize are shown: scoped, bounded text.

Agents get the task and the latest results, never the transcript with every tool message:
langgraph-supervisor passes the full history to every worker (its issues #60, #111, #117), so
the prompt grows with every step. Here the input is bounded by the constants below.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from relaygraph._names import ANSWER_NAME, CITATION_PATTERN, CUT_RESULT_CITES, SUPERVISOR
from relaygraph.agents import Agent
from relaygraph.handoffs import Assignment
from relaygraph.supervisor._state import TeamState, Visit

MAX_RESULTS_SHOWN = 4
"""Only the latest results are shown; earlier ones were already built upon."""
MAX_RESULT_CHARS = 1500
"""The newest result is shown up to this length."""
MAX_EARLIER_RESULT_CHARS = 400
"""Each earlier result shown is clipped to this length: the newest result builds on it, and
every call of every later visit would carry it again."""
MAX_TASK_CHARS = 200
MAX_HISTORY_TURNS = 3
MAX_HISTORY_CHARS = 600
ANSWER_NAMES = (None, ANSWER_NAME, SUPERVISOR)
"""Who writes the team's answers in a thread: finalize, the tool supervisor (unnamed: older)."""


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit].rstrip() + " [...]"


_CITATION = re.compile(CITATION_PATTERN)


def _clip_result(text: str, limit: int) -> str:
    """A result clipped to ``limit`` as :func:`_clip` does, naming the documents that only
    its cut text cited (:data:`~relaygraph._names.CUT_RESULT_CITES`).

    A researcher's long answer shown before the writer's would otherwise lose its
    ``[doc_id]`` in the cut, and the writer, quoting the same sentences whole, would be
    credited with finding them.
    """
    text = text.strip()
    if len(text) <= limit:
        return text
    kept = text[:limit].rstrip()
    shown = set(_CITATION.findall(kept))
    cut = [doc for doc in dict.fromkeys(_CITATION.findall(text)) if doc not in shown]
    if not cut:
        return f"{kept} [...]"
    return f"{kept}{CUT_RESULT_CITES}{' '.join(f'[{doc}]' for doc in cut)})"


def turn_visits(state: TeamState) -> list[Visit]:
    turn = state.get("turn", 0)
    return [v for v in state.get("visits", []) if v["turn"] == turn]


def results_text(
    visits: Sequence[Visit], *, with_tasks: bool = True, assignment: Assignment | None = None
) -> str:
    """The latest results, newest last; ``with_tasks`` shows the task each one answered.

    The supervisor (and finalize) see each result's task, which the supervisor needs so as
    not to give the same task twice; an agent sees only the results, which are
    self-contained by contract: every call of its visit carries them, so the tasks would
    be repeated on each. ``assignment`` is the task of the agent that reads them, whose
    own task a peer's handoff note need not repeat (see :func:`_handoff_note`).
    """
    if not with_tasks:
        # A failed model call is no result: an agent is not given its error as work
        # (the supervisor and finalize see that it failed, and why).
        visits = [v for v in visits if v["ended"] != "model_error"]
    if not visits:
        return "Results so far: none yet."
    shown = visits[-MAX_RESULTS_SHOWN:]
    skipped = len(visits) - len(shown)
    lines = ["Results so far:"]
    if skipped:
        lines.append(f"({skipped} earlier result(s) not shown)")
    for i, visit in enumerate(shown, start=1):
        limit = MAX_RESULT_CHARS if i == len(shown) else MAX_EARLIER_RESULT_CHARS
        task = f" (task: {_clip(visit['task'], MAX_TASK_CHARS)})" if with_tasks else ""
        following = shown[i] if i < len(shown) else None
        output = _handoff_note(visit, following, with_tasks=with_tasks, assignment=assignment)
        lines.append(f"- {visit['agent']}{task}: {_clip_result(output, limit) or '(no output)'}")
    return "\n".join(lines)


def _handoff_note(
    visit: Visit, following: Visit | None, *, with_tasks: bool, assignment: Assignment | None
) -> str:
    """A visit's output; for one that handed its work to a peer directly, only the peer's
    name when the message shows the task anyway.

    Such a visit's output is ``Handed off to <peer>: <task>``. The same message shows that
    task again as the peer's when the peer's result follows with its task, or when the peer
    is the agent reading it (its own task heads its message): there the note says
    ``Handed off to <peer>.`` and the task is sent once.
    """
    if visit["ended"] == "model_error":
        return f"(no result: {visit['output']})"
    if visit["ended"] != "handed_off":
        return visit["output"]
    if following is not None and with_tasks and following["source"] == visit["agent"]:
        target, task = following["agent"], following["task"]
    elif (
        following is None
        and assignment is not None
        and assignment["kind"] == "direct"
        and assignment["source"] == visit["agent"]
    ):
        target, task = assignment["agent"], assignment["task"]
    else:
        return visit["output"]
    note = f"Handed off to {target}"
    return f"{note}." if visit["output"] == f"{note}: {task}" else visit["output"]


def history_text(state: TeamState) -> str:
    """The thread's earlier requests and answers, for a continued conversation.

    A request is a human message; its answer is the team's last answer before the next
    request: finalize's (``relaygraph``) or the tool supervisor's own message, never an
    agent's (the tool supervisor's thread holds the agents' messages too).
    """
    messages = state.get("messages", [])
    current = max((i for i, m in enumerate(messages) if m.type == "human"), default=0)
    pairs: list[tuple[str, str]] = []
    for message in messages[:current]:
        if message.type == "human":
            pairs.append(("User", message.text))
        elif (
            message.type == "ai"
            and not getattr(message, "tool_calls", None)
            and getattr(message, "name", None) in ANSWER_NAMES
            and pairs
        ):
            if pairs[-1][0] == "Team":
                pairs[-1] = ("Team", message.text)
            else:
                pairs.append(("Team", message.text))
    pairs = pairs[-2 * MAX_HISTORY_TURNS :]
    if not pairs:
        return ""
    lines = ["Earlier in this conversation:"]
    lines += [f"{who}: {_clip(text, MAX_HISTORY_CHARS)}" for who, text in pairs]
    return "\n".join(lines) + "\n\n"


def _with_extra(prompt: str, extra: str | None) -> str:
    """The built-in prompt, and the team's own addition (a team file's [supervisor])."""
    return f"{prompt}\n\n{extra.strip()}" if extra and extra.strip() else prompt


def supervisor_prompt(agents: Sequence[Agent], *, extra: str | None = None) -> str:
    """The routing supervisor's system prompt: the roster and what each route field holds,
    in as few words as say it (it goes with every supervisor call of every task)."""
    roster = "\n".join(f"- {agent.name}: {agent.description}" for agent in agents)
    return _with_extra(
        (
            f"Choose who works next; do no work yourself. The agents:\n{roster}\n\n"
            "next: an agent, or FINISH once the results answer the request. task: what it "
            "must do, self-contained, not given before. reason: why, in a sentence. then: "
            "the steps after it you already know, 'agent: task' each."
        ),
        extra,
    )


def tool_supervisor_prompt(agents: Sequence[Agent], *, extra: str | None = None) -> str:
    """The ``supervisor-tools`` topology's supervisor: it routes by calling tools."""
    roster = "\n".join(f"- {agent.name}: {agent.description}" for agent in agents)
    return _with_extra(
        (
            "You are the supervisor of a team of agents. You do no work yourself: give work to "
            "one agent at a time with its transfer_to_<agent> tool ('task': exactly what it must "
            "do, self-contained; 'reason': why, in one sentence). When the agents' results answer "
            "the request, reply to the user with the final answer, keeping doc ids in square "
            f"brackets as citations.\n\nThe agents:\n{roster}"
        ),
        extra,
    )


def supervisor_input(state: TeamState, barred: Sequence[str]) -> str:
    """The request and the latest results with their tasks; before any agent has worked,
    the request alone (as an agent's input shows no empty results block)."""
    text = f"{history_text(state)}Request: {state.get('request', '')}"
    visits = turn_visits(state)
    if visits:
        text += f"\n\n{results_text(visits)}"
    if barred:
        text += "\n\nYou may not route to: " + "; ".join(barred)
    return text


def agent_input(state: TeamState, assignment: Assignment) -> str:
    """The scoped message that starts an agent's visit: its task, the request and the latest
    results. It is sent once, as the visit's first message; the agent's own calls and tool
    results follow it, so every later call of the visit repeats it only as the unchanged
    prefix of the conversation.

    A task from the supervisor is headed ``Task:``; one a peer handed over directly names
    that peer (``Task (from researcher):``). The reason for the assignment is not shown:
    the task is self-contained by contract, and the reason is recorded with the handoff.
    """
    source = assignment["source"]
    heading = "Task" if source == SUPERVISOR else f"Task (from {source})"
    text = f"{heading}: {assignment['task']}\n\n"
    text += f"{history_text(state)}Request: {state.get('request', '')}"
    visits = [v for v in turn_visits(state) if v["ended"] != "model_error"]
    results = results_text(visits, with_tasks=False, assignment=assignment)
    return f"{text}\n\n{results}" if visits else text


FINALIZE_PROMPT = (
    "You write the team's final answer to the user's request from the results the agents "
    "produced. Answer directly and completely; keep doc ids in square brackets as citations; "
    "if the results fall short of the request, say what is missing."
)


def finalize_input(state: TeamState) -> str:
    text = f"{history_text(state)}Request: {state.get('request', '')}\n\n"
    text += results_text(turn_visits(state))
    if state.get("stop_reason"):
        text += f"\n\nThe team stopped early: {state['stop_reason']}"
    return text
