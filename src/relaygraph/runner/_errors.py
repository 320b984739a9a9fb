"""Why the runner refuses a request before it records anything: the field at fault, a
stable code, and whether the request is wrong, names nothing, or comes at the wrong time."""

from __future__ import annotations

from typing import Literal

from relaygraph.errors import ConfigError

__all__ = ["RefusalKind", "RequestRefused"]

RefusalKind = Literal["invalid", "not_found", "conflict"]
"""``invalid``: the request itself is wrong. ``not_found``: it names a task or an approval
that does not exist. ``conflict``: it is valid, but what it names is not in a state that
takes it now (a busy thread, an approval decided already)."""


class RequestRefused(ConfigError):
    """A task submission or a decision the runner refuses before it records anything.

    The CLI prints the message; the HTTP API answers with ``code`` and ``field`` (422 for
    ``invalid``, 404 for ``not_found``, 409 for ``conflict``).

    Attributes:
        field: The request field at fault, as :class:`~relaygraph.runner.TaskRequest` and
            :class:`~relaygraph.runner.Decision` name it (``input``, ``model``,
            ``agent_models.coder``, ``policy``, ``start_agent``, ``thread_id``,
            ``idempotency_key``, ``approval_id``, ``args``); None when no one field is.
        code: Stable and machine-readable: ``invalid_request``, ``invalid_model``,
            ``model_not_allowed``, ``invalid_policy``, ``policy_loosens``,
            ``invalid_topology``, ``thread_busy``, ``idempotency_key_reused``,
            ``task_not_found``, ``approval_not_found``, ``not_waiting``.
        kind: Whether the request is wrong, names nothing, or comes at the wrong time.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None,
        code: str = "invalid_request",
        kind: RefusalKind = "invalid",
    ) -> None:
        self.field = field
        self.code = code
        self.kind: RefusalKind = kind
        super().__init__(message)
