"""One run of a task, in named steps: the graph input it goes on from, its ``run_started``
event, the stream of the graph's events, how it ended, and what the ledger records of the
end. :class:`~relaygraph.runner.TaskRunner` prepares a :class:`TaskRun` (team, context,
config, lease) and takes it through these steps."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from relaygraph.errors import ConfigError, RelaygraphError
from relaygraph.events import (
    EVENT_SHAPES,
    Event,
    RunStartedEvent,
    TraceLinks,
    events_to,
    interrupted_event,
    run_finished_event,
    run_started_event,
    run_suspended_event,
    token_event,
    violation_event,
)
from relaygraph.runner._inline_saves import saves_inline
from relaygraph.runner._result import RunResult
from relaygraph.runner._summary import (
    citations_checked,
    honest_status,
    summarize,
    waiting_violations,
)
from relaygraph.store import RunEnd

if TYPE_CHECKING:
    from relaygraph.agents.context import TaskContext
    from relaygraph.policies import TeamPolicy
    from relaygraph.runner._event_writer import EventWriter
    from relaygraph.runner._lease import RunHold
    from relaygraph.store import Ledger, Task
    from relaygraph.topology import Topology

__all__ = [
    "CONTINUE",
    "LEASE_LOST",
    "SUSPENDED",
    "DrainSignal",
    "EventHandler",
    "StreamEnd",
    "TaskRun",
]

log = logging.getLogger(__name__)

EventHandler = Callable[[dict[str, Any]], None]
CONTINUE: Any = object()
"""Graph input for :meth:`TaskRunner.run`: continue an interrupted process's task."""
SUSPENDED = "suspended: the server stopped; the task continues when it starts again"
INTERRUPTED = "cancelled: the process running it was stopped (Ctrl-C or SIGTERM)"
"""The stop reason of a task whose ``relaygraph run`` (or ``run_task``) was stopped."""
LEASE_LOST = (
    "suspended: this runner could not keep its lease (another runner took the task over, or "
    "the ledger did not answer its renewals in time); the task continues on the next runner"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamEnd:
    """How the graph's stream ended, and the graph's state then."""

    drained: bool
    """Stopped at a step boundary on request: a cancel, a shutdown or a lost lease."""
    error: str | None
    """The stop reason of a run that failed: ``error: ...`` or a last-resort budget."""
    snapshot: Any
    """The graph's state (with its subgraphs') after the stream."""
    in_flight: tuple[list[dict[str, Any]], list[dict[str, Any]]]
    """Usage records and violations of the visits the stream left in progress."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskRun:
    """One run of ``task``, under this runner's lease; every event goes through ``writer``."""

    ledger: Ledger
    runner_id: str
    task: Task
    policy: TeamPolicy
    topology: Topology
    recorded: dict[str, str]
    """The model spec each role runs on, as the task records it."""
    context: TaskContext
    config: dict[str, Any]
    """The graph call's config: thread, identity, limits, tracing."""
    cancel: threading.Event
    stop: threading.Event | None
    lease: RunHold
    """The runner's hold on the task: its lease (in process), or its attempt (a worker)."""
    writer: EventWriter
    watch_cancel: bool = True
    """Whether ``cancel`` may be set by others than ``lease`` (a caller's event): a watcher
    thread then turns it into a drain. When False, only the lease (or attempt) sets it, and
    tells the run itself (``when_cancelled``): no thread to start per run."""
    attempt: int | None = None
    """A worker's attempt (the fencing number every ledger write of the run carries); None
    in process, where the lease keeps the task to one runner."""

    @property
    def roles(self) -> tuple[str, ...]:
        return self.topology.roles(tuple(self.policy.agents))

    def graph_input(self, graph: Any, graph_input: Any) -> Any:
        """The input the graph goes on from: ``graph_input``, or for :data:`CONTINUE` what
        the task's checkpoints and decisions say."""
        if graph_input is CONTINUE:
            graph_input = self._continue_input(graph)
        if self.task.from_step and isinstance(graph_input, Mapping) and "request" in graph_input:
            # A replay from a step goes on from the checkpoint its submission forked for it
            # (``runner._replay``) while it has none of its own, whichever way it starts.
            graph_input = self._fork_input(graph)
        return graph_input

    def started_event(self) -> RunStartedEvent:
        """The run's ``run_started`` event (the one place it is built), with where the
        run's trace will be when tracing is on; asked just before the run starts."""
        from relaygraph.tracing import trace_reference

        return run_started_event(
            task_id=self.task.id,
            thread_id=self.task.thread_id,
            models=self.recorded,
            topology=self.topology.to_mapping(),
            # trace_reference answers in the shape of events.TraceLinks.
            trace=cast("TraceLinks | None", trace_reference(self.config)),
        )

    def stream(self, graph: Any, graph_input: Any, *, stream_tokens: bool) -> StreamEnd:
        """Stream the graph from ``graph_input``, each event to the writer, until it ends,
        pauses, fails, or drains at a step boundary (a cancel, a shutdown, a lost lease)."""
        control = self._control()
        drained, error = False, None
        try:
            stream = self._opened(graph.stream, graph_input, control, stream_tokens)
            # The saves on this thread (see _inline_saves): sync durability waits for
            # each anyway.
            with self._watched(control, stream_tokens), saves_inline():
                for item in stream:
                    self._on_item(item, stream_tokens)
        except Exception as exc:
            drained, error = _ended_by(exc)
        return self._end(graph.get_state(self.config, subgraphs=True), drained, error)

    async def astream(self, graph: Any, graph_input: Any, *, stream_tokens: bool) -> StreamEnd:
        """:meth:`stream` on the running event loop (``graph.astream``): the run holds no
        thread while its nodes await their models."""
        control = self._control()
        drained, error = False, None
        try:
            stream = self._opened(graph.astream, graph_input, control, stream_tokens)
            with self._watched(control, stream_tokens):
                async for item in stream:
                    self._on_item(item, stream_tokens)
        except Exception as exc:
            drained, error = _ended_by(exc)
        return self._end(await graph.aget_state(self.config, subgraphs=True), drained, error)

    def _control(self) -> Any:
        """The run's drain control. Cancel and stop ask LangGraph to drain: the run ends at
        the next super-step boundary (in whichever graph or agent subgraph is running) after
        that step's writes are checkpointed, so a continued run neither loses nor repeats
        work. A write that fails stops the run at the next step boundary too (the error is
        raised when the run records its end)."""
        from langgraph.runtime import RunControl

        control = RunControl()
        self.writer.when_failed(lambda exc: control.request_drain("shutdown"))
        return control

    def _options(self, control: Any, stream_tokens: bool) -> dict[str, Any]:
        return {
            # Without tokens the events go straight to the writer (events_to), and the
            # stream yields only the steps' updates, which nothing reads. Tokens come on
            # LangGraph's stream, and the events with them, so that both keep their order.
            "stream_mode": ["custom", "messages"] if stream_tokens else ["updates"],
            "subgraphs": stream_tokens,
            "control": control,
            # Each step's checkpoint is written before the next step starts: a model's
            # tool calls are durable before any of the tools runs, so a run continued
            # after a crash finds them (and the tool journal their results) instead of
            # asking the model again and running other calls. In process too (no
            # redelivery, a lease): `serve` restarted after a crash continues each running
            # task from its last checkpoint, and under "async" a tool could run (and
            # journal its result) before the step that holds its call is saved; the
            # continued run would ask the model again, get other calls (other ids), and
            # repeat the side effects.
            "durability": "sync",
        }

    def _opened(
        self, open_stream: Callable[..., Any], graph_input: Any, control: Any, stream_tokens: bool
    ) -> Any:
        """The graph's stream from ``graph_input`` (``open_stream`` is ``graph.stream`` or
        ``graph.astream``), under the run's config, context and drain ``control``; a lost
        hold or a cancel drains it."""
        stream = open_stream(
            graph_input,
            self.config,
            context=self.context,
            **self._options(control, stream_tokens),
        )
        self._drain_on_hold(control)
        return stream

    def _drain_on_hold(self, control: Any) -> None:
        """A lost lease (or a superseded attempt) drains the run; it stays the new holder's.
        A cancel the hold finds drains it too."""
        self.lease.when_lost(lambda: control.request_drain("shutdown"))
        self.lease.when_cancelled(lambda: control.request_drain("cancel"))

    @contextmanager
    def _watched(self, control: Any, stream_tokens: bool) -> Iterator[None]:
        """The events of the graph's nodes go to the writer (none on LangGraph's stream,
        unless tokens are streamed: a run inside a tool of another run's, a nested
        run_task, sets its own sink, or none), and a cancel or stop drains the run."""
        watched = self.cancel if self.watch_cancel else None
        with (
            events_to(None if stream_tokens else self.writer.queue),
            _drain_when(control, cancel=watched, stop=self.stop),
        ):
            yield

    def _on_item(self, item: Any, stream_tokens: bool) -> None:
        if not stream_tokens:
            return
        namespace, mode, data = item
        if mode == "custom":
            # The team's events; what else a tool writes on LangGraph's stream (its own
            # progress) is not the task's, as without tokens, where that stream is not read
            # (and the ledger would refuse it).
            if isinstance(data, dict) and data.get("type") in EVENT_SHAPES:
                self.writer.put(cast("Event", data))
        elif text := _token_text(data[0]):
            self.writer.put(token_event(_token_role(namespace, data[1]), text))

    def _end(self, snapshot: Any, drained: bool, error: str | None) -> StreamEnd:
        from relaygraph.supervisor import in_flight_records

        return StreamEnd(
            drained=drained,
            error=error,
            snapshot=snapshot,
            in_flight=in_flight_records(snapshot, self.policy),
        )

    def result(self, end: StreamEnd) -> RunResult:
        """The run's result: how it ended, checked by :func:`honest_status`."""
        snapshot = end.snapshot
        state = snapshot.values
        usage, violations = end.in_flight
        in_flight = (usage, [*violations, *waiting_violations(snapshot)])
        pending = [
            {"id": i.id, **(i.value if isinstance(i.value, dict) else {"value": i.value})}
            for i in snapshot.interrupts
        ]
        status: str
        stop_reason: str | None
        answer: str | None
        if self.cancelled(end):
            status, stop_reason, answer = "cancelled", "cancelled by request", None
        elif end.drained:
            reason = LEASE_LOST if self.lease.lost.is_set() else SUSPENDED
            status, stop_reason, answer = "running", reason, None
        elif end.error is not None:
            status, stop_reason, answer = "failed", end.error, None
        elif pending:
            status, stop_reason, answer = "interrupted", _pending_reason(pending), None
        else:
            status = state.get("status") or "failed"
            stop_reason, answer = state.get("stop_reason"), state.get("answer")
        summary = summarize(state, self.policy, self.roles, in_flight)
        turn = state.get("turn", 0)
        status, stop_reason = honest_status(
            status,
            stop_reason,
            summary,
            answer,
            request=self.task.input,
            transcripts=[
                m for v in state.get("visits", []) if v["turn"] == turn for m in v["messages"]
            ],
            grounding=citations_checked(self.policy, self.recorded),
        )
        try:
            artifacts = sorted(p.name for p in self.context.artifacts.iterdir() if p.is_file())
        except FileNotFoundError:  # No agent saved one (the folder is made by the first).
            artifacts = []
        return RunResult(
            task_id=self.task.id,
            thread_id=self.task.thread_id,
            status=status,
            answer=answer,
            stop_reason=stop_reason,
            artifacts=artifacts,
            models=self.recorded,
            topology=self.topology.to_mapping(),
            pending=pending,
            **summary,
        )

    def cancelled(self, end: StreamEnd) -> bool:
        return end.drained and self.cancel.is_set()

    def record_end(self, end: StreamEnd, result: RunResult) -> None:
        """Report the end (what a paused task waits for, then ``run_finished``) and record
        it with what the visits still in progress spent (the finished nodes' usage came
        with their events), giving up the lease. A suspended run is not finished: the task
        stays ``running`` for the next server to continue."""
        emit = self.writer.put
        in_flight = end.in_flight[0]
        if end.drained and not self.cancelled(end):
            emit(run_suspended_event(result.stop_reason))
            self.writer.finish(RunEnd(usage=in_flight, runner_id=self.runner_id))
            return
        self._report_pause(result.pending)
        emit(run_finished_event(result.status, result.stop_reason))
        self.writer.finish(
            RunEnd(
                usage=in_flight,
                runner_id=self.runner_id,
                status=result.status,
                answer=result.answer,
                stop_reason=result.stop_reason,
            )
        )

    def _report_pause(self, pending: list[dict[str, Any]]) -> None:
        """An ``interrupted`` event per request the task waits for; a ping-pong sent to a
        person is reported as a violation too, once."""
        emit = self.writer.put
        waits_on_ping_pong = any(item.get("type") == "ping_pong" for item in pending)
        if waits_on_ping_pong:
            self.writer.flush()  # The approvals read next come from `interrupted` events.
        reported = (
            {a.interrupt_id for a in self.ledger.approvals(self.task.id)}
            if waits_on_ping_pong
            else set()
        )
        for item in pending:
            if item.get("type") == "ping_pong" and item["id"] not in reported:
                # The detection step re-runs when the decision comes, so the violation is
                # reported here, at the pause: once, even if no decision ever comes.
                emit(violation_event(item.get("next"), "ping_pong", item.get("detail") or ""))
            emit(interrupted_event(item))

    def _fork_input(self, graph: Any) -> Any:
        """The graph input of a replay from a step that has not run yet: on from the fork
        its thread holds (None).

        Raises:
            ConfigError: The thread holds no fork (its checkpoints were deleted).
        """
        latest = graph.get_state(self.config)
        forked_from = (latest.metadata or {}).get("relaygraph_forked_from")
        if forked_from is None:
            raise ConfigError(
                f"task {self.task.id} replays task {self.task.replay_of} from step "
                f"{self.task.from_step}, but its thread holds no checkpoint to go on from"
            )
        return None

    def _continue_input(self, graph: Any) -> Any:
        """The graph input that continues the task after a restart (:data:`CONTINUE`).

        On from the task's last checkpoint if it made one (the thread's latest checkpoint
        is this task's); else from the start, as if it had just been claimed. A task that
        waits at interrupts the ledger has decisions for (a worker's run after a decision;
        a server that stopped while resuming one) is resumed with those decisions; one
        still undecided waits again.
        """
        latest = graph.get_state(self.config)
        if not self._checkpointed(latest):
            return {"request": self.task.input}
        return self._continued(latest, self.ledger.approvals(self.task.id))

    async def agraph_input(self, graph: Any, graph_input: Any) -> Any:
        """:meth:`graph_input` on the running event loop."""
        if graph_input is not CONTINUE:
            return graph_input
        latest = await graph.aget_state(self.config)
        if not self._checkpointed(latest):
            return {"request": self.task.input}
        approvals = await asyncio.to_thread(self.ledger.approvals, self.task.id)
        return self._continued(latest, approvals)

    def _checkpointed(self, latest: Any) -> bool:
        """Whether the thread's latest checkpoint is this task's."""
        return bool((latest.metadata or {}).get("relaygraph_task_id") == self.task.id)

    def _continued(self, latest: Any, approvals: Any) -> Any:
        from relaygraph.runner._decide import resume_input

        decided = {a.interrupt_id: a for a in approvals if not a.pending}
        answered = [i.id for i in latest.interrupts if i.id in decided]
        if answered:
            return resume_input({i: _answer(decided[i]) for i in answered})
        return None


def _ended_by(exc: Exception) -> tuple[bool, str | None]:
    """How an exception the graph's stream raised ends the run: (drained, error)."""
    from langgraph.errors import GraphDrained, GraphRecursionError

    if isinstance(exc, GraphDrained):
        return True, None
    if isinstance(exc, GraphRecursionError):
        # The team's own step guard finalizes before this; it stays a last resort that
        # ends the task cleanly instead of surfacing LangGraph's error.
        return False, "budget:team:recursion_limit"
    if isinstance(exc, RelaygraphError):
        return False, f"error: {exc}"
    # A provider or tool failure ends this task, not the process.
    return False, f"error: {type(exc).__name__}: {exc}"


def _answer(approval: Any) -> dict[str, Any]:
    """A recorded decision as the paused graph reads it."""
    given = (
        ("decision", approval.decision),
        ("args", approval.edited_args),
        ("reason", approval.reason),
    )
    return {key: value for key, value in given if value is not None}


def _token_role(namespace: tuple[str, ...], metadata: dict[str, Any]) -> str:
    """The role whose model streamed a token: the agent's name where its agent says it,
    else the team graph's node the token came from (the outermost of ``namespace``, as
    ``node:task_id``). The node inside that subgraph is not the role: the tool-calling
    supervisor's model runs in langgraph-supervisor's node ``agent``."""
    if name := metadata.get("lc_agent_name"):
        return str(name)
    if namespace:
        return namespace[0].split(":", 1)[0]
    return str(metadata.get("langgraph_node"))


def _token_text(chunk: Any) -> str:
    from langchain_core.messages import AIMessageChunk

    return chunk.text if isinstance(chunk, AIMessageChunk) else ""


def _pending_reason(pending: list[dict[str, Any]]) -> str:
    first = pending[0]
    if first.get("type") == "approval":
        return f"awaiting approval: {first['agent']} wants to run {first['tool']}"
    return f"awaiting a decision: {first.get('detail', first.get('type'))}"


@contextmanager
def _drain_when(
    control: Any, *, cancel: threading.Event | None, stop: threading.Event | None
) -> Iterator[None]:
    """While in the block, ask ``control`` to drain as soon as ``cancel`` or ``stop`` is set.

    A :class:`DrainSignal` asks as it is set, in the thread that sets it; a plain event is
    watched from a thread, so that the request reaches LangGraph before its next step
    boundary even when the step in progress emits no event (a long model or tool call):
    one thread for every run of the process (:class:`_DrainWatch`), not one per run.
    """
    if cancel is None and stop is None:
        yield
        return
    token = _DRAIN_WATCH.watch(control, cancel, stop)
    try:
        yield
    finally:
        _DRAIN_WATCH.unwatch(token)


class DrainSignal(threading.Event):
    """A cancel or stop event that, once set, asks every run watching it to drain at once,
    in the thread that sets it (:meth:`_DrainWatch.drain_now`): no thread looks at it
    again and again. A server's task workers make their runs' events this way: with
    hundreds of tasks in flight, looking at every run's event 20 times a second held the
    interpreter from the runs."""

    def set(self) -> None:
        super().set()
        _DRAIN_WATCH.drain_now(self)


_Watched = tuple[Any, threading.Event | None, threading.Event | None]


class _DrainWatch:
    """The cancel and stop events of every run of the process: a :class:`DrainSignal`
    drains its runs as it is set; the plain events are looked at every
    :data:`POLL_SECONDS` by one thread, which ends while none is watched.

    A thread per run cost each run a thread's start and end on its own path, and each of
    them woke the interpreter twenty times a second: with 8 runs at once, 160 times a
    second, each time taking the interpreter from a run that was working. Plain
    ``threading.Event`` objects that callers own (``TaskRunner.run``'s ``cancel`` and
    ``stop``) cannot call back when set: hence a look every 50 ms at those.
    """

    POLL_SECONDS = 0.05

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[object, _Watched] = {}
        self._polled: dict[object, _Watched] = {}
        """The runs with a plain event, which the thread looks at."""
        self._thread: threading.Thread | None = None

    def forget(self) -> None:
        """In a forked child: none of the parent's runs or its thread are here, and its
        lock may have been copied held."""
        self._lock = threading.Lock()
        self._runs, self._polled, self._thread = {}, {}, None

    def watch(
        self, control: Any, cancel: threading.Event | None, stop: threading.Event | None
    ) -> object:
        token = object()
        run = (control, cancel, stop)
        with self._lock:
            self._runs[token] = run
            if any(e is not None and not isinstance(e, DrainSignal) for e in (cancel, stop)):
                self._polled[token] = run
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="relaygraph-drain", daemon=True
                    )
                    self._thread.start()
        # An event set before the run was watched here asked no one: ask now. One set
        # after finds the run watched (drain_now reads under the lock taken above).
        why = _why(cancel, stop)
        if why is not None:
            self._drain(token, control, why)
        return token

    def unwatch(self, token: object) -> None:
        with self._lock:
            self._runs.pop(token, None)
            self._polled.pop(token, None)

    def drain_now(self, event: threading.Event) -> int:
        """Ask every watched run whose cancel or stop event is ``event`` (set by the
        caller) to drain now, in the caller's thread, rather than at the next look: a
        cancel asked for through the API then reaches the run before the API answers,
        however busy the machine (the look could come after the step in progress had
        finished and the run gone on). Returns how many runs were asked."""
        with self._lock:
            runs = [(t, run) for t, run in self._runs.items() if event in (run[1], run[2])]
        for token, (control, cancel, _) in runs:
            self._drain(token, control, "cancel" if cancel is event else "shutdown")
        return len(runs)

    def _drain(self, token: object, control: Any, why: str) -> None:
        """Ask one run to drain (once: it is watched no more)."""
        self.unwatch(token)
        try:
            control.request_drain(why)
        except Exception:  # One run's must not stop every run's watch.
            log.exception("asking a run to drain (%s) failed", why)

    def _loop(self) -> None:
        while True:
            time.sleep(self.POLL_SECONDS)
            with self._lock:
                if not self._polled:
                    self._thread = None
                    return
                runs = list(self._polled.items())
            for token, (control, cancel, stop) in runs:
                why = _why(cancel, stop)
                if why is not None:
                    self._drain(token, control, why)


def _why(cancel: threading.Event | None, stop: threading.Event | None) -> str | None:
    """Why a run watching ``cancel`` and ``stop`` drains now (None: it does not)."""
    if cancel is not None and cancel.is_set():
        return "cancel"
    if stop is not None and stop.is_set():
        return "shutdown"
    return None


_DRAIN_WATCH = _DrainWatch()
os.register_at_fork(after_in_child=_DRAIN_WATCH.forget)
