"""``relaygraph doctor --model openai:MODEL``: what a Chat Completions server supports.

It sends the requests a team sends — plain chat, the route by each structured-output method,
a named ``tool_choice``, ``tool_choice: "auto"``, a tool round trip, ``parallel_tool_calls``,
a stream — through the same client the team uses, and prints what works, what does not, and
the spec options to use. Each probe ends one of four ways:

- ``ok``: the server took the request and the answer is what was asked for;
- ``weak``: the server took it but the model's answer missed (invalid JSON, no tool call):
  the protocol works, the model may not be up to it;
- ``rejected``: the server refused the request (an option may work around it);
- ``error``: the call failed otherwise (a timeout, the server unreachable); ``skipped``
  when plain chat already failed.

Only argparse is imported at module level, so ``relaygraph --help`` stays quick.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

__all__ = ["DoctorReport", "Probe", "diagnose", "run_doctor"]

EXIT_OK, EXIT_UNUSABLE = 0, 1
ProbeStatus = Literal["ok", "weak", "rejected", "error", "skipped"]

_VERDICT = {
    "title": "Verdict",
    "description": "A yes-or-no answer with its reason.",
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "reason": {"type": "string"},
    },
    "required": ["answer", "reason"],
    "additionalProperties": False,
}
_QUESTION = "Is the sky blue on a clear day? Answer yes or no, with a one-line reason."
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
_PROBE_MAX_TOKENS = 128


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """One request and how the server answered it."""

    name: str
    status: ProbeStatus
    detail: str
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    """What ``relaygraph doctor`` found, and the spec to use."""

    model: str
    """The spec probed."""
    base_url: str
    probes: list[Probe]
    spec: str
    """The spec with the options this server needs (the user's own options kept)."""
    options: dict[str, str]
    """The options added, by name."""
    notes: list[str] = field(default_factory=list)
    """What no option fixes (a server flag to set, a model too weak for a method)."""

    @property
    def usable(self) -> bool:
        """A team can run here (with :attr:`options`): plain chat works, some method gives
        the route reliably (an accepted method whose answers miss the schema is not enough:
        every route would need repair), agents can be offered tools and given their
        results, and a streamed answer arrives (token streaming streams every call)."""
        by_name = {p.name: p.status for p in self.probes}
        structured = [by_name.get(f"structured: {m}") for m in _METHODS]
        return (
            by_name.get("chat") == "ok"
            and "ok" in structured
            and by_name.get("tool_choice: auto") in ("ok", "weak")
            and by_name.get("tool round trip") in ("ok", "weak")
            and by_name.get("streaming") == "ok"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable}


_METHODS = ("json_schema", "function_calling", "json_mode")


def run_doctor(args: argparse.Namespace) -> int:
    """Run ``relaygraph doctor``; returns the exit code.

    Raises:
        ConfigError: The spec is invalid or names no OpenAI model.
    """
    report = diagnose(args.model, timeout=args.timeout, base_url=args.base_url)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=False) + "\n")
    else:
        _print(report)
    return EXIT_OK if report.usable else EXIT_UNUSABLE


@contextmanager
def _quiet() -> Iterator[None]:
    """Failed probes are the point here: the model's warnings about them stay silent."""
    logger = logging.getLogger("relaygraph.models")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def diagnose(spec: str, *, timeout: float = 120.0, base_url: str | None = None) -> DoctorReport:
    """Probe the server of ``spec`` (see the module docstring).

    Args:
        spec: An ``openai:`` spec, with its options.
        timeout: Seconds each request may take, unless the spec sets ``timeout``.
        base_url: The server; ``$OPENAI_BASE_URL`` (else OpenAI's) when None.

    Raises:
        ConfigError: The spec is invalid or names no OpenAI model.
    """
    from relaygraph.errors import ModelSpecError
    from relaygraph.models._openai import OPENAI_API, build_openai_model
    from relaygraph.models._options import OpenAIOptions
    from relaygraph.models._spec import parse_model_spec

    parsed = parse_model_spec(spec)
    if parsed.provider != "openai":
        raise ModelSpecError(spec, "doctor probes Chat Completions servers: use openai:MODEL")
    options = parsed.options or OpenAIOptions()
    if options.timeout is None:
        parsed = replace(parsed, options=replace(options, timeout=timeout))
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    model = build_openai_model(parsed, role="doctor", base_url=base_url)
    # The spec's own options go into the probes (its tool_call_content too), except
    # parallel_tool_calls=omit: its probe asks whether the field is taken.
    updates: dict[str, Any] = {"omit_parallel_tool_calls": False}
    if getattr(model, "max_tokens", None) is None:
        updates["max_tokens"] = _PROBE_MAX_TOKENS
    probe_model = model.model_copy(update=updates)
    probes: list[Probe] = []
    headers: dict[str, str] = {}
    with _quiet():
        chat = _timed("chat", lambda: _chat(probe_model, headers))
        probes.append(chat)
        litellm = any(name.lower().startswith("x-litellm") for name in headers)
        steps: list[tuple[str, Callable[[], Probe]]] = [
            *((f"structured: {m}", _structured_step(probe_model, m)) for m in _METHODS),
            ("tool_choice: named", lambda: _named_tool(probe_model)),
            ("tool_choice: auto", lambda: _auto_tool(probe_model)),
            ("tool round trip", lambda: _round_trip(probe_model, litellm=litellm)),
            ("parallel_tool_calls", lambda: _parallel(probe_model)),
            ("streaming", lambda: _streaming(probe_model)),
        ]
        for name, step in steps:
            if chat.status != "ok":
                probes.append(Probe(name=name, status="skipped", detail="plain chat failed"))
            else:
                probes.append(_timed(name, step))
    added, notes = _advice(probes)
    values: dict[str, Any] = dict(added)
    merged = replace(parse_model_spec(spec).options or OpenAIOptions(), **values)
    recommended = replace(parse_model_spec(spec), options=merged)
    return DoctorReport(
        model=spec,
        base_url=base_url or OPENAI_API,
        probes=probes,
        spec=str(recommended),
        options=added,
        notes=notes,
    )


def _timed(name: str, step: Callable[[], Probe]) -> Probe:
    from relaygraph.models._errors import ModelCallError

    started = time.monotonic()
    try:
        probe = step()
    except ModelCallError as exc:
        status: ProbeStatus = "rejected" if exc.refused else "error"
        probe = Probe(name=name, status=status, detail=exc.reason)
    except Exception as exc:  # A probe's surprise is a finding to print, not a traceback.
        probe = Probe(name=name, status="error", detail=f"{type(exc).__name__}: {exc}")
    return replace(probe, name=name, seconds=round(time.monotonic() - started, 2))


def _ok(detail: str) -> Probe:
    return Probe(name="", status="ok", detail=detail)


def _weak(detail: str) -> Probe:
    return Probe(name="", status="weak", detail=detail)


def _short(text: Any, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _chat(model: Any, headers: dict[str, str]) -> Probe:
    """Plain chat; ``headers`` gets the answer's HTTP headers (a proxy names itself there)."""
    reply = model.model_copy(update={"include_response_headers": True}).invoke(
        "Reply with one word: ready"
    )
    headers.update(reply.response_metadata.get("headers") or {})
    usage = reply.usage_metadata
    if not reply.text.strip():
        return _weak("the server answered with no text")
    tokens = f"{usage['output_tokens']} tokens" if usage else "no usage reported"
    return _ok(f"answered {_short(reply.text, 40)!r} ({tokens})")


def _valid(parsed: Any) -> bool:
    return (
        isinstance(parsed, dict)
        and parsed.get("answer") in ("yes", "no")
        and isinstance(parsed.get("reason"), str)
    )


def _structured_step(model: Any, method: str) -> Callable[[], Probe]:
    from langchain_core.exceptions import OutputParserException

    def step() -> Probe:
        structured = model.with_structured_output(_VERDICT, method=method, include_raw=True)
        try:
            out = structured.invoke([("system", "You answer questions."), ("user", _QUESTION)])
        except OutputParserException as exc:
            return _weak(f"accepted; the answer could not be read: {_short(exc, 70)}")
        parsed = out.get("parsed")
        if _valid(parsed):
            return _ok(f"valid: {_short(json.dumps(parsed), 60)}")
        if out.get("parsing_error") is not None:
            return _weak(f"accepted; the answer is no JSON: {_short(out['parsing_error'], 60)}")
        raw = out.get("raw")
        said = raw.text or (raw.tool_calls and json.dumps(raw.tool_calls[0]["args"])) or "nothing"
        return _weak(f"accepted; the answer misses the schema: {_short(parsed or said, 60)}")

    return step


def _named_tool(model: Any) -> Probe:
    bound = model.bind_tools(
        _TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    reply = bound.invoke("What time is it in Paris?")
    names = [c["name"] for c in reply.tool_calls]
    if names and set(names) == {"get_time"}:
        return _ok(f"called get_time({_short(json.dumps(reply.tool_calls[0]['args']), 40)})")
    if names:
        return _weak(f"called {', '.join(names)}, not the named get_time: tool_choice is ignored")
    return _broken_arguments(reply) or _weak(
        f"answered in text instead of calling get_time: {_short(reply.text, 50)!r}"
    )


def _broken_arguments(reply: Any) -> Probe | None:
    """A tool call whose arguments are not JSON (cut at the token limit, or a grammar-less
    server): a call the model made, not an answer in text."""
    if not reply.invalid_tool_calls:
        return None
    call = reply.invalid_tool_calls[0]
    return _weak(
        f"called {call.get('name') or 'a tool'} with arguments that are not JSON: "
        f"{_short(call.get('args') or '', 50)!r}"
    )


def _auto_tool(model: Any) -> Probe:
    bound = model.bind_tools(_TOOLS[:1], tool_choice="auto")
    reply = bound.invoke("What is the weather in Paris right now? Use the tool.")
    if reply.tool_calls:
        return _ok(f"called {reply.tool_calls[0]['name']}")
    return _broken_arguments(reply) or _weak(
        "accepted, but the model answered in text: agents on this server may never call their tools"
    )


def _round_trip(model: Any, *, litellm: bool) -> Probe:
    """A tool call and its result, with the assistant's ``content`` as the spec sends it.

    Behind LiteLLM, ``""`` is sent from the start: LiteLLM drops ``content: null`` from an
    assistant message with tool calls, and a backend that needs the field then fails with a
    500 that names nothing a probe could recognise.
    """
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from relaygraph.models._errors import ModelCallError

    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "c1"}]),
        ToolMessage("Sunny, 21 °C.", tool_call_id="c1"),
    ]
    if model.empty_tool_call_content:
        model.bind_tools(_TOOLS[:1]).invoke(history)
        return _ok('tool result answered (assistant content "", as the spec says)')
    if litellm:
        empty = model.model_copy(update={"empty_tool_call_content": True})
        empty.bind_tools(_TOOLS[:1]).invoke(history)
        return _weak(
            'behind LiteLLM, which drops content null beside tool calls; "" accepted: '
            "use tool_call_content=empty"
        )
    try:
        model.bind_tools(_TOOLS[:1]).invoke(history)
    except ModelCallError as null_refused:
        if not null_refused.refused:
            raise
        model.model_copy(update={"empty_tool_call_content": True}).bind_tools(_TOOLS[:1]).invoke(
            history
        )
        return _weak(
            f'content null refused ({_short(null_refused.reason, 120)}); "" accepted: '
            "use tool_call_content=empty"
        )
    return _ok("tool result answered (assistant content null)")


def _parallel(model: Any) -> Probe:
    # A named choice, so that a server refusing "auto" (vLLM without a tool parser) answers
    # for this field alone.
    choice = {"type": "function", "function": {"name": "get_weather"}}
    bound = model.bind_tools(_TOOLS, tool_choice=choice, parallel_tool_calls=False)
    bound.invoke("What is the weather in Paris?")
    return _ok("parallel_tool_calls: false accepted (whether it is obeyed is not visible)")


def _streaming(model: Any) -> Probe:
    from relaygraph._names import USAGE_ESTIMATED_KEY

    chunks = list(model.stream("Count from one to five."))
    if not chunks:
        return _weak("the stream was empty")
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    # The model estimates the tokens of a stream that reported none, and marks them so.
    estimated = not total.usage_metadata or total.response_metadata.get(USAGE_ESTIMATED_KEY)
    usage = "no usage in the stream (tokens estimated)" if estimated else "with usage"
    return _ok(f"{len(chunks)} chunks, {usage}")


def _advice(probes: list[Probe]) -> tuple[dict[str, str], list[str]]:
    """The options a team needs on this server, and what no option fixes."""
    by_name = {p.name: p for p in probes}
    options: dict[str, str] = {}
    notes: list[str] = []
    if by_name["chat"].status != "ok":
        return options, [f"plain chat failed: {by_name['chat'].detail}"]
    structured = {m: by_name[f"structured: {m}"].status for m in _METHODS}
    working = [m for m in _METHODS if structured[m] == "ok"] or [
        m for m in _METHODS if structured[m] == "weak"
    ]
    if not working:
        notes.append("no structured-output method was accepted: the supervisor cannot route")
    elif working[0] != "json_schema":
        # auto would find it too, after one refused call per process: pinned, none is wasted.
        options["structured"] = working[0]
    if working and structured[working[0]] == "weak":
        notes.append(
            f"structured output by {working[0]} is accepted but the model's answers miss the "
            "schema: no method gives the route reliably, every route needs repair"
        )
    trip = by_name["tool round trip"]
    if trip.status == "weak" and "tool_call_content=empty" in trip.detail:
        options["tool_call_content"] = "empty"
    elif trip.status in ("rejected", "error"):
        notes.append(f"a tool round trip fails: {trip.detail}")
    parallel = by_name["parallel_tool_calls"]
    if parallel.status == "rejected" and "parallel_tool_calls" in parallel.detail:
        options["parallel_tool_calls"] = "omit"
    auto = by_name["tool_choice: auto"]
    if auto.status == "rejected":
        notes.append(
            "tool_choice 'auto' is refused, and agents need it to call tools: start the "
            "server with tool calling on (vLLM: --enable-auto-tool-choice --tool-call-parser "
            "NAME)"
        )
    elif auto.status == "weak":
        notes.append(
            "with tools offered the model answered in text: agents may finish without "
            "calling tools (a chat template or model with tool calling fixes this)"
        )
    named = by_name["tool_choice: named"]
    if named.status == "weak" and "structured" not in options and working == ["function_calling"]:
        notes.append("the named tool_choice is not obeyed: function calling may miss the route")
    streaming = by_name["streaming"]
    if streaming.status != "ok":
        notes.append(
            f"streaming is broken ({streaming.detail}): a run with token streaming fails here"
        )
    elif "no usage" in streaming.detail:
        notes.append("streamed answers carry no usage: where a run streams, tokens are estimated")
    return options, notes


def _print(report: DoctorReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    colours = {"ok": "green", "weak": "yellow", "rejected": "red", "error": "red", "skipped": "dim"}
    console = Console(highlight=False)
    console.print(f"[bold]relaygraph doctor[/] {escape(report.model)} at {escape(report.base_url)}")
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("probe")
    table.add_column("result")
    table.add_column("seconds", justify="right")
    table.add_column("detail", overflow="fold")
    for probe in report.probes:
        colour = colours[probe.status]
        table.add_row(
            probe.name,
            f"[{colour}]{probe.status}[/]",
            f"{probe.seconds:.1f}",
            escape(probe.detail),
        )
    console.print(table)
    if report.options:
        added = ", ".join(f"{k}={v}" for k, v in report.options.items())
        console.print(f"options this server needs: [bold]{escape(added)}[/]")
    else:
        console.print("options this server needs: none")
    # Quoted for the shell: a spec's `&` between options would end the command there.
    console.print(f"use: [bold]--model {escape(shlex.quote(report.spec))}[/]")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if not report.usable:
        console.print("[red]a team cannot run on this server as it is[/]")
