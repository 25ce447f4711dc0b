"""A private asyncio loop on a daemon thread, whose calls have overall deadlines and which never
holds up interpreter shutdown.

The OpenEnv client (:mod:`corrgrpo_envs.integrations.openenv_client`) runs each env
instance's HTTP and WebSocket exchanges on one of these. ``asyncio.wait_for`` around a
whole exchange is a deadline that a server sending its answer a byte at a time cannot
stretch (a timeout per read can be), and the calling thread waits at most the deadline and
a grace second even if the loop itself were stuck. Python does not return from starting a
thread while the interpreter shuts down, so nothing here starts, signals or joins one then:
the loop's thread is a daemon and the OS closes its sockets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

__all__ = ["DeadlineLoop", "CLOSE_S", "GRACE_S"]

#: How long closing waits for servers to acknowledge.
CLOSE_S = 2.0
#: Beyond a deadline, how long a caller waits for the loop to deliver the timeout.
GRACE_S = 1.0


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread: run until stopped, then drop what is left."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=GRACE_S))
    finally:
        loop.close()


class DeadlineLoop:
    """An asyncio loop on a daemon thread, started on first use; see the module doc.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                if sys.is_finalizing():
                    raise RuntimeError("the interpreter is shutting down")
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, fn: Callable[[], Awaitable[Any]], deadline_s: float) -> Any:
        """``await fn()`` on the loop (``fn`` is called there); ``TimeoutError`` after ``deadline_s``."""

        async def bounded() -> Any:
            try:
                return await asyncio.wait_for(fn(), deadline_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no answer within {deadline_s:g} s") from None

        future = asyncio.run_coroutine_threadsafe(bounded(), self._running())
        try:
            return future.result(deadline_s + GRACE_S)
        except (TimeoutError, concurrent.futures.TimeoutError):
            if future.done():
                raise
            future.cancel()  # the loop did not deliver the deadline: leave the call to it
            raise TimeoutError(f"no answer within {deadline_s:g} s") from None

    def submit(self, fn: Callable[[], Awaitable[Any]]) -> None:
        """Run ``fn()`` on the loop in the background (a close nobody waits for), within ``CLOSE_S``."""
        loop = self._loop
        if loop is None or sys.is_finalizing():
            return

        async def quietly() -> None:
            with suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(fn(), CLOSE_S)

        coro = quietly()
        try:
            asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed
            coro.close()

    def shutdown(self, closing: Callable[[], Awaitable[Any]] | None = None, wait: bool = True) -> None:
        """Run ``closing()`` (within ``CLOSE_S``), stop the loop and, with ``wait``, join its thread.

        Idempotent, and does nothing at all while the interpreter shuts down.
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or sys.is_finalizing():
            return

        async def finish() -> None:
            if closing is not None:
                with suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(closing(), CLOSE_S)
            loop.stop()

        coro = finish()
        try:
            asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            return
        if wait and thread is not threading.current_thread():
            thread.join(CLOSE_S + 2 * GRACE_S)
