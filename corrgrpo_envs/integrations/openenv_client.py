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
where both exist they must agree. A step whose vector misses a component, has an extra
one, or holds a NaN, an infinity or a value outside the bounds raises
:class:`RemoteRewardError` naming the server, the task and the component: never a
silent zero.

Several servers (``openenv://a:8000,b:8000``, or a list) form one pool per process:
an episode starts on the server that already runs its task's group, else on the least
busy one, so the G rollouts of a task share a server (their rewards are compared with
each other; one server means one env version and warm per-task caches) while groups
spread. A server that drops the connection or does not answer within ``timeout_s``
is marked down for ``down_s`` seconds, a warning is logged, and the episode is
replayed on another server (reset to the same task and seed, the earlier actions
stepped again and their rewards checked to be identical), at most ``retries`` times;
then :class:`RemoteEnvError` names every server tried. A server that answers with an
error (unknown task, a step after the end) is not retried: its message is raised.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from corrgrpo_envs.core import MAX_ACTION_CHARS, MultiRewardEnv, StepOutcome
from corrgrpo_envs.tasks import Task, TaskSource

__all__ = [
    "OpenEnvEnv",
    "RemoteEnvError",
    "RemoteRewardError",
    "parse_urls",
    "mcp_tool_call",
    "SCHEME",
]

SCHEME = "openenv://"
log = logging.getLogger(__name__)


class RemoteEnvError(RuntimeError):
    """An OpenEnv server failed or refused a request (the message names the server and task)."""


class RemoteRewardError(RemoteEnvError):
    """A step's reward vector does not match the declared components (names server, task, component)."""


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


# ------------------------------------------------------------------ server pool
class _ServerPool:
    """Which server each episode runs on, shared by every env of one server list in a process."""

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self.lock = threading.Lock()
        self.active: Counter[str] = Counter()
        self.task_server: dict[str, str] = {}
        self.task_count: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}

    def acquire(self, task_id: str, exclude: Sequence[str] = ()) -> str | None:
        """A server for an episode of ``task_id``: the one its group uses, else the least busy."""
        with self.lock:
            now = time.monotonic()
            up = [u for u in self.urls if u not in exclude and self.down_until.get(u, 0.0) <= now]
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


_POOLS: dict[tuple[str, ...], _ServerPool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(urls: Sequence[str]) -> _ServerPool:
    with _POOLS_LOCK:
        key = tuple(urls)
        if key not in _POOLS:
            _POOLS[key] = _ServerPool(urls)
        return _POOLS[key]


# ------------------------------------------------------------- server probing
def _describe_server(url: str, split: str, timeout: float) -> dict[str, Any]:
    """The server's reward components, action schema, env name and tasks of ``split`` (OpenEnv routes)."""
    try:
        schema = httpx.get(f"{url}/schema", timeout=timeout)
        schema.raise_for_status()
        names = httpx.get(f"{url}/list_environments", timeout=timeout)
    except httpx.HTTPError as exc:
        raise RemoteEnvError(f"OpenEnv server {url}: cannot read /schema ({type(exc).__name__}: {exc})") from None
    body = schema.json()
    env_name = None
    if names.status_code == 200 and isinstance(names.json(), list) and names.json():
        env_name = str(names.json()[0])
    tasks: list[str] | None = None
    if env_name is not None:
        listed = httpx.post(f"{url}/{env_name}/tasks", json={"split": split}, timeout=timeout)
        if listed.status_code == 200:
            tasks = [str(t["id"]) if isinstance(t, Mapping) and "id" in t else str(t)
                     for t in listed.json().get("tasks", [])]
        elif listed.status_code not in (404, 405, 501):
            raise RemoteEnvError(
                f"OpenEnv server {url}: listing the tasks of split {split!r} failed "
                f"({listed.status_code}: {listed.text[:200]})"
            )
    return {
        "reward_components": body.get("observation", {}).get("reward_components"),
        "action": body.get("action", {}),
        "env_name": env_name,
        "tasks": tasks,
    }


def _text_field(action_schema: Mapping[str, Any], server: str) -> str:
    """The action's one required string field (``message`` for ``corrgrpo serve`` and ``openenv init``)."""
    props = action_schema.get("properties", {})
    required = [k for k in action_schema.get("required", []) if k != "metadata"]
    strings = [k for k in (required or list(props)) if props.get(k, {}).get("type") == "string"]
    if len(strings) == 1:
        return strings[0]
    raise RemoteEnvError(
        f"OpenEnv server {server}: cannot tell which action field takes the text "
        f"(string fields: {strings or 'none'}); set action_field in the env config"
    )


def _observation_text(observation: Mapping[str, Any], field: str | None) -> str:
    """What a third-party observation says, as a user message."""
    if field is not None:
        return str(observation.get(field, ""))
    shown = {k: v for k, v in observation.items() if k not in ("metadata", "reward", "done")}
    if not shown and observation.get("metadata"):
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
            servers that do not publish them (or to check those that do).
        action_field: the action's text field (default: its one required string field).
        action_format: ``"text"`` (the text goes into ``action_field``) or ``"mcp"`` (an MCP
            tool env: the tool call written in the text becomes a ``call_tool`` action, and
            the server's ``list_tools`` fill the observation's ``tools``).
        observation_field: the observation field shown to the policy (third-party
            servers without ``messages``; default: every field).
        max_turns: end an episode after this many steps (servers that never say done).
        timeout_s: seconds to wait for a server's answer before trying another one.
        retries: other servers tried when one fails mid-episode.
        down_s: seconds a failed server is left out of the pool.
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
        max_action_chars: int = MAX_ACTION_CHARS,
        render_mode: str | None = None,
    ):
        self.urls = parse_urls(url)
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.retries, self.down_s = int(retries), float(down_s)
        self.max_turns = None if max_turns is None else int(max_turns)
        self.observation_field = observation_field
        described: dict[str, dict[str, Any]] = {}
        failures: list[str] = []
        for u in self.urls:
            try:
                described[u] = _describe_server(u, split, self.connect_timeout_s)
            except RemoteEnvError as exc:
                failures.append(str(exc))
        if not described:
            raise RemoteEnvError("; ".join(failures))
        for msg in failures:
            log.warning("%s (left out until it answers)", msg)
        first_url, first = next(iter(described.items()))
        for u, d in described.items():
            for key in ("reward_components", "tasks"):
                if d[key] != first[key]:
                    raise RemoteEnvError(
                        f"OpenEnv servers {first_url} and {u} serve different {key.replace('_', ' ')}"
                    )
        names, low, high, weights = self._components(
            first_url, first["reward_components"], reward_names, reward_low, reward_high, reward_weights
        )
        self._from_components = first["reward_components"] is not None
        if first["tasks"] is not None:
            tasks = [Task(t, {"reset": {"task_id": t}}) for t in first["tasks"]]
            source = TaskSource(tasks, name=first["env_name"] or "openenv")
        else:
            tasks = [Task(f"seed-{i}", {"reset": {"seed": i}}) for i in range(int(num_tasks))]
            source = TaskSource(tasks, name=first["env_name"] or "openenv").split(split)
        self._env_name = first["env_name"]
        self._split_name = split
        if action_format not in ("text", "mcp"):
            raise ValueError(f"action_format must be 'text' or 'mcp', got {action_format!r}")
        self.action_format = action_format
        self.action_field = (
            None if action_format == "mcp" else action_field or _text_field(first["action"], first_url)
        )
        self._tools: list[dict[str, Any]] = []
        self._pool = _pool(self.urls)
        self._clients: dict[str, Any] = {}
        self._server: str | None = None
        self._history: list[tuple[str, dict[str, float]]] = []
        self._turns = 0
        self._episode_task: str | None = None
        self._reset_args: dict[str, Any] = {}
        self._conversation: list[dict[str, Any]] = []
        super().__init__(
            source, names, low, high, weights, max_action_chars=max_action_chars, render_mode=render_mode
        )

    # -------------------------------------------------------------- components
    @staticmethod
    def _components(
        server: str,
        published: Sequence[Mapping[str, Any]] | None,
        names: Sequence[str] | None,
        low: Sequence[float] | None,
        high: Sequence[float] | None,
        weights: Sequence[float] | None,
    ) -> tuple[list[str], list[float], list[float], list[float] | None]:
        if published is not None:
            p_names = [str(r["name"]) for r in published]
            if names is not None and list(names) != p_names:
                raise RemoteEnvError(
                    f"OpenEnv server {server} publishes rewards {p_names}, the config says {list(names)}"
                )
            for key, given in (("low", low), ("high", high)):
                if given is not None and [float(x) for x in given] != [float(r[key]) for r in published]:
                    raise RemoteEnvError(
                        f"OpenEnv server {server}: reward_{key} {list(given)} differs from the server's "
                        f"{[r[key] for r in published]} for {p_names}"
                    )
            w = list(weights) if weights is not None else [float(r.get("weight", 1.0)) for r in published]
            return p_names, [float(r["low"]) for r in published], [float(r["high"]) for r in published], w
        names = list(names) if names is not None else ["reward"]
        k = len(names)
        lo = list(low) if low is not None else [-math.inf] * k
        hi = list(high) if high is not None else [math.inf] * k
        return names, lo, hi, None if weights is None else list(weights)

    def _vector(self, result: Any, server: str) -> dict[str, float]:
        """The step's components, checked against the declared names and bounds."""
        meta = result.metadata or result.observation.get("metadata") or {}
        where = f"OpenEnv server {server}, task {self.task.id if self.task else '?'}"
        if isinstance(meta.get("reward_components"), Mapping):
            raw, source = meta["reward_components"], "metadata['reward_components']"
        elif isinstance(meta.get("rubric_scores"), Mapping):
            raw, source = meta["rubric_scores"], "metadata['rubric_scores']"
        elif len(self.reward_names) == 1 and not self._from_components:
            reward = result.reward
            if reward is None and not result.done:
                reward = 0.0  # OpenEnv's reward is optional: a turn that scores nothing, mid-episode
            raw, source = {self.reward_names[0]: reward}, "reward"
        else:
            raise RemoteRewardError(f"{where}: the step carries no reward components {list(self.reward_names)}")
        missing = [n for n in self.reward_names if n not in raw]
        extra = [n for n in raw if n not in self.reward_names]
        if missing or extra:
            raise RemoteRewardError(
                f"{where}: {source} is missing component(s) {missing} / has unknown {extra}; "
                f"declared {list(self.reward_names)}"
            )
        values: dict[str, float] = {}
        for name, lo, hi in zip(self.reward_names, self.reward_space.low, self.reward_space.high):
            value = raw[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RemoteRewardError(f"{where}: component {name!r} is {value!r}, not a number")
            value = float(value)
            if not math.isfinite(value):
                raise RemoteRewardError(f"{where}: component {name!r} is {value}")
            if not (float(lo) - 1e-6 <= value <= float(hi) + 1e-6):
                raise RemoteRewardError(
                    f"{where}: component {name!r} = {value} is outside its bounds [{lo:g}, {hi:g}]"
                )
            values[name] = value
        return values

    # -------------------------------------------------------------- transport
    def _client(self, url: str) -> Any:
        from openenv.core import GenericEnvClient

        client = self._clients.get(url)
        if client is None:
            client = GenericEnvClient(
                base_url=url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.timeout_s,
            ).sync()
            self._clients[url] = client
        return client

    def _drop_client(self, url: str) -> None:
        client = self._clients.pop(url, None)
        if client is not None:
            try:
                client.close()
            except Exception:  # the connection is already gone
                pass

    def _call(self, url: str, what: str, fn: Any) -> Any:
        """Run one request; a server-side error becomes :class:`RemoteEnvError`, a transport fault propagates."""
        try:
            return fn(self._client(url))
        except RuntimeError as exc:
            if str(exc).startswith("Server error:"):
                task = self.task.id if self.task else "?"
                hint = ""
                if "CAPACITY_REACHED" in str(exc):
                    hint = (" (each env instance holds one session: raise the server's "
                            "max_concurrent_envs to at least its share of P*G members)")
                raise RemoteEnvError(f"OpenEnv server {url}, task {task}, {what}: {exc}{hint}") from None
            raise

    def _start(self, url: str, reset_args: Mapping[str, Any]) -> Any:
        return self._call(url, "reset", lambda c: c.reset(**reset_args))

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
            result = self._call(url, "replay", lambda c, a=action: c.step(self._payload(a)))
            got = self._vector(result, url)
            if got != expected:
                raise RemoteEnvError(
                    f"OpenEnv server {url}, task {self.task.id}: replaying the episode gave rewards "
                    f"{got}, the first server gave {expected}"
                )
        return result

    _FAULTS = (ConnectionError, OSError, TimeoutError, EOFError)

    def _is_fault(self, exc: BaseException) -> bool:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        return isinstance(exc, (*self._FAULTS, ConnectionClosed, InvalidHandshake)) or (
            isinstance(exc, RuntimeError) and not isinstance(exc, RemoteEnvError)
        )

    def _with_failover(self, what: str, fn: Any) -> Any:
        """``fn(url)`` on the episode's server; on a fault, replay the episode on another server first."""
        tried: list[str] = []
        errors: list[str] = []
        replay = False
        while True:
            url = self._server
            assert url is not None
            try:
                if replay:
                    self._replay_on(url)
                return fn(url)
            except RemoteEnvError:
                raise
            except BaseException as exc:
                if not self._is_fault(exc):
                    raise
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                tried.append(url)
                errors.append(f"{url} ({reason})")
                self._drop_client(url)
                self._pool.mark_down(url, self.down_s)
                self._pool.release(url, self._episode_task)
                self._server = None
                nxt = self._pool.acquire(self._episode_task, exclude=tried) if len(tried) <= self.retries else None
                if nxt is None:
                    raise RemoteEnvError(
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
                "list_tools", lambda u: self._call(u, "list_tools", lambda c: c.step({"type": "list_tools"}))
            )
            self._tools = [
                {"name": t["name"], "description": t.get("description", ""),
                 "parameters": t.get("input_schema", {"type": "object", "properties": {}})}
                for t in listed.observation.get("tools", [])
            ]
        return self._conversation_of(result, first=True)

    def _conversation_of(self, result: Any, first: bool, action: str | None = None) -> dict:
        obs = result.observation
        if "messages" in obs:
            return {"messages": list(obs["messages"]), "tools": list(obs.get("tools", []))}
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
        result = self._with_failover(
            "step", lambda u: self._call(u, "step", lambda c: c.step(self._payload(action)))
        )
        server = self._server
        rewards = self._vector(result, server)
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
        """The server's reference messages for ``task_id`` (OpenEnv's task route), where it has them."""
        ids = self.task_ids
        if task_id not in set(ids) or self._env_name is None or task_id.startswith("seed-"):
            raise KeyError(task_id) if task_id not in set(ids) else NotImplementedError(
                f"OpenEnv server {self.urls[0]} lists no reference answers"
            )
        url = self.urls[0]
        # the served env's own split order: the index of the task in the listed split
        reply = httpx.post(
            f"{url}/{self._env_name}/task",
            json={"split": self._split_name, "index": ids.index(task_id)},
            timeout=self.connect_timeout_s,
        )
        if reply.status_code != 200:
            raise RemoteEnvError(f"OpenEnv server {url}, task {task_id}: {reply.status_code} {reply.text[:200]}")
        task = reply.json().get("task", {})
        if task.get("id") != task_id or "reference" not in task:
            raise NotImplementedError(f"OpenEnv server {url} lists no reference answer for {task_id}")
        return [str(m) for m in task["reference"]]

    def close(self) -> None:
        self._release()
        for url in list(self._clients):
            self._drop_client(url)
        super().close()
