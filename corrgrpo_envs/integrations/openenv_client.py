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

The parts, each in its own module: the addresses, the token and the errors
(:mod:`~corrgrpo_envs.integrations.openenv_remote`), reading and checking what a server sends
(:mod:`~corrgrpo_envs.integrations.openenv_schema`), what a server publishes
(:mod:`~corrgrpo_envs.integrations.openenv_discovery`), the components expected and each step's
check (:mod:`~corrgrpo_envs.integrations.openenv_rewards`), the sessions with their deadlines and
cap and the shared server pool (:mod:`~corrgrpo_envs.integrations.openenv_pool`), and the move of
an episode to another server (:mod:`~corrgrpo_envs.integrations.openenv_failover`). This module
is the Gymnasium env over them, and the place their public names are imported from.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.integrations.deadline_loop import LoopLease
from corrgrpo_envs.integrations.openenv_discovery import PROBE_TEXT as PROBE_TEXT
from corrgrpo_envs.integrations.openenv_discovery import _Discovery
from corrgrpo_envs.integrations.openenv_failover import _Failover
from corrgrpo_envs.integrations.openenv_pool import _Connections, _PoolLease
from corrgrpo_envs.integrations.openenv_remote import (
    SCHEME,
    TOKEN_ENV,
    RemoteEnvError,
    RemoteReferenceError,
    RemoteRewardError,
    auth_headers,
    parse_urls,
)
from corrgrpo_envs.integrations.openenv_rewards import _RewardContract
from corrgrpo_envs.integrations.openenv_schema import FLOAT32_MAX as FLOAT32_MAX
from corrgrpo_envs.integrations.openenv_schema import (
    _observation_text,
    _text_field,
    mcp_tool_call,
)
from corrgrpo_envs.integrations.openenv_settings import (
    DEFAULT_MAX_OBSERVATION_BYTES,
    OpenEnvSettings,
)
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


class OpenEnvEnv(MultiRewardEnv):
    """The env behind one or more OpenEnv servers, stepped over OpenEnv's WebSocket client.

    Its keyword arguments are the fields of
    :class:`~corrgrpo_envs.integrations.openenv_settings.OpenEnvSettings` (names, defaults and
    allowed values declared there once: the servers, the task split, the reward components, the
    action and observation fields, the deadlines, retries and size cap, the token). The first
    argument is the servers (``openenv://HOST:PORT``, several separated by commas, or a list),
    as the resolver and most callers give them; an ``OpenEnvSettings`` object may be given there
    instead, keyword arguments then go over it. Without reward names from the servers' schema or
    the settings, the components are learned from a first episode (see the module doc).
    """

    def __init__(self, url: str | Sequence[str] | OpenEnvSettings | None = None, **kwargs: Any):
        if isinstance(url, OpenEnvSettings) or url is None:
            settings = url
        else:
            # the servers by position: the address every caller of an OpenEnv env starts with
            settings, kwargs = None, {"url": url, **kwargs}
        s = OpenEnvSettings.read(settings, kwargs)
        self.urls = parse_urls(s.url)
        self.timeout_s, self.connect_timeout_s = s.timeout_s, s.connect_timeout_s
        self.retries, self.down_s = s.retries, s.down_s
        self.max_turns = s.max_turns
        self.max_observation_bytes = s.max_observation_bytes
        self.observation_field = s.observation_field
        self.action_format = s.action_format
        self._headers = auth_headers(s.token)
        self._lease = _PoolLease(self.urls)
        self._pool = self._lease.pool
        # every env of the process shares one loop thread (a thread per session cost more than the I/O)
        self._loop_lease = LoopLease()
        self._loop = self._loop_lease.loop
        self._conns = _Connections(self._loop, self._headers, self.timeout_s, self.connect_timeout_s,
                                   self.max_observation_bytes)
        # an env dropped without close(): close its sessions (not at interpreter exit, see DeadlineLoop)
        self._finalizer = weakref.finalize(self, self._loop_lease.release, self._conns.aclose, False)
        self._finalizer.atexit = False
        self._lease_finalizer = weakref.finalize(self, self._lease.release)
        self._lease_finalizer.atexit = False
        self._discovery = _Discovery(self.urls, self._pool, self._conns, self.down_s)
        self._episode = _Failover(self.urls, self._pool, self._conns, self.retries, self.down_s)
        self._turns = 0
        self._conversation: list[dict[str, Any]] = []
        self._tools: list[dict[str, Any]] = []
        try:
            self._setup(s)
        except BaseException:
            self._loop_lease.release(self._conns.aclose)
            self._lease.release()
            raise

    def _setup(self, s: OpenEnvSettings) -> None:
        split = s.split
        described = self._discovery.describe(split)
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
                seeds = [Task(f"seed-{i}", {"reset": {"seed": i}}) for i in range(s.num_tasks)]
                source = TaskSource(seeds, name=name).split(split)
        except ValueError as exc:
            raise RemoteEnvError(f"OpenEnv server {first_url}: its task listing: {exc}") from None
        if len(source) == 0:
            raise RemoteEnvError(f"OpenEnv server {first_url} lists no tasks in split {split!r}")
        self._env_name = first["env_name"]
        self._split_name = split
        self.action_field = (
            None if self.action_format == "mcp"
            else s.action_field or _text_field(first["action"], first_url)
        )

        def learn() -> dict[str, Any]:
            return self._discovery.learn(first_url, source[0], self.action_format, self.action_field,
                                         self.max_turns)

        self._rewards, (names, low, high, weights) = _RewardContract.resolve(
            first_url, first["reward_components"], s.reward_names, s.reward_low, s.reward_high,
            s.reward_weights, learn,
        )
        super().__init__(
            source, names, low, high, weights, max_action_chars=s.max_action_chars,
            render_mode=s.render_mode
        )

    # -------------------------------------------------------------- transport
    def _task_label(self) -> str:
        return self.task.id if self.task else "?"

    def _call(self, url: str, what: str, op: Callable[[Any], Awaitable[Any]]) -> Any:
        return self._conns.call(url, what, op, self._task_label())

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

    def _vector(self, result: Any, server: str) -> dict[str, float]:
        """The step's components, checked against the declared names and bounds (in float32)."""
        where = f"OpenEnv server {server}, task {self._task_label()}"
        return self._rewards.vector(result, where, self.reward_names, self.reward_space.low,
                                    self.reward_space.high)

    def _replay_on(self, url: str) -> Any:
        """Reset ``url`` to this episode's task and step the actions played so far (same rewards)."""
        result = self._start(url, self._episode.reset_args)
        for action, expected in self._episode.history:
            result = self._send(url, "replay", self._payload(action))
            got = self._vector(result, url)
            if got != expected:
                raise RemoteEnvError(
                    f"OpenEnv server {url}, task {self.task.id}: replaying the episode gave rewards "
                    f"{got}, the first server gave {expected}"
                )
        return result

    # ----------------------------------------------------------------- hooks
    def _observe_task(self, task: Task) -> dict:
        self._turns = 0
        self._episode.begin(task.id, task["reset"])
        result = self._episode.run("reset", lambda u: self._start(u, self._episode.reset_args))
        if self.action_format == "mcp":
            listed = self._episode.run(
                "list_tools", lambda u: self._send(u, "list_tools", {"type": "list_tools"}), self._replay_on
            )
            tools = listed.observation.get("tools", [])
            named = isinstance(tools, list) and all(
                isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tools
            )
            if not named:
                raise RemoteEnvError(
                    f"OpenEnv server {self._episode.server}, task {task.id}: list_tools sent no tool list"
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

        result, rewards = self._episode.run("step", step, self._replay_on)
        server = self._episode.server
        self._episode.history.append((action, rewards))
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
            self._episode.release()
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
        # the served env's own split order: the index of the task in the listed split
        return self._discovery.reference(self._env_name, self._split_name, task_id, ids.index(task_id))

    def close(self) -> None:
        """Close every session (waiting at most a few seconds for the servers); idempotent and cheap."""
        self._episode.release()
        self._loop_lease.release(self._conns.aclose)
        self._lease.release()
        super().close()
