"""A TCP proxy in front of a server that misbehaves on command: the network half of a fault soak.

Everything a client sends reaches the server unchanged; what comes back depends on the
proxy's current ``mode`` (read for every chunk, so a mode applies to open connections too):

* ``pass``: bytes flow both ways;
* ``stall``: nothing flows (connections stay open, as behind a dead router);
* ``trickle``: the server's bytes reach the client one every ``trickle_s`` seconds;
* ``garbage``: the client receives random bytes instead of the server's answer;
* ``refuse``: new connections are closed at once and open ones are cut.

The proxy knows no protocol: it moves bytes, so HTTP and WebSocket traffic fail the way
they fail on a real network.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from contextlib import suppress

MODES = ("pass", "stall", "trickle", "garbage", "refuse")


class FaultProxy:
    """``127.0.0.1:port`` forwarding to ``127.0.0.1:target_port``, with a switchable fault."""

    def __init__(self, target_port: int, trickle_s: float = 1.0, seed: int = 0):
        self.target_port = target_port
        self.trickle_s = trickle_s
        self.mode = "pass"
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"openenv://127.0.0.1:{self.port}"

    def set_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; modes: {MODES}")
        self.mode = mode
        if mode == "refuse":
            self._loop.call_soon_threadsafe(self._cut_all)

    def _cut_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._server = await asyncio.start_server(self._handle, sock=self._sock)
            self._ready.set()
            await self._server.serve_forever()

        with suppress(asyncio.CancelledError, RuntimeError):
            self._loop.run_until_complete(main())

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, server_w))
        try:
            await asyncio.gather(self._pump(client_r, server_w, upstream=True),
                                 self._pump(server_r, client_w, upstream=False))
        finally:
            for w in (client_w, server_w):
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                while self.mode == "stall":
                    await asyncio.sleep(0.05)
                if self.mode == "refuse":
                    break
                if not upstream and self.mode == "garbage":
                    data = bytes(self._random.randrange(256) for _ in range(min(len(data), 512)))
                if not upstream and self.mode == "trickle":
                    for i in range(len(data)):
                        if self.mode != "trickle":
                            writer.write(data[i:])
                            break
                        writer.write(data[i:i + 1])
                        await writer.drain()
                        await asyncio.sleep(self.trickle_s)
                else:
                    writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        def stop() -> None:
            self._cut_all()
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()

        if self._loop.is_running():
            self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=5)
