"""What every part of the OpenEnv client shares: server addresses, the token, the errors, and a
fault put in words (:mod:`~corrgrpo_envs.integrations.openenv_client` re-exports the public names).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

from corrgrpo_envs.integrations import OPENENV_SCHEME

__all__ = [
    "SCHEME",
    "TOKEN_ENV",
    "RemoteEnvError",
    "RemoteRewardError",
    "RemoteReferenceError",
    "parse_urls",
    "auth_headers",
]

#: one definition of the scheme for the registry and the client (corrgrpo_envs.integrations)
SCHEME = OPENENV_SCHEME
#: The environment variable holding the servers' shared token (``corrgrpo serve --token``).
TOKEN_ENV = "CORRGRPO_OPENENV_TOKEN"

#: The client's one logger, whichever of its modules logs: a user's logging config (and a
#: test's caplog) names ``openenv_client``, the module the env is imported from.
log = logging.getLogger("corrgrpo_envs.integrations.openenv_client")


class RemoteEnvError(RuntimeError):
    """An OpenEnv server failed or refused a request (the message names the server and task)."""


class RemoteRewardError(RemoteEnvError):
    """A step's reward vector does not match the declared components (names server, task, component).

    ``reason`` is the message without the server and task (what a failover log lists per server).
    """

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class RemoteReferenceError(RemoteEnvError, NotImplementedError):
    """A server gives no reference answer: it serves none unless started with ``--serve-references``."""


class _RefusedError(RemoteEnvError):
    """A server refused the request for want of the shared token (401/403): not a fault."""


class _BadAnswer(Exception):
    """An answer that is not OpenEnv's (garbage, wrong types, over the cap): a fault, retried elsewhere."""


def parse_urls(spec: str | Sequence[str]) -> list[str]:
    """``openenv://h:p``, ``openenv://h1:p,h2:p`` or a list of them, as ``http://`` base URLs."""
    items = [spec] if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            for prefix in (SCHEME, "http://", "ws://"):
                if part.startswith(prefix):
                    part = part[len(prefix):]
                    break
            if "://" in part or not part:
                raise ValueError(f"not an OpenEnv server address: {item!r} (use openenv://HOST:PORT)")
            urls.append("http://" + part.rstrip("/"))
    if not urls:
        raise ValueError(f"no OpenEnv server in {spec!r}")
    return urls


def auth_headers(token: str | None = None) -> dict[str, str] | None:
    """``Authorization: Bearer`` with ``token``, else ``$CORRGRPO_OPENENV_TOKEN``; None without both."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None:
        return None
    if any(c in token for c in "\r\n"):
        raise ValueError(f"{TOKEN_ENV} / env.token holds a line break")
    return {"Authorization": f"Bearer {token}"}


def _refused(url: str, status: int, has_token: bool) -> RemoteEnvError:
    """A 401/403 from a server that requires the shared token."""
    told = "the token given was refused" if has_token else "no token was given"
    return _RefusedError(
        f"OpenEnv server {url} refused the request ({status}: it requires a token and {told}); "
        f"set {TOKEN_ENV} to the token it was started with"
    )


def _refused_status(exc: BaseException) -> int | None:
    """The HTTP status of a refused WebSocket handshake (401/403) behind ``exc``, if it is one."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        status = getattr(response, "status_code", None)
        if status in (401, 403):
            return int(status)
        seen = seen.__cause__ or seen.__context__
    return None


_CONTROLS = re.compile(r"[\x00-\x1f\x7f]+")


def _oneline(text: Any, limit: int = 300) -> str:
    """What a server sent, as one line of at most ``limit`` characters (it ends up in an error line)."""
    line = _CONTROLS.sub(" ", str(text)).strip()
    return line if len(line) <= limit else line[:limit] + "..."


def _reason(exc: BaseException, cap: int) -> str:
    """A fault, in words (one line)."""
    sent = getattr(exc, "sent", None)
    if getattr(sent, "code", None) == 1009:
        return f"an answer larger than env.max_observation_bytes ({cap} bytes)"
    if isinstance(exc, _BadAnswer):
        return _oneline(exc)
    return _oneline(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
