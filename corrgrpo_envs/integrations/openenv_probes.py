"""Red-team probes of the OpenEnv boundary: a served env under attack, and the client against
hostile servers (run by ``corrgrpo redteam``; each ``probe_<name>() -> (held, detail)``).

Server probes start ``python -m corrgrpo_envs.serve corrgrpo/ScaleDominance-v0`` on a free
loopback port and attack it for a few seconds while a legitimate client (OpenEnv's own
``GenericEnvClient`` over a WebSocket, as the trainer's client) times its round trips. An
attack is held when the server refuses it as designed, the legitimate client's p99 round
trip stays under :data:`P99_BOUND_S` with no error, the server's resident memory grows
by less than :data:`MEMORY_MB` and its log (stderr, at its default level) by less than
:data:`LOG_BYTES`: a server that writes a line per refused peer lets the attacker fill its
disk, or stall it on a full pipe.

Client probes start a small misbehaving server in this process (a raw socket server, or a
FastAPI app under uvicorn on a thread) and check that :class:`OpenEnvEnv` refuses it within
its deadline with one :class:`RemoteEnvError`, and never returns a non-finite or invented
reward. Every server is loopback only and stopped when its probe ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_ID = "corrgrpo/ScaleDominance-v0"
ENV_NAME = "ScaleDominance-v0"
#: The legitimate client's p99 round trip under attack must stay below this, or below
#: :data:`P99_FACTOR` times its p99 over :data:`CALM_S` just before the attack, whichever is
#: larger: an attack that stalls the server shows as seconds, while a machine that other work
#: keeps busy slows the calm round trips as much as the attacked ones (the measured figures are
#: in the detail).
P99_BOUND_S = 0.5
P99_FACTOR = 4.0
CALM_S = 0.5
#: The server's resident memory may grow by less than this during an attack.
MEMORY_MB = 100.0
#: The server's log may grow by less than this during an attack (a few warnings, not a line per peer).
LOG_BYTES = 4096
ATTACK_S = 3.0
TOKEN = "red-team-token"
#: Refused WebSocket handshakes the token probe makes at least.
HANDSHAKES = 1500
STARTUP_S = 60.0


# ------------------------------------------------------------------ a served env
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass(frozen=True)
class _Served:
    """A served env: its URL, its process id and the file its stderr goes to."""

    base: str
    pid: int
    log: Path

    def log_bytes(self) -> int:
        with contextlib.suppress(OSError):
            return self.log.stat().st_size
        return 0


@contextlib.contextmanager
def _served(*options: str, token: str | None = None) -> Iterator[_Served]:
    """A toy env served in a subprocess; killed on exit. Its stderr goes to a file, never to a
    pipe nobody reads while the attack runs (a full pipe would stall the server, not the attack)."""
    port = _free_port()
    environ = {k: v for k, v in os.environ.items() if k != "CORRGRPO_OPENENV_TOKEN"}
    argv = [sys.executable, "-m", "corrgrpo_envs.serve", ENV_ID, "--port", str(port), *options]
    if token:
        argv += ["--token", token]
    with tempfile.TemporaryDirectory(prefix="corrgrpo-redteam-") as folder:
        log = Path(folder) / "server.log"
        with log.open("wb") as stderr:
            proc = subprocess.Popen(argv, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=stderr, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + STARTUP_S
            while True:
                if proc.poll() is not None:
                    err = log.read_bytes()[-400:].decode(errors="replace")
                    raise RuntimeError(f"the served env exited with {proc.returncode}: {err}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the served env did not answer /health within {STARTUP_S:g} s")
                with contextlib.suppress(OSError):
                    if asyncio.run(_request(base, "GET", "/health"))[0] == 200:
                        break
                time.sleep(0.1)
            yield _Served(base, proc.pid, log)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


async def _request(base: str, method: str, path: str, payload: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a fresh connection (cheap, so the flood is the server's cost)."""
    host, port = base.removeprefix("http://").split(":")
    body = b"" if payload is None else json.dumps(payload).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        await writer.drain()
        answer = b""
        async with asyncio.timeout(10):
            while len(answer) < 1 << 20 and (part := await reader.read(65536)):  # to the close
                answer += part
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, answer.partition(b"\r\n\r\n")[2]


async def _hammer(seconds: float, workers: int, one: Callable[[int], Awaitable[str]],
                  at_least: int = 0, longest: float = 20.0) -> Counter[str]:
    """Run ``one(i)`` from ``workers`` tasks for ``seconds``, and on until ``at_least`` calls
    were made (within ``longest`` seconds in all); count what each returned."""
    counts: Counter[str] = Counter()
    start = time.monotonic()
    end, last = start + seconds, start + max(seconds, longest)

    def going() -> bool:
        now = time.monotonic()
        return now < end or (sum(counts.values()) < at_least and now < last)

    async def worker(w: int) -> None:
        i = w
        while going():
            try:
                counts[await one(i)] += 1
            except Exception as exc:  # noqa: BLE001 - a reset connection is an outcome too
                counts[type(exc).__name__] += 1
            i += workers

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return counts


class _LegitimateClient(threading.Thread):
    """OpenEnv's own client playing episodes (reset, step) and timing every round trip."""

    def __init__(self, base: str, token: str | None = None):
        super().__init__(daemon=True, name="redteam-legitimate-client")
        self.base, self.token = base, token
        self.trips: list[float] = []
        self.error: str | None = None
        self.ready, self._stop_event = threading.Event(), threading.Event()

    def run(self) -> None:
        from openenv.core import GenericEnvClient

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            with GenericEnvClient(base_url=self.base, headers=headers, message_timeout_s=30.0).sync() as env:
                for _ in range(3):  # warm the session's thread and caches
                    env.reset()
                    env.step({"message": "warm-up"})
                self.ready.set()
                while not self._stop_event.is_set():
                    for call in (env.reset, lambda: env.step({"message": "0.5"})):
                        start = time.perf_counter()
                        call()
                        self.trips.append(time.perf_counter() - start)
                    time.sleep(0.01)  # a trainer's pace, not a flood of its own
        except Exception as exc:  # noqa: BLE001 - reported in the probe's detail
            self.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self.ready.set()

    def stop(self, since: int = 0) -> float:
        """Stop and return the p99 round trip in seconds of the trips from index ``since`` on
        (inf when none was measured)."""
        self._stop_event.set()
        self.join(40)
        return _p99(self.trips[since:])


def _p99(trips: list[float]) -> float:
    if not trips:
        return math.inf
    trips = sorted(trips)
    return trips[min(len(trips) - 1, int(math.ceil(0.99 * len(trips))) - 1)]


@dataclass(frozen=True)
class _Attack:
    """What an attack did: its counts, the legitimate client's p99 round trip (s) and error,
    the round trips measured, the server's growth in resident memory (MB) and log (bytes), and
    the same client's p99 round trip over :data:`CALM_S` just before the attack."""

    counts: Counter[str]
    p99: float
    error: str | None
    trips: int
    grown_mb: float
    logged: int
    calm_p99: float = 0.0

    @property
    def p99_bound(self) -> float:
        """The p99 the attack may leave the client with (calibrated on the calm window)."""
        calm = self.calm_p99 if math.isfinite(self.calm_p99) else 0.0
        return max(P99_BOUND_S, P99_FACTOR * calm)


def _under_attack(server: _Served, attack: Callable[[], Awaitable[Counter[str]]],
                  token: str | None = None) -> _Attack:
    """Run ``attack`` while a legitimate client plays."""
    client = _LegitimateClient(server.base, token)
    client.start()
    client.ready.wait(30)
    time.sleep(CALM_S)  # the calibration: the same client, the same moment's load, no attack
    calm = len(client.trips)
    calm_p99 = _p99(client.trips[:calm])
    idle, logged_before = _rss_mb(server.pid), server.log_bytes()
    peak = [idle]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            with contextlib.suppress(OSError):
                peak[0] = max(peak[0], _rss_mb(server.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        counts = asyncio.run(attack())
    finally:
        p99 = client.stop(since=calm)
        sampling.set()
        sampler.join(5)
    return _Attack(counts, p99, client.error, len(client.trips) - calm, peak[0] - idle,
                   server.log_bytes() - logged_before, calm_p99)


def _verdict(refused: bool, what: str, attack: _Attack) -> tuple[bool, str]:
    held = (refused and attack.error is None and attack.p99 < attack.p99_bound
            and attack.grown_mb < MEMORY_MB and attack.logged < LOG_BYTES)
    shown = ", ".join(f"{k}: {v}" for k, v in attack.counts.most_common(6))
    return held, (f"{what} ({shown}); legitimate client p99 {attack.p99 * 1e3:.0f} ms over {attack.trips} "
                  f"round trips (bound {attack.p99_bound * 1e3:.0f} ms; "
                  f"{attack.calm_p99 * 1e3:.0f} ms before the attack)"
                  f"{'; error ' + attack.error if attack.error else ''}; "
                  f"server RSS +{attack.grown_mb:.1f} MB (bound {MEMORY_MB:.0f}), "
                  f"log +{attack.logged} bytes (bound {LOG_BYTES})")


# ------------------------------------------------------------------ server probes
def probe_openenv_server_session_flood() -> tuple[bool, str]:
    """OpenEnv server: sessions created over HTTP /mcp are capped and reaped; clients keep working"""
    with _served("--max-sessions", "8", "--session-detached-s", "1") as server:
        base = server.base
        async def attack() -> Counter[str]:
            async def one(i: int) -> str:
                status, answer = await _request(base, "POST", "/mcp", {
                    "jsonrpc": "2.0", "id": i, "method": "openenv/session/create", "params": {}})
                if status == 200:
                    return "created" if b'"result"' in answer else "refused (JSON-RPC error)"
                return f"refused {status}"
            return await _hammer(ATTACK_S, 8, one)

        outcome = _under_attack(server, attack)
        time.sleep(2.5)  # past --session-detached-s: the flood's sessions are reaped
        after = _LegitimateClient(base)
        after.start()
        after.ready.wait(30)
        after.stop()
        refused = any(k != "created" for k in outcome.counts) and after.error is None and bool(after.trips)
        what = "flood refused past 8 sessions, new client served after reaping" if refused else \
            f"flood not refused or new client locked out ({after.error})"
        return _verdict(refused, what, outcome)


def _stream_body(base: str, declared: bool, total: int = 256 << 20,
                 chunk: int = 1 << 20) -> tuple[str, float, float]:
    """POST a ``total``-byte body a chunk at a time, its length declared or not (chunked);
    stop at the server's answer. Returns (status, MB sent, seconds)."""
    host, port = base.removeprefix("http://").split(":")
    block = b"x" * chunk if declared else f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
    length = f"Content-Length: {total}" if declared else "Transfer-Encoding: chunked"
    sent, answer, start = 0, b"", time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /reset HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"{length}\r\n\r\n".encode())
        try:
            while sent < total and time.perf_counter() - start < 20:
                sock.settimeout(0.02)
                with contextlib.suppress(TimeoutError):
                    answer = sock.recv(4096)
                    break
                sock.settimeout(10)
                sock.sendall(block)
                sent += chunk
            if not answer:
                sock.settimeout(10)
                answer = sock.recv(4096)
        except OSError as exc:  # the server closed the connection on the rest of the body
            answer = answer or type(exc).__name__.encode()
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else answer[:40].decode()
    return status, sent / (1 << 20), time.perf_counter() - start


def probe_openenv_server_oversize_body() -> tuple[bool, str]:
    """OpenEnv server: a 256 MB HTTP body (declared or chunked) is refused (413) before it is read"""
    with _served() as server:
        base = server.base
        results: list[tuple[str, float, float]] = []

        async def attack() -> Counter[str]:
            end = time.monotonic() + ATTACK_S
            while time.monotonic() < end or not results:
                results.append(await asyncio.to_thread(_stream_body, base, len(results) % 2 == 0))
            return Counter(f"status {s}" for s, _, _ in results)

        outcome = _under_attack(server, attack)
        refused = all(s == "413" for s, _, _ in results)
        most = max(mb for _, mb, _ in results)
        slowest = max(t for _, _, t in results)
        return _verdict(refused, f"{len(results)} bodies of 256 MB, declared and chunked, at most "
                        f"{most:.0f} MB sent before the answer, each refused within {slowest:.2f} s",
                        outcome)


def probe_openenv_server_request_flood() -> tuple[bool, str]:
    """OpenEnv server: a flood of task listings and stateless requests does not stall other clients"""
    with _served() as server:
        base = server.base
        calls = [("POST", f"/{ENV_NAME}/tasks", {"split": "all"}), ("POST", "/reset", {}),
                 ("GET", "/schema", None), ("POST", f"/{ENV_NAME}/num_tasks", {"split": "all"}),
                 ("GET", "/state", None), ("POST", "/step", {"action": {"message": "hi"}}),
                 ("GET", "/metadata", None), ("GET", f"/{ENV_NAME}/splits", None)]

        async def attack() -> Counter[str]:
            async def one(i: int) -> str:
                method, path, payload = calls[i % len(calls)]
                status, _ = await _request(base, method, path, payload)
                return "answered" if status < 500 or status == 503 else f"failed {status}"
            return await _hammer(ATTACK_S, 16, one)

        outcome = _under_attack(server, attack)
        answered = outcome.counts.get("answered", 0) > 0 and not any(k.startswith("failed") for k in outcome.counts)
        return _verdict(answered, f"{sum(outcome.counts.values())} requests in {ATTACK_S:g} s",
                        outcome)


def probe_openenv_server_reference_answers() -> tuple[bool, str]:
    """OpenEnv server: reference answers (/{name}/task) are refused (403) without --serve-references"""
    with _served() as server:
        base = server.base
        async def attack() -> Counter[str]:
            async def one(i: int) -> str:
                status, answer = await _request(base, "POST", f"/{ENV_NAME}/task", {"split": "all", "index": i % 8})
                return f"status {status}" + (" with a reference" if b"reference\"" in answer else "")
            return await _hammer(ATTACK_S, 8, one)

        outcome = _under_attack(server, attack)
        refused = set(outcome.counts) == {"status 403"}
        return _verdict(refused, "every request refused" if refused else "some answered",
                        outcome)


def probe_openenv_server_token() -> tuple[bool, str]:
    """OpenEnv server with a token: requests and WebSocket handshakes without it are refused (401)"""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    with _served(token=TOKEN) as server:

        base = server.base
        ws_url = base.replace("http://", "ws://", 1) + "/ws"
        calls = [(method, path, payload, auth)
                 for method, path, payload in (("GET", "/schema", None), ("POST", "/reset", {}),
                                               ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "params": {},
                                                                 "method": "openenv/session/create"}))
                 for auth in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"})]

        async def attack() -> Counter[str]:
            async def http(i: int) -> str:
                method, path, payload, auth = calls[i % len(calls)]
                return f"http {(await _request(base, method, path, payload, auth))[0]}"

            async def handshake(i: int) -> str:
                auth = None if i % 2 else {"Authorization": "Bearer wrong"}
                try:
                    async with connect(ws_url, open_timeout=10, additional_headers=auth):
                        return "ws opened"
                except InvalidStatus as exc:
                    return f"ws {exc.response.status_code}"

            counts = await _hammer(ATTACK_S, 8, http)
            # past 1,100 refusals whatever the machine's speed: one log line per refusal
            # filled a 64 KiB pipe at about 1,040 and stalled the server
            counts.update(await _hammer(1.0, 4, handshake, at_least=HANDSHAKES))
            return counts

        outcome = _under_attack(server, attack, token=TOKEN)
        refused = set(outcome.counts) == {"http 401", "ws 401"}
        return _verdict(refused, "every request without the token refused" if refused else "some let through",
                        outcome)


#: Where the WebSocket squatters and churners connect from: another loopback address than the
#: legitimate client's (127.0.0.1), as another machine would (Linux answers all of 127/8).
ATTACKER_ADDRESS = "127.0.0.2"
#: Sockets the squatter opens, and the seconds between the ``state`` messages that hold them.
SQUATTERS = 64
SQUAT_EVERY_S = 3.0
#: The squatted server's sessions (its quota per client is half of them).
SQUATTED_SESSIONS = 16


def _ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws"


def _closed_as(exc: BaseException) -> str:
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None:
        return f"closed {exc.rcvd.code}"
    return type(exc).__name__


def _newcomer(base: str) -> str:
    """A client that arrives while the attack goes on: opens a session and plays one episode."""
    from openenv.core import GenericEnvClient

    try:
        with GenericEnvClient(base_url=base, message_timeout_s=30.0).sync() as env:
            env.reset()
            env.step({"message": "0.5"})
    except Exception as exc:  # noqa: BLE001 - what it got instead is the outcome
        return f"newcomer refused ({str(exc)[:120]})"
    return "newcomer played"


def probe_openenv_server_websocket_squatters() -> tuple[bool, str]:
    """OpenEnv server: 64 WebSockets holding slots with state messages get their quota; others play"""
    from websockets.asyncio.client import connect

    with _served("--max-sessions", str(SQUATTED_SESSIONS)) as server:
        base = server.base
        quota = SQUATTED_SESSIONS // 2
        held = [0, 0]  # now, most at once

        async def attack() -> Counter[str]:
            counts: Counter[str] = Counter()
            answered = asyncio.Semaphore(0)
            stop = asyncio.Event()

            async def squatter() -> None:
                first = True
                while not stop.is_set():
                    holding = False
                    try:
                        async with connect(_ws_url(base), open_timeout=30, compression=None,
                                           local_addr=(ATTACKER_ADDRESS, 0)) as ws:
                            while not stop.is_set():
                                await ws.send(json.dumps({"type": "state"}))
                                reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                                if reply.get("type") != "state":
                                    counts[f"refused {reply.get('data', {}).get('code')}"] += 1
                                    break
                                if not holding:
                                    holding = True
                                    held[0] += 1
                                    held[1] = max(held)
                                    counts["held a session"] += 1
                                if first:
                                    first = False
                                    answered.release()
                                with contextlib.suppress(TimeoutError):
                                    await asyncio.wait_for(stop.wait(), SQUAT_EVERY_S)
                    except Exception as exc:  # noqa: BLE001 - a refusal or a close is an outcome too
                        counts[_closed_as(exc)] += 1
                    finally:
                        held[0] -= holding
                    if first:
                        first = False
                        answered.release()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)

            tasks = [asyncio.create_task(squatter()) for _ in range(SQUATTERS)]
            for _ in range(SQUATTERS):  # every squatter holds a slot or was refused one
                await answered.acquire()
            counts[await asyncio.to_thread(_newcomer, base)] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ATTACK_S)
            stop.set()
            await asyncio.gather(*tasks)
            return counts

        outcome = _under_attack(server, attack)
        refused = (held[1] <= quota and outcome.counts["newcomer played"] == 1
                   and sum(n for k, n in outcome.counts.items() if k.startswith(("refused", "closed 1013"))) > 0)
        what = (f"{SQUATTERS} squatters from {ATTACKER_ADDRESS} held at most {held[1]} sessions at once "
                f"(quota {quota} of {SQUATTED_SESSIONS}), a newcomer from another address "
                + ("played" if outcome.counts["newcomer played"] else "was refused"))
        return _verdict(refused, what, outcome)


def probe_openenv_server_connection_churn() -> tuple[bool, str]:
    """OpenEnv server: opening and closing WebSockets in a loop is rate-limited (close code 1013)"""
    from websockets.asyncio.client import connect

    with _served() as server:
        base = server.base

        async def attack() -> Counter[str]:
            async def one(i: int) -> str:
                async with connect(_ws_url(base), open_timeout=30, compression=None,
                                   local_addr=(ATTACKER_ADDRESS, 0)) as ws:
                    if i % 4:
                        return "opened and closed"
                    try:
                        await ws.send(json.dumps({"type": "reset", "data": {}}))
                        reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    except Exception as exc:  # noqa: BLE001 - refused before the reset went out
                        return f"reset: {_closed_as(exc)}"
                    if reply.get("type") == "error":
                        return f"reset refused {reply.get('data', {}).get('code')}"
                    return "reset answered"
            return await _hammer(ATTACK_S, 16, one)

        outcome = _under_attack(server, attack)
        limited = outcome.counts["reset: closed 1013"]
        refused = limited > 0 and outcome.counts["reset answered"] > 0
        return _verdict(refused, f"{sum(outcome.counts.values())} connections from {ATTACKER_ADDRESS} in "
                        f"{ATTACK_S:g} s, {limited} of the resets refused for the rate", outcome)


# ------------------------------------------------------------------ client probes
class _RawServer:
    """A loopback TCP server on a thread of this process; ``handle(reader, writer)`` per connection."""

    def __init__(self, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]):
        self.handle, self.port = handle, 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="redteam-raw-server")

    def __enter__(self) -> _RawServer:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.handle, "127.0.0.1", 0), self._loop).result(10)
        self._server = server
        self.port = server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _refusal(make: Callable[[], Any], deadline_s: float) -> tuple[BaseException | None, float]:
    """(the error ``make()`` raised, or None; seconds it took)."""
    start = time.perf_counter()
    try:
        env = make()
    except Exception as exc:  # noqa: BLE001 - the caller judges which error
        return exc, time.perf_counter() - start
    env.close()
    return None, time.perf_counter() - start


def probe_openenv_client_trickle() -> tuple[bool, str]:
    """OpenEnv client: a server trickling one byte a second is refused within connect_timeout_s"""
    from corrgrpo_envs.integrations.openenv_client import OpenEnvEnv, RemoteEnvError

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError, OSError):  # stopped with the server
            await reader.readuntil(b"\r\n\r\n")
            for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99999\r\n\r\n{":
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
        writer.close()

    connect_s = 2.0
    with _RawServer(trickle) as server:
        error, seconds = _refusal(lambda: OpenEnvEnv(f"openenv://127.0.0.1:{server.port}",
                                                     connect_timeout_s=connect_s, retries=0), connect_s)
    held = isinstance(error, RemoteEnvError) and seconds < connect_s + 2.0
    return held, (f"refused in {seconds:.2f} s (connect_timeout_s {connect_s:g} s, margin 2 s): "
                  f"{type(error).__name__ if error else 'accepted'}: {str(error)[:160]}")


class _LyingServer:
    """A FastAPI app speaking just enough OpenEnv (schema, WebSocket reset/step) under uvicorn on a
    thread; ``schema_components`` and ``step_data`` say what it declares and what a step sends."""

    def __init__(self, schema_components: list[dict[str, Any]], step_data: Callable[[], str]):
        self.schema_components, self.step_data = schema_components, step_data
        self.port, self._server, self._thread = 0, None, None

    def _app(self) -> Any:
        from fastapi import FastAPI, WebSocket
        from fastapi.responses import JSONResponse, Response
        from starlette.websockets import WebSocketDisconnect

        app = FastAPI()
        app.get("/health")(lambda: {"status": "healthy"})
        schema = {"action": {"type": "object", "required": ["message"],
                             "properties": {"message": {"type": "string"}}},
                  "observation": {"type": "object", "reward_components": self.schema_components},
                  "state": {}}
        # json.dumps, not FastAPI's encoder: a liar may declare bounds no strict encoder writes
        app.get("/schema")(lambda: Response(json.dumps(schema), media_type="application/json"))
        app.get("/list_environments")(lambda: JSONResponse({"detail": "not found"}, status_code=404))

        async def session(ws: WebSocket) -> None:
            await ws.accept()
            with contextlib.suppress(WebSocketDisconnect):
                while True:
                    kind = json.loads(await ws.receive_text()).get("type")
                    if kind == "close":
                        return
                    if kind == "reset":
                        await ws.send_text(json.dumps({"type": "observation", "data": {
                            "observation": {"text": "say something"}, "reward": None, "done": False}}))
                    else:
                        await ws.send_text(self.step_data())

        # Starlette's route, not FastAPI's: this module's annotations are strings, which
        # FastAPI's dependency injection would not resolve
        app.router.add_websocket_route("/ws", session)
        return app

    def __enter__(self) -> _LyingServer:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self._app(), log_level="error", lifespan="off",
                                                     ws_max_size=1 << 30))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the lying OpenEnv server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def _components(names: list[str], low: float = 0.0, high: float = 1.0, weight: float = 1.0) -> list[dict]:
    return [{"name": n, "low": low, "high": high, "weight": weight} for n in names]


def _step_frame(text: str, components: dict[str, Any]) -> str:
    return json.dumps({"type": "observation", "data": {
        "observation": {"text": text}, "reward": 1.0, "done": True,
        "metadata": {"reward_components": components}}})


def _play(server: _LyingServer, **options: Any) -> tuple[Any, BaseException | None, float]:
    """Build an env on ``server`` and play one step: (rewards, or None; the error; seconds)."""
    from corrgrpo_envs.integrations.openenv_client import OpenEnvEnv

    start = time.perf_counter()
    env = None
    try:
        env = OpenEnvEnv(f"openenv://127.0.0.1:{server.port}", retries=0, timeout_s=10.0,
                         connect_timeout_s=5.0, **options)
        env.reset(seed=0)
        step = env.step("hello")
        return step[1], None, time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - the caller judges which error
        return None, exc, time.perf_counter() - start
    finally:
        if env is not None:
            env.close()


def probe_openenv_client_huge_observation() -> tuple[bool, str]:
    """OpenEnv client: a 32 MB observation is refused with a size error, memory bounded"""
    from corrgrpo_envs.integrations.openenv_client import RemoteEnvError

    big = _step_frame("x" * (32 << 20), {"a": 1.0})
    before = _rss_mb(os.getpid())
    with _LyingServer(_components(["a"]), lambda: big) as server:
        rewards, error, seconds = _play(server, max_observation_bytes=1 << 20)
    grown = _rss_mb(os.getpid()) - before  # the server's copy of its frame counts too
    held = isinstance(error, RemoteEnvError) and "max_observation_bytes" in str(error) and grown < MEMORY_MB
    return held, (f"refused in {seconds:.2f} s with max_observation_bytes 1 MiB, client RSS "
                  f"+{grown:.1f} MB (bound {MEMORY_MB:.0f}, server in this process): "
                  f"{type(error).__name__ if error else f'accepted, rewards {rewards}'}: {str(error)[:160]}")


def probe_openenv_client_lying_rewards() -> tuple[bool, str]:
    """OpenEnv client: NaN, 1e300 and renamed components (and 1e39 weights) raise, never train"""
    from corrgrpo_envs.integrations.openenv_client import RemoteEnvError, RemoteRewardError

    # (what the schema declares, what a step sends, the error expected)
    lies: dict[str, tuple[list[dict], str, type[Exception]]] = {
        "NaN": (_components(["a", "b"]), _step_frame("ok", {"a": float("nan"), "b": 0.5}),
                RemoteRewardError),
        "1e300": (_components(["a", "b"], low=-math.inf, high=math.inf), _step_frame("ok", {"a": 1e300, "b": 0.5}),
                  RemoteRewardError),
        "renamed": (_components(["a", "b"]), _step_frame("ok", {"a": 0.5, "c": 0.5}),
                    RemoteRewardError),
        "weight 1e39": (_components(["a", "b"], weight=1e39), _step_frame("ok", {"a": 0.5, "b": 0.5}),
                        RemoteEnvError),
        "bound 1e300": (_components(["a", "b"], high=1e300), _step_frame("ok", {"a": 0.5, "b": 0.5}),
                        RemoteEnvError),
    }
    results, held = [], True
    for name, (declared, frame, expected) in lies.items():
        with _LyingServer(declared, lambda frame=frame: frame) as server:
            rewards, error, seconds = _play(server)
        # a refusal for another reason (a token, a protocol slip) would not show the lie was caught
        held &= isinstance(error, expected) and "refused the request" not in str(error)
        results.append(f"{name}: {type(error).__name__ if error else f'ACCEPTED rewards {rewards}'} "
                       f"in {seconds:.2f} s" + (f" ({str(error)[:120]})" if error else ""))
    return held, "; ".join(results)


__all__ = ["P99_BOUND_S", "MEMORY_MB"] + sorted(n for n in dir() if n.startswith("probe_"))
