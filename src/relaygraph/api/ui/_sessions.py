"""Dashboard sessions: who is signed in, kept on the server, named by a signed cookie.

The browser holds only a random session id with an HMAC signature (an HttpOnly,
SameSite=Strict cookie); the API key it signed in with is checked once and never stored,
sent back, put in a URL or logged. A session ends on sign-out, after a configurable idle
time, or as soon as the key it was opened with is revoked.

Sessions live in the server process: a restart signs everyone out, and several servers
behind one address need sticky sessions (see docs/dashboard.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

COOKIE = "relaygraph_session"
LOGIN_COOKIE = "relaygraph_login"
"""Holds the sign-in form's CSRF token before there is a session (a double-submit cookie)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DashboardSession:
    """One signed-in browser."""

    id: str
    project_id: str
    project_name: str
    key_ids: tuple[str, ...]
    """The ledger ids of the API key it signed in with (a key is told apart by its prefix);
    the session ends when none of them is live any more."""
    csrf: str
    """The token every form post of this session carries."""
    last_seen: float
    """``time.monotonic()`` of the last request a person made (automatic refreshes do
    not count)."""


@dataclass(kw_only=True)
class SessionStore:
    """The dashboard's sessions, in memory, safe to share between threads.

    Args:
        idle_seconds: A session unused this long ends.
        clock: The time source (tests pass their own).
    """

    idle_seconds: float
    clock: Callable[[], float] = time.monotonic
    _secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _sessions: dict[str, DashboardSession] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, *, project_id: str, project_name: str, key_ids: tuple[str, ...]) -> str:
        """Start a session; returns the cookie value that names it."""
        session = DashboardSession(
            id=secrets.token_urlsafe(32),
            project_id=project_id,
            project_name=project_name,
            key_ids=key_ids,
            csrf=secrets.token_urlsafe(32),
            last_seen=self.clock(),
        )
        with self._lock:
            self._drop_idle()
            self._sessions[session.id] = session
        return f"{session.id}.{self.sign(session.id)}"

    def find(self, cookie: str | None, *, touch: bool) -> tuple[DashboardSession | None, bool]:
        """The live session a cookie names.

        Args:
            cookie: The cookie's value, as the browser sent it.
            touch: Count this request as activity (a person's click, not a refresh).

        Returns:
            The session or None, and whether a session existed but ran out of time (for the
            sign-in page to say so).
        """
        session_id = self.verified(cookie)
        if session_id is None:
            return None, False
        now = self.clock()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None, False
            if now - session.last_seen > self.idle_seconds:
                del self._sessions[session_id]
                return None, True
            if touch:
                session = replace(session, last_seen=now)
                self._sessions[session_id] = session
            return session, False

    def close(self, cookie: str | None) -> None:
        """End the session the cookie names, if any (sign-out)."""
        session_id = self.verified(cookie)
        if session_id is not None:
            with self._lock:
                self._sessions.pop(session_id, None)

    def end(self, session_id: str) -> None:
        """End a session by its id (its key was revoked)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def sign(self, value: str) -> str:
        return hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()

    def verified(self, cookie: str | None) -> str | None:
        """The session id in a cookie whose signature holds, else None."""
        if not cookie or cookie.count(".") != 1:
            return None
        session_id, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self.sign(session_id)):
            return None
        return session_id

    def _drop_idle(self) -> None:
        now = self.clock()
        for session_id in [
            s.id for s in self._sessions.values() if now - s.last_seen > self.idle_seconds
        ]:
            del self._sessions[session_id]


def same_token(given: str | None, expected: str) -> bool:
    """Whether a posted CSRF token is the expected one (in constant time)."""
    return bool(given) and hmac.compare_digest(str(given), expected)
