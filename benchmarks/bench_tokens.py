"""2. Prompt tokens per task: what each side sends its models, counted at the server.

Both sides run on the real ``ChatOpenAI`` client against ``tests/openai_server.py``, a local
Chat Completions server that plays the scenario's script and records every request body. The
tokens of a request are counted from the body itself, four characters per token (the
estimate relaygraph and the server use; no tokenizer download is needed): the text of every
message, plus the names and arguments of the tool calls in assistant messages. The tool and
response-format definitions sent beside the messages are counted separately.
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
from _scenarios import GOLDEN, REQUEST, SCENARIOS, golden_cases, to_bare

TARGET = 0.5
ROLES = ("supervisor", "researcher", "coder", "writer", "finalize")


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


KINDS = ("system", "user", "assistant", "tool")


def count(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Model calls, message tokens (also by message role) and definition tokens."""
    counted = dict.fromkeys(("calls", "messages", "definitions", *KINDS), 0)
    counted["calls"] = len(requests)
    for body in requests:
        model = f"model:{body.get('model', '')}"
        for message in body.get("messages", []):
            tokens = _tokens(_message_text(message))
            counted["messages"] += tokens
            counted[model] = counted.get(model, 0) + tokens
            role = message.get("role", "")
            counted[role if role in KINDS else "system"] += tokens
        extra = {k: body[k] for k in ("tools", "response_format") if k in body}
        counted["definitions"] += _tokens(json.dumps(extra)) if extra else 0
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


def run(home: Path) -> Section:
    section = Section("2. Prompt tokens per task")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    section.add(
        "Each scenario once per side over HTTP (`ChatOpenAI` → `tests/openai_server.py`, which "
        "plays the script and records each request body). Tokens are counted from the bodies "
        "at 4 characters per token: message text plus tool-call names and arguments "
        "(*messages*); the tool and response-format schemas sent beside them are counted "
        "apart (*definitions*). The ratio and the target use the message tokens; the last "
        "column adds the definitions. The bare team plays the same turns (each supervisor "
        "route a `transfer_to_<agent>` call; a direct handoff becomes a reply and a transfer, "
        "since bare workers have no peer handoffs; relaygraph's finalize answer becomes the "
        "supervisor's last reply).",
        "",
    )
    rows = []
    totals = {"relaygraph": 0, "full_history": 0, "last_message": 0}
    totals_all = dict.fromkeys(totals, 0)
    ratios: dict[str, float] = {}
    finalize: dict[str, int] = {}
    kinds: dict[str, dict[str, int]] = {
        side: dict.fromkeys(KINDS, 0) for side in ("relaygraph", "full_history")
    }
    cases = [
        (name, description, REQUEST, factory(), False)
        for name, (description, factory) in SCENARIOS.items()
    ]
    playable, skipped = golden_cases()
    cases += [
        (f"golden:{id_}", request, request, script, True) for id_, request, script in playable
    ]
    golden: dict[str, dict[str, int]] = {side: {"messages": 0, "tasks": 0} for side in totals}
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
                for kind in KINDS:
                    kinds[side][kind] += c[kind]
            if is_golden:
                golden[side]["messages"] += c["messages"]
                golden[side]["tasks"] += 1
                continue
            totals[side] += c["messages"]
            totals_all[side] += c["messages"] + c["definitions"]
        if not is_golden:
            ratios[name] = counted["relaygraph"]["messages"] / counted["full_history"]["messages"]
            finalize[name] = counted["relaygraph"].get("model:script-finalize", 0)
        for side, c in counted.items():
            label = {
                "relaygraph": "relaygraph",
                "full_history": "bare, `output_mode='full_history'`",
                "last_message": "bare, `output_mode='last_message'`",
            }[side]
            ratio = (
                "1 (baseline)"
                if side == "full_history"
                else f"{c['messages'] / counted['full_history']['messages']:.2f}×"
            )
            both = c["messages"] + c["definitions"]
            base_both = counted["full_history"]["messages"] + counted["full_history"]["definitions"]
            rows.append(
                [
                    f"{name}: {description}",
                    label,
                    c["calls"],
                    c["messages"],
                    c["definitions"],
                    ratio,
                    f"{both} ({both / base_both:.2f}×)",
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
                "ratio to full_history",
                "messages + definitions",
            ],
            rows,
        ),
        "",
    )
    golden_ratio: float | None = None
    if golden["relaygraph"]["tasks"]:
        n = golden["relaygraph"]["tasks"]
        per_task = {side: golden[side]["messages"] / n for side in golden}
        golden_ratio = per_task["relaygraph"] / per_task["full_history"]
        section.add(
            f"The golden set (`{GOLDEN.relative_to(REPO)}`), {n} task(s) both sides can play: "
            f"relaygraph {per_task['relaygraph']:.0f} message tokens per task, bare "
            f"full_history {per_task['full_history']:.0f}, bare last_message "
            f"{per_task['last_message']:.0f}: **{golden_ratio:.2f}×** full_history and "
            f"**{per_task['relaygraph'] / per_task['last_message']:.2f}×** last_message.",
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
    overall = totals["relaygraph"] / totals["full_history"]
    overall_last = totals["relaygraph"] / totals["last_message"]
    overall_all = totals_all["relaygraph"] / totals_all["full_history"]
    section.add(
        f"The four scenarios together: relaygraph {totals['relaygraph']} message tokens, bare "
        f"full_history {totals['full_history']}, bare last_message {totals['last_message']}: "
        f"**{overall:.2f}×** full_history and **{overall_last:.2f}×** last_message "
        f"({overall_all:.2f}× full_history with definitions counted).",
        "",
    )
    krows = [
        [
            {
                "system": "system prompts",
                "user": "user / task messages",
                "assistant": "assistant messages (tool calls, replies)",
                "tool": "tool results (incl. transfer messages)",
            }[kind],
            kinds["relaygraph"][kind],
            kinds["full_history"][kind],
        ]
        for kind in KINDS
    ]
    section.add(
        "What the message tokens are, every task above together:",
        "",
        *table(["part of the prompts", "relaygraph", "bare full_history"], krows),
        "",
    )
    rg, bare = kinds["relaygraph"], kinds["full_history"]
    rg_total, bare_total = sum(rg.values()), sum(bare.values())
    first = next(iter(ratios))
    trend = ", ".join(
        f"{name} {ratio:.2f}×" for name, ratio in ratios.items() if name != "relay.json"
    )
    section.add(
        "**What costs the tokens.** relaygraph's prompts are scoped: an agent sees its task "
        "and the latest results, not the transcript, so its tokens grow with the number of "
        "calls, not with the history. "
        f"{100 * rg['system'] / rg_total:.0f}% of its message tokens are system prompts and "
        f"{100 * rg['user'] / rg_total:.0f}% the scoped task message (the request, the task "
        "and up to four earlier results, sent again with every call of a visit); the "
        f"transcript (assistant + tool) is {100 * (rg['assistant'] + rg['tool']) / rg_total:.0f}%. "
        "Bare full_history re-sends the whole transcript to every call (assistant + tool = "
        f"{100 * (bare['assistant'] + bare['tool']) / bare_total:.0f}% of its tokens), which "
        f"grows with every step, so the ratio falls as tasks get longer ({trend}). On short "
        "tasks the fixed part dominates: the system prompt of every call (the same size on "
        "both sides), the results block repeated in each call of a visit, and one more call "
        f"than bare (`finalize`, {finalize[first]} tokens in {first}) keep relaygraph above "
        f"{TARGET}×. The definitions are about twice bare's: each agent is also offered a "
        "`transfer_to_<peer>` tool per peer, and every supervisor call carries the route's "
        "JSON schema.",
        "",
    )
    for name, ratio in ratios.items():
        section.verdicts.append(
            Verdict(
                "2. tokens",
                f"{name}: ≤ {TARGET}× bare full_history",
                f"{ratio:.2f}×",
                ratio <= TARGET,
            )
        )
    if golden_ratio is not None:
        section.verdicts.append(
            Verdict(
                "2. tokens",
                f"golden set, tokens per task: ≤ {TARGET}× bare full_history",
                f"{golden_ratio:.2f}×",
                golden_ratio <= TARGET,
            )
        )
    met = all(r <= TARGET for r in ratios.values()) and (
        golden_ratio is None or golden_ratio <= TARGET
    )
    section.add(
        f"**Target (≤ {TARGET}× bare full_history, per scenario and for the golden set): "
        + ("met.**" if met else "MISSED.**"),
        "",
    )
    return section
