"""Red-team probes of the OpenEnv client against hostile servers in this process: a server that
trickles its answer, one that sends a huge observation, and ones that lie about their rewards.
Each ``probe_<name>() -> (held, detail)``; see :mod:`~corrgrpo_envs.integrations.openenv_probes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from corrgrpo_envs.integrations.openenv_probe_harness import (
    MEMORY_MB,
    _rss_mb,
)


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

