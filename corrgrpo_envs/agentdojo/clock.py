"""A deterministic clock for AgentDojo's tools.

AgentDojo stamps newly sent emails and created or edited cloud files with
``datetime.datetime.now()``, so tool outputs would differ between two runs of
the same episode. While an episode runs a tool with a clock installed, those
reads return a fixed instant that advances one second per read instead; the
instant lies after every date in AgentDojo's data (its checks compare
"modified later than before"), as the real "now" does. Outside such a call (for
instance when AgentDojo's own pipelines run in the same process) the real clock
is used: the override lives in a context variable, so it is also per-thread.
"""

from __future__ import annotations

import contextlib
import datetime as _datetime
import threading
import types
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["EpisodeClock", "EPOCH", "use_clock"]

#: The episode clock's first reading: after all dates in AgentDojo 0.1.35's data (latest 2024-12-06).
EPOCH = _datetime.datetime(2025, 1, 1, 9, 0, 0)
#: AgentDojo modules whose only use of ``datetime`` is ``datetime.datetime.now()``.
_CLOCKED_MODULES = (
    "agentdojo.default_suites.v1.tools.email_client",
    "agentdojo.default_suites.v1.tools.cloud_drive_client",
)

_ACTIVE: ContextVar[EpisodeClock | None] = ContextVar("agentdojo_episode_clock", default=None)
_INSTALL_LOCK = threading.Lock()
_installed = False


class EpisodeClock:
    """Readings ``EPOCH``, ``EPOCH + 1 s``, ... (one per ``now()``)."""

    def __init__(self, start: _datetime.datetime = EPOCH):
        self.start = start
        self.readings = 0

    def now(self) -> _datetime.datetime:
        value = self.start + _datetime.timedelta(seconds=self.readings)
        self.readings += 1
        return value


class _ClockedDateTime:
    """Stands in for the ``datetime.datetime`` class inside the clocked modules."""

    @staticmethod
    def now(tz: Any = None) -> _datetime.datetime:
        clock = _ACTIVE.get()
        if clock is None:
            return _datetime.datetime.now(tz)
        return clock.now()

    def __getattr__(self, name: str) -> Any:
        return getattr(_datetime.datetime, name)


def _shim_module() -> types.ModuleType:
    shim = types.ModuleType("datetime")
    shim.__dict__.update({k: v for k, v in vars(_datetime).items() if not k.startswith("__")})
    shim.datetime = _ClockedDateTime()  # type: ignore[attr-defined]
    return shim


def _install() -> None:
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        import importlib

        shim = _shim_module()
        for name in _CLOCKED_MODULES:
            module = importlib.import_module(name)
            # Leave a module alone if something else already replaced its clock.
            if getattr(module, "datetime", None) is _datetime:
                module.datetime = shim  # type: ignore[attr-defined]
        _installed = True


@contextlib.contextmanager
def use_clock(clock: EpisodeClock | None) -> Iterator[None]:
    """Within the block, AgentDojo's tools read ``clock`` (the real clock when None)."""
    if clock is None:
        yield
        return
    _install()
    token = _ACTIVE.set(clock)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
