"""What a served env allows: the token, the size and pace of HTTP requests, the session quota
and deadlines (:class:`ServerLimits`, ``corrgrpo serve``'s flags), and the fixed limits beside them.

:mod:`~corrgrpo_envs.integrations.openenv_middleware` and
:mod:`~corrgrpo_envs.integrations.openenv_sessions` apply them.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

__all__ = [
    "TOKEN_VARIABLE",
    "ServerLimits",
    "is_loopback",
]

#: The served env's limits log under one name, whichever module applies them: a user's
#: logging config names ``openenv_limits``, the module ``corrgrpo serve`` imports them from.
log = logging.getLogger("corrgrpo_envs.integrations.openenv_limits")

#: The environment variable ``corrgrpo serve`` reads the shared token from (``--token`` wins).
TOKEN_VARIABLE = "CORRGRPO_OPENENV_TOKEN"
#: Paths served without the token (a load balancer's or a scheduler's liveness probe).
OPEN_PATHS = frozenset({"/health"})
#: HTTP requests inside the app at once. A session's message then waits behind at most one
#: request's turn on the event loop (a few ms). Under the task-listing and stateless-request
#: flood of tests/test_openenv_server_limits.py on a loaded two-core machine, a session's p99
#: round trip was 17-64 ms with 1 (six runs), 60-74 ms with 2, 100-146 ms with 4 and
#: 251-338 ms unlimited (two runs each).
HTTP_CONCURRENCY = 1
#: HTTP requests waiting for their turn; beyond this a request is refused at once (503).
HTTP_QUEUE = 64
#: Seconds a client has to send an HTTP body (a trickled body is refused with 408).
BODY_DEADLINE_S = 30.0
#: Seconds the app has to answer one HTTP request (else 503, and the next request goes in).
REQUEST_DEADLINE_S = 120.0
#: Calls waiting for the route env's worker thread; beyond this a request gets 503.
ROUTE_QUEUE = 32
#: Task listings kept (by route and arguments) after their first answer.
LISTING_CACHE = 256

#: A WebSocket session past its maximum age is closed between episodes once its client has
#: been quiet this long (closing it just as an episode ends would race the client's next
#: reset); a client that never pauses keeps it until ``session_idle_s`` past the age.
AGE_QUIET_S = 2.0
#: The close code of a connection refused for a limit that frees up with time (RFC 6455: try again later).
TRY_AGAIN_LATER = 1013
#: The close code of a session the server ended (idle, too old, or its slot given to another client).
GOING_AWAY = 1001


@dataclass(frozen=True)
class ServerLimits:
    """What a served env allows (``corrgrpo serve``'s flags).

    Attributes:
        tokens: the tokens every path but ``/health`` needs, any one of them (none: no token
            needed). Each token is one client for the quota and the connection rate.
        session_idle_s: a WebSocket session whose client neither resets nor steps this long
            is closed (``state`` requests do not count).
        detached_s: a session with no WebSocket attached (made over HTTP ``/mcp``, or
            whose WebSocket closed) is closed after this long without a request; a WebSocket
            session between episodes, quiet this long, gives its slot to a new client when
            the server is full.
        session_max_age_s: a WebSocket session older than this is closed between episodes
            (mid-episode, ``session_idle_s`` later); OpenEnv's client opens a new one on its
            next call.
        sessions_per_client: sessions one client may hold at once (``None``: half the
            server's sessions, at least 1).
        connections_per_s: new WebSocket connections a client may open each second, after a
            burst of one per session of its quota.
        concurrent_builds: session envs built at once (each on its session's first reset).
        serve_references: ``/{name}/task`` answers the env's reference messages (else 403).
    """

    tokens: tuple[str, ...] = ()
    session_idle_s: float = 600.0
    detached_s: float = 60.0
    session_max_age_s: float = 3600.0
    sessions_per_client: int | None = None
    connections_per_s: float = 5.0
    concurrent_builds: int = 1
    serve_references: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))  # a list when read back from JSON
        for name in ("session_idle_s", "detached_s", "session_max_age_s", "connections_per_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("sessions_per_client", "concurrent_builds"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        if any(not t for t in self.tokens):
            raise ValueError("a token is empty")

    def quota(self, max_sessions: int) -> int:
        """Sessions one client may hold on a server of ``max_sessions``."""
        return self.sessions_per_client or max(1, int(max_sessions) // 2)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

