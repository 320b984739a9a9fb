"""LangSmith: one trace per task, agent runs named by agent, handoffs that are not errors.

LangChain's tracer records every exception that leaves a run as that run's error. A
handoff leaves an agent's graph as LangGraph's ``ParentCommand`` and a pause for a person
as ``GraphInterrupt``, so out of the box the handoff tool's node and the whole agent
subgraph show as failed (langgraph-supervisor #40, langsmith-sdk #1127).
:class:`LangSmithTracer` ends those runs normally, with what happened as their output.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from langchain_core.tracers.langchain import LangChainTracer
from langchain_core.tracers.schemas import Run
from langgraph.errors import GraphInterrupt, ParentCommand

from relaygraph._names import SUPERVISOR
from relaygraph.events import handoff_result
from relaygraph.tracing import _runs
from relaygraph.tracing._runs import RunTree


def _annotate(run: Run, *, tags: tuple[str, ...] = (), **metadata: Any) -> None:
    # The metadata dict can be shared with sibling runs: replace it, never mutate it.
    run.extra["metadata"] = {**run.metadata, **metadata}
    if tags:
        run.tags = sorted({*(run.tags or []), *tags})


def _event(run: Run, name: str, **kwargs: Any) -> None:
    run.events.append({"name": name, "time": datetime.now(UTC).isoformat(), "kwargs": kwargs})


class LangSmithTracer(LangChainTracer):
    """LangChain's LangSmith tracer, aware of the team graph.

    - An agent visit's run (a direct child of the task's run) gets ``relaygraph_agent``
      and ``relaygraph_role`` metadata beside LangGraph's ``langgraph_node`` and
      ``langgraph_checkpoint_ns``.
    - A run that a ``ParentCommand`` or ``GraphInterrupt`` passes through ends without
      an error; its output says ``handoff`` (from, to, task, reason) or ``interrupted``.
    - The agent run that handed off gets ``relaygraph_handoff`` metadata, a ``handoff``
      event and the ``handoff`` tag; the ``transfer_to_<peer>`` tool run gets the same
      metadata and tag: the handoff's own run.
    - Routes, violations and budget hits become events and metadata on the node's run.

    Real errors are recorded as LangChain records them. Pass it in the graph call's
    ``callbacks``: LangChain then adds no tracer of its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tree = RunTree()
        self._tree_lock = threading.Lock()

    def copy_with_metadata_defaults(
        self,
        *,
        metadata: Mapping[str, str] | None = None,
        tags: list[str] | None = None,
    ) -> LangChainTracer:
        copy = super().copy_with_metadata_defaults(metadata=metadata, tags=tags)
        if isinstance(copy, LangSmithTracer):
            # Copies serve the same task: they share what is known about its runs.
            copy._tree, copy._tree_lock = self._tree, self._tree_lock
        return copy

    def _on_chain_start(self, run: Run) -> None:
        with self._tree_lock:
            is_node = self._tree.start(run.id, run.parent_run_id, run.name)
            role = _runs.node_role(run.name) if run.id != self._tree.root else None
        if is_node and role is not None:
            _annotate(run, relaygraph_agent=run.name, relaygraph_role=role)
        super()._on_chain_start(run)

    def on_chain_end(
        self,
        outputs: Any,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Run:
        with self._tree_lock:
            name = self._tree.nodes.get(run_id)
            self._tree.forget(run_id)
        run = self.run_map.get(str(run_id))
        if name is not None and run is not None:
            self._record_node(run, name, _runs.node_records(outputs))
        return super().on_chain_end(outputs, run_id=run_id, inputs=inputs, **kwargs)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        inputs: dict[str, Any] | None = None,
        run_id: UUID,
        **kwargs: Any,
    ) -> Run:
        if not _runs.is_control_flow(error) or str(run_id) not in self.run_map:
            with self._tree_lock:
                self._tree.forget(run_id)
            return super().on_chain_error(error, inputs=inputs, run_id=run_id, **kwargs)
        run = self.run_map[str(run_id)]
        self._mark_control_flow(run, error)
        name = self._tree.nodes.get(run_id)
        if name is not None and isinstance(error, ParentCommand) and error.args:
            # A team node that leaves with a command to the team graph (the tool
            # supervisor's transfers and answer): its records travel in the command.
            self._record_node(run, name, _runs.node_records(error.args[0]))
        return self.on_chain_end(
            self._control_flow_output(error), run_id=run_id, inputs=inputs, **kwargs
        )

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> Run:
        run = self.run_map.get(str(run_id))
        if run is not None and (handoff := _runs.handoff_of(output)) is not None:
            _annotate(run, tags=("handoff",), relaygraph_handoff=handoff_result(handoff))
        return super().on_tool_end(output, run_id=run_id, **kwargs)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> Run:
        if _runs.is_control_flow(error) and str(run_id) in self.run_map:
            self._mark_control_flow(self.run_map[str(run_id)], error)
            return super().on_tool_end(self._control_flow_output(error), run_id=run_id, **kwargs)
        return super().on_tool_error(error, run_id=run_id, **kwargs)

    @staticmethod
    def _control_flow_output(error: BaseException) -> dict[str, Any]:
        if (handoff := _runs.handoff_of(error)) is not None:
            return {"handoff": handoff_result(handoff)}
        if isinstance(error, ParentCommand):
            command = error.args[0] if error.args else None
            return {"command": {"goto": str(getattr(command, "goto", ""))}}
        if isinstance(error, GraphInterrupt):
            return {"interrupted": _runs.interrupt_values(error)}
        return {"stopped": _runs.control_flow_kind(error)}

    @staticmethod
    def _mark_control_flow(run: Run, error: BaseException) -> None:
        _annotate(run, relaygraph_control_flow=_runs.control_flow_kind(error))

    def _record_node(self, run: Run, name: str, records: _runs.NodeRecords) -> None:
        metadata: dict[str, Any] = {}
        tags: list[str] = []
        if records.ended:
            metadata["relaygraph_ended"] = records.ended
        is_router = _runs.node_role(name) == SUPERVISOR
        for handoff in records.handoffs:
            if handoff["kind"] == "route":
                metadata["relaygraph_route"] = handoff_result(handoff)
                _event(run, "route", **handoff_result(handoff))
            elif is_router:
                # The tool supervisor passing on an agent's own handoff.
                metadata["relaygraph_relay"] = handoff_result(handoff)
                _event(run, "relay", **handoff_result(handoff))
            else:
                metadata["relaygraph_handoff"] = handoff_result(handoff)
                tags.append("handoff")
                _event(run, "handoff", **handoff_result(handoff))
        if (
            is_router
            and records.goto is not None
            and not {"relaygraph_route", "relaygraph_relay"} & set(metadata)
        ):
            metadata["relaygraph_route"] = {"from": name, "to": records.goto}
        violations = [
            {"kind": v.get("kind"), "agent": v.get("agent"), "detail": v.get("detail")}
            for v in records.violations
        ]
        for violation in violations:
            _event(run, "budget_hit" if violation["kind"] == "budget" else "violation", **violation)
        if violations:
            metadata["relaygraph_violations"] = violations
        if records.usage is not None:
            keys = ("model_calls", "tool_calls", "input_tokens", "output_tokens", "cost_usd")
            metadata["relaygraph_usage"] = {k: records.usage.get(k) for k in keys}
        if records.stop_reason:
            metadata["relaygraph_stop_reason"] = records.stop_reason
        if metadata or tags:
            _annotate(run, tags=tuple(tags), **metadata)
