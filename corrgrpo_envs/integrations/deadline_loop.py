"""A private asyncio loop on a daemon thread, whose calls have overall deadlines and which never
holds up interpreter shutdown.

The OpenEnv client (:mod:`corrgrpo_envs.integrations.openenv_client`) runs the HTTP and
WebSocket exchanges of every env instance of a process on one of these (a
:class:`LoopLease` each): one thread for P*G sessions, not one per session, which is what
the client's time went to (thread wake-ups and switches) when each session had its own. ``asyncio.wait_for`` around a
whole exchange is a deadline that a server sending its answer a byte at a time cannot
stretch (a timeout per read can be), and the calling thread waits at most the deadline and
a grace second even if the loop itself were stuck. Python does not return from starting a
thread while the interpreter shuts down, so nothing here starts, signals or joins one then:
the loop's thread is a daemon and the OS closes its sockets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

__all__ = ["DeadlineLoop", "LoopLease", "CLOSE_S", "GRACE_S"]

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


class _SharedLoop:
    """The process's one :class:`DeadlineLoop` and how many leases hold it."""

    def __init__(self, name: str):
        self.name = name
        self.lock = threading.Lock()
        self.loop: DeadlineLoop | None = None
        self.users = 0

    def forget(self) -> None:
        """In a forked child: the parent's loop thread does not exist here; start afresh."""
        self.lock = threading.Lock()
        self.loop, self.users = None, 0


_SHARED = _SharedLoop("corrgrpo-openenv-loop")
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SHARED.forget)


class LoopLease:
    """One user's hold on the process's shared :class:`DeadlineLoop` (``loop``).

    The loop starts with the first lease and stops when the last one is released, so a
    process that closed all its envs has no thread left.
    """

    def __init__(self) -> None:
        with _SHARED.lock:
            if _SHARED.loop is None:
                _SHARED.loop = DeadlineLoop(_SHARED.name)
            _SHARED.users += 1
            self.loop: DeadlineLoop = _SHARED.loop
        self._held = True

    def release(self, closing: Callable[[], Awaitable[Any]] | None = None, wait: bool = True) -> None:
        """Run ``closing()`` (within ``CLOSE_S``; waited for with ``wait``), then let go of the loop.

        Idempotent, and does nothing at all while the interpreter shuts down.
        """
        with _SHARED.lock:
            if not self._held:
                return
            self._held = False
        if closing is not None and not sys.is_finalizing():
            # while this lease still holds the loop, so nobody stops it under the closing
            if wait:
                with suppress(Exception):
                    self.loop.run(closing, CLOSE_S)
            else:
                self.loop.submit(closing)
        with _SHARED.lock:
            last = _SHARED.loop is self.loop and _SHARED.users == 1
            if _SHARED.loop is self.loop:
                _SHARED.users -= 1
                if last:
                    _SHARED.loop = None
        if last:
            self.loop.shutdown(wait=wait)
