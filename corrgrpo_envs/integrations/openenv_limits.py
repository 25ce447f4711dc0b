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
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from openenv.core.env_server.exceptions import SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import (
    Action,
    ConcurrencyConfig,
    Observation,
    State,
)

from corrgrpo_envs.integrations.openenv_admission import (
    ConnectionRate,
    SessionsByClient,
    client_key,
)
from corrgrpo_envs.integrations.openenv_deferred_env import BuildGate, DeferredEnv

__all__ = [
    "TOKEN_VARIABLE",
    "ServerLimits",
    "BoundaryMiddleware",
    "LimitedEnvServer",
    "WebSocketConnection",
    "is_loopback",
]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

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


def _close_reason(text: str) -> str:
    """``text`` cut to the 123 bytes a WebSocket close frame carries."""
    raw = text.encode()
    return text if len(raw) <= 123 else raw[:120].decode(errors="ignore") + "..."


class WebSocketConnection:
    """One WebSocket connection: its client, its session, and when the server closes it.

    The middleware makes one per connection and waits for the client's next message only
    until :meth:`due`; the server links the session it makes (or the one the connection
    attaches to) and may end the connection early with :meth:`close_now`.
    """

    def __init__(self, client: str, idle_s: float, max_age_s: float):
        self.client = client
        self.idle_s = float(idle_s)
        self.max_age_s = float(max_age_s)
        self.opened_at = time.monotonic()
        self.session: DeferredEnv | None = None
        self.closing: tuple[int, str] | None = None
        """The code and reason of the server's close frame, once the server decided to close."""
        self._forced: tuple[int, str] | None = None
        self._waiting: asyncio.Timeout | None = None

    def due(self) -> tuple[float, int, str]:
        """(when, close code, reason): the time (``time.monotonic()``) the connection is closed
        at unless its client resets or steps before."""
        if self._forced is not None:
            return 0.0, *self._forced
        env = self.session
        last = env.last_active if env is not None else self.opened_at
        born = env.created_at if env is not None else self.opened_at
        idle_due = last + self.idle_s
        age_due = born + self.max_age_s + self.idle_s  # in any case
        if env is None or not env.in_episode:  # between episodes: once the client pauses
            age_due = min(age_due, max(born + self.max_age_s, last + AGE_QUIET_S))
        if idle_due <= age_due:
            return idle_due, GOING_AWAY, f"no reset or step for {self.idle_s:g} s: session closed"
        return age_due, GOING_AWAY, f"session older than {self.max_age_s:g} s: closed (open a new one)"

    @property
    def waiting_for_client(self) -> bool:
        """The app is waiting for the client's next message (none is being answered)."""
        return self._waiting is not None

    def close_now(self, code: int, reason: str) -> None:
        """End the connection: at once if it is waiting for its client, else before its next message."""
        self._forced = (code, _close_reason(reason))
        if self._waiting is not None:
            self._waiting.reschedule(asyncio.get_running_loop().time())

    async def receive(self, receive: Receive) -> Message:
        """The client's next message, or a disconnect once :meth:`due` has passed."""
        while True:
            when, code, reason = self.due()
            try:
                async with asyncio.timeout(max(0.0, when - time.monotonic())) as waiting:
                    self._waiting = waiting
                    return await receive()
            except TimeoutError:
                when, code, reason = self.due()
                if when > time.monotonic():
                    continue
                self.closing = (code, _close_reason(reason))  # the app sees its client leave, and closes the session
                return {"type": "websocket.disconnect", "code": code}
            finally:
                self._waiting = None


#: Set while a request is a WebSocket connection (the session it creates lives with it).
_CONNECTION: contextvars.ContextVar[WebSocketConnection | None] = contextvars.ContextVar(
    "openenv_connection", default=None)
#: The client of the request being served (:func:`client_key`).
_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("openenv_client", default="unknown")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------ the middleware
class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


def _json_reply(status: int, detail: str, close: bool = False, extra: tuple = ()) -> tuple[list, bytes]:
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    if close:  # the rest of a refused body is not read: the connection ends with the answer
        headers.append((b"connection", b"close"))
    return headers, body


async def _reply(send: Send, status: int, detail: str, close: bool = False, extra: tuple = ()) -> None:
    headers, body = _json_reply(status, detail, close, extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


#: True in the task of a WebSocket handshake this middleware refused (see :class:`_RefusalLogFilter`)
_REFUSED_HANDSHAKE: contextvars.ContextVar[bool] = contextvars.ContextVar("refused_handshake", default=False)


class _RefusalLogFilter(logging.Filter):
    """Drops uvicorn's "ASGI callable returned without completing handshake." after our own 401.

    uvicorn 0.54's websockets-sansio protocol logs that ERROR (and sends nothing more) after
    every handshake refused through the ``websocket.http.response`` extension, although the
    401 reached the client (upstream: Kludex/uvicorn pull request 3138). One line per refused
    peer lets an unauthenticated flood write the server's log without bound: a parent that
    reads the server's stderr late stalls the whole server once the pipe is full (64 KiB,
    about 1,040 refusals). The record is dropped only in the task whose handshake this
    middleware refused; the same message from an app bug still shows.
    """

    MESSAGE = "ASGI callable returned without completing handshake."

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_REFUSED_HANDSHAKE.get() and record.getMessage() == self.MESSAGE)


def _install_refusal_log_filter() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _RefusalLogFilter) for f in logger.filters):
        logger.addFilter(_RefusalLogFilter())


class BoundaryMiddleware:
    """Token, body cap, admission of HTTP requests and WebSocket connections, and the
    WebSocket session deadlines (ASGI).

    Args:
        app: the ASGI app (OpenEnv's FastAPI app).
        max_body_bytes: the largest HTTP body read (the WebSocket frame cap).
        limits: the tokens, the session deadlines and the connection rate.
        connection_burst: new WebSocket connections a client may open at once.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, limits: ServerLimits | None = None,
                 connection_burst: int = 64):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.limits = limits or ServerLimits()
        self._expected = [f"Bearer {token}".encode() for token in self.limits.tokens]
        self._rate = ConnectionRate(self.limits.connections_per_s, connection_burst)
        self._slots = asyncio.Semaphore(HTTP_CONCURRENCY)
        self._waiting = 0
        _install_refusal_log_filter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        token_index = None
        if self._expected and scope["path"] not in OPEN_PATHS:
            token_index = self._token_index(scope)
            if token_index is None:
                detail = ("missing or wrong token: send the header 'Authorization: Bearer <token>' "
                          "(the server's --token or " + TOKEN_VARIABLE + ")")
                if kind == "http":
                    await _reply(send, 401, detail, extra=((b"www-authenticate", b"Bearer"),))
                else:
                    await self._refuse_handshake(scope, receive, send, detail)
                return
        mark = _CLIENT.set(client_key(scope, token_index))
        try:
            if kind == "websocket":
                await self._websocket(scope, receive, send)
            else:
                await self._http(scope, receive, send)
        finally:
            _CLIENT.reset(mark)

    def _token_index(self, scope: Scope) -> int | None:
        """Which of the server's tokens the request carries (None: none of them)."""
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        matches = [hmac.compare_digest(given, expected) for expected in self._expected]  # constant time each
        return matches.index(True) if any(matches) else None

    async def _refuse_handshake(self, scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        _REFUSED_HANDSHAKE.set(True)  # this task's context: read by uvicorn's log call after we return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            headers, body = _json_reply(401, detail, extra=((b"www-authenticate", b"Bearer"),))
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        else:  # a server without the extension answers a close before accept with 403
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong token"})

    # ------------------------------------------------------------------ HTTP
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((value for key, value in scope["headers"] if key == b"content-length"), None)
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _reply(send, 400, f"Content-Length {declared[:40]!r} is not a number", close=True)
                return
            if size > self.max_body_bytes:
                await _reply(send, 413, self._too_large(f"{size} bytes"), close=True)
                return
        try:
            async with asyncio.timeout(BODY_DEADLINE_S):
                body = await self._read_body(receive)
        except _BodyTooLarge:
            await _reply(send, 413, self._too_large("the body"), close=True)
            return
        except TimeoutError:
            await _reply(send, 408, f"the request body took longer than {BODY_DEADLINE_S:g} s", close=True)
            return
        except _ClientGone:
            return
        if self._waiting >= HTTP_QUEUE:
            await _reply(send, 503, f"busy: {self._waiting} requests are waiting; retry later",
                         extra=((b"retry-after", b"1"),))
            return
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        held = True
        started = False

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        async def send_releasing(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()  # the answer is made: a client slow to read it holds no one up
            await send(message)

        try:
            async with asyncio.timeout(REQUEST_DEADLINE_S):
                await self.app(scope, _replay(body, receive), send_releasing)
        except TimeoutError:
            log.warning("%s %s took longer than %g s; answered 503", scope["method"], scope["path"],
                        REQUEST_DEADLINE_S)
            if not started:
                await _reply(send, 503, f"the request took longer than {REQUEST_DEADLINE_S:g} s", close=True)
        finally:
            release()

    def _too_large(self, what: str) -> str:
        return (f"request body too large: {what} is over the server's cap of {self.max_body_bytes} bytes "
                "(the same cap as a WebSocket message)")

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # ------------------------------------------------------------- WebSocket
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = _CLIENT.get()
        wait_s = self._rate.admit(client, time.monotonic())
        if wait_s > 0:
            await self._refuse_connection(receive, send, (
                f"too many new connections from {client}: at most {self.limits.connections_per_s:g} a second "
                f"after a burst of {self._rate.burst}; retry in {wait_s:.1f} s"))
            return
        connection = WebSocketConnection(client, self.limits.session_idle_s, self.limits.session_max_age_s)

        async def receive_in_time() -> Message:
            return await connection.receive(receive)

        async def send_with_reason(message: Message) -> None:
            if connection.closing is not None and message["type"] == "websocket.close":
                code, reason = connection.closing
                message = {**message, "code": code, "reason": reason}
            await send(message)

        mark = _CONNECTION.set(connection)
        try:
            await self.app(scope, receive_in_time, send_with_reason)
        finally:
            _CONNECTION.reset(mark)

    @staticmethod
    async def _refuse_connection(receive: Receive, send: Send, reason: str) -> None:
        """Refuse a WebSocket with a close frame: code 1013 (try again later) and the reason.

        Nothing else is sent: a churning client gets its refusal for the least work, and a
        trainer's client sees a closed connection, a fault it retries elsewhere or later
        (an OpenEnv error frame would be an answer, which it does not retry).
        """
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": _close_reason(reason)})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then the client's later messages."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# --------------------------------------------------------------- the env server
class _RouteEnv(Environment):
    """What OpenEnv's per-request routes get instead of a freshly built env.

    Every call goes to the server's route env in its worker thread (or is answered from
    what that env said before), so a route never builds or runs an env on the event loop.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, server: LimitedEnvServer):
        super().__init__()
        self._server = server

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("the route env resets through reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("the route env has no episode")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        try:
            return await self._server.call_route_env("reset", seed=seed, episode_id=episode_id, **kwargs)
        except (ValueError, KeyError, IndexError, TypeError) as exc:  # the client's arguments
            raise HTTPException(status_code=400, detail=str(exc)) from None

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        # What a fresh env does (it has no episode to step), without building one.
        raise HTTPException(
            status_code=400,
            detail="POST /step is stateless in OpenEnv (a fresh env per request, with no episode): "
            "reset and step over a WebSocket session (/ws)",
        )

    @property
    def state(self) -> State:
        return self._server.pristine_state

    def get_metadata(self) -> Any:
        return self._server.metadata

    async def list_splits(self) -> Any:
        return await self._server.listing("list_splits")

    async def list_tasks(self, split: str) -> Any:
        return await self._server.listing("list_tasks", split)

    async def num_tasks(self, split: str) -> Any:
        return await self._server.listing("num_tasks", split)

    async def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> Any:
        return await self._server.listing("get_task_range", split, start, stop)

    async def get_task(self, split: str, index: int) -> Any:
        return await self._server.call_route_env("get_task", split, index)

    def close(self) -> None:
        pass  # the route env outlives every request


class LimitedEnvServer(HTTPEnvServer):
    """OpenEnv's :class:`HTTPEnvServer` with a session policy and no env work on the event loop.

    Args:
        session_env: builds one session's env (called in that session's worker thread, on
            the session's first reset, through the server's :class:`BuildGate`).
        route_env: an env built once, for the routes OpenEnv serves with a fresh env per
            request; it answers them one at a time in its own worker thread.
        action_cls, observation_cls, state_cls, env_name: as :class:`HTTPEnvServer`.
        max_sessions: sessions at once (WebSocket and HTTP together).
        limits: the session quota per client, the detached sessions' lifetime, the builds
            at once (the middleware applies the rest).
    """

    def __init__(
        self,
        session_env: Callable[[], Environment],
        route_env: Environment,
        action_cls: type[Action],
        observation_cls: type[Observation],
        *,
        env_name: str,
        state_cls: type[State] = State,
        max_sessions: int = 64,
        limits: ServerLimits | None = None,
    ):
        limits = limits or ServerLimits()
        # session_timeout only switches OpenEnv's reaper on; _reap_idle_sessions is this class's.
        config = ConcurrencyConfig(max_concurrent_envs=int(max_sessions), session_timeout=float(limits.detached_s))
        super().__init__(session_env, action_cls, observation_cls, concurrency_config=config,
                         env_name=env_name, state_cls=state_cls)
        self._session_env = self._env_factory
        self._env_factory = self._env_for_caller  # what every OpenEnv route and session calls
        self._route_env = route_env
        self._route_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-routes")
        self._route_waiting = 0
        self._listings: dict[tuple, Any] = {}
        self.pristine_state = route_env.state.model_copy(deep=True)
        self.metadata = route_env.get_metadata()
        self.detached_s = float(limits.detached_s)
        self.max_detached = max(1, int(max_sessions) // 8)
        self.builds = BuildGate(limits.concurrent_builds)
        self.by_client = SessionsByClient(limits.quota(max_sessions))
        self._http_sessions: set[str] = set()
        self._http_building = 0
        self._connections: dict[str, WebSocketConnection] = {}  # a WebSocket's own session -> it

    def _env_for_caller(self) -> Environment:
        """A session's own env in a worker thread (built on its first reset); on the event loop,
        the stand-in that builds nothing."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return DeferredEnv(self._session_env, self.builds, self.pristine_state.model_copy(deep=True))
        return _RouteEnv(self)

    # ------------------------------------------------------------ route env calls
    async def call_route_env(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``route_env.<name>(*args, **kwargs)`` in the route env's thread; 503 when too many wait."""
        if self._route_waiting >= ROUTE_QUEUE:
            raise HTTPException(status_code=503, detail=f"busy: {self._route_waiting} requests are waiting; retry later",
                                headers={"Retry-After": "1"})
        self._route_waiting += 1
        try:
            call = functools.partial(getattr(self._route_env, name), *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self._route_pool, call)
        finally:
            self._route_waiting -= 1

    async def listing(self, name: str, *args: Any) -> Any:
        """A task listing (a pure function of its arguments while the server runs), kept once answered."""
        key = (name, *args)
        if key in self._listings:
            return self._listings[key]
        value = await self.call_route_env(name, *args)
        if len(self._listings) < LISTING_CACHE:
            self._listings[key] = value
        return value

    # ------------------------------------------------------------------ sessions
    def _detached_ids(self) -> list[str]:
        """Sessions made over HTTP that no WebSocket is attached to (built ones only)."""
        return [sid for sid in self._http_sessions
                if self._sessions.get(sid) is not None and sid not in self._session_websocket_attachments]

    async def _create_session(self) -> tuple[str, Environment]:
        connection, client = _CONNECTION.get(), _CLIENT.get()
        self.by_client.retain(self._sessions)  # openenv/session/close ends sessions without a word
        if not self.by_client.reserve(client):
            held, quota = self.by_client.held(client), self.by_client.quota
            if connection is not None:
                connection.closing = (TRY_AGAIN_LATER, _close_reason(
                    f"session quota: {client} holds {held} sessions, at most {quota} per client"))
            raise SessionCapacityError(
                held, quota,
                f"Session quota reached: client {client} holds {held} sessions, at most {quota} per client "
                "(the server's --sessions-per-client); close one or retry later",
            )
        try:
            if connection is not None:  # a WebSocket's own session: it ends with the connection
                await self._make_room()
                session_id, env = await super()._create_session()
            else:
                session_id, env = await self._create_detached_session()
        except SessionCapacityError as exc:
            self.by_client.cancel(client)
            if connection is not None:
                connection.closing = (TRY_AGAIN_LATER, _close_reason(str(exc)))
            raise
        except BaseException:
            self.by_client.cancel(client)
            raise
        self.by_client.add(client, session_id)
        if connection is not None and isinstance(env, DeferredEnv):
            connection.session = env
            self._connections[session_id] = connection
        return session_id, env

    async def _create_detached_session(self) -> tuple[str, Environment]:
        """A session made over HTTP (``openenv/session/create``), within their eighth of the slots."""
        self._http_sessions &= set(self._sessions)  # some leave through openenv/session/close
        held = len(self._http_sessions) + self._http_building
        if held >= self.max_detached:
            raise SessionCapacityError(
                held, self.max_detached,
                f"Server at capacity for sessions made over HTTP: {held}/{self.max_detached} "
                "(open a WebSocket session on /ws instead)",
            )
        self._http_building += 1
        try:
            session_id, env = await super()._create_session()
        finally:
            self._http_building -= 1
        self._http_sessions.add(session_id)
        return session_id, env

    def _update_session_activity(self, session_id: str, increment_step: bool = False) -> None:
        super()._update_session_activity(session_id, increment_step)
        # OpenEnv calls this when a WebSocket attaches to a session made over HTTP, in that
        # connection's task: the connection's deadlines then follow that session's env.
        connection = _CONNECTION.get()
        if connection is not None and connection.session is None:
            env = self._sessions.get(session_id)
            if isinstance(env, DeferredEnv):
                connection.session = env

    async def _make_room(self) -> None:
        """At capacity, close the least recently used session that no WebSocket holds; failing
        that, the WebSocket session quiet longest, if it is between episodes and has been quiet
        for ``detached_s`` (a session at work, or mid-episode, is never taken)."""
        if len(self._sessions) < self._max_concurrent_envs:
            return
        detached = [(self._session_info[sid].last_activity_at, sid)
                    for sid in self._detached_ids() if sid in self._session_info]
        if detached:
            _, victim = min(detached)
            log.warning("closing session %s (no WebSocket attached) to make room for a WebSocket client", victim)
            await self._destroy_session(victim)
            return
        quiet_since = time.monotonic() - self.detached_s
        idle = [(env.last_active, sid) for sid, connection in self._connections.items()
                if connection.waiting_for_client and (env := connection.session) is not None
                and not env.busy and not env.in_episode and env.last_active <= quiet_since]
        if idle:
            _, victim = min(idle)
            self._connections[victim].close_now(GOING_AWAY, (
                f"closed to make room for another client: no reset or step for {self.detached_s:g} s"))
            await self._destroy_session(victim)

    async def _destroy_session(self, session_id: str) -> None:
        self._http_sessions.discard(session_id)
        self._connections.pop(session_id, None)
        self.by_client.discard(session_id)
        await super()._destroy_session(session_id)

    async def _reap_idle_sessions(self) -> None:
        """Close sessions without a WebSocket once ``detached_s`` has passed since their last request.

        (A WebSocket's own session is closed by :class:`BoundaryMiddleware` when its client
        goes quiet, and by OpenEnv when the connection ends.)
        """
        interval = min(max(self.detached_s / 4, 0.25), 5.0)
        while True:
            try:
                await asyncio.sleep(interval)
                self._http_sessions &= set(self._sessions)
                for sid in self._detached_ids():
                    info = self._session_info.get(sid)
                    if info is not None and time.time() - info.last_activity_at > self.detached_s:
                        await self._destroy_session(sid)
            except asyncio.CancelledError:
                break
            except Exception as exc:  # keep reaping: one failed close must not stop the others
                log.warning("closing idle sessions failed (will retry): %s", exc)

    def _stop_reaper(self) -> None:
        super()._stop_reaper()
        self._route_pool.shutdown(wait=False)
