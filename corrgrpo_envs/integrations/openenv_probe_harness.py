"""What the red-team probes of the OpenEnv boundary share: a served env in a subprocess, a flood
of requests, a legitimate client timing its round trips under the attack, and the verdict
(see :mod:`~corrgrpo_envs.integrations.openenv_probes`).
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
#: The variable that raises that floor (milliseconds), for a machine whose other work starves
#: the server of CPU during the attack itself (the calm window cannot see that load); the
#: refusal counts, memory and log bounds still decide whether the limits work.
P99_BOUND_VARIABLE = "CORRGRPO_REDTEAM_P99_BOUND_MS"
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
        return max(p99_floor_s(), P99_FACTOR * calm)


def p99_floor_s() -> float:
    """The p99 floor in seconds: :data:`P99_BOUND_S`, or :data:`P99_BOUND_VARIABLE` when set
    to a number of milliseconds above it (a bound is only ever raised, never lowered)."""
    raw = os.environ.get(P99_BOUND_VARIABLE, "")
    try:
        given = float(raw) / 1e3
    except ValueError:
        return P99_BOUND_S
    return max(P99_BOUND_S, given) if math.isfinite(given) else P99_BOUND_S


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


# ------------------------------------------------------------------ WebSocket helpers
def _ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws"


def _closed_as(exc: BaseException) -> str:
    from websockets.exceptions import ConnectionClosed

    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None:
        return f"closed {exc.rcvd.code}"
    return type(exc).__name__

