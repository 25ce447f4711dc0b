"""The OpenEnv client's connections: one env's sessions and HTTP client, whose every exchange has
one overall deadline and a size cap (:class:`_Connections`), and the pool of servers that every
env of one server list in a process shares (:class:`_ServerPool`, held through :class:`_PoolLease`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from corrgrpo_envs.integrations.deadline_loop import GRACE_S, DeadlineLoop
from corrgrpo_envs.integrations.openenv_quotas import GOING_AWAY
from corrgrpo_envs.integrations.openenv_remote import (
    RemoteEnvError,
    _BadAnswer,
    _oneline,
    _refused,
    _refused_status,
)
from corrgrpo_envs.integrations.openenv_schema import _checked


class _Connections:
    """One env instance's open sessions (``GenericEnvClient`` per server) and HTTP client.

    Every exchange runs on ``loop`` within one overall deadline (``connect_timeout_s`` to open
    a session, ``timeout_s`` per reset or step; an HTTP read's deadline is its caller's) and
    reads at most ``max_observation_bytes`` per answer. It holds no reference to its env, so
    an env's finalizer may close it.
    """

    def __init__(self, loop: DeadlineLoop, headers: dict[str, str] | None, timeout_s: float,
                 connect_timeout_s: float, max_observation_bytes: int):
        self.loop = loop
        self.headers = headers
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_observation_bytes = max_observation_bytes
        self.clients: dict[str, Any] = {}
        self.http: httpx.AsyncClient | None = None

    def refused(self, url: str, status: int) -> RemoteEnvError:
        """The error of a 401/403 from ``url`` (it says whether a token was sent)."""
        return _refused(url, status, self.headers is not None)

    # ------------------------------------------------------------- WebSocket
    def new_session(self, url: str) -> Any:
        """An unconnected ``GenericEnvClient`` on ``url`` with this env's deadlines, cap and token."""
        from openenv.core import GenericEnvClient

        return GenericEnvClient(
            base_url=url,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.timeout_s + GRACE_S,  # our own deadline comes first
            max_message_size_mb=self.max_observation_bytes / 2**20,
            headers=self.headers,
        )

    def session(self, url: str) -> Any:
        """This env's open session on ``url`` (opened within ``connect_timeout_s``)."""
        client = self.clients.get(url)
        if client is None:
            client = self.new_session(url)

            async def connect() -> None:
                await client.connect()

            try:
                self.loop.run(connect, self.connect_timeout_s)
            except ConnectionError as exc:
                status = _refused_status(exc)
                if status is not None:
                    raise self.refused(url, status) from None
                raise
            self.clients[url] = client
        return client

    def drop(self, url: str) -> None:
        """Forget ``url``'s session; it is closed in the background (a dead server does not answer)."""
        client = self.clients.pop(url, None)
        if client is not None:

            async def close() -> None:
                await client.close()

            self.loop.submit(close)

    def call(self, url: str, what: str, op: Callable[[Any], Awaitable[Any]], task: str) -> Any:
        """``await op(session)`` within ``timeout_s``; a server-side error becomes :class:`RemoteEnvError`
        (naming ``task``), a malformed answer :class:`_BadAnswer`, a transport fault propagates.

        A reset whose session the server closed as going away (code 1001: its idle or age limit,
        a close that can cross the reset on the wire) is sent once more on a new session to the
        same server: a reset has no episode state to lose, and the server asked for a new session,
        so this is no fault to route around (any other close, or a second one, propagates).
        """
        from websockets.exceptions import ConnectionClosed

        try:
            return self._call_once(url, what, op, task)
        except ConnectionClosed as exc:
            if what != "reset" or exc.rcvd is None or exc.rcvd.code != GOING_AWAY:
                raise
        self.drop(url)
        return self._call_once(url, what, op, task)

    def _call_once(self, url: str, what: str, op: Callable[[Any], Awaitable[Any]], task: str) -> Any:
        client = self.session(url)
        try:
            result = self.loop.run(lambda: op(client), self.timeout_s)
        except RuntimeError as exc:
            if str(exc).startswith("Server error:"):
                hint = ""
                if "CAPACITY_REACHED" in str(exc):
                    # corrgrpo serve says which limit: its sessions, or one client's quota of them
                    limit = "--sessions-per-client" if "quota" in str(exc) else "max_concurrent_envs"
                    hint = (f" (each env instance holds one session: raise the server's "
                            f"{limit} to at least its share of P*G members)")
                raise RemoteEnvError(
                    f"OpenEnv server {url}, task {task}, {what}: {_oneline(exc)}{hint}"
                ) from None
            raise
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # the client could not parse it
            raise _BadAnswer(_oneline(f"a malformed answer ({type(exc).__name__}: {exc})")) from None
        return _checked(result)

    # ------------------------------------------------------------------ HTTP
    def http_client(self) -> httpx.AsyncClient:
        """This env's HTTP client (made on the loop, on first use); the deadline is the caller's."""
        if self.http is None:
            headers = {"Accept-Encoding": "identity", **(self.headers or {})}
            per_read = max(self.timeout_s, self.connect_timeout_s)  # a backstop: the deadline is overall
            self.http = httpx.AsyncClient(headers=headers, timeout=per_read)
        return self.http

    async def fetch(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """``(status, parsed JSON)``, or ``(status, text)`` for an error status; refused over the cap."""
        cap = self.max_observation_bytes
        async with self.http_client().stream(method, url, json=body) as reply:
            declared = reply.headers.get("content-length", "")
            if declared.strip().isdigit() and int(declared) > cap:
                raise _BadAnswer(
                    f"an answer of {int(declared)} bytes, over env.max_observation_bytes ({cap})"
                )
            data = bytearray()
            async for chunk in reply.aiter_bytes():
                data += chunk
                if len(data) > cap:
                    raise _BadAnswer(f"an answer larger than env.max_observation_bytes ({cap} bytes)")
        if reply.status_code != 200:
            return reply.status_code, data[:200].decode("utf-8", errors="replace")
        try:
            return reply.status_code, json.loads(data)
        except (ValueError, RecursionError):
            raise _BadAnswer("an answer that is not JSON") from None

    async def aclose(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        http, self.http = self.http, None

        async def close(client: Any) -> None:
            await client.close()

        jobs = [close(c) for c in clients] + ([http.aclose()] if http is not None else [])
        await asyncio.gather(*jobs, return_exceptions=True)


# ------------------------------------------------------------------ server pool
class _ServerPool:
    """Which server each episode runs on, shared by every env of one server list in a process.

    It also remembers what every env of the list shares: each server's description (read
    once per split) and the components learned from a first episode (learned once).
    """

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self.lock = threading.Lock()
        self.active: Counter[str] = Counter()
        self.task_server: dict[str, str] = {}
        self.task_count: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}
        self.described: dict[tuple[str, str], dict[str, Any]] = {}
        self.learned: dict[str, Any] | None = None
        self.learn_lock = threading.Lock()
        self.users = 0  # open envs of this list (see _PoolLease)

    def acquire(self, task_id: str, exclude: Sequence[str] = (), include_down: bool = False) -> str | None:
        """A server for an episode of ``task_id``: the one its group uses, else the least busy.

        Servers marked down are left out unless ``include_down``.
        """
        with self.lock:
            now = time.monotonic()
            up = [u for u in self.urls
                  if u not in exclude and (include_down or self.down_until.get(u, 0.0) <= now)]
            if not up:
                return None
            url = self.task_server.get(task_id)
            if url not in up:
                url = min(up, key=lambda u: (self.active[u], self.urls.index(u)))
            self.active[url] += 1
            self.task_server[task_id] = url
            self.task_count[task_id] += 1
            return url

    def release(self, url: str, task_id: str) -> None:
        with self.lock:
            self.active[url] -= 1
            self.task_count[task_id] -= 1
            if self.task_count[task_id] <= 0:
                self.task_count.pop(task_id, None)
                if self.task_server.get(task_id) == url:
                    self.task_server.pop(task_id, None)

    def mark_down(self, url: str, seconds: float) -> None:
        with self.lock:
            self.down_until[url] = time.monotonic() + seconds

    def is_down(self, url: str) -> bool:
        with self.lock:
            return self.down_until.get(url, 0.0) > time.monotonic()


_POOLS: dict[tuple[str, ...], _ServerPool] = {}
_POOLS_LOCK = threading.Lock()


class _PoolLease:
    """One env's use of a shared pool. The pool, and what it remembers of its servers (their
    descriptions, learned components, down marks), lives while an env of its list is open: an
    address later reused by another server (a restarted job, a test's recycled port) is
    described afresh, never taken for the one an earlier run knew."""

    def __init__(self, urls: Sequence[str]):
        self.key = tuple(urls)
        with _POOLS_LOCK:
            pool = _POOLS.get(self.key)
            if pool is None:
                pool = _POOLS[self.key] = _ServerPool(urls)
            pool.users += 1
        self.pool: _ServerPool | None = pool

    def release(self) -> None:
        """Idempotent: the last lease of a pool drops it."""
        with _POOLS_LOCK:
            pool, self.pool = self.pool, None
            if pool is None:
                return
            pool.users -= 1
            if pool.users <= 0 and _POOLS.get(self.key) is pool:
                del _POOLS[self.key]
