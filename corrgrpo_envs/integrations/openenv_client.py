"""Any OpenEnv server as a :class:`~corrgrpo_envs.MultiRewardEnv` (``env.id: openenv://HOST:PORT``).

Episodes run over the ``openenv`` package's own WebSocket client
(:class:`openenv.core.GenericEnvClient`, one session per env instance and server);
the reward names and the task list are read once from the server's ``GET /schema``
and OpenEnv's task routes (``/list_environments``, ``/{env_name}/tasks``).

The reward vector of a step comes from, in order:

1. ``metadata["reward_components"]`` (``{name: value}``, what ``corrgrpo serve`` sends);
2. ``metadata["rubric_scores"]`` (``{name: score}``, a server's named rubric scores);
3. the scalar ``reward`` as one component (named ``reward`` unless configured).

Names, bounds and weights come from the server's schema (``observation.reward_components``)
or from the config (``reward_names``, ``reward_low``, ``reward_high``, ``reward_weights``);
where both exist they must agree. When neither names them, they are learned once per
process from a first episode (a reset, then steps with a probe text until one carries
rewards): that step's component names, else the scalar; the bounds are then the
config's, else what the reset declares (``metadata["reward_spec"]``), else unbounded.
A step whose vector misses a component, has an extra one, changes where its rewards
come from, or holds a NaN, an infinity, a value float32 cannot hold or a value outside
the bounds is refused (never a silent zero): it is a fault like a dropped connection
(below), and with no other server to try, :class:`RemoteRewardError` names the server,
the task, the component and the fix (``env.reward_names`` where that is it).

Every exchange with a server has one overall deadline (``connect_timeout_s`` to read its
description or open a session, ``timeout_s`` per reset or step, however slowly the bytes
come) and a size cap (``max_observation_bytes`` per answer, HTTP or WebSocket). With
``CORRGRPO_OPENENV_TOKEN`` set (or ``token``), every request carries
``Authorization: Bearer <token>``.

Several servers (``openenv://a:8000,b:8000``, or a list) form one pool per process:
an episode starts on the server that already runs its task's group, else on the least
busy one, so the G rollouts of a task share a server (their rewards are compared with
each other; one server means one env version and warm per-task caches) while groups
spread. A server that drops the connection, does not answer within its deadline, sends
an answer that is not OpenEnv's (garbage, over the size cap) or rewards that break the
declared components is marked down for ``down_s`` seconds, a warning is logged, and the
episode is replayed on another server (reset to the same task and seed, the earlier
actions stepped again and their rewards checked to be identical), at most ``retries``
times (servers other episodes marked down included); then :class:`RemoteEnvError` names
every server tried. A server that answers with an error (unknown task, a step after the
end) is not retried: its message is raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from corrgrpo_envs.core import MAX_ACTION_CHARS, MultiRewardEnv, StepOutcome
from corrgrpo_envs.integrations import OPENENV_SCHEME
from corrgrpo_envs.integrations.deadline_loop import CLOSE_S, GRACE_S, LoopLease
from corrgrpo_envs.integrations.openenv_settings import DEFAULT_MAX_OBSERVATION_BYTES
from corrgrpo_envs.spaces import Conversation
from corrgrpo_envs.tasks import Task, TaskSource

__all__ = [
    "OpenEnvEnv",
    "RemoteEnvError",
    "RemoteRewardError",
    "RemoteReferenceError",
    "parse_urls",
    "mcp_tool_call",
    "SCHEME",
    "TOKEN_ENV",
    "DEFAULT_MAX_OBSERVATION_BYTES",
]

SCHEME = OPENENV_SCHEME
#: The environment variable holding the servers' shared token (``corrgrpo serve --token``).
TOKEN_ENV = "CORRGRPO_OPENENV_TOKEN"
#: Rewards, bounds and weights are stored as float32: a larger finite value would become inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The text a first episode is stepped with when the components must be learned.
PROBE_TEXT = "Hello."
_FIX = (
    "set env.reward_names (and env.reward_low / env.reward_high) in the config to the components to expect"
)
log = logging.getLogger(__name__)


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


# ------------------------------------------------------------------ checks
def _number(value: Any, what: str, allow_infinite: bool = False) -> float:
    """``value`` as a float that float32 holds as the same kind of number, or ``ValueError`` saying why.

    NaN is refused, infinities unless ``allow_infinite`` (an unbounded bound), and finite
    values beyond float32's range (they would be stored as infinities).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {value!r:.80}, not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError(
            f"{what} = an integer of {value.bit_length()} bits is beyond float32's range "
            f"(±{FLOAT32_MAX:.3g})"
        ) from None
    if math.isnan(number) or (math.isinf(number) and not allow_infinite):
        raise ValueError(f"{what} is {number}")
    if math.isfinite(number) and abs(number) > FLOAT32_MAX:
        raise ValueError(
            f"{what} = {number:.6g} is beyond float32's range (±{FLOAT32_MAX:.3g}); "
            "the env stores float32"
        )
    return number


def _bounds(
    names: Sequence[str], low: Sequence[Any], high: Sequence[Any], where: str
) -> tuple[list[float], list[float]]:
    """Checked bounds: one per name, numbers float32 holds (±inf: unbounded), low <= high."""
    k = len(names)
    for key, given in (("reward_low", low), ("reward_high", high)):
        if len(given) != k:
            raise ValueError(
                f"{where}: {key} has {len(given)} values for the {k} components {list(names)}"
            )
    lo = [_number(v, f"{where}: reward_low of {n!r}", allow_infinite=True) for n, v in zip(names, low)]
    hi = [_number(v, f"{where}: reward_high of {n!r}", allow_infinite=True) for n, v in zip(names, high)]
    for n, a, b in zip(names, lo, hi):
        if a > b:
            raise ValueError(f"{where}: component {n!r} has reward_low {a:g} above reward_high {b:g}")
    return lo, hi


def _spec(published: Any, where: str) -> list[tuple[str, Any, Any, Any]]:
    """A server's ``[{name, low, high, weight}, ...]`` as tuples, or ``ValueError``."""
    if not isinstance(published, list) or not all(
        isinstance(r, Mapping) and isinstance(r.get("name"), str) for r in published
    ):
        raise ValueError(f"{where}: reward_components is not a list of {{name, low, high, weight}}")
    return [
        (r["name"], r.get("low", -math.inf), r.get("high", math.inf), r.get("weight", 1.0))
        for r in published
    ]


def _task_ids(listed: Any) -> list[str]:
    """The ids of OpenEnv's task listing (``{"tasks": [{"id": ...} | id, ...]}``)."""
    tasks = listed.get("tasks") if isinstance(listed, Mapping) else None
    if not isinstance(tasks, list):
        raise _BadAnswer("a task listing without a list of tasks")
    ids = []
    for t in tasks:
        tid = t.get("id") if isinstance(t, Mapping) else t
        if not isinstance(tid, (str, int)) or isinstance(tid, bool):
            raise _BadAnswer(f"a task listing with a task {t!r:.80}")
        ids.append(str(tid))
    return ids


def _metadata(result: Any) -> Mapping[str, Any]:
    meta = result.metadata
    if meta is None:
        meta = result.observation.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise _BadAnswer(f"metadata that is not an object ({type(meta).__name__})")
    return meta


def _checked(result: Any) -> Any:
    """A reset/step result whose parts have OpenEnv's types (else :class:`_BadAnswer`)."""
    if not isinstance(result.observation, Mapping):
        raise _BadAnswer(f"an observation that is not an object ({type(result.observation).__name__})")
    _metadata(result)
    if not isinstance(result.done, bool):
        raise _BadAnswer(f"done = {result.done!r:.40}, not a boolean")
    obs = result.observation
    if "messages" in obs and not Conversation().contains(
        {"messages": obs["messages"], "tools": obs.get("tools", [])}
    ):
        raise _BadAnswer("messages that are not a conversation")
    return result


def _components_in(meta: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """Where a step's named components are, and them (``None``: the step has only its scalar)."""
    for key in ("reward_components", "rubric_scores"):
        if isinstance(meta.get(key), Mapping) and meta[key]:  # an empty map names nothing
            return f"metadata[{key!r}]", meta[key]
    return None


_CONTROLS = re.compile(r"[\x00-\x1f\x7f]+")


def _oneline(text: Any, limit: int = 300) -> str:
    """What a server sent, as one line of at most ``limit`` characters (it ends up in an error line)."""
    line = _CONTROLS.sub(" ", str(text)).strip()
    return line if len(line) <= limit else line[:limit] + "..."


def _lie(where: str, reason: str) -> RemoteRewardError:
    """A reward that breaks the declared components, at ``where`` (server and task)."""
    return RemoteRewardError(f"{where}: {reason}", reason)


def _reason(exc: BaseException, cap: int) -> str:
    """A fault, in words (one line)."""
    sent = getattr(exc, "sent", None)
    if getattr(sent, "code", None) == 1009:
        return f"an answer larger than env.max_observation_bytes ({cap} bytes)"
    if isinstance(exc, _BadAnswer):
        return _oneline(exc)
    return _oneline(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class _Connections:
    """One env instance's open sessions (``GenericEnvClient`` per server) and HTTP client."""

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}
        self.http: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        http, self.http = self.http, None

        async def close(client: Any) -> None:
            await client.close()

        jobs = [close(c) for c in clients] + ([http.aclose()] if http is not None else [])
        await asyncio.gather(*jobs, return_exceptions=True)


# ------------------------------------------------------------------ server pool
class _ServerPool:
    """Which server each episode runs on, shared by every env of one server list in a process.

    It also remembers what every env of the list shares: each server's description (read
    once per split) and the components learned from a first episode (learned once).
    """

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self.lock = threading.Lock()
        self.active: Counter[str] = Counter()
        self.task_server: dict[str, str] = {}
        self.task_count: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}
        self.described: dict[tuple[str, str], dict[str, Any]] = {}
        self.learned: dict[str, Any] | None = None
        self.learn_lock = threading.Lock()
        self.users = 0  # open envs of this list (see _PoolLease)

    def acquire(self, task_id: str, exclude: Sequence[str] = (), include_down: bool = False) -> str | None:
        """A server for an episode of ``task_id``: the one its group uses, else the least busy.

        Servers marked down are left out unless ``include_down``.
        """
        with self.lock:
            now = time.monotonic()
            up = [u for u in self.urls
                  if u not in exclude and (include_down or self.down_until.get(u, 0.0) <= now)]
            if not up:
                return None
            url = self.task_server.get(task_id)
            if url not in up:
                url = min(up, key=lambda u: (self.active[u], self.urls.index(u)))
            self.active[url] += 1
            self.task_server[task_id] = url
            self.task_count[task_id] += 1
            return url

    def release(self, url: str, task_id: str) -> None:
        with self.lock:
            self.active[url] -= 1
            self.task_count[task_id] -= 1
            if self.task_count[task_id] <= 0:
                self.task_count.pop(task_id, None)
                if self.task_server.get(task_id) == url:
                    self.task_server.pop(task_id, None)

    def mark_down(self, url: str, seconds: float) -> None:
        with self.lock:
            self.down_until[url] = time.monotonic() + seconds

    def is_down(self, url: str) -> bool:
        with self.lock:
            return self.down_until.get(url, 0.0) > time.monotonic()


_POOLS: dict[tuple[str, ...], _ServerPool] = {}
_POOLS_LOCK = threading.Lock()


class _PoolLease:
    """One env's use of a shared pool. The pool, and what it remembers of its servers (their
    descriptions, learned components, down marks), lives while an env of its list is open: an
    address later reused by another server (a restarted job, a test's recycled port) is
    described afresh, never taken for the one an earlier run knew."""

    def __init__(self, urls: Sequence[str]):
        self.key = tuple(urls)
        with _POOLS_LOCK:
            pool = _POOLS.get(self.key)
            if pool is None:
                pool = _POOLS[self.key] = _ServerPool(urls)
            pool.users += 1
        self.pool: _ServerPool | None = pool

    def release(self) -> None:
        """Idempotent: the last lease of a pool drops it."""
        with _POOLS_LOCK:
            pool, self.pool = self.pool, None
            if pool is None:
                return
            pool.users -= 1
            if pool.users <= 0 and _POOLS.get(self.key) is pool:
                del _POOLS[self.key]


# ------------------------------------------------------------- text and actions
def _text_field(action_schema: Mapping[str, Any], server: str) -> str:
    """The action's one required string field (``message`` for ``corrgrpo serve``, ``openenv init``)."""
    props = action_schema.get("properties", {})
    props = props if isinstance(props, Mapping) else {}
    required = action_schema.get("required", [])
    required = [k for k in (required if isinstance(required, list) else []) if k != "metadata"]
    strings = [
        k for k in (required or list(props))
        if isinstance(props.get(k), Mapping) and props[k].get("type") == "string"
    ]
    if len(strings) == 1:
        return str(strings[0])
    raise RemoteEnvError(
        f"OpenEnv server {server}: cannot tell which action field takes the text "
        f"(string fields: {strings or 'none'}); set action_field in the env config"
    )


def _observation_text(observation: Mapping[str, Any], field: str | None) -> str:
    """What a third-party observation says, as a user message."""
    if field is not None:
        return str(observation.get(field, ""))
    shown = {k: v for k, v in observation.items() if k not in ("metadata", "reward", "done")}
    if not shown and isinstance(observation.get("metadata"), Mapping) and observation["metadata"]:
        shown = dict(observation["metadata"])
    if len(shown) == 1:
        return str(next(iter(shown.values())))
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in shown.items())


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def mcp_tool_call(text: str) -> dict[str, Any] | None:
    """An MCP ``call_tool`` action from a tool call written in the text, or ``None`` when there is none.

    The call is the first JSON object ``{"name": ..., "arguments": {...}}`` (``parameters``
    is read as ``arguments``) inside ``<tool_call>...</tool_call>`` (the form the tool-call
    domain and Qwen-style templates write), or the whole text when it is that object.
    """
    blocks = _TOOL_CALL.findall(text) or [text]
    for block in blocks:
        for line in [block.strip(), *block.strip().splitlines()]:
            try:
                call = json.loads(line)
            except (json.JSONDecodeError, ValueError):
                continue
            if isinstance(call, Mapping) and isinstance(call.get("name"), str):
                args = call.get("arguments", call.get("parameters", {}))
                if isinstance(args, Mapping):
                    return {"type": "call_tool", "tool_name": call["name"], "arguments": dict(args)}
    return None


# ------------------------------------------------------------------------ env
class OpenEnvEnv(MultiRewardEnv):
    """The env behind one or more OpenEnv servers, stepped over OpenEnv's WebSocket client.

    Args:
        url: ``openenv://HOST:PORT``, several separated by commas, or a list.
        split: the server's task split (``all``/``train``/``eval``); servers without
            a task listing get ``num_tasks`` tasks ``seed-<i>`` (reset with that seed).
        reward_names, reward_low, reward_high, reward_weights: the components, for
            servers that do not publish them (or to check those that do). Without names
            from either, they are learned from a first episode (see the module doc).
        action_field: the action's text field (default: its one required string field).
        action_format: ``"text"`` (the text goes into ``action_field``) or ``"mcp"`` (an MCP
            tool env: the tool call written in the text becomes a ``call_tool`` action, and
            the server's ``list_tools`` fill the observation's ``tools``).
        observation_field: the observation field shown to the policy (third-party
            servers without ``messages``; default: every field).
        max_turns: end an episode after this many steps (servers that never say done).
        timeout_s: overall deadline of one reset or step (however slowly the answer comes);
            a server past it is left for another one.
        connect_timeout_s: overall deadline to read a server's description (schema, task
            listing) and to open a session.
        retries: other servers tried when one fails mid-episode.
        down_s: seconds a failed server is left out of the pool.
        max_observation_bytes: the largest answer read from a server (an observation, a
            task listing, a reference); a larger one is a fault naming this key.
        token: the servers' shared token (default: ``$CORRGRPO_OPENENV_TOKEN``), sent as
            ``Authorization: Bearer`` on every request and WebSocket handshake.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        split: str = "all",
        reward_names: Sequence[str] | None = None,
        reward_low: Sequence[float] | None = None,
        reward_high: Sequence[float] | None = None,
        reward_weights: Sequence[float] | None = None,
        action_field: str | None = None,
        action_format: str = "text",
        observation_field: str | None = None,
        max_turns: int | None = None,
        num_tasks: int = 64,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        retries: int = 2,
        down_s: float = 30.0,
        max_observation_bytes: int = DEFAULT_MAX_OBSERVATION_BYTES,
        token: str | None = None,
        max_action_chars: int = MAX_ACTION_CHARS,
        render_mode: str | None = None,
    ):
        self.urls = parse_urls(url)
        for key, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0 < value < math.inf:
                raise ValueError(f"env.{key} must be a positive number of seconds, got {value!r}")
        if isinstance(max_observation_bytes, bool) or not isinstance(max_observation_bytes, int) \
                or max_observation_bytes < 1024:
            raise ValueError(
                f"env.max_observation_bytes must be an integer >= 1024, got {max_observation_bytes!r}"
            )
        if action_format not in ("text", "mcp"):
            raise ValueError(f"action_format must be 'text' or 'mcp', got {action_format!r}")
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.retries, self.down_s = int(retries), float(down_s)
        self.max_turns = None if max_turns is None else int(max_turns)
        self.max_observation_bytes = int(max_observation_bytes)
        self.observation_field = observation_field
        self.action_format = action_format
        self._headers = auth_headers(token)
        self._lease = _PoolLease(self.urls)
        self._pool = self._lease.pool
        self._conns = _Connections()
        # every env of the process shares one loop thread (a thread per session cost more than the I/O)
        self._loop_lease = LoopLease()
        self._loop = self._loop_lease.loop
        # an env dropped without close(): close its sessions (not at interpreter exit, see DeadlineLoop)
        self._finalizer = weakref.finalize(self, self._loop_lease.release, self._conns.aclose, False)
        self._finalizer.atexit = False
        self._lease_finalizer = weakref.finalize(self, self._lease.release)
        self._lease_finalizer.atexit = False
        self._server: str | None = None
        self._history: list[tuple[str, dict[str, float]]] = []
        self._turns = 0
        self._episode_task: str | None = None
        self._reset_args: dict[str, Any] = {}
        self._conversation: list[dict[str, Any]] = []
        self._tools: list[dict[str, Any]] = []
        try:
            self._setup(split, num_tasks, reward_names, reward_low, reward_high, reward_weights,
                        action_field, max_action_chars, render_mode)
        except BaseException:
            self._loop_lease.release(self._conns.aclose)
            self._lease.release()
            raise

    def _setup(self, split: str, num_tasks: int, reward_names: Sequence[str] | None,
               reward_low: Sequence[float] | None, reward_high: Sequence[float] | None,
               reward_weights: Sequence[float] | None, action_field: str | None,
               max_action_chars: int, render_mode: str | None) -> None:
        described = self._describe(split)
        first_url, first = next(iter(described.items()))
        for u, d in described.items():
            for key in ("reward_components", "tasks"):
                if d[key] != first[key]:
                    raise RemoteEnvError(
                        f"OpenEnv servers {first_url} and {u} serve different {key.replace('_', ' ')}"
                    )
        name = first["env_name"] or "openenv"
        try:
            if first["tasks"] is not None:
                listed = [Task(t, {"reset": {"task_id": t}}) for t in first["tasks"]]
                source = TaskSource(listed, name=name)
            else:
                seeds = [Task(f"seed-{i}", {"reset": {"seed": i}}) for i in range(int(num_tasks))]
                source = TaskSource(seeds, name=name).split(split)
        except ValueError as exc:
            raise RemoteEnvError(f"OpenEnv server {first_url}: its task listing: {exc}") from None
        if len(source) == 0:
            raise RemoteEnvError(f"OpenEnv server {first_url} lists no tasks in split {split!r}")
        self._env_name = first["env_name"]
        self._split_name = split
        self.action_field = (
            None if self.action_format == "mcp"
            else action_field or _text_field(first["action"], first_url)
        )
        names, low, high, weights = self._components(
            first_url, first["reward_components"], reward_names, reward_low, reward_high, reward_weights,
            source[0],
        )
        super().__init__(
            source, names, low, high, weights, max_action_chars=max_action_chars, render_mode=render_mode
        )

    # ------------------------------------------------------------- describing
    def _describe(self, split: str) -> dict[str, dict[str, Any]]:
        """Every answering server's description, in ``urls`` order (read at once, one deadline)."""
        pool = self._pool
        with pool.lock:
            cached = {u: pool.described[(u, split)] for u in self.urls if (u, split) in pool.described}
            now = time.monotonic()
            todo = [u for u in self.urls if u not in cached and pool.down_until.get(u, 0.0) <= now]
        if not cached and not todo:
            todo = list(self.urls)  # every server is marked down: ask them all again, not fail at once
        failures: list[str] = []
        if todo:
            async def ask_all() -> list[Any]:
                return await asyncio.gather(*(self._ask(u, split) for u in todo), return_exceptions=True)

            try:
                answers = self._loop.run(ask_all, self.connect_timeout_s + GRACE_S)
            except TimeoutError:  # each server has its own deadline inside: this is a backstop
                raise RemoteEnvError(
                    f"OpenEnv server(s) {', '.join(todo)}: no description within connect_timeout_s = "
                    f"{self.connect_timeout_s:g} s"
                ) from None
            for u, answer in zip(todo, answers):
                if isinstance(answer, _RefusedError):
                    raise answer  # every server shares the token: no other one would take this client
                if isinstance(answer, BaseException):
                    if not isinstance(answer, Exception):
                        raise answer
                    failures.append(f"OpenEnv server {u}: {answer}")
                    pool.mark_down(u, self.down_s)
                    continue
                with pool.lock:
                    pool.described[(u, split)] = answer
                cached[u] = answer
        if not cached:
            raise RemoteEnvError("; ".join(failures))
        for msg in failures:
            log.warning("%s (left out for %g s)", msg, self.down_s)
        return {u: cached[u] for u in self.urls if u in cached}

    async def _ask(self, url: str, split: str) -> dict[str, Any]:
        """One server's description; failures say which route did not answer and why."""
        route = ["/schema"]
        try:
            reading = self._read_description(url, split, route)
            return await asyncio.wait_for(reading, self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise _BadAnswer(
                f"cannot read {route[0]} (no complete answer within "
                f"connect_timeout_s = {self.connect_timeout_s:g} s)"
            ) from None
        except (httpx.HTTPError, OSError, _BadAnswer) as exc:
            reason = _reason(exc, self.max_observation_bytes)
            raise _BadAnswer(f"cannot read {route[0]} ({reason})") from None

    async def _read_description(self, url: str, split: str, route: list[str]) -> dict[str, Any]:
        status, schema = await self._fetch("GET", f"{url}/schema")
        if status in (401, 403):
            raise _refused(url, status, self._headers is not None)
        if status != 200:
            raise _BadAnswer(f"HTTP {status}: {_oneline(schema, 200)}")
        if not isinstance(schema, Mapping) or not isinstance(schema.get("observation", {}), Mapping) \
                or not isinstance(schema.get("action", {}), Mapping):
            raise _BadAnswer("a schema that is not OpenEnv's ({action, observation, ...})")
        components = schema.get("observation", {}).get("reward_components")
        if components is not None:
            try:
                _spec(components, f"OpenEnv server {url} /schema")
            except ValueError as exc:
                raise _BadAnswer(str(exc)) from None
        route[0] = "/list_environments"
        status, listed_names = await self._fetch("GET", f"{url}/list_environments")
        env_name = None
        if status == 200 and isinstance(listed_names, list) and listed_names \
                and isinstance(listed_names[0], str) and listed_names[0]:
            env_name = listed_names[0]
        tasks: list[str] | None = None
        if env_name is not None:
            route[0] = f"/{env_name}/tasks"
            path = f"{url}/{quote(env_name, safe='')}/tasks"
            status, listed = await self._fetch("POST", path, {"split": split})
            if status == 200:
                tasks = _task_ids(listed)
            elif status in (401, 403):
                raise _refused(url, status, self._headers is not None)
            elif status not in (404, 405, 501):
                raise RemoteEnvError(
                    f"OpenEnv server {url}: listing the tasks of split {split!r} failed "
                    f"({status}: {_oneline(listed, 200)})"
                )
        return {
            "reward_components": components,
            "action": schema.get("action", {}),
            "env_name": env_name,
            "tasks": tasks,
        }

    def _http(self) -> httpx.AsyncClient:
        """This env's HTTP client (made on the loop, on first use); the deadline is the caller's."""
        if self._conns.http is None:
            headers = {"Accept-Encoding": "identity", **(self._headers or {})}
            per_read = max(self.timeout_s, self.connect_timeout_s)  # a backstop: the deadline is overall
            self._conns.http = httpx.AsyncClient(headers=headers, timeout=per_read)
        return self._conns.http

    async def _fetch(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """``(status, parsed JSON)``, or ``(status, text)`` for an error status; refused over the cap."""
        cap = self.max_observation_bytes
        async with self._http().stream(method, url, json=body) as reply:
            declared = reply.headers.get("content-length", "")
            if declared.strip().isdigit() and int(declared) > cap:
                raise _BadAnswer(
                    f"an answer of {int(declared)} bytes, over env.max_observation_bytes ({cap})"
                )
            data = bytearray()
            async for chunk in reply.aiter_bytes():
                data += chunk
                if len(data) > cap:
                    raise _BadAnswer(f"an answer larger than env.max_observation_bytes ({cap} bytes)")
        if reply.status_code != 200:
            return reply.status_code, data[:200].decode("utf-8", errors="replace")
        try:
            return reply.status_code, json.loads(data)
        except (ValueError, RecursionError):
            raise _BadAnswer("an answer that is not JSON") from None

    # -------------------------------------------------------------- components
    def _components(
        self,
        server: str,
        published: Sequence[Mapping[str, Any]] | None,
        names: Sequence[str] | None,
        low: Sequence[float] | None,
        high: Sequence[float] | None,
        weights: Sequence[float] | None,
        first_task: Task,
    ) -> tuple[list[str], list[float], list[float], list[float] | None]:
        """Names, bounds, weights: the server's schema, else the config, else learned; checked in float32."""
        self._learned_source: str | None = None
        self._scalar_ok = published is None
        declared: list[tuple[str, Any, Any, Any]] | None = None
        try:
            if published is not None:
                declared = _spec(published, f"OpenEnv server {server} /schema")
                p_names = [r[0] for r in declared]
                if names is not None and [str(n) for n in names] != p_names:
                    raise RemoteEnvError(
                        f"OpenEnv server {server} publishes rewards {p_names}, "
                        f"the config says {list(names)}"
                    )
                p_low, p_high = _bounds(p_names, [r[1] for r in declared], [r[2] for r in declared],
                                        f"OpenEnv server {server} /schema")
                for key, given, theirs in (("low", low, p_low), ("high", high, p_high)):
                    if given is not None and [float(x) for x in given] != theirs:
                        raise RemoteEnvError(
                            f"OpenEnv server {server}: reward_{key} {list(given)} differs from the server's "
                            f"{theirs} for {p_names}"
                        )
                names = p_names
                self._origin = f"published by {server}"
            elif names is not None:
                names = [str(n) for n in names]
                self._origin = "env.reward_names"
            else:
                learned = self._learn(server, first_task)
                names, declared = list(learned["names"]), learned["declared"]
                self._learned_source = learned["source"]
                self._origin = f"learned from the {learned['when']} of {learned['server']}"
                if declared is not None and [r[0] for r in declared] != names:
                    declared = None  # a spec for other names says nothing about these
            k = len(names)
            if low is None:
                low = [r[1] for r in declared] if declared else [-math.inf] * k
            if high is None:
                high = [r[2] for r in declared] if declared else [math.inf] * k
            where = "env" if published is None else f"OpenEnv server {server}"
            lo, hi = _bounds(names, list(low), list(high), where)
            weights_from = "env.reward_weights"
            if weights is None and declared:
                weights, weights_from = [r[3] for r in declared], f"OpenEnv server {server}"
            w = None if weights is None else list(weights)
            if w is not None:
                if len(w) != k:
                    raise ValueError(f"{weights_from}: {len(w)} weights for the {k} components {names}")
                w = [_number(x, f"{weights_from}: the weight of {n!r}") for n, x in zip(names, w)]
        except ValueError as exc:
            raise RemoteEnvError(str(exc)) from None
        return names, lo, hi, w

    def _learn(self, server: str, task: Task) -> dict[str, Any]:
        """A server's components from a first episode (once per process and server list)."""
        pool = self._pool
        with pool.learn_lock:  # every env of the list waits for the one that asks
            if pool.learned is None:
                pool.learned = self._probe(server, task)
                found = pool.learned
                log.warning(
                    "learned reward components %s from the %s of %s (%s); a later change is an error "
                    "(set env.reward_names to declare them)",
                    found["names"], found["when"], server, found["source"],
                )
            return pool.learned

    def _probe(self, server: str, task: Task) -> dict[str, Any]:
        """Reset a throwaway session to ``task``, step it with :data:`PROBE_TEXT` until it scores."""
        from openenv.core import GenericEnvClient

        client = GenericEnvClient(
            base_url=server,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.timeout_s + GRACE_S,
            max_message_size_mb=self.max_observation_bytes / 2**20,
            headers=self._headers,
        )
        steps = max(1, self.max_turns or 1)

        async def episode() -> dict[str, Any]:
            try:
                result = _checked(await asyncio.wait_for(client.reset(**task["reset"]), self.timeout_s))
                meta = _metadata(result)
                declared = None
                if meta.get("reward_spec") is not None:
                    with suppress(ValueError):
                        declared = _spec(meta["reward_spec"], "reward_spec")
                found, when = _components_in(meta), "first reset"
                for i in range(steps):
                    if found is not None or result.done:
                        break
                    if self.action_format == "mcp" and i > 0:
                        break  # only list_tools is harmless to send without a model's tool call
                    if self.action_format == "mcp":
                        payload = {"type": "list_tools"}
                    else:
                        payload = {self.action_field: PROBE_TEXT}
                    result = _checked(await asyncio.wait_for(client.step(payload), self.timeout_s))
                    found, when = _components_in(_metadata(result)), "first step"
                    if found is None and result.reward is not None:
                        break
                source, names = ("reward", ["reward"]) if found is None else (found[0], list(found[1]))
                return {"names": [str(n) for n in names], "source": source, "when": when,
                        "server": server, "declared": declared}
            finally:
                with suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(client.close(), CLOSE_S)

        deadline = self.connect_timeout_s + self.timeout_s * (steps + 1)
        try:
            return self._loop.run(episode, deadline)
        except RemoteEnvError:
            raise
        except Exception as exc:
            status = _refused_status(exc)
            if status is not None:
                raise _refused(server, status, self._headers is not None) from None
            raise RemoteEnvError(
                f"OpenEnv server {server} names no reward components and a first episode to learn them "
                f"failed ({_reason(exc, self.max_observation_bytes)}); {_FIX}"
            ) from None

    def _vector(self, result: Any, server: str) -> dict[str, float]:
        """The step's components, checked against the declared names and bounds (in float32)."""
        meta = _metadata(result)
        where = f"OpenEnv server {server}, task {self.task.id if self.task else '?'}"
        found = _components_in(meta)
        if found is not None:
            source, raw = found
        elif len(self.reward_names) == 1 and self._scalar_ok:
            reward = result.reward
            if reward is None and not result.done:
                reward = 0.0  # OpenEnv's reward is optional: a turn that scores nothing, mid-episode
            source, raw = "reward", {self.reward_names[0]: reward}
        else:
            raise _lie(where, f"the step carries no reward components {list(self.reward_names)} "
                              f"({self._origin}); {_FIX}")
        if self._learned_source is not None and source != self._learned_source:
            raise _lie(where, f"the step's rewards are in {source}, but they were in {self._learned_source} "
                              f"({self._origin} {list(self.reward_names)}): the server's components "
                              f"changed; {_FIX}")
        missing = [n for n in self.reward_names if n not in raw]
        extra = [str(n) for n in raw if n not in self.reward_names]
        if missing or extra:
            raise _lie(where, f"{source} is missing component(s) {missing} / has unknown {extra}; "
                              f"expected {list(self.reward_names)} ({self._origin}); {_FIX}")
        values: dict[str, float] = {}
        for name, lo, hi in zip(self.reward_names, self.reward_space.low, self.reward_space.high):
            try:
                value = _number(raw[name], f"component {name!r}")
            except ValueError as exc:
                raise _lie(where, str(exc)) from None
            if not (float(lo) - 1e-6 <= value <= float(hi) + 1e-6):
                raise _lie(where, f"component {name!r} = {value} is outside its bounds [{lo:g}, {hi:g}]")
            values[name] = value
        return values

    # -------------------------------------------------------------- transport
    def _client(self, url: str) -> Any:
        """This env's open session on ``url`` (opened within ``connect_timeout_s``)."""
        from openenv.core import GenericEnvClient

        client = self._conns.clients.get(url)
        if client is None:
            client = GenericEnvClient(
                base_url=url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.timeout_s + GRACE_S,  # our own deadline comes first
                max_message_size_mb=self.max_observation_bytes / 2**20,
                headers=self._headers,
            )

            async def connect() -> None:
                await client.connect()

            try:
                self._loop.run(connect, self.connect_timeout_s)
            except ConnectionError as exc:
                status = _refused_status(exc)
                if status is not None:
                    raise _refused(url, status, self._headers is not None) from None
                raise
            self._conns.clients[url] = client
        return client

    def _drop_client(self, url: str) -> None:
        """Forget ``url``'s session; it is closed in the background (a dead server does not answer)."""
        client = self._conns.clients.pop(url, None)
        if client is not None:

            async def close() -> None:
                await client.close()

            self._loop.submit(close)

    def _call(self, url: str, what: str, op: Callable[[Any], Awaitable[Any]]) -> Any:
        """``await op(client)`` within ``timeout_s``; a server-side error becomes :class:`RemoteEnvError`,
        a malformed answer :class:`_BadAnswer`, a transport fault propagates."""
        client = self._client(url)
        try:
            result = self._loop.run(lambda: op(client), self.timeout_s)
        except RuntimeError as exc:
            if str(exc).startswith("Server error:"):
                task = self.task.id if self.task else "?"
                hint = ""
                if "CAPACITY_REACHED" in str(exc):
                    # corrgrpo serve says which limit: its sessions, or one client's quota of them
                    limit = "--sessions-per-client" if "quota" in str(exc) else "max_concurrent_envs"
                    hint = (f" (each env instance holds one session: raise the server's "
                            f"{limit} to at least its share of P*G members)")
                raise RemoteEnvError(
                    f"OpenEnv server {url}, task {task}, {what}: {_oneline(exc)}{hint}"
                ) from None
            raise
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # the client could not parse it
            raise _BadAnswer(_oneline(f"a malformed answer ({type(exc).__name__}: {exc})")) from None
        return _checked(result)

    def _start(self, url: str, reset_args: Mapping[str, Any]) -> Any:
        async def reset(client: Any) -> Any:
            return await client.reset(**reset_args)

        return self._call(url, "reset", reset)

    def _send(self, url: str, what: str, payload: dict[str, Any]) -> Any:
        async def step(client: Any) -> Any:
            return await client.step(payload)

        return self._call(url, what, step)

    def _payload(self, action: str) -> dict[str, Any]:
        if self.action_format == "mcp":
            call = mcp_tool_call(action)
            assert call is not None  # _act scores a text without a tool call locally
            return call
        return {self.action_field: action}

    def _replay_on(self, url: str) -> Any:
        """Reset ``url`` to this episode's task and step the actions played so far (same rewards)."""
        result = self._start(url, self._reset_args)
        for action, expected in self._history:
            result = self._send(url, "replay", self._payload(action))
            got = self._vector(result, url)
            if got != expected:
                raise RemoteEnvError(
                    f"OpenEnv server {url}, task {self.task.id}: replaying the episode gave rewards "
                    f"{got}, the first server gave {expected}"
                )
        return result

    _FAULTS = (
        ConnectionError, OSError, TimeoutError, asyncio.TimeoutError, EOFError, _BadAnswer, httpx.HTTPError,
    )

    def _is_fault(self, exc: BaseException) -> bool:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        return isinstance(exc, (*self._FAULTS, ConnectionClosed, InvalidHandshake)) or (
            isinstance(exc, RuntimeError) and not isinstance(exc, RemoteEnvError)
        )

    def _with_failover(self, what: str, fn: Any) -> Any:
        """``fn(url)`` on the episode's server; on a fault, replay the episode on another one first."""
        tried: list[str] = []
        errors: list[str] = []
        lies: list[bool] = []
        replay = False
        while True:
            url = self._server
            assert url is not None
            try:
                if replay:
                    self._replay_on(url)
                return fn(url)
            except BaseException as exc:
                # a reward that breaks the declared components is routed around like a dropped
                # connection: the step is answered by a healthy server, or by none
                lie = isinstance(exc, RemoteRewardError)
                if not lie and (isinstance(exc, RemoteEnvError) or not self._is_fault(exc)):
                    raise
                if lie and len(tried) == 0 and (self.retries < 1 or len(self.urls) == 1):
                    raise  # nowhere else to go: its own message, which names the fix
                reason = getattr(exc, "reason", None) or _reason(exc, self.max_observation_bytes)
                tried.append(url)
                lies.append(lie)
                errors.append(f"{url} ({reason})")
                self._drop_client(url)
                self._pool.mark_down(url, self.down_s)
                self._pool.release(url, self._episode_task)
                self._server = None
                nxt = None
                if len(tried) <= self.retries:
                    # a server another episode marked down is still tried before the step gives up:
                    # the mark steers new episodes, it is no verdict
                    nxt = self._pool.acquire(self._episode_task, exclude=tried) or self._pool.acquire(
                        self._episode_task, exclude=tried, include_down=True
                    )
                if nxt is None:
                    failed = RemoteRewardError if all(lies) else RemoteEnvError
                    raise failed(
                        f"task {self._episode_task}, {what}: OpenEnv server(s) failed: {'; '.join(errors)}"
                    ) from None
                log.warning(
                    "OpenEnv server %s failed during %s of task %s (%s); replaying the episode on %s",
                    url, what, self._episode_task, reason, nxt,
                )
                self._server = nxt
                replay = what != "reset"  # a reset needs no history: it is simply sent again

    # ----------------------------------------------------------------- hooks
    def _release(self) -> None:
        if self._server is not None and self._episode_task is not None:
            self._pool.release(self._server, self._episode_task)
        self._server = None

    def _observe_task(self, task: Task) -> dict:
        self._release()
        self._reset_args = dict(task["reset"])
        self._history = []
        self._turns = 0
        self._episode_task = task.id
        url = self._pool.acquire(task.id)
        if url is None:
            # every server is marked down: try them all again rather than fail at once
            with self._pool.lock:
                self._pool.down_until.clear()
            url = self._pool.acquire(task.id)
        self._server = url
        result = self._with_failover("reset", lambda u: self._start(u, self._reset_args))
        if self.action_format == "mcp":
            listed = self._with_failover(
                "list_tools", lambda u: self._send(u, "list_tools", {"type": "list_tools"})
            )
            tools = listed.observation.get("tools", [])
            named = isinstance(tools, list) and all(
                isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tools
            )
            if not named:
                raise RemoteEnvError(
                    f"OpenEnv server {self._server}, task {task.id}: list_tools sent no tool list"
                )
            self._tools = [
                {"name": t["name"], "description": str(t.get("description", "")),
                 "parameters": t.get("input_schema", {"type": "object", "properties": {}})}
                for t in tools
            ]
        return self._conversation_of(result, first=True)

    def _conversation_of(self, result: Any, first: bool, action: str | None = None) -> dict:
        obs = result.observation
        if "messages" in obs:
            tools = obs.get("tools", [])
            return {"messages": list(obs["messages"]), "tools": list(tools)}
        text = _observation_text(obs, self.observation_field)
        if first:
            self._conversation = [{"role": "user", "content": text}]
        else:
            self._conversation = [
                *self._conversation,
                {"role": "assistant", "content": action or ""},
                {"role": "user", "content": text},
            ]
        return {"messages": [dict(m) for m in self._conversation], "tools": [dict(t) for t in self._tools]}

    def _act(self, action: str) -> StepOutcome:
        if self.action_format == "mcp" and mcp_tool_call(action) is None:
            # as for any unusable action: the lowest reward, and the episode ends
            return self._invalid_outcome(
                'no tool call in the answer (expected <tool_call>{"name": ..., "arguments": {...}}</tool_call>)'
            )
        def step(url: str) -> tuple[Any, dict[str, float]]:
            result = self._send(url, "step", self._payload(action))
            return result, self._vector(result, url)

        result, rewards = self._with_failover("step", step)
        server = self._server
        self._history.append((action, rewards))
        self._turns += 1
        obs = result.observation
        truncated = bool(obs.get("truncated", False))
        done = bool(result.done)
        if not done and self.max_turns is not None and self._turns >= self.max_turns:
            truncated = True
        terminated = done and not truncated
        info = dict(obs.get("info", {})) if isinstance(obs.get("info"), Mapping) else {}
        info["server"] = server
        if terminated or truncated:
            self._release()
        return StepOutcome(
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            observation=self._conversation_of(result, first=False, action=action),
            info=info,
        )

    def reference_action(self, task_id: str) -> list[str]:
        """The server's reference messages for ``task_id`` (OpenEnv's task route).

        ``corrgrpo serve`` sends them only when started with ``--serve-references``; without
        them this raises :class:`RemoteReferenceError` saying so.
        """
        ids = self.task_ids
        if task_id not in set(ids):
            raise KeyError(task_id)
        url = self.urls[0]
        if self._env_name is None or task_id.startswith("seed-"):
            raise RemoteReferenceError(
                f"OpenEnv server {url} lists no tasks, so it has no reference answers"
            )
        fix = ("start it with --serve-references (corrgrpo serve ENV --serve-references), which sft from a "
               "remote env and eval --policy reference need")
        path = f"{url}/{quote(self._env_name, safe='')}/task"
        # the served env's own split order: the index of the task in the listed split
        body = {"split": self._split_name, "index": ids.index(task_id)}
        try:
            status, reply = self._loop.run(lambda: self._fetch("POST", path, body), self.timeout_s)
        except (httpx.HTTPError, OSError, TimeoutError, _BadAnswer) as exc:
            raise RemoteEnvError(
                f"OpenEnv server {url}, task {task_id}: reading the reference failed "
                f"({_reason(exc, self.max_observation_bytes)})"
            ) from None
        if status == 401:
            raise _refused(url, status, self._headers is not None)
        if status == 403:
            raise RemoteReferenceError(f"OpenEnv server {url} refuses reference answers (403): {fix}")
        if status in (404, 405, 501):
            raise RemoteReferenceError(
                f"OpenEnv server {url} has no task route ({status}), so no reference answers"
            )
        if status != 200:
            raise RemoteEnvError(
                f"OpenEnv server {url}, task {task_id}: {status} {_oneline(reply, 200)}"
            )
        task = reply.get("task", {}) if isinstance(reply, Mapping) else {}
        if not isinstance(task, Mapping) or task.get("id") != task_id:
            raise RemoteEnvError(f"OpenEnv server {url} answered for another task than {task_id}")
        reference = task.get("reference")
        if reference is None:
            raise RemoteReferenceError(
                f"OpenEnv server {url} sent no reference answer for task {task_id}: {fix} "
                "(or its env has none)"
            )
        if not isinstance(reference, list) or not reference:
            raise RemoteEnvError(
                f"OpenEnv server {url}, task {task_id}: the reference is not a list of messages"
            )
        return [str(m) for m in reference]

    def close(self) -> None:
        """Close every session (waiting at most a few seconds for the servers); idempotent and cheap."""
        self._release()
        self._loop_lease.release(self._conns.aclose)
        self._lease.release()
        super().close()
