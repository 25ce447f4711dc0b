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
  requests cannot take the event loop from the sessions. A WebSocket whose client sends
  nothing for ``session_idle_s`` is closed (code 1001) and its session with it.
* :class:`LimitedEnvServer` is OpenEnv's server with a session policy and no env work on
  the event loop. Sessions made over plain HTTP (``/mcp`` ``openenv/session/create``)
  hold at most an eighth of the slots, are closed after ``detached_s`` seconds without a
  request while no WebSocket is attached to them, and give their slot up to a WebSocket
  client when the server is full. The routes OpenEnv answers with a fresh env per request
  (task listing, ``/reset``, ``/step``, ``/state``, ``/metadata``, ``/mcp`` without a
  session) get a stand-in instead: it runs their calls on one env built at start, in one
  worker thread, and keeps the task listings it has answered.
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
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State

__all__ = [
    "TOKEN_VARIABLE",
    "ServerLimits",
    "BoundaryMiddleware",
    "LimitedEnvServer",
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

#: Set while a request is a WebSocket connection (the session it creates lives with it).
_CONNECTION: contextvars.ContextVar[object | None] = contextvars.ContextVar("openenv_connection", default=None)


@dataclass(frozen=True)
class ServerLimits:
    """What a served env allows (``corrgrpo serve``'s flags).

    Attributes:
        token: the shared token every path but ``/health`` needs (``None``: none needed).
        session_idle_s: a WebSocket whose client sends nothing this long is closed.
        detached_s: a session with no WebSocket attached (made over HTTP ``/mcp``, or
            whose WebSocket closed) is closed after this long without a request.
        serve_references: ``/{name}/task`` answers the env's reference messages (else 403).
    """

    token: str | None = None
    session_idle_s: float = 600.0
    detached_s: float = 60.0
    serve_references: bool = False

    def __post_init__(self) -> None:
        for name in ("session_idle_s", "detached_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.token is not None and not self.token:
            raise ValueError("the token is empty")


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
    """Token, body cap, admission of HTTP requests and the WebSocket idle deadline (ASGI).

    Args:
        app: the ASGI app (OpenEnv's FastAPI app).
        max_body_bytes: the largest HTTP body read (the WebSocket frame cap).
        token: the shared token, or ``None``.
        session_idle_s: seconds a WebSocket may wait for its client's next message.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, token: str | None = None, session_idle_s: float = 600.0):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.session_idle_s = float(session_idle_s)
        self._expected = f"Bearer {token}".encode() if token else None
        self._slots = asyncio.Semaphore(HTTP_CONCURRENCY)
        self._waiting = 0
        _install_refusal_log_filter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        if self._expected is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            detail = ("missing or wrong token: send the header 'Authorization: Bearer <token>' "
                      "(the server's --token or " + TOKEN_VARIABLE + ")")
            if kind == "http":
                await _reply(send, 401, detail, extra=((b"www-authenticate", b"Bearer"),))
            else:
                await self._refuse_handshake(scope, receive, send, detail)
            return
        if kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self._http(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        assert self._expected is not None
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        return hmac.compare_digest(given, self._expected)  # constant time: no prefix timing

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
        idle_s = self.session_idle_s
        expired = False

        async def receive_until_idle() -> Message:
            nonlocal expired
            try:
                async with asyncio.timeout(idle_s):
                    return await receive()
            except TimeoutError:
                expired = True  # the app sees its client leave, and closes the session
                return {"type": "websocket.disconnect", "code": 1001}

        async def send_with_reason(message: Message) -> None:
            if expired and message["type"] == "websocket.close":
                message = {**message, "code": 1001, "reason": f"no message for {idle_s:g} s: session closed"}
            await send(message)

        mark = _CONNECTION.set(object())
        try:
            await self.app(scope, receive_until_idle, send_with_reason)
        finally:
            _CONNECTION.reset(mark)


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
        session_env: builds one session's env (called in that session's worker thread).
        route_env: an env built once, for the routes OpenEnv serves with a fresh env per
            request; it answers them one at a time in its own worker thread.
        action_cls, observation_cls, state_cls, env_name: as :class:`HTTPEnvServer`.
        max_sessions: sessions at once (WebSocket and HTTP together).
        detached_s: seconds a session without a WebSocket lives after its last request.
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
        detached_s: float = 60.0,
    ):
        # session_timeout only switches OpenEnv's reaper on; _reap_idle_sessions is this class's.
        config = ConcurrencyConfig(max_concurrent_envs=int(max_sessions), session_timeout=float(detached_s))
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
        self.detached_s = float(detached_s)
        self.max_detached = max(1, int(max_sessions) // 8)
        self._http_sessions: set[str] = set()
        self._http_building = 0
        self._http_build_lock = asyncio.Lock()

    def _env_for_caller(self) -> Environment:
        """A session's own env in a worker thread; on the event loop, the stand-in that builds nothing."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._session_env()
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
        if _CONNECTION.get() is not None:  # a WebSocket's own session: it ends with the connection
            await self._make_room()
            return await super()._create_session()
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
            async with self._http_build_lock:  # one at a time: a burst of them builds one env at a time
                session_id, env = await super()._create_session()
        finally:
            self._http_building -= 1
        self._http_sessions.add(session_id)
        return session_id, env

    async def _make_room(self) -> None:
        """At capacity, close the least recently used session that no WebSocket holds."""
        if len(self._sessions) < self._max_concurrent_envs:
            return
        detached = [(self._session_info[sid].last_activity_at, sid)
                    for sid in self._detached_ids() if sid in self._session_info]
        if detached:
            _, victim = min(detached)
            log.warning("closing session %s (no WebSocket attached) to make room for a WebSocket client", victim)
            await self._destroy_session(victim)

    async def _destroy_session(self, session_id: str) -> None:
        self._http_sessions.discard(session_id)
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
