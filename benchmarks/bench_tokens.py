"""2. Prompt tokens per task: what each side sends its models, counted at the server.

Both sides run on the real ``ChatOpenAI`` client against ``tests/openai_server.py``, a local
Chat Completions server that plays the scenario's script and records every request body. The
tokens of a request are counted from the body itself, four characters per token (the
estimate relaygraph and the server use; no tokenizer download is needed): the text of every
message, plus the names and arguments of the tool calls in assistant messages (*messages*),
and the tool and response-format definitions sent beside them (*definitions*). A task's
tokens are both together: that is what a provider bills.

A third figure is what a provider's automatic prompt caching could serve from its cache:
for each request, the longest prefix (definitions first, then the messages in order, as
providers render a prompt) that it shares with an earlier request of the same role in the
same task.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from _bare import AGENT_NAMES, build_bare_team
from _common import REPO, Section, Verdict, log, table
from _scenarios import GOLDEN, REQUEST, SCENARIOS, golden_cases, step_by_step, to_bare

TARGET_LAST = 1.0
"""Tokens per task (messages and definitions) against bare ``last_message``, every task."""
TARGET_FULL = 0.5
"""Tokens per task against bare ``full_history`` on the long tasks and all four together."""
FULL_TARGET_SCENARIOS = ("long-6", "long-12")
ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")
SIDES = ("relaygraph", "full_history", "last_message")
LABELS = {
    "relaygraph": "relaygraph",
    "full_history": "bare, `output_mode='full_history'`",
    "last_message": "bare, `output_mode='last_message'`",
}


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4) if text else 0


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    else:
        text = content or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += fn.get("name", "") + fn.get("arguments", "")
    return text


def _definitions(body: dict[str, Any]) -> str:
    extra = {k: body[k] for k in ("tools", "response_format") if k in body}
    return json.dumps(extra) if extra else ""


def _prompt(body: dict[str, Any]) -> str:
    """The request as a provider's cache sees it: definitions, then each message in order."""
    parts = [_definitions(body)]
    parts += [f"{m.get('role', '')}\n{_message_text(m)}" for m in body.get("messages", [])]
    return "\x00".join(parts)


def _shared_prefix(a: str, b: str) -> int:
    # A prefix of characters, which is what commonprefix compares (not path components).
    return len(os.path.commonprefix([a, b]))  # noqa: RUF071


KINDS = ("system", "user", "assistant", "tool")


def count(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Model calls; message tokens (also by message role and by model); definition tokens,
    and among them ``peer_handoffs``, the agents' ``transfer_to_<peer>`` tools; their sum
    (``total``); and ``cached``, the tokens a prefix cache would serve."""
    counted = dict.fromkeys(
        ("calls", "messages", "definitions", "peer_handoffs", "cached", *KINDS), 0
    )
    counted["calls"] = len(requests)
    earlier: dict[str, list[str]] = {}
    for body in requests:
        model = f"model:{body.get('model', '')}"
        for message in body.get("messages", []):
            tokens = _tokens(_message_text(message))
            counted["messages"] += tokens
            counted[model] = counted.get(model, 0) + tokens
            role = message.get("role", "")
            counted[role if role in KINDS else "system"] += tokens
        definitions = _tokens(_definitions(body))
        counted["definitions"] += definitions
        if body.get("model") != "script-supervisor":
            counted["peer_handoffs"] += sum(
                _tokens(json.dumps(tool))
                for tool in body.get("tools", [])
                if tool.get("function", {}).get("name", "").startswith("transfer_to_")
            )
        counted[model] = counted.get(model, 0) + definitions
        prompt = _prompt(body)
        seen = earlier.setdefault(model, [])
        shared = max((_shared_prefix(prompt, e) for e in seen), default=0)
        counted["cached"] += shared // 4
        seen.append(prompt)
    counted["total"] = counted["messages"] + counted["definitions"]
    return counted


def _relaygraph(script: dict[str, Any], home: Path, request: str) -> dict[str, int]:
    from tests.openai_server import serve_script

    from relaygraph.runner import run_task

    with serve_script(script) as server:
        os.environ["OPENAI_BASE_URL"] = server.base_url
        result = run_task(request, agent_models={r: f"openai:script-{r}" for r in ROLES}, home=home)
        requests = list(server.requests)
        left = {k: v for k, v in server.remaining().items() if v}
    assert result.status == "succeeded", result.stop_reason
    # Finalize answers with the last agent's reply unless the policy asks for its model:
    # the script's finalize turn is then the bare supervisor's last reply only.
    finalized = any(body.get("model") == "script-finalize" for body in requests)
    if not finalized:
        left.pop("finalize", None)
    assert not left, f"relaygraph left script turns unplayed: {left}"
    return count(requests)


def _bare(script: dict[str, Any], home: Path, request: str, output_mode: str) -> dict[str, int]:
    from langchain_openai import ChatOpenAI
    from tests.openai_server import serve_script

    from relaygraph.agents import TaskContext

    bare = to_bare(script)
    with serve_script(bare) as server:
        models = {
            role: ChatOpenAI(
                model=f"script-{role}",
                base_url=server.base_url,
                api_key="bench",  # type: ignore[arg-type]
                max_retries=0,
            )
            for role in ("supervisor", *AGENT_NAMES)
        }
        graph = build_bare_team(models, output_mode=output_mode)
        context = TaskContext.for_task(home, task_id=f"bare-{output_mode}", thread_id="t")
        context.workspace.mkdir(parents=True, exist_ok=True)
        context.artifacts.mkdir(parents=True, exist_ok=True)
        graph.invoke(
            {"messages": [{"role": "user", "content": request}]},
            {"recursion_limit": 200},
            context=context,
        )
        requests = list(server.requests)
        left = {k: v for k, v in server.remaining().items() if v}
    assert not left, f"the bare team left script turns unplayed: {left}"
    return count(requests)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def run(home: Path) -> Section:
    section = Section("2. Prompt tokens per task")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    section.add(
        "Each scenario once per side over HTTP (`ChatOpenAI` → `tests/openai_server.py`, which "
        "plays the script and records each request body). Tokens are counted from the bodies "
        "at 4 characters per token: message text plus tool-call names and arguments "
        "(*messages*), and the tool and response-format schemas sent beside them "
        "(*definitions*); a task's *tokens* are both together, as a provider bills them, and "
        "the ratios and targets use them. *Cacheable* is what a provider's automatic prompt "
        "caching could serve from its cache: per request, the longest prefix (definitions, "
        "then the messages in order) shared with an earlier request of the same role in the "
        "task. The bare team plays the same turns (each supervisor route a "
        "`transfer_to_<agent>` call; a direct handoff becomes a reply and a transfer, since "
        "bare workers have no peer handoffs; the script's finalize answer becomes the bare "
        "supervisor's last reply, while relaygraph, under its default "
        '`[finalize] answer = "last_reply"`, answers with the last agent\'s reply and makes '
        "no finalize call).",
        "",
    )
    rows = []
    totals = {side: dict.fromkeys(("total", "cached"), 0) for side in SIDES}
    kinds: dict[str, dict[str, int]] = {
        side: dict.fromkeys((*KINDS, "definitions"), 0) for side in ("relaygraph", "last_message")
    }
    by_scenario: dict[str, dict[str, dict[str, int]]] = {}
    cases = [
        (name, description, REQUEST, factory(), False)
        for name, (description, factory) in SCENARIOS.items()
    ]
    playable, skipped = golden_cases()
    cases += [
        (f"golden:{id_}", request, request, script, True) for id_, request, script in playable
    ]
    golden = {side: dict.fromkeys(("total", "cached", "tasks"), 0) for side in SIDES}
    golden_cases_over: list[str] = []
    for name, description, request, script, is_golden in cases:
        log(f"  tokens: {name}")
        try:
            counted = {
                "relaygraph": _relaygraph(script, home, request),
                "full_history": _bare(script, home, request, "full_history"),
                "last_message": _bare(script, home, request, "last_message"),
            }
        except Exception as exc:
            if not is_golden:
                raise
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            why = why if len(why) <= 200 else why[:200] + "…"
            skipped.append((name.removeprefix("golden:"), f"cannot be played on both sides: {why}"))
            continue
        for side, c in counted.items():
            if side in kinds:
                for kind in kinds[side]:
                    kinds[side][kind] += c[kind]
            bucket = golden[side] if is_golden else totals[side]
            bucket["total"] += c["total"]
            bucket["cached"] += c["cached"]
            if is_golden:
                golden[side]["tasks"] += 1
        if is_golden:
            if counted["relaygraph"]["total"] > counted["last_message"]["total"]:
                golden_cases_over.append(name.removeprefix("golden:"))
        else:
            by_scenario[name] = counted
        last, full = counted["last_message"], counted["full_history"]
        for side, c in counted.items():
            rows.append(
                [
                    f"{name}: {description}",
                    LABELS[side],
                    c["calls"],
                    c["messages"],
                    c["definitions"],
                    f"**{c['total']}**",
                    f"{c['cached']} ({_pct(c['cached'], c['total'])})",
                    _ratio(c["total"], last["total"]),
                    _ratio(c["total"], full["total"]),
                ]
            )
    section.add(
        *table(
            [
                "scenario",
                "side",
                "model calls",
                "message tokens",
                "definition tokens",
                "tokens",
                "cacheable",
                "ratio to last_message",
                "ratio to full_history",
            ],
            rows,
        ),
        "",
    )
    golden_ratio: float | None = None
    if golden["relaygraph"]["tasks"]:
        n = golden["relaygraph"]["tasks"]
        per_task = {side: golden[side]["total"] / n for side in SIDES}
        cached = {side: golden[side]["cached"] / n for side in SIDES}
        golden_ratio = per_task["relaygraph"] / per_task["last_message"]
        over = (
            f" Cases above bare last_message on their own: {', '.join(golden_cases_over)}."
            if golden_cases_over
            else " No case is above bare last_message on its own."
        )
        section.add(
            f"The golden set (`{GOLDEN.relative_to(REPO)}`), {n} task(s) both sides can play, "
            f"tokens per task: relaygraph {per_task['relaygraph']:.0f} "
            f"({cached['relaygraph']:.0f} cacheable), bare last_message "
            f"{per_task['last_message']:.0f} ({cached['last_message']:.0f} cacheable), bare "
            f"full_history {per_task['full_history']:.0f} "
            f"({cached['full_history']:.0f} cacheable): **{golden_ratio:.2f}×** last_message "
            f"and **{per_task['relaygraph'] / per_task['full_history']:.2f}×** full_history."
            + over,
            "",
        )
    elif not GOLDEN.exists():
        section.add(f"The golden set (`{GOLDEN.relative_to(REPO)}`) is not there: not run.", "")
    if skipped:
        section.add(
            "Golden cases left out: "
            + "; ".join(f"`{id_}` ({why})" for id_, why in skipped)
            + ". (A case under its own policy, or one whose point is a budget stop, a "
            "ping-pong or an approval, has no bare counterpart.)",
            "",
        )
    together = totals["relaygraph"]["total"] / totals["full_history"]["total"]
    together_last = totals["relaygraph"]["total"] / totals["last_message"]["total"]
    section.add(
        f"The four scenarios together, tokens: relaygraph {totals['relaygraph']['total']} "
        f"({totals['relaygraph']['cached']} cacheable), bare full_history "
        f"{totals['full_history']['total']} ({totals['full_history']['cached']} cacheable), "
        f"bare last_message {totals['last_message']['total']} "
        f"({totals['last_message']['cached']} cacheable): **{together:.2f}×** full_history "
        f"and **{together_last:.2f}×** last_message.",
        "",
    )
    krows = [
        [
            {
                "system": "system prompts",
                "user": "user / task messages",
                "assistant": "assistant messages (tool calls, replies)",
                "tool": "tool results (incl. transfer messages)",
                "definitions": "tool and response-format definitions",
            }[kind],
            kinds["relaygraph"][kind],
            kinds["last_message"][kind],
        ]
        for kind in (*KINDS, "definitions")
    ]
    section.add(
        "What the tokens are, every task above together:",
        "",
        *table(["part of the prompts", "relaygraph", "bare last_message"], krows),
        "",
    )
    rg = kinds["relaygraph"]
    rg_total = sum(rg.values())
    trend = ", ".join(
        f"{name} {c['relaygraph']['total'] / c['full_history']['total']:.2f}×"
        for name, c in by_scenario.items()
        if name != "relay.json"
    )
    handoffs = {name: c["relaygraph"]["peer_handoffs"] for name, c in by_scenario.items()}
    without = ", ".join(
        f"{name} {(c['relaygraph']['total'] - handoffs[name]) / c['last_message']['total']:.2f}×"
        for name, c in by_scenario.items()
        if name != "relay.json"  # it hands off directly: it needs its transfer tools
    )
    stepwise = []
    for name, (_, factory) in SCENARIOS.items():
        unplanned = step_by_step(factory())
        if unplanned is not None:
            log(f"  tokens: {name}, one route per supervisor call")
            tokens = _relaygraph(unplanned, home, REQUEST)["total"]
            bare = by_scenario[name]
            stepwise.append(
                f"{name} {tokens} tokens ({tokens / bare['last_message']['total']:.2f}× "
                f"last_message, {tokens / bare['full_history']['total']:.2f}× full_history)"
            )
    uncached = {
        side: totals[side]["total"] - totals[side]["cached"] for side in ("relaygraph", *SIDES[1:])
    }
    section.add(
        "**What costs the tokens.** relaygraph's prompts are scoped: an agent sees its task, "
        "the request and the latest results (the newest in full, earlier ones clipped; "
        "without the tasks they answered, which only the supervisor's input lists), not "
        "the transcript, so its prompts grow with the calls of a visit, not with the history. "
        "Bare full_history re-sends the whole transcript to every call, which grows with every "
        f"step, so the ratio to full_history falls as tasks get longer ({trend}); bare "
        "last_message re-sends each agent's last reply and the transfer messages, which grow "
        "more slowly. The agents' system prompts and tools are the same on both sides. "
        f"System prompts are {_pct(rg['system'], rg_total)} of relaygraph's tokens, the task "
        f"messages {_pct(rg['user'], rg_total)}, the agents' own calls and tool results "
        f"{_pct(rg['assistant'] + rg['tool'], rg_total)} and the definitions "
        f"{_pct(rg['definitions'], rg_total)}. The scoped task message is sent once per visit, "
        "as its first message after the system prompt; each later call of the visit carries it "
        "again only as the unchanged prefix of the conversation, as in any ReAct loop (Chat "
        "Completions keeps no state between calls). Finalize answers with the last agent's "
        "reply and makes no model call, so a task takes no more model calls than bare's, one "
        "fewer per direct handoff (bare plays it as a reply and a supervisor call), and one "
        "fewer per planned step (below).",
        "",
        "**Plans.** A route may carry the steps after it that the supervisor already knows "
        "(`then`, `'agent: task'` each): each runs without a supervisor call while the visit "
        "before it finishes with a result, and any other outcome (a handoff to a peer, a budget "
        "stop, a refusal, a failed call, an agent that may not work now) asks the supervisor "
        "again. Where a scenario's steps are known at the start, its relaygraph script plans "
        "them: relay-3's first route plans the writer's step, long-6's and long-12's the whole "
        "cycle, and the supervisor is asked once more when the plan is done (FINISH); bare's "
        "supervisor has no plans and routes every step in a call of its own. The agents' turns, "
        "tasks and results are the same. Played one route per supervisor call, as bare's, "
        "relaygraph costs: " + "; ".join(stepwise) + ". The plan field costs every supervisor "
        "call a few tokens (its schema, a list of strings, and a sentence of the prompt).",
        "",
        "What relaygraph sends and bare does not is the direct handoffs: every agent call "
        "carries a `transfer_to_<peer>` definition for each peer its policy allows (its name, "
        "an empty description, a `task` and an optional `reason`), and bare's workers have "
        "none. The built-in researcher and coder may hand off to every other agent; the "
        "writer, the last stage, to none (its reply is the deliverable; work it finds missing "
        "goes back through the supervisor). Over the four scenarios the definitions are "
        f"{sum(handoffs.values())} tokens "
        f"({_pct(sum(handoffs.values()), totals['relaygraph']['total'])} of relaygraph's); "
        f"without them the ratio to last_message would be {without}. Each supervisor call "
        "carries the route's JSON schema (the agents' names, two strings and the plan's list "
        "of strings, no descriptions), fewer tokens than bare's three transfer tools.",
        "",
        "**Caching.** Every prompt starts with what its role sends alike on every call: the "
        "definitions (an agent's tools; the supervisor's route schema, which gains FINISH after "
        "its first call of a request), then the system prompt; every later call of an agent's "
        "visit extends the visit's earlier calls, and the supervisor's input lists the request "
        "and then the results in order. A prefix cache serves those. Across visits relaygraph "
        "shares less than bare: an agent's scoped message is rebuilt for each visit (its task "
        "first, then the request and a window of the latest four results), while bare's "
        "histories only grow, each call extending the last: bounded prompts cost fewer tokens, "
        "append-only ones cache better. Tokens a cache would not serve, the four scenarios "
        "together: "
        f"relaygraph {uncached['relaygraph']}, bare last_message {uncached['last_message']}, "
        f"bare full_history {uncached['full_history']}. OpenAI's automatic caching serves only "
        "prompts of 1024 tokens or more, in 128-token steps: the prompts here are all shorter, "
        "so on OpenAI itself none of these scripted tasks would be served from cache; the column "
        "shows what a prefix cache without that floor would serve.",
        "",
    )
    for name, counted in by_scenario.items():
        rg_tokens = counted["relaygraph"]["total"]
        ratio = rg_tokens / counted["last_message"]["total"]
        section.verdicts.append(
            Verdict(
                "2. tokens",
                f"{name}: ≤ {TARGET_LAST}× bare last_message",
                f"{ratio:.2f}×",
                ratio <= TARGET_LAST,
            )
        )
    if golden_ratio is not None:
        section.verdicts.append(
            Verdict(
                "2. tokens",
                f"golden set, tokens per task: ≤ {TARGET_LAST}× bare last_message",
                f"{golden_ratio:.2f}×",
                golden_ratio <= TARGET_LAST,
            )
        )
    for name in FULL_TARGET_SCENARIOS:
        counted = by_scenario[name]
        ratio = counted["relaygraph"]["total"] / counted["full_history"]["total"]
        section.verdicts.append(
            Verdict(
                "2. tokens",
                f"{name}: ≤ {TARGET_FULL}× bare full_history",
                f"{ratio:.2f}×",
                ratio <= TARGET_FULL,
            )
        )
    section.verdicts.append(
        Verdict(
            "2. tokens",
            f"the four scenarios together: ≤ {TARGET_FULL}× bare full_history",
            f"{together:.2f}×",
            together <= TARGET_FULL,
        )
    )
    met = all(v.met for v in section.verdicts)
    section.add(
        f"**Targets (tokens with definitions: ≤ {TARGET_LAST}× bare last_message per scenario "
        f"and for the golden set; ≤ {TARGET_FULL}× bare full_history on "
        f"{', '.join(FULL_TARGET_SCENARIOS)} and the four scenarios together): "
        + ("met.**" if met else "NOT met.**"),
        "",
    )
    return section
