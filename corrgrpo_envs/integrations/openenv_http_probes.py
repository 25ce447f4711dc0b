"""Red-team probes of a served env over HTTP: sessions made over ``/mcp``, oversize bodies, a
flood of listings and stateless requests, reference answers, and the token (on HTTP and on the
WebSocket handshake). Each ``probe_<name>() -> (held, detail)``; see
:mod:`~corrgrpo_envs.integrations.openenv_probes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter

from corrgrpo_envs.integrations.openenv_probe_harness import (
    ATTACK_S,
    ENV_NAME,
    HANDSHAKES,
    TOKEN,
    _hammer,
    _LegitimateClient,
    _request,
    _served,
    _under_attack,
    _verdict,
)


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

