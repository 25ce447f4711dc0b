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

import math
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from corrgrpo_envs.core import MAX_ACTION_CHARS, MultiRewardEnv, StepOutcome
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
from corrgrpo_envs.integrations.openenv_settings import DEFAULT_MAX_OBSERVATION_BYTES
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

        def learn() -> dict[str, Any]:
            return self._discovery.learn(first_url, source[0], self.action_format, self.action_field,
                                         self.max_turns)

        self._rewards, (names, low, high, weights) = _RewardContract.resolve(
            first_url, first["reward_components"], reward_names, reward_low, reward_high, reward_weights,
            learn,
        )
        super().__init__(
            source, names, low, high, weights, max_action_chars=max_action_chars, render_mode=render_mode
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
