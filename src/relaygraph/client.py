"""A Python client for the task service (``relaygraph serve``), on httpx.

    from relaygraph.client import Client

    with Client("http://127.0.0.1:8000", key) as client:
        task = client.submit("When are checkpoints written?")
        for event in client.events(task["id"]):
            print(event["id"], event["event"], event["data"])
        print(client.get(task["id"])["answer"])

Every HTTP error becomes an :class:`ApiError` carrying the server's stable error ``code``.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import httpx

from relaygraph.errors import ConfigError, RelaygraphError

__all__ = ["FINISHED", "STOPPED", "ApiError", "Client"]

FINISHED: tuple[str, ...] = ("succeeded", "degraded", "failed", "cancelled")
"""Statuses a task never leaves."""
STOPPED: tuple[str, ...] = (*FINISHED, "interrupted")
"""Statuses at which a task is not running: finished, or waiting for a person."""


class ApiError(RelaygraphError):
    """The server answered with an error.

    Attributes:
        status: The HTTP status (401, 404, 409, 413, 422, ...).
        code: The server's stable error code (``task_not_found``, ``thread_busy``, ...).
        message: What went wrong, naming the bad field.
        field: The request field at fault, when the server named one.
    """

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        where = f" [{field}]" if field else ""
        super().__init__(f"{status} {code}{where}: {message}")

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """Build the error from a response's JSON error body (``{"error": {...}}``)."""
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "code" in error:
            return cls(
                response.status_code,
                str(error["code"]),
                str(error.get("message", "")),
                error.get("field"),
            )
        text = response.text.strip()[:500] or response.reason_phrase
        return cls(response.status_code, "http_error", text)


class Client:
    """A synchronous client for one project: its API key decides which tasks it sees.

    Args:
        url: The server's base URL, for example ``http://127.0.0.1:8000``.
        key: The project's API key (``relaygraph projects create NAME`` prints one).
        timeout: Seconds to wait for each response (event streams wait as long as the
            task runs).
        transport: An httpx transport to use instead of the network (tests pass
            ``httpx.ASGITransport`` or ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str,
        key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base = url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        self.url = base
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise ApiError.from_response(response)
        return response.json()

    # Tasks

    def submit(
        self,
        input: str,
        *,
        thread_id: str | None = None,
        policy: Mapping[str, Any] | None = None,
        model: str | None = None,
        agent_models: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        multitask: Literal["reject", "enqueue"] | None = None,
        idempotency_key: str | None = None,
        topology: Literal["structured", "swarm", "supervisor-tools"] | None = None,
        start_agent: str | None = None,
        output_mode: Literal["last_message", "full_history"] | None = None,
        team: str | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        """Submit a task (``POST /v1/tasks``); it runs in the background.

        Args:
            input: What the team should do.
            thread_id: Continue this conversation; a new thread when None.
            policy: Policy-file-shaped overrides; they may only tighten the team's limits.
            model: Model spec for every role (must be on the server's allowlist).
            agent_models: Model spec per role (``coder``, ``supervisor``, ...).
            metadata: Your own JSON object, kept with the task.
            multitask: When the thread is busy: ``reject`` (the default, 409
                ``thread_busy``) or ``enqueue`` (run after the thread's current task).
            idempotency_key: A retry with the same key returns the task the first try
                created instead of creating another.
            topology: How the agents are arranged (default ``structured``); a thread keeps
                the topology it started with.
            start_agent: ``swarm`` only: the agent a new thread starts with.
            output_mode: ``supervisor-tools`` only: ``last_message`` or ``full_history``.
            team: The team to run: one the project registered (:meth:`push_team`), one the
                server loads, or ``default`` (the built-in team, also when None).
            version: The registered team's version; its latest when None.

        Returns:
            The task as the server recorded it (status ``queued`` or ``running``).

        Raises:
            ApiError: 409 ``thread_busy``, 413, 422 naming the bad field, and so on.
        """
        body: dict[str, Any] = {"input": input}
        optional = {
            "thread_id": thread_id,
            "policy": None if policy is None else dict(policy),
            "model": model,
            "agent_models": None if agent_models is None else dict(agent_models),
            "metadata": None if metadata is None else dict(metadata),
            "multitask": multitask,
            "topology": topology,
            "start_agent": start_agent,
            "output_mode": output_mode,
            "team": team,
            "version": version,
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        task: dict[str, Any] = self._call("POST", "/v1/tasks", json=body, headers=headers)
        return task

    def replay(
        self,
        task_id: str,
        *,
        from_step: int = 0,
        team: str | None = None,
        version: int | None = None,
        model: str | None = None,
        agent_models: Mapping[str, str] | None = None,
        policy: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Replay a recorded task as a new one (``POST /v1/tasks/{id}/replay``): from its
        request, or after its first ``from_step`` steps (their tool calls are not run
        again, and the replay starts in a copy of the task's workspace), with another team
        version, model or a tighter policy. The original is not changed; the new task names
        it in ``replay_of``.

        Args:
            idempotency_key: A retry with the same key returns the replay the first try
                created instead of creating another.

        Raises:
            ApiError: 404 ``task_not_found`` (also for another project's task), 422 naming
                the bad field (``from_step`` past the task's steps, a policy that loosens,
                ``workspace_quota_exceeded``), 409 ``idempotency_key_reused``.
        """
        body: dict[str, Any] = {"from_step": from_step}
        optional = {
            "team": team,
            "version": version,
            "model": model,
            "agent_models": None if agent_models is None else dict(agent_models),
            "policy": None if policy is None else dict(policy),
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        headers = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        task: dict[str, Any] = self._call(
            "POST", f"/v1/tasks/{task_id}/replay", json=body, headers=headers
        )
        return task

    def diff(self, task_a: str, task_b: str) -> dict[str, Any]:
        """Two tasks' trajectories aligned by step (``GET /v1/tasks/{a}/diff/{b}``), with
        ``summary.first_divergence`` and the differences summed."""
        diff: dict[str, Any] = self._call("GET", f"/v1/tasks/{task_a}/diff/{task_b}")
        return diff

    def get(self, task_id: str) -> dict[str, Any]:
        """The task now (``GET /v1/tasks/{id}``): status, answer, stop reason, times.

        Raises:
            ApiError: 404 ``task_not_found`` (also for another project's task).
        """
        task: dict[str, Any] = self._call("GET", f"/v1/tasks/{task_id}")
        return task

    def list(
        self, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page of the project's tasks, newest first (``GET /v1/tasks``).

        Args:
            status: Only tasks with this status.
            limit: Page size, 1 to 200.
            cursor: The ``next_cursor`` of the previous page.

        Returns:
            A dict, one page (unlike :meth:`teams`, which returns a list):
            ``{"tasks": [...], "next_cursor": str | None}``; None on the last page.
        """
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if cursor is not None:
            params["cursor"] = cursor
        page: dict[str, Any] = self._call("GET", "/v1/tasks", params=params)
        return page

    def wait(
        self,
        task_id: str,
        *,
        timeout: float = 300,
        poll: float = 0.2,
        until: tuple[str, ...] = STOPPED,
    ) -> dict[str, Any]:
        """Poll the task until its status is one of ``until``.

        Args:
            task_id: The task.
            timeout: Seconds to wait before giving up.
            poll: Seconds between polls.
            until: The statuses to wait for; by default any at which the task stopped,
                ``interrupted`` (waiting for a person) included.

        Returns:
            The task at that status.

        Raises:
            TimeoutError: The task did not reach one of ``until`` in ``timeout`` seconds.
            ApiError: The server refused the request (404 for an unknown task).
        """
        deadline = time.monotonic() + timeout
        while True:
            task = self.get(task_id)
            if task["status"] in until:
                return task
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"task {task_id} is still {task['status']!r} after {timeout:g} s "
                    f"(waiting for {', '.join(until)})"
                )
            time.sleep(poll)

    def events(
        self, task_id: str, *, after: int = 0, retry_for: float = 30.0
    ) -> Iterator[dict[str, Any]]:
        """Follow the task's events (``GET /v1/tasks/{id}/events``, Server-Sent Events).

        A finished task's events replay from the ledger and the iterator ends. A running
        task's events arrive as they happen; the iterator ends when the task finishes. If
        the connection drops before that, the client reconnects with ``Last-Event-ID`` so
        that no event is lost or repeated.

        Args:
            task_id: The task.
            after: Start after this sequence number (0: from the first event).
            retry_for: Give up after this many seconds without a successful connection.

        Yields:
            ``{"id": int, "event": str, "data": dict}`` in sequence order.

        Raises:
            ApiError: The server refused the stream (404 for an unknown task).
            httpx.TransportError: The server could not be reached for ``retry_for`` seconds.
        """
        last = after
        failing_since: float | None = None
        while True:
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = str(last)
            timeout = httpx.Timeout(self.timeout, read=None)
            try:
                with self._http.stream(
                    "GET", f"/v1/tasks/{task_id}/events", headers=headers, timeout=timeout
                ) as response:
                    if response.is_error:
                        response.read()
                        raise ApiError.from_response(response)
                    failing_since = None
                    for event in _parse_sse(response.iter_lines()):
                        last = event["id"]
                        yield event
            except httpx.TransportError:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > retry_for:
                    raise
                time.sleep(0.5)
                continue
            # The server closes the stream when the task has finished; a close for any
            # other reason (a restart, a proxy timeout) is followed by a reconnect. A task
            # that finished while the stream was down has events this client has not seen
            # yet: the reconnect replays them, and the stream after it ends.
            try:
                task = self.get(task_id)
                if task["status"] in FINISHED and task["last_event_seq"] <= last:
                    return
            except httpx.TransportError:
                failing_since = failing_since or time.monotonic()
                time.sleep(0.5)

    def cancel(self, task_id: str) -> dict[str, Any]:
        """Cancel the task (``POST /v1/tasks/{id}/cancel``).

        A queued or interrupted task is cancelled at once; a running one stops at its next
        step boundary, so its status turns ``cancelled`` shortly after (use :meth:`wait`).

        Raises:
            ApiError: 409 ``task_finished`` when it has finished already.
        """
        task: dict[str, Any] = self._call("POST", f"/v1/tasks/{task_id}/cancel")
        return task

    # Teams

    def push_team(
        self,
        name: str,
        *,
        toml: str | None = None,
        definition: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Register a version of a team for the project (``PUT /v1/teams/{name}``).

        Args:
            name: The team's name, as tasks name it (a ``name`` in the file is replaced).
            toml: The team file's text.
            definition: Or its content as a mapping (give exactly one).

        Returns:
            The version: ``name``, ``version``, ``digest``, ``agents``, ``created`` (False:
            the team was unchanged, and this is its latest version).

        Raises:
            ApiError: 422 ``invalid_team`` naming the key (a reference the server does not
                allow included), 409 ``team_name_taken``.
        """
        body: dict[str, Any] = {"toml": toml} if toml is not None else {}
        if definition is not None:
            body["definition"] = dict(definition)
        team: dict[str, Any] = self._call("PUT", f"/v1/teams/{name}", json=body)
        return team

    def teams(self) -> builtins.list[dict[str, Any]]:
        """The teams the project may run (``GET /v1/teams``): the built-in team, the
        server's own, and the latest version of each of the project's.

        Returns:
            A list, every team at once (teams are few, so they come in no pages, unlike
            :meth:`list`'s tasks): the body's ``teams``, each a dict with ``name``,
            ``origin`` (``builtin``, ``server``, ``project``), ``version`` and ``digest``.
        """
        body = self._call("GET", "/v1/teams")
        teams: builtins.list[dict[str, Any]] = body["teams"]
        return teams

    def team(self, name: str, version: int | None = None) -> dict[str, Any]:
        """A team with every version (``GET /v1/teams/{name}``); with ``version``, that
        version with its definition (``GET /v1/teams/{name}/versions/{version}``).

        Raises:
            ApiError: 404 ``team_not_found`` (also for another project's team).
        """
        path = f"/v1/teams/{name}" + (f"/versions/{version}" if version is not None else "")
        team: dict[str, Any] = self._call("GET", path)
        return team

    # Approvals

    def approvals(self, task_id: str) -> builtins.list[dict[str, Any]]:
        """The task's pauses for a person, oldest first, decided or not.

        Each has ``id`` (the approval id), ``kind``, ``agent``, ``tool``, ``args``, and
        ``decision``/``decided_by``/``reason`` once decided.
        """
        body = self._call("GET", f"/v1/tasks/{task_id}/approvals")
        approvals: builtins.list[dict[str, Any]] = body["approvals"]
        return approvals

    def approve(
        self,
        task_id: str,
        approval_id: str | None = None,
        *,
        decision: Literal["approve", "reject", "edit"] = "approve",
        args: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Decide what an interrupted task waits for; the task resumes from its checkpoint.

        Args:
            task_id: The interrupted task.
            approval_id: The approval to decide; None for the task's only pending one.
            decision: ``approve`` (run the tool as asked), ``reject`` (the model is told)
                or ``edit`` (run it with ``args`` instead).
            args: The replacement arguments, for ``edit``.
            reason: Why; recorded, and shown to the model on a rejection.

        Returns:
            The task, now running again.

        Raises:
            ConfigError: ``approval_id`` is None and the task has no pending approval, or
                several.
            ApiError: 404 ``approval_not_found``; 409 ``not_waiting`` when it was decided
                already or the task is not waiting.
        """
        if approval_id is None:
            pending = [a for a in self.approvals(task_id) if a.get("decision") is None]
            if len(pending) != 1:
                raise ConfigError(
                    f"task {task_id} has {len(pending)} pending approvals; "
                    "name the one to decide with approval_id"
                )
            approval_id = str(pending[0]["id"])
        body: dict[str, Any] = {"decision": decision}
        if args is not None:
            body["args"] = dict(args)
        if reason is not None:
            body["reason"] = reason
        task: dict[str, Any] = self._call(
            "POST", f"/v1/tasks/{task_id}/approvals/{approval_id}", json=body
        )
        return task

    # Records

    def handoffs(self, task_id: str) -> builtins.list[dict[str, Any]]:
        """Every transfer of work in the task, in order (``GET /v1/tasks/{id}/handoffs``).

        Each has ``kind`` (``route`` or ``direct``), ``from``, ``to``, ``task``,
        ``reason``, ``step``, ``checkpoint_ns``, ``tokens_so_far`` and ``at``.
        """
        body = self._call("GET", f"/v1/tasks/{task_id}/handoffs")
        handoffs: builtins.list[dict[str, Any]] = body["handoffs"]
        return handoffs

    def usage(
        self, since: datetime | str | None = None, until: datetime | str | None = None
    ) -> dict[str, Any]:
        """What the project's tasks created in ``[since, until)`` used (``GET /v1/usage``).

        Args:
            since: Start of the range (a time-zone-aware datetime or ISO 8601 text).
            until: End of the range, excluded.

        Returns:
            ``{"project_id", "since", "until", "tasks", "total": {...}, "agents": {...}}``.
        """
        params = {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in (("since", since), ("until", until))
            if value is not None
        }
        usage: dict[str, Any] = self._call("GET", "/v1/usage", params=params)
        return usage

    def project(self) -> dict[str, Any]:
        """The key's project, its quotas and what it uses now (``GET /v1/projects/me``).

        Returns:
            ``{"id", "name", "quotas": {"max_running", "max_queued", "daily_cost_usd",
            "max_streams"}, "usage": {"running", "queued", "cost_today_usd", "streams"},
            "day_started_at"}``; a quota of None has no limit.
        """
        me: dict[str, Any] = self._call("GET", "/v1/projects/me")
        return me


def _parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Server-Sent Events from a stream of lines: one dict per event that has an id."""
    event_id: str | None = None
    kind = "message"
    data: builtins.list[str] = []
    for line in lines:
        if not line:
            if data and event_id is not None and event_id.isdigit():
                yield {"id": int(event_id), "event": kind, "data": json.loads("\n".join(data))}
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue  # A comment: the server's keep-alive ping.
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event_id = value
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)
