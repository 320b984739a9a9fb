"""The supervisor's routing decision: a validated :class:`Route`, repaired once, never a crash.

The route is asked for with the model's own structured-output method: an ``openai:`` model
takes it from its spec (``?structured=...``, ``auto`` by default), so the same supervisor
works on servers that reject ``response_format: json_schema``. A call the server fails
(:class:`~relaygraph.models.ModelCallError`) is treated as a route that came back invalid:
asked once more, then the documented fallback, with the server's words in the reason.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, ParamSpec, TypeVar

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from relaygraph._calls import Call, Steps, run_sync
from relaygraph._names import FINISH
from relaygraph.models import AnswerCut, ModelCallError

__all__ = ["FINISH", "Route", "RouteDecision", "route_model", "route_next_agent", "route_steps"]

P = ParamSpec("P")
T = TypeVar("T")


class Route(BaseModel):
    """Base of the route schema; :func:`route_model` narrows ``next`` to the team's agents."""

    model_config = ConfigDict(extra="forbid")
    next: str = Field(description="The agent that works next, or FINISH when the task is done.")
    task: str = Field(description="What that agent must do, self-contained. Empty for FINISH.")
    reason: str = Field(description="Why, in one sentence.")
    then: list[str] = Field(
        default_factory=list,
        description="Later steps already known, 'agent: task' each, in order.",
    )
    """The supervisor's plan after ``next``: each step runs without another supervisor call
    while the one before it finished with a result; any other outcome asks the supervisor
    again (see :func:`planned_steps`). A string per step rather than an object keeps the
    schema, which goes with every supervisor call, a few tokens long."""

    agents_allowed: ClassVar[tuple[str, ...]] = ()
    """The agents a planned step may name (set by :func:`route_model`; empty: any)."""

    @model_validator(mode="after")
    def _task_for_agent(self) -> Route:
        if self.next != FINISH and not self.task.strip():
            raise ValueError(f"'task' must say what {self.next!r} should do; it is empty")
        if self.then and self.next == FINISH:
            raise ValueError("'then' must be empty when 'next' is FINISH")
        for step in self.then:
            _planned_step(step, type(self).agents_allowed)
        return self

    def planned_steps(self) -> list[tuple[str, str]]:
        """The plan after ``next`` as ``(agent, task)`` pairs, in order."""
        return [_planned_step(step, type(self).agents_allowed) for step in self.then]


def _planned_step(step: str, agents: tuple[str, ...]) -> tuple[str, str]:
    agent, colon, task = step.partition(":")
    agent, task = agent.strip(), task.strip(_BLANK)
    if not colon or not task:
        raise ValueError(f"each step of 'then' must be 'agent: task'; got {step!r}")
    if agent == FINISH or (agents and agent not in agents):
        choices = ", ".join(agents) if agents else "an agent of the team"
        raise ValueError(f"step {step!r} of 'then' names {agent!r}, not one of {choices}")
    return agent, task


def route_model(
    agents: Sequence[str], *, may_finish: bool = True, team: Sequence[str] | None = None
) -> type[Route]:
    """The ``Route`` schema for a team: ``next`` is one of ``agents`` or ``FINISH``.

    Args:
        agents: The agents the supervisor may route to now.
        may_finish: Whether ``FINISH`` is a choice. Before any agent has worked on a request
            it is not: a team that answers without its agents is no team, and small models
            otherwise pick FINISH at once.
        team: Every agent of the team, which a planned step (``then``) may name: an agent
            that may not work now (a bar after a ping-pong, a spent budget) may be able to
            by the time its step comes, which is checked then. None: ``agents``.
    """
    return _route_model(tuple(agents), may_finish, tuple(team) if team is not None else None)


# The supervisor asks for its route at every step: the schema class of a roster and its
# JSON schema are made once per roster, since pydantic's create_model and
# model_json_schema are costly to repeat at every call (benchmarks/ measures it); bounded,
# as a server may hold many teams.
@functools.lru_cache(maxsize=256)
def _route_model(
    agents: tuple[str, ...], may_finish: bool, team: tuple[str, ...] | None
) -> type[Route]:
    choices: Any = Literal[(*agents, FINISH)] if may_finish else Literal[agents]
    model = create_model(
        "Route",
        __base__=Route,
        next=(choices, Field(description="The agent that works next, or FINISH.")),
    )
    model.agents_allowed = agents if team is None else team
    return model


def route_json_schema(schema: type[Route]) -> dict[str, Any]:
    """The JSON schema the supervisor's model fills for ``schema`` (from :func:`route_model`):
    its fields and choices without titles or descriptions, and ``next`` as its choices alone
    (an enum of strings needs no ``"type": "string"``).

    The schema goes with every supervisor call, and the supervisor's prompt already says
    what ``next``, ``task`` and ``reason`` are; the reply is validated against ``schema``
    itself all the same. ``additionalProperties: false`` stays: a server that decodes under
    the schema then never produces a key the validation refuses.
    """
    # A fresh copy per call (the caller may change it), from the text made once.
    return json.loads(_route_json_text(schema))


def plan_step_pattern(agents: Sequence[str]) -> str:
    """The regular expression every step of ``then`` must match: ``'agent: task'`` with an
    agent of ``agents`` and a task that is not blank.

    It goes into the JSON schema sent to the server, so that a server that decodes under the
    schema (llama.cpp's grammars, vLLM's guided decoding) can only write steps that
    :func:`_planned_step` accepts: stricter than the check (spaces only around the colon, a
    task on one line), never looser. It keeps to the regex subset those grammars translate
    (literals, capturing groups, alternation, classes, ``*``): no ``\\s``, no ``(?:``.
    """
    # An agent's name is letters, digits, '_' and '-' (Agent checks it): literal in a regex.
    names = "|".join(agents)
    return f"^ *({names}) *: *[^ \\t-\\r].*$"


_BLANK = " \t\n\r\x0b\x0c"
"""What a planned task may not consist of alone: the ASCII white space, the class the
pattern above excludes from a task's first character (``[^ \\t-\\r]``)."""


@functools.lru_cache(maxsize=256)
def _route_json_text(schema: type[Route]) -> str:
    full = schema.model_json_schema()
    dropped = {"title", "description"}
    trimmed = {
        **{key: value for key, value in full.items() if key != "description"},
        "properties": {
            name: {
                k: v
                for k, v in field.items()
                if k not in dropped and not (k == "type" and "enum" in field)
            }
            for name, field in full["properties"].items()
        },
    }
    if schema.agents_allowed:
        steps = trimmed["properties"]["then"]["items"]
        steps["pattern"] = plan_step_pattern(schema.agents_allowed)
    return json.dumps(trimmed)


@dataclass(frozen=True, kw_only=True, slots=True)
class RouteDecision:
    """What routing produced: a valid route, or the fallback and why."""

    route: Route
    fallback: bool
    """True when the model's output failed validation twice and the run finishes instead."""
    error: str | None
    """The last validation error or failed call, when there was one."""
    raw: tuple[AIMessage, ...]
    """The model's raw replies, for usage accounting (one, or two after a repair); a call
    that failed gave none."""
    refused: tuple[str, ...] = ()
    """Agents the model named that it may not route to now (a spent budget, a bar)."""
    call_failed: bool = False
    """The last attempt's model call failed (the server's error, a timeout): the fallback
    is the server's doing, not the model's."""

    @property
    def stop_reason(self) -> str | None:
        """Why a fallback finishes the task: ``model_error: ...`` for a failed call,
        ``invalid_route: ...`` for output that stayed invalid; None without a fallback."""
        if not self.fallback:
            return None
        return f"{'model_error' if self.call_failed else 'invalid_route'}: {self.error}"


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'route'}: {err['msg']}"
            + (f" (got {err['input']!r})" if err["type"] != "missing" else "")
            for err in exc.errors()
        )
    # LangChain's parser errors end with a troubleshooting link: not for the model's eyes.
    return str(exc).split("\nFor troubleshooting, visit:")[0].strip()


@dataclass(frozen=True, slots=True)
class _Attempt:
    route: Route | None
    raw: AIMessage | None
    """The reply; None when the call failed."""
    error: str | None
    asked: str | None = None
    """The ``next`` the reply named, when it named one but was invalid."""


def _attempt(
    model: BaseChatModel,
    schema: type[Route],
    messages: list[BaseMessage],
    config: RunnableConfig,
) -> Steps[_Attempt]:
    # No method named: each model uses its own (an openai: spec's ``structured`` option).
    structured = model.with_structured_output(route_json_schema(schema), include_raw=True)
    try:
        out: dict[str, Any] = yield Call.invoke(structured, messages, config)
    except ModelCallError as exc:
        return _Attempt(None, None, f"the model call failed: {exc.reason}")
    except (OutputParserException, ValueError) as exc:
        # Some providers raise instead of reporting a parsing error; treat it the same way.
        # A cut answer carries what the server answered: its tokens were spent all the same.
        reply = exc.reply if isinstance(exc, AnswerCut) else None
        unparsed = AIMessage(content=f"(unparseable output: {exc})")
        if reply is not None:
            unparsed.usage_metadata = reply.usage_metadata
            unparsed.response_metadata = reply.response_metadata
        return _Attempt(None, unparsed, _describe(exc))
    raw = out.get("raw")
    raw_msg = raw if isinstance(raw, AIMessage) else AIMessage(content=str(raw))
    if out.get("parsing_error") is not None:
        return _Attempt(None, raw_msg, _describe(out["parsing_error"]))
    parsed = out.get("parsed")
    unreadable = _not_a_route(parsed, raw_msg)
    if unreadable is not None:
        return _Attempt(None, raw_msg, unreadable)
    try:
        return _Attempt(schema.model_validate(parsed), raw_msg, None)
    except ValidationError as exc:
        asked = parsed.get("next") if isinstance(parsed, dict) else None
        return _Attempt(None, raw_msg, _describe(exc), asked if isinstance(asked, str) else None)


def _not_a_route(parsed: Any, raw: AIMessage) -> str | None:
    """Why a reply holds no route at all (no JSON object, or one with none of the route's
    keys), said as such: validating it would only report "next: Field required"."""
    if isinstance(parsed, dict) and parsed.keys() & Route.model_fields.keys():
        return None
    said = raw.text.strip() or (json.dumps(raw.tool_calls[0]["args"]) if raw.tool_calls else "")
    excerpt = f"{said[:120]!r}{'...' if len(said) > 120 else ''}" if said else "nothing"
    if isinstance(parsed, dict):
        return f"the reply is JSON but not a route (no 'next', 'task' or 'reason'): {excerpt}"
    return f"the reply is not a JSON object: it said {excerpt}"


def _as_text(reply: AIMessage) -> AIMessage:
    """The reply as plain text, to quote in a repair: a reply by function calling holds a
    tool call that would otherwise need a tool message answering it."""
    if not reply.tool_calls:
        return reply
    text = reply.text or json.dumps(reply.tool_calls[0]["args"], ensure_ascii=False)
    return AIMessage(content=text)


def route_steps(
    model: BaseChatModel,
    messages: list[BaseMessage],
    *,
    agents: Sequence[str],
    config: RunnableConfig,
    may_finish: bool = True,
    unavailable: Mapping[str, str] | None = None,
    team: Sequence[str] | None = None,
) -> Steps[RouteDecision]:
    """Ask the model for the next route; repair once; fall back to FINISH.

    Output that fails validation (not JSON, an unknown agent, a missing field, an empty task)
    gets one repair attempt whose prompt quotes the error, and, for an agent in
    ``unavailable`` (agent -> why it may not work now), the reason. A call that failed (the
    server's error after the client's retries) is made once more as it was: the model said
    nothing to repair. If the second attempt fails too, the decision is the documented
    fallback: finish with what exists, flagged so the run reports ``degraded``.
    """
    unavailable = unavailable or {}
    schema = route_model(agents, may_finish=may_finish, team=team)
    first = yield from _attempt(model, schema, messages, config)
    if first.route is not None and first.raw is not None:
        return RouteDecision(route=first.route, fallback=False, error=None, raw=(first.raw,))
    if first.raw is None:
        second = yield from _attempt(model, schema, messages, config)
    else:
        why = unavailable.get(first.asked or "")
        refused_now = f" {first.asked!r} may not work now: {why}." if why else ""
        repair = [
            *messages,
            _as_text(first.raw),
            HumanMessage(
                content=f"Your reply was not a valid route: {first.error}.{refused_now} Reply "
                f"again with JSON matching the schema; 'next' must be one of "
                f"{', '.join([*agents, FINISH] if may_finish else agents)}."
            ),
        ]
        second = yield from _attempt(model, schema, repair, config)
    raw = tuple(a.raw for a in (first, second) if a.raw is not None)
    refused = tuple(
        dict.fromkeys(a.asked for a in (first, second) if a.asked and a.asked in unavailable)
    )
    if second.route is not None:
        return RouteDecision(
            route=second.route, fallback=False, error=first.error, raw=raw, refused=refused
        )
    call_failed = second.raw is None
    why_not = "the route could not be asked for" if call_failed else "route output invalid twice"
    # Built unvalidated: FINISH may not be among this schema's choices (see route_model).
    fallback = Route.model_construct(next=FINISH, task="", reason=f"{why_not}: {second.error}")
    return RouteDecision(
        route=fallback,
        fallback=True,
        error=second.error,
        raw=raw,
        refused=refused,
        call_failed=call_failed,
    )


def _on_this_thread(steps: Callable[P, Steps[T]], *, name: str, doc: str) -> Callable[P, T]:
    """A function ``name`` that runs ``steps`` to their end on this thread, making each
    call there (:func:`run_sync`), with their parameters."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(steps(*args, **kwargs))

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


route_next_agent = _on_this_thread(
    route_steps,
    name="route_next_agent",
    doc="Ask the model for the next route (see :func:`route_steps`), on this thread.",
)
