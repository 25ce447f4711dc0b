"""A legitimate OpenEnv client that times its round trips, and attackers of a served env.

Each runs in its own process (so that neither the attack nor the test's bookkeeping
holds the probe's interpreter) and prints one JSON object:

    python -m tests.openenv_attacks probe URL SECONDS [--token T]
    python -m tests.openenv_attacks KIND URL SECONDS [--token T]

``probe`` opens one WebSocket session with OpenEnv's own client and plays episodes
(reset, one step) for SECONDS, timing every message: ``{"round_trips": [s, ...],
"errors": [...]}``. A KIND attacks for SECONDS and counts what came back:

The attack says ``attacking`` on stderr once under way, and stops at SIGTERM.

* ``sessions``: ``openenv/session/create`` over plain HTTP ``/mcp``, 8 at a time;
* ``body``: 256 MB bodies streamed to ``/reset``, declared (``Content-Length``) and
  chunked, one after the other; the test's process never holds them;
* ``flood``: task listings and stateless requests (``/reset``, ``/step``, ``/state``,
  ``/schema``, ``/metadata``), 32 at a time;
* ``references``: ``/{name}/task`` (reference answers), 32 at a time;
* ``token``: every kind of request without the token or with a wrong one, and
  WebSocket handshakes without it, 32 at a time;
* ``squat``: 64 WebSocket sessions from another address (:data:`ATTACKER_ADDRESS`), each
  holding its slot with one cheap ``state`` message every 3 s, and reconnecting a second
  after it is refused or closed;
* ``churn``: WebSocket connections opened and closed at once from another address, 16 at a
  time; one in four sends a ``reset`` first (which builds the session's env).

The WebSocket attacks come from :data:`ATTACKER_ADDRESS`, a loopback address other than the
legitimate client's: a limit per client must tell them apart, as it would two machines.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

#: The source address of the WebSocket attacks (any 127.0.0.0/8 address is this machine on Linux).
ATTACKER_ADDRESS = "127.0.0.2"
#: Sessions the squatter holds, and the seconds between its ``state`` messages.
SQUATTERS = 64
SQUAT_EVERY_S = 3.0
BIG_BODY = 256 << 20
CHUNK = 1 << 20
#: An attack runs until SIGTERM (the test stops it when its probe is done) or this many seconds.
_STOP = threading.Event()


def _started() -> None:
    """Tell the test the attack is under way (it starts its probe on this line)."""
    sys.stderr.write("attacking\n")
    sys.stderr.flush()


def probe(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    from openenv.core import GenericEnvClient

    headers = {"Authorization": f"Bearer {token}"} if token else None
    trips: list[float] = []
    errors: list[str] = []
    try:
        with GenericEnvClient(base_url=url, headers=headers, message_timeout_s=30.0).sync() as env:
            for _ in range(3):  # the session's first messages warm its thread and caches
                env.reset()
                env.step({"message": "warm-up"})
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for call in (lambda: env.reset(), lambda: env.step({"message": '{"name": "x", "arguments": {}}'})):
                    start = time.perf_counter()
                    call()
                    trips.append(time.perf_counter() - start)
    except Exception as exc:  # reported, and the test fails on it
        errors.append(f"{type(exc).__name__}: {exc}")
    return {"round_trips": trips, "errors": errors}


async def _hammer(seconds: float, concurrency: int, one: Any) -> dict[str, int]:
    """Run ``one(i)`` from ``concurrency`` workers for ``seconds``; count the outcomes it returns."""
    counts: collections.Counter[str] = collections.Counter()
    end = time.monotonic() + seconds

    async def worker(w: int) -> None:
        i = w
        while time.monotonic() < end and not _STOP.is_set():
            try:
                counts[str(await one(i))] += 1
            except Exception as exc:  # a refused or reset connection is an outcome too
                counts[type(exc).__name__] += 1
            i += concurrency

    _started()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return dict(counts)


async def sessions(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    clients = [RawHTTP(url, headers) for _ in range(8)]

    async def one(i: int) -> str:
        client = clients[i % len(clients)]
        status, answer = await client.request("POST", "/mcp", {"jsonrpc": "2.0", "params": {}, "id": i,
                                                               "method": "openenv/session/create"})
        reply = json.loads(answer) if status == 200 else {}
        return "created" if "result" in reply else f"refused {status}"

    start = time.monotonic()
    counts: dict[str, Any] = await _hammer(seconds, len(clients), one)
    return {**counts, "seconds": round(time.monotonic() - start, 2)}


def _stream_big_body(url: str, declared: bool) -> dict[str, Any]:
    """POST a 256 MB body to /reset over a raw socket; stop at the server's answer or its close."""
    parts = urlsplit(url)
    head = ["POST /reset HTTP/1.1", f"Host: {parts.hostname}:{parts.port}", "Content-Type: application/json"]
    head.append(f"Content-Length: {BIG_BODY}" if declared else "Transfer-Encoding: chunked")
    chunk = b"x" * CHUNK
    frame = chunk if declared else f"{CHUNK:x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answer = b""
    start = time.perf_counter()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sock.settimeout(0.05)
        try:
            while sent < BIG_BODY:
                try:
                    answer = sock.recv(65536)  # an answer before the body is sent: stop sending
                    break
                except TimeoutError:
                    pass
                sock.settimeout(30)
                sock.sendall(frame)
                sock.settimeout(0.05)
                sent += CHUNK
            if not answer:
                if not declared:
                    sock.sendall(b"0\r\n\r\n")
                sock.settimeout(30)
                answer = sock.recv(65536)
        except OSError as exc:  # the server closed the connection on the rest of the body
            if not answer:
                answer = f"{type(exc).__name__}".encode()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else answer.decode()[:40]
    return {"status": status, "sent_mb": sent / (1 << 20), "seconds": time.perf_counter() - start}


def body(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    results = []
    end = time.monotonic() + seconds
    declared = True
    _started()
    while (time.monotonic() < end and not _STOP.is_set()) or not results:
        results.append({"declared": declared, **_stream_big_body(url, declared)})
        declared = not declared
    return {"attempts": results}


class RawHTTP:
    """Keep-alive HTTP/1.1 requests over one connection, read just far enough to count them.

    An attacker spends little CPU per request; httpx would spend more on this machine's
    two cores than the server does, and the flood would be the attacker's, not the server's.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, method: str, path: str, payload: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        body = b"" if payload is None else json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.headers}{extra}"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        try:
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            close = False
            for line in head.split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                if key.strip().lower() == b"content-length":
                    length = int(value)
                elif key.strip().lower() == b"connection" and value.strip().lower() == b"close":
                    close = True
            answer = await reader.readexactly(length)
        except Exception:
            self.close()
            raise
        if close:
            self.close()
        return status, answer

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def _flood_with(url: str, seconds: float, calls: list, headers: dict[str, str] | None = None,
                      concurrency: int = 32) -> dict[str, int]:
    clients = [RawHTTP(url, headers) for _ in range(concurrency)]

    async def one(i: int) -> str:
        method, path, payload, extra = calls[i % len(calls)]
        status, _ = await clients[i % concurrency].request(method, path, payload, extra)
        return f"{method} {path} {status}"

    try:
        return await _hammer(seconds, concurrency, one)
    finally:
        for client in clients:
            client.close()


async def flood(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    name = await _env_name(url)
    calls = [
        ("POST", f"/{name}/tasks", {"split": "all"}, None),
        ("POST", "/reset", {}, None),
        ("GET", "/schema", None, None),
        ("POST", f"/{name}/num_tasks", {"split": "all"}, None),
        ("GET", "/state", None, None),
        ("POST", "/step", {"action": {"message": "hi"}}, None),
        ("GET", "/metadata", None, None),
        ("GET", f"/{name}/splits", None, None),
        ("POST", f"/{name}/task_range", {"split": "all", "start": 0, "stop": 500}, None),
    ]
    return await _flood_with(url, seconds, calls)


async def references(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    name = await _env_name(url)
    calls = [("POST", f"/{name}/task", {"split": "all", "index": i}, None) for i in range(100)]
    return await _flood_with(url, seconds, calls)


async def wrong_token(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    ws_url = url.replace("http://", "ws://", 1) + "/ws"
    calls = [(method, path, payload, auth)
             for method, path, payload in (("GET", "/schema", None), ("POST", "/reset", {}),
                                           ("POST", "/mcp", {"jsonrpc": "2.0", "method": "openenv/session/create",
                                                             "params": {}, "id": 1}), ("GET", "/state", None))
             for auth in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {token}x"})]
    http = _flood_with(url, seconds, calls, concurrency=24)

    async def handshakes() -> dict[str, int]:
        async def one(i: int) -> str:
            try:
                async with connect(ws_url, open_timeout=30):
                    return "ws opened"
            except InvalidStatus as exc:
                return f"ws {exc.response.status_code}"

        return await _hammer(seconds, 8, one)

    counts: dict[str, int] = {}
    for part in await asyncio.gather(http, handshakes()):
        counts.update(part)
    return counts


# the red-team probes' own helpers: one definition of the socket URL and of how a close reads
from corrgrpo_envs.integrations.openenv_probe_harness import _closed_as as _closed_code  # noqa: E402
from corrgrpo_envs.integrations.openenv_probe_harness import _ws_url  # noqa: E402


async def squat(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    """Hold :data:`SQUATTERS` sessions with ``state`` messages only; count how the server answered."""
    from websockets.asyncio.client import connect

    counts: collections.Counter[str] = collections.Counter()
    held = 0
    most_held = 0
    first_answers = asyncio.Semaphore(0)  # one release per squatter once its first try is answered
    end = time.monotonic() + seconds

    async def squatter() -> None:
        nonlocal held, most_held
        first = True
        while time.monotonic() < end and not _STOP.is_set():
            holding = False
            try:
                async with connect(_ws_url(url), open_timeout=30, local_addr=(ATTACKER_ADDRESS, 0),
                                   compression=None) as ws:
                    while time.monotonic() < end and not _STOP.is_set():
                        await ws.send(json.dumps({"type": "state"}))
                        reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                        if reply.get("type") != "state":
                            counts[f"refused {reply.get('data', {}).get('code')}"] += 1
                            break
                        if not holding:
                            holding, held = True, held + 1
                            most_held = max(most_held, held)
                            counts["sessions held"] += 1
                        if first:
                            first = False
                            first_answers.release()
                        await asyncio.sleep(SQUAT_EVERY_S)  # the attack: a client that holds a session idle
            except Exception as exc:  # a refused or closed connection is an outcome too
                counts[_closed_code(exc)] += 1
            finally:
                if holding:
                    held -= 1
            if first:
                first = False
                first_answers.release()
            await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(squatter()) for _ in range(SQUATTERS)]
    for _ in range(SQUATTERS):  # every squatter has its slot, or was refused one, before the probe
        await first_answers.acquire()
    _started()
    await asyncio.gather(*tasks)
    return {**counts, "most_held_at_once": most_held}


async def reset_from_the_attackers_address(url: str) -> str:
    """One WebSocket from :data:`ATTACKER_ADDRESS` that resets, then closes: ``"reset answered"``,
    ``"reset refused <code>"`` (an error reply) or ``"reset: <close>"`` (closed before the reply)."""
    from websockets.asyncio.client import connect

    async with connect(_ws_url(url), open_timeout=30, local_addr=(ATTACKER_ADDRESS, 0), compression=None) as ws:
        try:
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
        except Exception as exc:  # refused before the reset went out: the close says why
            return f"reset: {_closed_code(exc)}"
    if reply.get("type") == "error":
        return f"reset refused {reply.get('data', {}).get('code')}"
    return "reset answered"


async def churn(url: str, seconds: float, token: str | None) -> dict[str, Any]:
    """Open and close WebSocket connections as fast as the server takes them (one in four resets)."""
    from websockets.asyncio.client import connect

    async def one(i: int) -> str:
        if i % 4 == 0:
            return await reset_from_the_attackers_address(url)
        async with connect(_ws_url(url), open_timeout=30, local_addr=(ATTACKER_ADDRESS, 0), compression=None):
            return "opened and closed"

    return await _hammer(seconds, 16, one)


async def _env_name(url: str) -> str:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        return (await client.get("/list_environments")).json()[0]


ATTACKS = {"sessions": sessions, "body": body, "flood": flood, "references": references, "token": wrong_token,
           "squat": squat, "churn": churn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.openenv_attacks")
    parser.add_argument("kind", choices=["probe", *ATTACKS])
    parser.add_argument("url")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--token", default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    if args.kind == "probe":
        out = probe(args.url, args.seconds, args.token)
    else:
        run = ATTACKS[args.kind](args.url, args.seconds, args.token)
        out = asyncio.run(run) if asyncio.iscoroutine(run) else run
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
