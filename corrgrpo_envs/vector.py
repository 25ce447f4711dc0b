"""Grouped rollouts: P tasks x G members, the batch shape of GRPO-style training.

Gymnasium's own vector envs do not fit this: ``SyncVectorEnv`` rejects vector
rewards, ``AsyncVectorEnv`` shares memory that text observations do not fit,
and both autoreset. :class:`GroupedVectorEnv` instead

* resets all G members of group p to the same task,
* steps a batch of actions (text), members that already finished take ``None``
  (multi-turn members finish at different turns; nothing autoresets),
* returns float32 rewards ``(P*G, K)`` with ``group_ids`` saying which group
  each row belongs to,
* spreads the members over ``workers`` threads or processes (checking code or
  AgentDojo state is the expensive part of a step). Process workers build
  their own env instances from the id/YAML/factory and keyword arguments and
  talk over pipes with pickled messages.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["GroupedVectorEnv"]

EnvSpec = str | Path | list[str] | Callable[..., gym.Env]
EXECUTORS = ("thread", "process")


def _build_env(spec: EnvSpec, kwargs: dict[str, Any]) -> gym.Env:
    if isinstance(spec, (str, Path, list, tuple)):  # a list: OpenEnv server addresses
        from corrgrpo_envs.registry import make

        return make(spec, **kwargs)
    return spec(**kwargs)


def _describe(env: gym.Env) -> dict[str, Any]:
    """What the main process needs to know about the envs (workers send it once)."""
    u = env.unwrapped
    return {
        "reward_names": tuple(u.reward_names),
        "reward_weights": np.asarray(u.reward_weights, dtype=np.float32),
        "reward_space": u.reward_space,
        "task_ids": list(u.task_ids),
    }


def _reset_many(envs: dict[int, gym.Env], jobs: list[tuple[int, str, int | None]]) -> list:
    return [envs[i].reset(seed=seed, options={"task_id": tid}) for i, tid, seed in jobs]


def _step_many(envs: dict[int, gym.Env], jobs: list[tuple[int, Any]]) -> list:
    return [envs[i].step(action) for i, action in jobs]


def _call_first(envs: dict[int, gym.Env], job: tuple[str, tuple, dict]) -> Any:
    name, args, kwargs = job
    return getattr(next(iter(envs.values())).unwrapped, name)(*args, **kwargs)


_COMMANDS = {"reset": _reset_many, "step": _step_many, "call": _call_first}


def _worker(conn: Connection, spec: EnvSpec, kwargs: dict[str, Any], indices: list[int]) -> None:
    """A process worker: build its members' envs, then serve commands until ``close``."""
    try:
        envs = {i: _build_env(spec, kwargs) for i in indices}
        conn.send(("ok", _describe(envs[indices[0]])))
    except BaseException:  # report any failure to the parent rather than dying silently
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    try:
        while True:
            cmd, payload = conn.recv()
            if cmd == "close":
                break
            try:
                conn.send(("ok", _COMMANDS[cmd](envs, payload)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass  # the parent went away
    finally:
        for env in envs.values():
            env.close()
        conn.close()


class GroupedVectorEnv:
    """P groups x G members of a multi-reward env, stepped as one batch.

    Args:
        env: a registered id, an entry point ``"package.module:attribute"``, a YAML
            config path, OpenEnv servers (``"openenv://HOST:PORT"``, comma-separated or a
            list: the members' episodes spread over them), or a factory returning an env (called with ``env_kwargs``;
            must be picklable for ``executor="process"``, e.g. a module-level
            function or class). Process workers import an entry point's module
            themselves (they start with this process's ``sys.path``).
        num_groups: P, the number of distinct tasks per batch.
        group_size: G, rollouts per task.
        workers: threads or processes the members are spread over.
        executor: ``"thread"`` (envs live in this process) or ``"process"``.
        **env_kwargs: keyword arguments for every env (dataset, split, ...).

    Member ``i`` belongs to group ``i // G``; ``group_ids[i]`` says so.
    """

    def __init__(
        self,
        env: EnvSpec,
        num_groups: int,
        group_size: int,
        workers: int = 1,
        executor: str = "thread",
        **env_kwargs: Any,
    ):
        if int(num_groups) < 1 or int(group_size) < 1:
            raise ValueError(
                f"num_groups and group_size must be >= 1, got {num_groups} and {group_size}"
            )
        if int(workers) < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        if isinstance(env, gym.Env):
            raise ValueError(
                "pass an env id, a YAML path or a factory, not an env instance "
                "(each member needs its own env)"
            )
        self.num_groups = int(num_groups)
        self.group_size = int(group_size)
        self.num_envs = self.num_groups * self.group_size
        self.executor = executor
        self.group_ids = np.repeat(np.arange(self.num_groups, dtype=np.int64), self.group_size)
        self._shards = [
            s.tolist() for s in np.array_split(np.arange(self.num_envs), min(workers, self.num_envs))
        ]
        self.workers = len(self._shards)
        self._closed = False
        self._envs: dict[int, gym.Env] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._procs: list[mp.process.BaseProcess] = []
        self._conns: list[Connection] = []
        if executor == "thread":
            try:
                for i in range(self.num_envs):
                    self._envs[i] = _build_env(env, env_kwargs)
            except BaseException:
                self.close()  # the members built so far hold sessions and threads
                raise
            meta = _describe(self._envs[0])
            if self.workers > 1:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="corrgrpo-env")
        else:
            meta = self._start_processes(env, env_kwargs)
        self.reward_names: tuple[str, ...] = meta["reward_names"]
        self.reward_weights: np.ndarray = meta["reward_weights"]
        self.reward_space: gym.spaces.Box = meta["reward_space"]
        self.task_ids: list[str] = meta["task_ids"]
        k = len(self.reward_names)
        self.returns = np.zeros((self.num_envs, k), dtype=np.float32)
        self.active = np.zeros(self.num_envs, dtype=bool)
        self.episode_lengths = np.zeros(self.num_envs, dtype=np.int64)
        self.current_task_ids: list[str] = []
        self._obs: list[dict | None] = [None] * self.num_envs
        self._rng = np.random.default_rng()

    # ------------------------------------------------------------ processes
    def _start_processes(self, spec: EnvSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            pickle.dumps((spec, kwargs))
        except Exception as exc:
            raise ValueError(
                f"executor='process' needs a picklable env spec and kwargs: {exc} "
                "(use an id, a YAML path or a module-level factory)"
            ) from exc
        # spawn, not fork: the parent may hold torch threads or locks a fork would copy.
        ctx = mp.get_context("spawn")
        for indices in self._shards:
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker, args=(child, spec, kwargs, indices), daemon=True,
                name="corrgrpo-env-worker",
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        metas = []
        for w, conn in enumerate(self._conns):
            try:
                metas.append(self._receive(w, conn))
            except BaseException:
                self.close()
                raise
        return metas[0]

    def _receive(self, w: int, conn: Connection) -> Any:
        try:
            status, payload = conn.recv()
        except EOFError:
            raise RuntimeError(f"env worker {w} died (exit code {self._procs[w].exitcode})") from None
        if status != "ok":
            raise RuntimeError(f"env worker {w} failed:\n{payload}")
        return payload

    # ------------------------------------------------------------- dispatch
    def _run(self, cmd: str, jobs: dict[int, Any]) -> dict[int, Any]:
        """Run per-member jobs ``{member: job}`` on the members' workers; results by member."""
        per_shard = [[(i, *jobs[i]) for i in shard if i in jobs] for shard in self._shards]
        fn = _COMMANDS[cmd]
        if self.executor == "process":
            busy = [w for w, part in enumerate(per_shard) if part]
            for w in busy:
                self._conns[w].send((cmd, per_shard[w]))
            outs = [self._receive(w, self._conns[w]) for w in busy]
            parts = [per_shard[w] for w in busy]
        elif self._pool is not None:
            parts = [part for part in per_shard if part]
            outs = list(self._pool.map(lambda p: fn(self._envs, p), parts))
        else:
            parts = [part for part in per_shard if part]
            outs = [fn(self._envs, p) for p in parts]
        results: dict[int, Any] = {}
        for part, out in zip(parts, outs):
            for job, res in zip(part, out):
                results[job[0]] = res
        return results

    # ------------------------------------------------------------------ API
    def reset(
        self, task_ids: Sequence[str] | None = None, seed: int | None = None
    ) -> tuple[list[dict], list[dict[str, Any]]]:
        """Start P groups; group p's G members all reset to ``task_ids[p]``.

        Without ``task_ids``, P distinct tasks are drawn (with repeats only when
        the split has fewer than P) from this object's generator, seeded by
        ``seed``. Member ``i`` is reset with ``seed + i`` when ``seed`` is given.
        Each info carries ``task_id`` and ``group_id``.
        """
        self._check_open()
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if task_ids is None:
            n = len(self.task_ids)
            picks = self._rng.choice(n, size=self.num_groups, replace=n < self.num_groups)
            task_ids = [self.task_ids[int(j)] for j in picks]
        task_ids = [str(t) for t in task_ids]
        if len(task_ids) != self.num_groups:
            raise ValueError(f"reset needs {self.num_groups} task ids (one per group), got {len(task_ids)}")
        known = set(self.task_ids)
        unknown = [t for t in task_ids if t not in known]
        if unknown:
            raise ValueError(
                f"unknown task ids {unknown[:3]} (this split has {len(known)} tasks, "
                f"e.g. {self.task_ids[:3]})"
            )
        jobs = {
            i: (task_ids[g], None if seed is None else seed + i)
            for i, g in enumerate(self.group_ids.tolist())
        }
        results = self._run("reset", jobs)
        obs_list, info_list = [], []
        for i in range(self.num_envs):
            obs, info = results[i]
            info = dict(info)
            info["group_id"] = int(self.group_ids[i])
            obs_list.append(obs)
            info_list.append(info)
        self._obs = list(obs_list)
        self.current_task_ids = task_ids
        self.returns[:] = 0.0
        self.active[:] = True
        self.episode_lengths[:] = 0
        return obs_list, info_list

    def step(
        self, actions: Sequence[str | None]
    ) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Apply one action per member; finished members must get ``None``.

        Returns ``(obs_list, rewards float32 [P*G, K], terminated bool [P*G],
        truncated bool [P*G], info_list)``. Rows of members that had already
        finished hold their last observation, a zero reward, ``False`` flags and
        an empty info. ``active``, ``returns`` and ``episode_lengths`` are updated.
        """
        self._check_open()
        if len(actions) != self.num_envs:
            raise ValueError(f"step needs {self.num_envs} actions (P*G), got {len(actions)}")
        jobs: dict[int, tuple[Any]] = {}
        for i, action in enumerate(actions):
            if self.active[i]:
                if action is None:
                    raise ValueError(f"member {i} is still running and needs an action, got None")
                jobs[i] = (action,)
            elif action is not None:
                raise ValueError(f"member {i} has finished its episode; pass None for it")
        if not jobs:
            raise RuntimeError("every member has finished; call reset()")
        results = self._run("step", jobs)
        k = len(self.reward_names)
        rewards = np.zeros((self.num_envs, k), dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, (obs, reward, term, trunc, info) in results.items():
            self._obs[i] = obs
            rewards[i] = reward
            terminated[i] = term
            truncated[i] = trunc
            info = dict(info)
            info["group_id"] = int(self.group_ids[i])
            infos[i] = info
        stepped = np.zeros(self.num_envs, dtype=bool)
        stepped[list(results)] = True
        self.returns += rewards
        self.episode_lengths += stepped
        self.active &= ~(terminated | truncated)
        return list(self._obs), rewards, terminated, truncated, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call a method of one member's unwrapped env, e.g. ``call("reference_action", tid)``."""
        self._check_open()
        if self.executor == "process":
            self._conns[0].send(("call", (name, args, kwargs)))
            return self._receive(0, self._conns[0])
        return _call_first(self._envs, (name, args, kwargs))

    @property
    def num_rewards(self) -> int:
        return len(self.reward_names)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("GroupedVectorEnv is closed")

    def close(self) -> None:
        """Stop the workers and close every env (idempotent; every env is closed even if one fails)."""
        if getattr(self, "_closed", True):  # closed, or __init__ failed before there was anything to close
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        failure: BaseException | None = None
        for env in self._envs.values():
            try:
                env.close()
            except Exception as exc:  # close the others first, then report it
                failure = failure or exc
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (OSError, BrokenPipeError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=1)
        for conn in self._conns:
            conn.close()
        if failure is not None:
            raise failure

    def __enter__(self) -> GroupedVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # At interpreter shutdown closing could start a thread (an OpenEnv client's event loop),
        # which never returns then: skip it, the OS closes sockets and daemon workers end.
        if sys.is_finalizing():
            return
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"GroupedVectorEnv(groups={self.num_groups}, group_size={self.group_size}, "
            f"workers={self.workers}, executor={self.executor!r}, rewards={list(self.reward_names)})"
        )
