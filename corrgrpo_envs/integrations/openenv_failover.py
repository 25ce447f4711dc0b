"""Which server an episode runs on, and moving it to another one when its server fails.

A fault (a dropped connection, a deadline passed, an answer that is not OpenEnv's, rewards that
break the declared components) marks the server down, and the episode is replayed on another
one (reset to the same task and seed, the earlier actions stepped again) before the call is
sent there, at most ``retries`` times; then one error names every server tried. A server that
answers with an error is not a fault: its message is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from corrgrpo_envs.integrations.openenv_pool import _Connections, _ServerPool
from corrgrpo_envs.integrations.openenv_remote import (
    RemoteEnvError,
    RemoteRewardError,
    _BadAnswer,
    _reason,
    log,
)

_FAULTS = (
    ConnectionError, OSError, TimeoutError, asyncio.TimeoutError, EOFError, _BadAnswer, httpx.HTTPError,
)


def _is_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the server's fault (another server may do better), not its answer."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake

    return isinstance(exc, (*_FAULTS, ConnectionClosed, InvalidHandshake)) or (
        isinstance(exc, RuntimeError) and not isinstance(exc, RemoteEnvError)
    )


class _Failover:
    """One env's current episode: its server (``server``), task, reset arguments and the actions
    played with their rewards (``history``, what a replay steps again), and the move to another
    server of ``pool`` on a fault."""

    def __init__(self, urls: Sequence[str], pool: _ServerPool, conns: _Connections, retries: int,
                 down_s: float):
        self.urls = list(urls)
        self.pool = pool
        self.conns = conns
        self.retries = retries
        self.down_s = down_s
        self.server: str | None = None
        self.task: str | None = None
        self.reset_args: dict[str, Any] = {}
        self.history: list[tuple[str, dict[str, float]]] = []

    def begin(self, task_id: str, reset_args: Mapping[str, Any]) -> str | None:
        """Start an episode of ``task_id``: the server its group uses, else the least busy one."""
        self.release()
        self.reset_args = dict(reset_args)
        self.history = []
        self.task = task_id
        url = self.pool.acquire(task_id)
        if url is None:
            # every server is marked down: try them all again rather than fail at once
            with self.pool.lock:
                self.pool.down_until.clear()
            url = self.pool.acquire(task_id)
        self.server = url
        return url

    def release(self) -> None:
        """Give the episode's server back to the pool (idempotent)."""
        if self.server is not None and self.task is not None:
            self.pool.release(self.server, self.task)
        self.server = None

    def run(self, what: str, fn: Callable[[str], Any], replay: Callable[[str], Any] | None = None) -> Any:
        """``fn(url)`` on the episode's server; on a fault, ``replay(url)`` on another one first
        (``None``: ``fn`` needs no history, as a reset)."""
        tried: list[str] = []
        errors: list[str] = []
        lies: list[bool] = []
        replaying = False
        while True:
            url = self.server
            assert url is not None
            try:
                if replaying and replay is not None:
                    replay(url)
                return fn(url)
            except BaseException as exc:
                # a reward that breaks the declared components is routed around like a dropped
                # connection: the step is answered by a healthy server, or by none
                lie = isinstance(exc, RemoteRewardError)
                if not lie and (isinstance(exc, RemoteEnvError) or not _is_fault(exc)):
                    raise
                if lie and len(tried) == 0 and (self.retries < 1 or len(self.urls) == 1):
                    raise  # nowhere else to go: its own message, which names the fix
                reason = getattr(exc, "reason", None) or _reason(exc, self.conns.max_observation_bytes)
                tried.append(url)
                lies.append(lie)
                errors.append(f"{url} ({reason})")
                self.conns.drop(url)
                self.pool.mark_down(url, self.down_s)
                self.pool.release(url, self.task)
                self.server = None
                nxt = None
                if len(tried) <= self.retries:
                    # a server another episode marked down is still tried before the step gives up:
                    # the mark steers new episodes, it is no verdict
                    nxt = self.pool.acquire(self.task, exclude=tried) or self.pool.acquire(
                        self.task, exclude=tried, include_down=True
                    )
                if nxt is None:
                    failed = RemoteRewardError if all(lies) else RemoteEnvError
                    raise failed(
                        f"task {self.task}, {what}: OpenEnv server(s) failed: {'; '.join(errors)}"
                    ) from None
                log.warning(
                    "OpenEnv server %s failed during %s of task %s (%s); replaying the episode on %s",
                    url, what, self.task, reason, nxt,
                )
                self.server = nxt
                replaying = True
