"""The sessions of a served env: when one WebSocket connection's session is closed
(:class:`WebSocketConnection`), and OpenEnv's server with a session policy and no env work on
the event loop (:class:`LimitedEnvServer`; see :mod:`~corrgrpo_envs.integrations.openenv_limits`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
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

from corrgrpo_envs.integrations.openenv_admission import SessionsByClient
from corrgrpo_envs.integrations.openenv_deferred_env import BuildGate, DeferredEnv
from corrgrpo_envs.integrations.openenv_quotas import (
    AGE_QUIET_S,
    GOING_AWAY,
    LISTING_CACHE,
    ROUTE_QUEUE,
    TRY_AGAIN_LATER,
    ServerLimits,
    log,
)

__all__ = ["WebSocketConnection", "LimitedEnvServer"]

#: ASGI's types, for a connection's messages here and the middleware's calls.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
