"""The ASGI middleware in front of a served env (:class:`BoundaryMiddleware`): the token, the
HTTP body cap, the admission of HTTP requests and WebSocket connections, and each WebSocket
session's deadlines (see :mod:`~corrgrpo_envs.integrations.openenv_limits`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import json
import logging
import time

from corrgrpo_envs.integrations.openenv_admission import ConnectionRate, client_key
from corrgrpo_envs.integrations.openenv_quotas import (
    BODY_DEADLINE_S,
    HTTP_CONCURRENCY,
    HTTP_QUEUE,
    OPEN_PATHS,
    REQUEST_DEADLINE_S,
    TOKEN_VARIABLE,
    TRY_AGAIN_LATER,
    ServerLimits,
    log,
)
from corrgrpo_envs.integrations.openenv_sessions import (
    _CLIENT,
    _CONNECTION,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    WebSocketConnection,
    _close_reason,
)

__all__ = ["BoundaryMiddleware"]


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


def _json_reply(status: int, detail: str, close: bool = False, extra: tuple = ()) -> tuple[list, bytes]:
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    if close:  # the rest of a refused body is not read: the connection ends with the answer
        headers.append((b"connection", b"close"))
    return headers, body


async def _reply(send: Send, status: int, detail: str, close: bool = False, extra: tuple = ()) -> None:
    headers, body = _json_reply(status, detail, close, extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


#: True in the task of a WebSocket handshake this middleware refused (see :class:`_RefusalLogFilter`)
_REFUSED_HANDSHAKE: contextvars.ContextVar[bool] = contextvars.ContextVar("refused_handshake", default=False)


class _RefusalLogFilter(logging.Filter):
    """Drops uvicorn's "ASGI callable returned without completing handshake." after our own 401.

    uvicorn 0.54's websockets-sansio protocol logs that ERROR (and sends nothing more) after
    every handshake refused through the ``websocket.http.response`` extension, although the
    401 reached the client (upstream: Kludex/uvicorn pull request 3138). One line per refused
    peer lets an unauthenticated flood write the server's log without bound: a parent that
    reads the server's stderr late stalls the whole server once the pipe is full (64 KiB,
    about 1,040 refusals). The record is dropped only in the task whose handshake this
    middleware refused; the same message from an app bug still shows.
    """

    MESSAGE = "ASGI callable returned without completing handshake."

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_REFUSED_HANDSHAKE.get() and record.getMessage() == self.MESSAGE)


def _install_refusal_log_filter() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _RefusalLogFilter) for f in logger.filters):
        logger.addFilter(_RefusalLogFilter())


class BoundaryMiddleware:
    """Token, body cap, admission of HTTP requests and WebSocket connections, and the
    WebSocket session deadlines (ASGI).

    Args:
        app: the ASGI app (OpenEnv's FastAPI app).
        max_body_bytes: the largest HTTP body read (the WebSocket frame cap).
        limits: the tokens, the session deadlines and the connection rate.
        connection_burst: new WebSocket connections a client may open at once.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, limits: ServerLimits | None = None,
                 connection_burst: int = 64):
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.limits = limits or ServerLimits()
        self._expected = [f"Bearer {token}".encode() for token in self.limits.tokens]
        self._rate = ConnectionRate(self.limits.connections_per_s, connection_burst)
        self._slots = asyncio.Semaphore(HTTP_CONCURRENCY)
        self._waiting = 0
        _install_refusal_log_filter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        token_index = None
        if self._expected and scope["path"] not in OPEN_PATHS:
            token_index = self._token_index(scope)
            if token_index is None:
                detail = ("missing or wrong token: send the header 'Authorization: Bearer <token>' "
                          "(the server's --token or " + TOKEN_VARIABLE + ")")
                if kind == "http":
                    await _reply(send, 401, detail, extra=((b"www-authenticate", b"Bearer"),))
                else:
                    await self._refuse_handshake(scope, receive, send, detail)
                return
        mark = _CLIENT.set(client_key(scope, token_index))
        try:
            if kind == "websocket":
                await self._websocket(scope, receive, send)
            else:
                await self._http(scope, receive, send)
        finally:
            _CLIENT.reset(mark)

    def _token_index(self, scope: Scope) -> int | None:
        """Which of the server's tokens the request carries (None: none of them)."""
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        matches = [hmac.compare_digest(given, expected) for expected in self._expected]  # constant time each
        return matches.index(True) if any(matches) else None

    async def _refuse_handshake(self, scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        _REFUSED_HANDSHAKE.set(True)  # this task's context: read by uvicorn's log call after we return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            headers, body = _json_reply(401, detail, extra=((b"www-authenticate", b"Bearer"),))
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        else:  # a server without the extension answers a close before accept with 403
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong token"})

    # ------------------------------------------------------------------ HTTP
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = next((value for key, value in scope["headers"] if key == b"content-length"), None)
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _reply(send, 400, f"Content-Length {declared[:40]!r} is not a number", close=True)
                return
            if size > self.max_body_bytes:
                await _reply(send, 413, self._too_large(f"{size} bytes"), close=True)
                return
        try:
            async with asyncio.timeout(BODY_DEADLINE_S):
                body = await self._read_body(receive)
        except _BodyTooLarge:
            await _reply(send, 413, self._too_large("the body"), close=True)
            return
        except TimeoutError:
            await _reply(send, 408, f"the request body took longer than {BODY_DEADLINE_S:g} s", close=True)
            return
        except _ClientGone:
            return
        if self._waiting >= HTTP_QUEUE:
            await _reply(send, 503, f"busy: {self._waiting} requests are waiting; retry later",
                         extra=((b"retry-after", b"1"),))
            return
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        held = True
        started = False

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        async def send_releasing(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()  # the answer is made: a client slow to read it holds no one up
            await send(message)

        try:
            async with asyncio.timeout(REQUEST_DEADLINE_S):
                await self.app(scope, _replay(body, receive), send_releasing)
        except TimeoutError:
            log.warning("%s %s took longer than %g s; answered 503", scope["method"], scope["path"],
                        REQUEST_DEADLINE_S)
            if not started:
                await _reply(send, 503, f"the request took longer than {REQUEST_DEADLINE_S:g} s", close=True)
        finally:
            release()

    def _too_large(self, what: str) -> str:
        return (f"request body too large: {what} is over the server's cap of {self.max_body_bytes} bytes "
                "(the same cap as a WebSocket message)")

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # ------------------------------------------------------------- WebSocket
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = _CLIENT.get()
        wait_s = self._rate.admit(client, time.monotonic())
        if wait_s > 0:
            await self._refuse_connection(receive, send, (
                f"too many new connections from {client}: at most {self.limits.connections_per_s:g} a second "
                f"after a burst of {self._rate.burst}; retry in {wait_s:.1f} s"))
            return
        connection = WebSocketConnection(client, self.limits.session_idle_s, self.limits.session_max_age_s)

        async def receive_in_time() -> Message:
            return await connection.receive(receive)

        async def send_with_reason(message: Message) -> None:
            if connection.closing is not None and message["type"] == "websocket.close":
                code, reason = connection.closing
                message = {**message, "code": code, "reason": reason}
            await send(message)

        mark = _CONNECTION.set(connection)
        try:
            await self.app(scope, receive_in_time, send_with_reason)
        finally:
            _CONNECTION.reset(mark)

    @staticmethod
    async def _refuse_connection(receive: Receive, send: Send, reason: str) -> None:
        """Refuse a WebSocket with a close frame: code 1013 (try again later) and the reason.

        Nothing else is sent: a churning client gets its refusal for the least work, and a
        trainer's client sees a closed connection, a fault it retries elsewhere or later
        (an OpenEnv error frame would be an answer, which it does not retry).
        """
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": _close_reason(reason)})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then the client's later messages."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay

