"""The limits of a served env: who may call it, what one request may cost, how long a session lives.

``corrgrpo serve`` runs OpenEnv's own server (the routes of :class:`HTTPEnvServer` under
uvicorn). This module bounds it through ASGI's and OpenEnv's extension points; no route
is re-implemented:

* :class:`BoundaryMiddleware` wraps the app. With a token, every path but ``/health``
  needs ``Authorization: Bearer <token>`` (HTTP 401, and 401 on the WebSocket handshake).
  A refusal writes nothing to the server's log at its default level, so a flood of
  refused peers cannot fill a log or a pipe the server writes to.
  An HTTP body larger than the WebSocket frame cap is refused with 413 before it is read
  (a larger ``Content-Length``, or a streamed body as soon as it passes the cap). HTTP
  requests run one at a time and a bounded number wait (503 beyond), so a flood of cheap
  requests cannot take the event loop from the sessions. New WebSocket connections are
  rate-limited per client (:mod:`~corrgrpo_envs.integrations.openenv_admission`; refused
  with close code 1013 and the reason). A WebSocket session is closed (code 1001) when
  its client has neither reset nor stepped for ``session_idle_s`` (a ``state`` request is
  not activity), or once it is older than ``session_max_age_s``.
* :class:`LimitedEnvServer` is OpenEnv's server with a session policy and no env work on
  the event loop. Each client holds at most a quota of the sessions. A session's env is a
  :class:`~corrgrpo_envs.integrations.openenv_deferred_env.DeferredEnv`: built on the
  session's first reset, a bounded number at a time, never on connect. Sessions made over
  plain HTTP (``/mcp`` ``openenv/session/create``) hold at most an eighth of the slots, are
  closed after ``detached_s`` seconds without a request while no WebSocket is attached to
  them, and give their slot up to a WebSocket client when the server is full; so does a
  WebSocket session between episodes once its client has been quiet for ``detached_s``.
  The routes OpenEnv answers with a fresh env per request (task listing, ``/reset``,
  ``/step``, ``/state``, ``/metadata``, ``/mcp`` without a session) get a stand-in
  instead: it runs their calls on one env built at start, in one worker thread, and keeps
  the task listings it has answered.

The parts: the limits themselves (:mod:`~corrgrpo_envs.integrations.openenv_quotas`), the
middleware (:mod:`~corrgrpo_envs.integrations.openenv_middleware`) and the sessions
(:mod:`~corrgrpo_envs.integrations.openenv_sessions`); their public names are imported from here.
"""

from __future__ import annotations

from corrgrpo_envs.integrations.openenv_middleware import BoundaryMiddleware
from corrgrpo_envs.integrations.openenv_quotas import (
    AGE_QUIET_S,
    BODY_DEADLINE_S,
    GOING_AWAY,
    HTTP_CONCURRENCY,
    HTTP_QUEUE,
    LISTING_CACHE,
    OPEN_PATHS,
    REQUEST_DEADLINE_S,
    ROUTE_QUEUE,
    TOKEN_VARIABLE,
    TRY_AGAIN_LATER,
    ServerLimits,
    is_loopback,
)
from corrgrpo_envs.integrations.openenv_sessions import LimitedEnvServer, WebSocketConnection

__all__ = [
    "TOKEN_VARIABLE",
    "ServerLimits",
    "BoundaryMiddleware",
    "LimitedEnvServer",
    "WebSocketConnection",
    "is_loopback",
    # the fixed limits beside them
    "AGE_QUIET_S",
    "BODY_DEADLINE_S",
    "GOING_AWAY",
    "HTTP_CONCURRENCY",
    "HTTP_QUEUE",
    "LISTING_CACHE",
    "OPEN_PATHS",
    "REQUEST_DEADLINE_S",
    "ROUTE_QUEUE",
    "TRY_AGAIN_LATER",
]
