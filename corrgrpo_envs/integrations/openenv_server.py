"""Serving a corrgrpo env as an OpenEnv ``Environment`` through the ``openenv`` package's server.

``corrgrpo serve ENV`` builds a FastAPI app with the routes of OpenEnv's
:class:`~openenv.core.env_server.http_server.HTTPEnvServer` (what ``create_app`` serves:
``/ws``, ``/reset``, ``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``, ``/mcp``
and the task listing ``/{env_name}/splits|tasks|num_tasks|task|task_range``) and runs it
with uvicorn. Nothing here speaks HTTP or WebSocket itself.

The reward-vector convention (the one NeMo Gym and SkyRL use):

* ``Observation.reward`` is the weighted total with the env's weights;
* ``Observation.metadata["reward_components"]`` is ``{name: value}`` with the env's
  reward names as keys, on every step;
* the names, bounds and weights are in ``GET /schema`` before any step, under
  ``observation["reward_components"]`` (a list of ``{name, low, high, weight}``), and
  in every reset observation's ``metadata["reward_spec"]``;
* the env's ``rubric`` has one child rubric per component, so
  ``env.rubric.named_rubrics()`` lists them with their ``last_score``.

One WebSocket session is one corrgrpo env instance, built on the session's first reset
(sessions are isolated; the server accepts ``max_sessions`` at once). The verdicts are computed by the corrgrpo
env inside the server; the rubrics only read them back, so nothing a client sends
can set a reward. What the server allows (a token, the body cap, idle and old sessions,
sessions and new connections per client, the reference answers) is
:mod:`corrgrpo_envs.integrations.openenv_limits`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from openenv.core.rubrics import Rubric
from pydantic import ConfigDict, Field

from corrgrpo_envs.core import MAX_ACTION_CHARS
from corrgrpo_envs.integrations.openenv_limits import (
    BoundaryMiddleware,
    LimitedEnvServer,
    ServerLimits,
)
from corrgrpo_envs.registry import description, make

__all__ = [
    "TextAction",
    "ConversationObservation",
    "EpisodeState",
    "RewardComponentRubric",
    "RewardVectorRubric",
    "MultiRewardOpenEnv",
    "reward_spec",
    "EnvBuildError",
    "ServerLimits",
    "build_app",
    "serve",
    "max_message_bytes",
]

#: The variable that carries the env spec to uvicorn's worker processes (``--workers N``).
SPEC_VARIABLE = "CORRGRPO_OPENENV_SPEC"
#: The answer to ``/{name}/task`` when reference answers are not served.
REFERENCES_OFF = (
    "reference answers are not served: start the server with "
    "'corrgrpo serve ENV --serve-references' to let clients read them"
)


class TextAction(Action):
    """One assistant message (tool calls written as the domain's prompt asks, as in-process)."""

    message: str = Field(..., description="the assistant's message")


class ConversationObservation(Observation):
    """A corrgrpo observation: the conversation so far, the tools, the task and the step info."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="chat messages")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="tool schemas")
    task_id: str = Field(default="", description="the episode's task id")
    truncated: bool = Field(default=False, description="the episode was cut short")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's step info")


class EpisodeState(State):
    """The session's episode: its id, step count, task and whether it has ended."""

    task_id: str | None = None
    done: bool = True


def reward_spec(env: Any) -> list[dict[str, Any]]:
    """``[{name, low, high, weight}, ...]`` of a multi-reward env, in reward-vector order."""
    return env.unwrapped.reward_table()


def observation_class(spec: Sequence[Mapping[str, Any]]) -> type[ConversationObservation]:
    """A :class:`ConversationObservation` whose JSON schema lists the reward components."""
    config = ConfigDict(
        **ConversationObservation.model_config,
        json_schema_extra={"reward_components": [dict(row) for row in spec]},
    )
    return type(
        "MultiRewardObservation",
        (ConversationObservation,),
        {"model_config": config, "__module__": __name__},
    )


class RewardComponentRubric(Rubric):
    """One reward component: reads the value the env computed from the observation's metadata."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, action: Any, observation: Observation) -> float:
        return float(observation.metadata["reward_components"][self.name])


class RewardVectorRubric(Rubric):
    """The weighted total of the components; each component is a named child rubric."""

    def __init__(self, names: Sequence[str], weights: Sequence[float]):
        super().__init__()
        self._weights = [float(w) for w in weights]
        self._components = []
        for name in names:
            child = RewardComponentRubric(name)
            setattr(self, name, child)  # registered as a child under the component's name
            self._components.append(child)

    def forward(self, action: Any, observation: Observation) -> float:
        return float(sum(w * c(action, observation) for w, c in zip(self._weights, self._components)))


def _json_safe(value: Any) -> Any:
    """A JSON-serialisable copy of an info value (numpy scalars and arrays become numbers and lists)."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


class MultiRewardOpenEnv(Environment):
    """A corrgrpo env behind OpenEnv's ``Environment`` interface (one instance per session).

    Args:
        env: a registered id, an entry point or a YAML config (as :func:`corrgrpo_envs.make`).
        env_kwargs: keyword arguments for the env (``split``, ``dataset``, ...).
        observation_cls: the observation model (default: :func:`observation_class` of the
            env's reward table).
        env_name: the public name of the env in the task listing routes.
        serve_references: whether ``get_task`` gives the env's reference messages
            (``corrgrpo serve --serve-references``); without it, it answers 403.

    ``reset`` takes ``seed``, ``episode_id``, and either ``task_id`` or OpenEnv's
    ``split`` + ``index``; anything else is an error that names the argument.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        env: str,
        env_kwargs: Mapping[str, Any] | None = None,
        observation_cls: type[ConversationObservation] | None = None,
        env_name: str | None = None,
        serve_references: bool = False,
    ):
        self._env_id = str(env)
        self._env = make(env, **dict(env_kwargs or {}))
        u = self._env.unwrapped
        super().__init__(rubric=RewardVectorRubric(u.reward_names, u.reward_weights))
        self._names = tuple(u.reward_names)
        self._spec = u.reward_table()
        self._obs_cls = observation_cls or observation_class(self._spec)
        self._serve_references = bool(serve_references)
        self._known = set(u.task_ids)
        self._env_name = env_name or self._env_id
        self._state = EpisodeState()
        self._step_count = 0

    # --------------------------------------------------------------- episodes
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        split: str | None = None,
        index: int | None = None,
        **kwargs: Any,
    ) -> ConversationObservation:
        if kwargs:
            raise ValueError(
                f"unknown reset arguments {sorted(kwargs)}; {self._env_id} takes seed, "
                "episode_id, task_id, or split and index"
            )
        if task_id is not None:
            task_id = str(task_id)
            if task_id not in self._known:
                some = sorted(self._known)[:3]
                raise ValueError(
                    f"unknown task id {task_id!r} for {self._env_id} "
                    f"({len(self._known)} tasks served, e.g. {some})"
                )
        elif split is not None or index is not None:
            if split is None or index is None:
                raise ValueError("reset by position needs both split and index")
            task_id = self._task_at(str(split), int(index)).id
        obs, info = self._env.reset(seed=seed, options={"task_id": task_id})
        self._reset_rubric()
        self._state = EpisodeState(episode_id=episode_id, step_count=0, task_id=info["task_id"], done=False)
        return self._obs_cls(
            messages=obs["messages"],
            tools=obs.get("tools", []),
            task_id=info["task_id"],
            done=False,
            reward=None,
            metadata={"task_id": info["task_id"], "reward_spec": self._spec},
        )

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> ConversationObservation:
        if self._state.task_id is None:
            raise RuntimeError(f"{self._env_id}: reset before stepping")
        if self._state.done:
            raise RuntimeError(
                f"{self._env_id}: the episode on task {self._state.task_id!r} has ended; reset before stepping"
            )
        obs, reward, terminated, truncated, info = self._env.step(action.message)
        components = {n: float(v) for n, v in zip(self._names, reward)}
        step_info = {k: v for k, v in info.items() if k not in ("reward_components", "task_id")}
        done = bool(terminated or truncated)
        observation = self._obs_cls(
            messages=obs["messages"],
            tools=obs.get("tools", []),
            task_id=info["task_id"],
            truncated=bool(truncated),
            info=_json_safe(step_info),
            done=done,
            metadata={"reward_components": components, "task_id": info["task_id"]},
        )
        observation.reward = self._apply_rubric(action, observation)
        self._state.step_count += 1
        self._state.done = done
        return observation

    @property
    def state(self) -> EpisodeState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        rows = "\n".join(
            f"| `{r['name']}` | {r['low']:g} | {r['high']:g} | {r['weight']:g} |" for r in self._spec
        )
        readme = (
            f"# {self._env_id}\n\n{description(self._env_id)}\n\n"
            "`Observation.reward` is the weighted total; "
            "`metadata[\"reward_components\"]` holds each component.\n\n"
            "| reward | low | high | weight |\n|---|---|---|---|\n" + rows + "\n"
        )
        return EnvironmentMetadata(
            name=self._env_id,
            description=description(self._env_id) or f"corrgrpo env {self._env_id}",
            readme_content=readme,
            version="corrgrpo",
        )

    def close(self) -> None:
        self._env.close()

    # ------------------------------------------------------------ task listing
    def _split(self, split: str) -> Any:
        tasks = self._env.unwrapped.tasks
        if split not in self._split_names():
            raise HTTPException(status_code=400, detail=f"unknown split {split!r}; splits: {self._split_names()}")
        return tasks.split(split) if split != "all" else tasks

    def _split_names(self) -> list[str]:
        return ["all", "train", "eval"] if hasattr(self._env.unwrapped.tasks, "split") else ["all"]

    def _task_at(self, split: str, index: int) -> Any:
        tasks = self._split(split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return tasks[index]

    def list_splits(self) -> list[str]:
        return self._split_names()

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"id": t.id, "index": i} for i, t in enumerate(self._split(split))]

    def num_tasks(self, split: str) -> int:
        return len(self._split(split))

    @property
    def observation_cls(self) -> type[ConversationObservation]:
        """The observation model (its JSON schema lists the reward components)."""
        return self._obs_cls

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        """One task; ``reference`` holds the env's reference messages where it has them.

        Reference answers are what a policy is scored against, so they are served only
        when the server was started with ``--serve-references``; otherwise 403.
        """
        if not self._serve_references:
            raise HTTPException(status_code=403, detail=REFERENCES_OFF)
        task = self._task_at(split, index)
        row: dict[str, Any] = {"id": task.id, "index": index}
        try:
            row["reference"] = list(self._env.unwrapped.reference_action(task.id))
        except NotImplementedError:
            pass
        return row

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        tasks = self._split(split)
        return [{"id": tasks[i].id, "index": i} for i in range(len(tasks))[slice(start, stop)]]


def max_message_bytes(max_action_chars: int = MAX_ACTION_CHARS) -> int:
    """The largest WebSocket message the server reads: room for the longest action, JSON-escaped.

    A larger message closes the connection with code 1009 (message too big) instead
    of being read into memory.
    """
    return 6 * max_action_chars + 64 * 1024


def public_name(env: str) -> str:
    """The env's name in OpenEnv's task routes: the id without namespace and characters URLs dislike."""
    base = str(env).rsplit("/", 1)[-1]
    base = base.rsplit(":", 1)[-1]
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in base) or "env"


class EnvBuildError(ValueError):
    """The env to serve cannot be built (an unknown id, a bad argument): nothing was started."""


def _build_route_env(env: str, kwargs: Mapping[str, Any], name: str, limits: ServerLimits) -> MultiRewardOpenEnv:
    try:
        return MultiRewardOpenEnv(str(env), kwargs, None, name, limits.serve_references)
    except Exception as exc:  # whatever the env raises, the operator gets one line naming it
        first = (str(exc).strip().splitlines() or [""])[0]
        raise EnvBuildError(f"cannot build {env} with {dict(kwargs)}: {type(exc).__name__}: {first}") from exc


def build_app(
    env: str,
    env_kwargs: Mapping[str, Any] | None = None,
    max_sessions: int = 128,
    limits: ServerLimits | None = None,
) -> Any:
    """The ASGI app serving ``env``: OpenEnv's routes, bounded by ``limits``.

    The routes are OpenEnv's own (:class:`HTTPEnvServer`, here its subclass
    :class:`LimitedEnvServer`, also ``app.state.env_server``), wrapped in
    :class:`BoundaryMiddleware`. One env is built
    here: it gives ``/schema`` the reward names, bounds and weights, fails before the
    server starts when the env cannot be built (:class:`EnvBuildError`), and then answers
    the task listing and the other per-request routes. Each session builds its own, on its
    first reset.
    """
    kwargs = dict(env_kwargs or {})
    limits = limits or ServerLimits()
    name = public_name(str(env))
    route_env = _build_route_env(env, kwargs, name, limits)
    obs_cls = route_env.observation_cls
    # A partial of the class lets OpenEnv read SUPPORTS_CONCURRENT_SESSIONS without
    # building a throwaway env; each session calls it for its own env.
    session_env = functools.partial(MultiRewardOpenEnv, str(env), kwargs, obs_cls, name, limits.serve_references)
    app = FastAPI(
        title=f"OpenEnv server: {env}",
        version="1.0.0",
        description=description(str(env)) or f"corrgrpo env {env} over OpenEnv",
    )
    server = LimitedEnvServer(
        session_env,
        route_env,
        TextAction,
        obs_cls,
        env_name=name,
        state_cls=EpisodeState,
        max_sessions=int(max_sessions),
        limits=limits,
    )
    server.register_routes(app, mode=os.environ.get("OPENENV_MODE", "simulation"))
    app.state.env_server = server  # its builds and sessions, for whoever holds the app
    max_chars = int(kwargs.get("max_action_chars", MAX_ACTION_CHARS))
    app.add_middleware(
        BoundaryMiddleware,
        max_body_bytes=max_message_bytes(max_chars),
        limits=limits,
        connection_burst=limits.quota(max_sessions),
    )
    return app


def _spec_of(env: str, kwargs: Mapping[str, Any], max_sessions: int, limits: ServerLimits) -> str:
    return json.dumps({"env": str(env), "env_kwargs": dict(kwargs), "max_sessions": int(max_sessions),
                       "limits": dataclasses.asdict(limits)})


def app_from_environment() -> Any:
    """The app for uvicorn's worker processes: the spec comes in :data:`SPEC_VARIABLE`."""
    spec = json.loads(os.environ[SPEC_VARIABLE])
    return build_app(spec["env"], spec["env_kwargs"], spec["max_sessions"], ServerLimits(**spec.get("limits", {})))


def serve(
    env: str,
    env_kwargs: Mapping[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    max_sessions: int = 128,
    log_level: str = "warning",
    limits: ServerLimits | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the OpenEnv server for ``env`` with uvicorn until interrupted.

    ``workers`` > 1 starts that many uvicorn worker processes on one port (each
    WebSocket session lives in one of them); ``max_sessions`` is per process. The env
    is built before uvicorn starts, so an env that cannot be built raises
    :class:`EnvBuildError` and nothing listens; ``on_ready`` is called once it is built.
    """
    import uvicorn

    kwargs = dict(env_kwargs or {})
    limits = limits or ServerLimits()
    max_chars = int(kwargs.get("max_action_chars", MAX_ACTION_CHARS))
    options: dict[str, Any] = {
        "host": host,
        "port": int(port),
        "log_level": log_level,
        "ws_max_size": max_message_bytes(max_chars),
        # no per-message compression: on the local or cluster links servers run on, deflating
        # each reset and step cost more CPU (client and server) than the bytes it saved
        "ws_per_message_deflate": False,
    }
    if int(workers) > 1:
        _build_route_env(env, kwargs, public_name(str(env)), limits).close()  # fail here, not in N workers
        os.environ[SPEC_VARIABLE] = _spec_of(env, kwargs, max_sessions, limits)
        if on_ready is not None:
            on_ready()
        uvicorn.run(f"{__name__}:app_from_environment", factory=True, workers=int(workers), **options)
    else:
        app = build_app(env, kwargs, max_sessions, limits)
        if on_ready is not None:
            on_ready()
        uvicorn.run(app, **options)
