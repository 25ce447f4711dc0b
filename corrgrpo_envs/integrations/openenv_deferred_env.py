"""A served session's env, built on the session's first reset and a bounded number at a time.

OpenEnv's server builds a session's env when the session is made: for a WebSocket, as soon
as the connection is accepted, before its client has said anything. A client that opens
and closes connections in a loop then has the server build envs as fast as it connects
(a whole corrgrpo env each: task tables, datasets, tool schemas), and every other session
waits for CPU. :class:`DeferredEnv` is what such a session gets instead: it builds the real
env on the first ``reset``, through a :class:`BuildGate` that lets at most a few builds run
at once, so connecting costs nothing and builds cannot crowd out the sessions at work.

It also keeps what the server's session policy reads: when the client last reset or stepped
(a ``state`` request is not activity: it costs nothing, and a client that only asks for state
is holding a slot, not using it), and whether an episode is in progress.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

__all__ = ["BuildGate", "DeferredEnv"]


class BuildGate:
    """At most ``concurrent`` env builds at once (the others wait in their session's thread).

    Builds are CPU work that holds the GIL for long stretches; two at a time already keep a
    core busy, and more would only make every session's messages wait longer.
    """

    def __init__(self, concurrent: int = 1):
        if int(concurrent) < 1:
            raise ValueError(f"concurrent builds must be at least 1, got {concurrent!r}")
        self.concurrent = int(concurrent)
        self._slots = threading.BoundedSemaphore(self.concurrent)
        self._count_lock = threading.Lock()
        self.built = 0
        """Envs built through this gate so far."""
        self.waiting = 0
        """Builds waiting for their turn now."""

    def build(self, factory: Callable[[], Environment]) -> Environment:
        """``factory()`` once a build slot is free (blocking the calling thread until then)."""
        with self._count_lock:
            self.waiting += 1
        try:
            self._slots.acquire()
        finally:
            with self._count_lock:
                self.waiting -= 1
        try:
            env = factory()
        finally:
            self._slots.release()
        with self._count_lock:
            self.built += 1
        return env


class DeferredEnv(Environment):
    """An env built on its first ``reset`` through ``gate``; every call after that goes to it.

    Args:
        factory: builds the real env (called in the session's own worker thread, where
            OpenEnv runs the session's resets and steps).
        gate: bounds how many builds run at once.
        pristine_state: what ``state`` answers before the first reset (a fresh env's state).

    Attributes:
        created_at: when the session was made (``time.monotonic()``).
        last_active: when the client last reset or stepped (or ``created_at``); while a
            reset or step runs, the time it started.
        busy: a reset or step is running.
        in_episode: an episode has been reset and has not ended.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, factory: Callable[[], Environment], gate: BuildGate, pristine_state: State):
        super().__init__()
        self._factory = factory
        self._gate = gate
        self._pristine = pristine_state
        self._env: Environment | None = None
        self.created_at = time.monotonic()
        self.last_active = self.created_at
        self.busy = False
        self.in_episode = False

    @property
    def built(self) -> bool:
        """Whether the real env exists (a reset has been asked for)."""
        return self._env is not None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._begin()
        try:
            if self._env is None:
                self._env = self._gate.build(self._factory)
            observation = self._env.reset(seed=seed, episode_id=episode_id, **kwargs)
            self.in_episode = not bool(observation.done)
            return observation
        finally:
            self._end()

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if self._env is None:  # what the env itself says, without building one to say it
            raise RuntimeError("reset before stepping")
        self._begin()
        try:
            observation = self._env.step(action, timeout_s=timeout_s, **kwargs)
            self.in_episode = not bool(observation.done)
            return observation
        finally:
            self._end()

    @property
    def state(self) -> State:
        return self._env.state if self._env is not None else self._pristine

    def get_metadata(self) -> Any:
        return self._env.get_metadata() if self._env is not None else super().get_metadata()

    def close(self) -> None:
        if self._env is not None:
            self._env.close()

    def _begin(self) -> None:
        self.busy = True
        self.last_active = time.monotonic()

    def _end(self) -> None:
        self.last_active = time.monotonic()
        self.busy = False
