"""Small OpenEnv servers that misbehave on purpose, for the client's fault tests.

:class:`FakeOpenEnv` is a FastAPI app under uvicorn on a thread of the test process (port 0):
``/health``, ``/schema``, ``/list_environments``, the task routes and a ``/ws`` session speak
just enough of OpenEnv's wire format, and every answer is a knob a test sets: what the
schema declares (bounds, weights), what a reset or step sends (NaN, 1e300, renamed
components, a 90 MB observation, garbage), an endless HTTP answer, a required token
(401, and a refused WebSocket handshake), refused or missing reference answers. It records
the ``Authorization`` header of every request and handshake.

:class:`TrickleProxy` sits in front of a server and, once told to, passes the server's
bytes to the client one every ``interval_s`` seconds (a byte at a time is enough to defeat
any timeout that applies per read).

:func:`free_port` with nothing listening on it is a server that is down.
"""

# no ``from __future__ import annotations``: FastAPI reads the routes' annotations as objects
import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.ports import free_port

__all__ = ["FakeOpenEnv", "TrickleProxy", "free_port", "observation"]

TEXT_ACTION = {"properties": {"message": {"type": "string"}}, "required": ["message"], "type": "object"}


def observation(text: str = "ok", reward: Any = None, done: bool = False, **metadata: Any) -> dict[str, Any]:
    """The ``data`` of an OpenEnv observation frame (what ``serialize_observation`` writes)."""
    data: dict[str, Any] = {"observation": {"text": text}, "reward": reward, "done": done}
    if metadata:
        data["metadata"] = metadata
    return data


def _components(names: list[str], low: float = 0.0, high: float = 1.0, weight: float = 1.0) -> list[dict]:
    return [{"name": n, "low": low, "high": high, "weight": weight} for n in names]


class FakeOpenEnv:
    """A scripted OpenEnv server; change its attributes between calls to change what it does.

    Attributes:
        components: ``/schema``'s ``observation.reward_components`` (None: not declared).
        env_name, tasks: the task listing (``env_name`` None: no listing, 404).
        on_reset, on_step: ``(data, turn) -> dict | str``: the observation frame's ``data``,
            or a raw text frame sent as is.
        schema_bytes: with a number, ``/schema`` streams that many bytes (no length declared).
        token: required as ``Authorization: Bearer`` on everything but ``/health``.
        reference: ``/task``'s reference messages (None: omitted); ``reference_status``: its status.
        headers: the ``Authorization`` header of every request and handshake, in order.
    """

    def __init__(self, components: list[str] | None = None, **knobs: Any):
        self.components: list[dict] | None = None if components is None else _components(components)
        self.action: dict[str, Any] = TEXT_ACTION
        self.env_name: str | None = None
        self.tasks: list[str] = []
        self.on_reset: Callable[[dict, int], Any] = lambda data, turn: observation("say something")
        self.on_step: Callable[[dict, int], Any] = lambda data, turn: observation(
            "done", reward=1.0, done=True, reward_components={c["name"]: 1.0 for c in self.components or []}
        )
        self.schema_bytes: int | None = None
        self.token: str | None = None
        self.reference: list[str] | None = ["the answer"]
        self.reference_status = 200
        self.headers: list[str | None] = []
        self.sessions = 0  # sessions opened so far
        self.open_sessions = 0  # sessions open now
        for key, value in knobs.items():
            if not hasattr(self, key):
                raise AttributeError(f"FakeOpenEnv has no knob {key!r}")
            setattr(self, key, value)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ------------------------------------------------------------------ app
    def _allowed(self, authorization: str | None) -> bool:
        self.headers.append(authorization)
        return self.token is None or authorization == f"Bearer {self.token}"

    def app(self) -> Any:
        from fastapi import FastAPI, Request, WebSocket
        from fastapi.responses import JSONResponse, StreamingResponse
        from starlette.websockets import WebSocketDisconnect

        app = FastAPI()
        denied = JSONResponse({"detail": "a token is required"}, status_code=401)

        @app.get("/health")
        async def health() -> dict:
            return {"status": "healthy"}

        @app.get("/schema")
        async def schema(request: Request) -> Any:
            if not self._allowed(request.headers.get("authorization")):
                return denied
            if self.schema_bytes is not None:
                return StreamingResponse(_flood(self.schema_bytes), media_type="application/json")
            observation_schema: dict[str, Any] = {"type": "object"}
            if self.components is not None:
                observation_schema["reward_components"] = self.components
            return {"action": self.action, "observation": observation_schema, "state": {}}

        @app.get("/list_environments")
        async def names(request: Request) -> Any:
            if not self._allowed(request.headers.get("authorization")):
                return denied
            if self.env_name is None:
                return JSONResponse({"detail": "not found"}, status_code=404)
            return [self.env_name]

        @app.post("/{name}/tasks")
        async def tasks(name: str, request: Request) -> Any:
            if not self._allowed(request.headers.get("authorization")):
                return denied
            return {"tasks": [{"id": t, "index": i} for i, t in enumerate(self.tasks)]}

        @app.post("/{name}/task")
        async def task(name: str, request: Request) -> Any:
            if not self._allowed(request.headers.get("authorization")):
                return denied
            if self.reference_status != 200:
                return JSONResponse({"detail": "reference answers are off"}, status_code=self.reference_status)
            body = await request.json()
            row: dict[str, Any] = {"id": self.tasks[int(body["index"])], "index": body["index"]}
            if self.reference is not None:
                row["reference"] = self.reference
            return {"task": row}

        @app.websocket("/ws")
        async def session(ws: WebSocket) -> None:
            if not self._allowed(ws.headers.get("authorization")):
                await ws.close(code=1008)  # before accept: the handshake is answered 403
                return
            await ws.accept()
            self.sessions += 1
            self.open_sessions += 1
            turn = 0
            try:
                while True:
                    message = json.loads(await ws.receive_text())
                    kind = message.get("type")
                    if kind == "close":
                        break
                    if kind == "reset":
                        turn = 0
                        reply = self.on_reset(message.get("data", {}), turn)
                    elif kind == "step":
                        turn += 1
                        reply = self.on_step(message.get("data", {}), turn)
                    else:
                        reply = {"type": "error", "data": {"message": f"unknown {kind}", "code": "X"}}
                    if isinstance(reply, str):
                        await ws.send_text(reply)
                    elif reply.get("type") == "error":
                        await ws.send_text(json.dumps(reply))
                    else:
                        await ws.send_text(json.dumps({"type": "observation", "data": reply}))
            except WebSocketDisconnect:
                pass
            finally:
                self.open_sessions -= 1

        return app

    # ------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"openenv://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeOpenEnv":
        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="error", lifespan="off", ws_max_size=1 << 20)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-openenv-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake OpenEnv server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "FakeOpenEnv":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _flood(size: int):
    """``size`` bytes of a JSON string that never ends, a MiB at a time."""
    chunk = b"x" * (1 << 20)
    yield b'{"action": "'
    sent = 0
    while sent < size:
        yield chunk
        sent += len(chunk)
        await asyncio.sleep(0)


class TrickleProxy:
    """``127.0.0.1:port`` forwarding to ``target_port``; with ``trickle`` on, the server's bytes
    reach the client one every ``interval_s`` seconds."""

    def __init__(self, target_port: int, interval_s: float = 2.0, trickle: bool = True):
        self.target_port, self.interval_s, self.trickle = target_port, interval_s, trickle
        self._loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, args=(sock,), name=f"trickle-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the trickle proxy did not start")

    @property
    def url(self) -> str:
        return f"openenv://127.0.0.1:{self.port}"

    def _run(self, sock: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._server = await asyncio.start_server(self._handle, sock=sock)

        self._loop.run_until_complete(listen())
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        for w in list(self._writers):
            w.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if not self.trickle:
                    client_w.write(data)
                    await client_w.drain()
                    continue
                for i in range(len(data)):
                    client_w.write(data[i:i + 1])
                    await client_w.drain()
                    await asyncio.sleep(self.interval_s)

        try:
            await asyncio.gather(upstream(), downstream())
        except (OSError, asyncio.CancelledError):
            pass  # a connection that ends, or the proxy stopping: nothing to report
        finally:
            for w in (client_w, server_w):
                w.close()
                self._writers.discard(w)

    def stop(self) -> None:
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "TrickleProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
