"""What an OpenEnv server publishes, read over its HTTP routes: its description (``GET /schema``,
``/list_environments``, ``/{env_name}/tasks``), the components a first episode shows when none
are published, and a task's reference answer (``/{env_name}/task``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import quote

import httpx

from corrgrpo_envs.integrations.deadline_loop import CLOSE_S, GRACE_S
from corrgrpo_envs.integrations.openenv_pool import _Connections, _ServerPool
from corrgrpo_envs.integrations.openenv_remote import (
    RemoteEnvError,
    RemoteReferenceError,
    _BadAnswer,
    _oneline,
    _reason,
    _refused_status,
    _RefusedError,
    log,
)
from corrgrpo_envs.integrations.openenv_schema import (
    _FIX,
    _checked,
    _components_in,
    _metadata,
    _spec,
    _task_ids,
)
from corrgrpo_envs.tasks import Task

#: The text a first episode is stepped with when the components must be learned.
PROBE_TEXT = "Hello."


class _Discovery:
    """Reads what the servers of ``urls`` publish, over ``conns`` (its deadlines and cap); what
    every env of the list shares (descriptions, learned components, down marks) is kept in ``pool``.
    """

    def __init__(self, urls: Sequence[str], pool: _ServerPool, conns: _Connections, down_s: float):
        self.urls = list(urls)
        self.pool = pool
        self.conns = conns
        self.down_s = down_s

    # ------------------------------------------------------------- describing
    def describe(self, split: str) -> dict[str, dict[str, Any]]:
        """Every answering server's description, in ``urls`` order (read at once, one deadline)."""
        pool, connect_s = self.pool, self.conns.connect_timeout_s
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
                answers = self.conns.loop.run(ask_all, connect_s + GRACE_S)
            except TimeoutError:  # each server has its own deadline inside: this is a backstop
                raise RemoteEnvError(
                    f"OpenEnv server(s) {', '.join(todo)}: no description within connect_timeout_s = "
                    f"{connect_s:g} s"
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
        connect_s = self.conns.connect_timeout_s
        try:
            reading = self._read_description(url, split, route)
            return await asyncio.wait_for(reading, connect_s)
        except asyncio.TimeoutError:
            raise _BadAnswer(
                f"cannot read {route[0]} (no complete answer within "
                f"connect_timeout_s = {connect_s:g} s)"
            ) from None
        except (httpx.HTTPError, OSError, _BadAnswer) as exc:
            reason = _reason(exc, self.conns.max_observation_bytes)
            raise _BadAnswer(f"cannot read {route[0]} ({reason})") from None

    async def _read_description(self, url: str, split: str, route: list[str]) -> dict[str, Any]:
        fetch = self.conns.fetch
        status, schema = await fetch("GET", f"{url}/schema")
        if status in (401, 403):
            raise self.conns.refused(url, status)
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
        status, listed_names = await fetch("GET", f"{url}/list_environments")
        env_name = None
        if status == 200 and isinstance(listed_names, list) and listed_names \
                and isinstance(listed_names[0], str) and listed_names[0]:
            env_name = listed_names[0]
        tasks: list[str] | None = None
        if env_name is not None:
            route[0] = f"/{env_name}/tasks"
            path = f"{url}/{quote(env_name, safe='')}/tasks"
            status, listed = await fetch("POST", path, {"split": split})
            if status == 200:
                tasks = _task_ids(listed)
            elif status in (401, 403):
                raise self.conns.refused(url, status)
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

    # --------------------------------------------------------------- learning
    def learn(self, server: str, task: Task, action_format: str, action_field: str | None,
              max_turns: int | None) -> dict[str, Any]:
        """A server's components from a first episode (once per process and server list)."""
        pool = self.pool
        with pool.learn_lock:  # every env of the list waits for the one that asks
            if pool.learned is None:
                pool.learned = self._probe(server, task, action_format, action_field, max_turns)
                found = pool.learned
                log.warning(
                    "learned reward components %s from the %s of %s (%s); a later change is an error "
                    "(set env.reward_names to declare them)",
                    found["names"], found["when"], server, found["source"],
                )
            return pool.learned

    def _probe(self, server: str, task: Task, action_format: str, action_field: str | None,
               max_turns: int | None) -> dict[str, Any]:
        """Reset a throwaway session to ``task``, step it with :data:`PROBE_TEXT` until it scores."""
        client = self.conns.new_session(server)
        timeout_s = self.conns.timeout_s
        steps = max(1, max_turns or 1)

        async def episode() -> dict[str, Any]:
            try:
                result = _checked(await asyncio.wait_for(client.reset(**task["reset"]), timeout_s))
                meta = _metadata(result)
                declared = None
                if meta.get("reward_spec") is not None:
                    with suppress(ValueError):
                        declared = _spec(meta["reward_spec"], "reward_spec")
                found, when = _components_in(meta), "first reset"
                for i in range(steps):
                    if found is not None or result.done:
                        break
                    if action_format == "mcp" and i > 0:
                        break  # only list_tools is harmless to send without a model's tool call
                    if action_format == "mcp":
                        payload = {"type": "list_tools"}
                    else:
                        payload = {action_field: PROBE_TEXT}
                    result = _checked(await asyncio.wait_for(client.step(payload), timeout_s))
                    found, when = _components_in(_metadata(result)), "first step"
                    if found is None and result.reward is not None:
                        break
                source, names = ("reward", ["reward"]) if found is None else (found[0], list(found[1]))
                return {"names": [str(n) for n in names], "source": source, "when": when,
                        "server": server, "declared": declared}
            finally:
                with suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(client.close(), CLOSE_S)

        deadline = self.conns.connect_timeout_s + timeout_s * (steps + 1)
        try:
            return self.conns.loop.run(episode, deadline)
        except RemoteEnvError:
            raise
        except Exception as exc:
            status = _refused_status(exc)
            if status is not None:
                raise self.conns.refused(server, status) from None
            raise RemoteEnvError(
                f"OpenEnv server {server} names no reward components and a first episode to learn them "
                f"failed ({_reason(exc, self.conns.max_observation_bytes)}); {_FIX}"
            ) from None

    # -------------------------------------------------------------- references
    def reference(self, env_name: str | None, split: str, task_id: str, index: int) -> list[str]:
        """The reference messages of ``task_id`` (the ``index``-th of ``split``) from the first server."""
        url = self.urls[0]
        if env_name is None or task_id.startswith("seed-"):
            raise RemoteReferenceError(
                f"OpenEnv server {url} lists no tasks, so it has no reference answers"
            )
        fix = ("start it with --serve-references (corrgrpo serve ENV --serve-references), which sft from a "
               "remote env and eval --policy reference need")
        path = f"{url}/{quote(env_name, safe='')}/task"
        # the served env's own split order: the index of the task in the listed split
        body = {"split": split, "index": index}
        try:
            status, reply = self.conns.loop.run(lambda: self.conns.fetch("POST", path, body),
                                                self.conns.timeout_s)
        except (httpx.HTTPError, OSError, TimeoutError, _BadAnswer) as exc:
            raise RemoteEnvError(
                f"OpenEnv server {url}, task {task_id}: reading the reference failed "
                f"({_reason(exc, self.conns.max_observation_bytes)})"
            ) from None
        if status == 401:
            raise self.conns.refused(url, status)
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
