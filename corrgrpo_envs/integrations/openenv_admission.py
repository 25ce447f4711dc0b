"""Who a client of a served env is, how fast it may open connections, and how many sessions it holds.

A client is its token where the server has one (``corrgrpo serve --token``, given once per
client), else its network address. Each client may hold at most a quota of the server's
sessions, so that one client cannot take every slot, and may open new WebSocket connections
only so fast, so that connecting and closing in a loop cannot keep the server busy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, MutableMapping
from typing import Any

__all__ = ["client_key", "ConnectionRate", "SessionsByClient"]

#: Clients whose connection rate is tracked at once; beyond it, those with a full allowance
#: are forgotten first (they lose nothing), then the longest unseen.
MAX_TRACKED_CLIENTS = 4096


def client_key(scope: Mapping[str, Any], token_index: int | None = None) -> str:
    """The client an ASGI request comes from: ``token #N`` (the N-th token of the server's
    list, never the token itself) when it was let in by a token, else its address."""
    if token_index is not None:
        return f"token #{token_index + 1}"
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class ConnectionRate:
    """New connections per client: ``burst`` at once, then ``per_s`` a second (a token bucket).

    Args:
        per_s: connections a client may open each second, in the long run.
        burst: connections a client may open at once (a trainer opening its sessions together).
    """

    def __init__(self, per_s: float, burst: int):
        if not per_s > 0 or int(burst) < 1:
            raise ValueError(f"a connection rate needs per_s > 0 and burst >= 1, got {per_s!r}, {burst!r}")
        self.per_s = float(per_s)
        self.burst = int(burst)
        # client -> (allowance, when it was last brought up to date); insertion order is recency
        self._clients: MutableMapping[str, tuple[float, float]] = {}

    def admit(self, key: str, now: float) -> float:
        """0.0 when ``key`` may open a connection at time ``now`` (seconds, monotonic), which
        then counts; else the seconds until it may (a refused attempt costs nothing)."""
        allowance, then = self._clients.pop(key, (float(self.burst), now))
        allowance = min(float(self.burst), allowance + (now - then) * self.per_s)
        admitted = allowance >= 1.0
        if admitted:
            allowance -= 1.0
        self._clients[key] = (allowance, now)
        if len(self._clients) > MAX_TRACKED_CLIENTS:
            self._forget(now)
        return 0.0 if admitted else (1.0 - allowance) / self.per_s

    def _forget(self, now: float) -> None:
        full = [k for k, (a, t) in self._clients.items() if a + (now - t) * self.per_s >= self.burst]
        for key in full:
            del self._clients[key]
        while len(self._clients) > MAX_TRACKED_CLIENTS:
            del self._clients[next(iter(self._clients))]


class SessionsByClient:
    """The sessions each client holds, against a quota per client.

    A session is *reserved* before its env exists (making one awaits a worker thread, and
    a burst of requests from one client must not all pass the check first), then *added*
    under its id, or *cancelled* when making it failed.

    Args:
        quota: sessions one client may hold at once.
    """

    def __init__(self, quota: int):
        if int(quota) < 1:
            raise ValueError(f"the session quota per client must be at least 1, got {quota!r}")
        self.quota = int(quota)
        self._sessions: dict[str, set[str]] = {}
        self._reserved: dict[str, int] = {}
        self._client_of: dict[str, str] = {}

    def held(self, key: str) -> int:
        """Sessions ``key`` holds now, those being made included."""
        return len(self._sessions.get(key, ())) + self._reserved.get(key, 0)

    def reserve(self, key: str) -> bool:
        """Take one of ``key``'s quota for a session being made; False when it has none left."""
        if self.held(key) >= self.quota:
            return False
        self._reserved[key] = self._reserved.get(key, 0) + 1
        return True

    def cancel(self, key: str) -> None:
        """Give back a reservation whose session was not made."""
        left = self._reserved.get(key, 0) - 1
        if left > 0:
            self._reserved[key] = left
        else:
            self._reserved.pop(key, None)

    def add(self, key: str, session_id: str) -> None:
        """Turn one of ``key``'s reservations into the session ``session_id``."""
        self.cancel(key)
        self._sessions.setdefault(key, set()).add(session_id)
        self._client_of[session_id] = key

    def retain(self, live: Collection[str]) -> None:
        """Forget the sessions not in ``live`` (some end without word, e.g. closed over HTTP)."""
        for session_id in [sid for sid in self._client_of if sid not in live]:
            self.discard(session_id)

    def discard(self, session_id: str) -> None:
        """Forget a session that ended (unknown ids are ignored)."""
        key = self._client_of.pop(session_id, None)
        if key is None:
            return
        held = self._sessions.get(key)
        if held is not None:
            held.discard(session_id)
            if not held:
                del self._sessions[key]
