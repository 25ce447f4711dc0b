"""``check_env``: does an env keep the multi-reward contract? (Gymnasium's checker plus ours.)

Gymnasium's ``gymnasium.utils.env_checker.check_env`` checks the spaces and the reset/step
API of any env; a multi-reward env promises more, and a trainer relies on every part of it:

* named rewards: unique names, one bound per name with ``low <= high``, finite weights;
* rewards inside their bounds, on the reference's actions and on sampled ones;
* the reference (``reference_action``), when the env declares one, ends its episode;
* ``metrics`` turns episode records into ``{name: float}`` and gives ``{}`` for none;
* the same seed and action give the same observation and rewards (two instances);
* observations are fresh objects (a caller may edit them without changing the env);
* unusable actions (empty, ``None``, too long, bytes) score the lowest reward with
  ``info["error"]`` and end the episode, instead of raising;
* ``reset(options={"task_id": ...})`` starts that task and an unknown id raises ``KeyError``;
* ``max_turns``, when the env has a turn limit, is a positive int attribute.

Each check gives one :class:`CheckResult`; ``check_env`` raises :class:`EnvCheckError`
listing every failed one (one line each), or returns the results with ``raise_on_error=False``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CheckResult", "EnvCheckError", "check_env", "CHECKS"]

#: the one warning Gymnasium's checker gives every vector-reward env (MO-Gymnasium's too)
VECTOR_REWARD_WARNING = "The reward returned by `step()` must be a float"

#: actions no policy should be able to crash an env with
BAD_ACTIONS: dict[str, Any] = {
    "empty": "",
    "whitespace": "  \n\t ",
    "too_long": "x" * 1_000_001,
    "nul_bytes": "ok\x00\x00",
    "lone_surrogate": "text \udc80 more",
    "bytes": b"\x89PNG\r\n",
    "none": None,
    "int": 7,
}


@dataclass(frozen=True)
class CheckResult:
    """One check: its name, whether it passed, and what was wrong (``""`` when it passed)."""

    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.name}" + (f": {self.detail}" if self.detail else "")


class EnvCheckError(AssertionError):
    """Raised by :func:`check_env` when a check fails; ``results`` holds every check."""

    def __init__(self, env_name: str, results: list[CheckResult]):
        self.results = results
        failed = [r.line() for r in results if not r.passed]
        super().__init__(f"{env_name} fails {len(failed)} of {len(results)} checks:\n" + "\n".join(failed))


class _Failed(Exception):
    """A check's own failure (as opposed to the env raising)."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _Failed(message)


def _u(env: gym.Env) -> Any:
    return env.unwrapped


def _actions(env: gym.Env, task_id: str) -> list:
    """The reference's messages for ``task_id``, else one sampled action."""
    try:
        ref = _u(env).reference_action(task_id)
    except NotImplementedError:
        return [env.action_space.sample()]
    _require(
        isinstance(ref, list) and ref and all(isinstance(m, str) for m in ref),
        f"reference_action({task_id!r}) must return a non-empty list of str, got {type(ref).__name__}",
    )
    return ref


def _check_step(env: gym.Env, out: tuple, what: str) -> None:
    obs, reward, terminated, truncated, info = out
    u = _u(env)
    k = len(u.reward_names)
    _require(env.observation_space.contains(obs), f"{what}: observation outside observation_space")
    _require(
        isinstance(reward, np.ndarray) and reward.dtype == np.float32 and reward.shape == (k,),
        f"{what}: reward must be a float32 array of shape ({k},), got {type(reward).__name__} "
        f"{getattr(reward, 'dtype', '')} {getattr(reward, 'shape', '')}",
    )
    _require(bool(np.all(np.isfinite(reward))), f"{what}: reward {reward.tolist()} is not finite")
    low, high = u.reward_space.low, u.reward_space.high
    outside = [
        f"{n}={float(v):g} not in [{float(lo):g}, {float(hi):g}]"
        for n, v, lo, hi in zip(u.reward_names, reward, low, high)
        if not lo <= v <= hi
    ]
    _require(not outside, f"{what}: " + "; ".join(outside))
    _require(isinstance(terminated, bool) and isinstance(truncated, bool), f"{what}: terminated/truncated must be bool")
    _require(info.get("task_id") in u.task_ids, f"{what}: info['task_id'] {info.get('task_id')!r} is not a task id")
    comps = info.get("reward_components")
    _require(
        isinstance(comps, dict) and list(comps) == list(u.reward_names),
        f"{what}: info['reward_components'] must have the keys {list(u.reward_names)}",
    )


# ------------------------------------------------------------------ the checks
def check_reward_declaration(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    u = _u(env)
    names = tuple(getattr(u, "reward_names", ()))
    k = len(names)
    _require(k >= 1, "reward_names is empty")
    _require(len(set(names)) == k, f"reward names repeat: {list(names)}")
    space = getattr(u, "reward_space", None)
    _require(
        isinstance(space, gym.spaces.Box) and space.shape == (k,) and space.dtype == np.float32,
        f"reward_space must be Box(shape=({k},), float32)",
    )
    bad = [n for n, lo, hi in zip(names, space.low, space.high) if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi)]
    _require(not bad, f"bounds must be finite with low <= high for {bad}")
    w = np.asarray(getattr(u, "reward_weights", None))
    _require(w.shape == (k,) and bool(np.all(np.isfinite(w))), f"reward_weights must be {k} finite numbers, got {w}")
    ids = list(u.task_ids)
    _require(len(ids) >= 1 and len(set(ids)) == len(ids), "task_ids must be non-empty and unique")


def check_gymnasium(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    from gymnasium.utils.env_checker import check_env as gym_check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(_u(env), skip_render_check=True)
    other = [str(w.message) for w in caught if VECTOR_REWARD_WARNING not in str(w.message)]
    _require(not other, "Gymnasium's check_env warns: " + " | ".join(other))


def check_reset(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    obs, info = env.reset(seed=0)
    _require(env.observation_space.contains(obs), "reset(seed=0): observation outside observation_space")
    _require(info.get("task_id") in _u(env).task_ids, "reset: info['task_id'] is not a task id")
    wanted = _u(env).task_ids[-1]
    _, info = env.reset(options={"task_id": wanted})
    _require(info.get("task_id") == wanted, f"reset(options={{'task_id': {wanted!r}}}) started {info.get('task_id')!r}")
    try:
        env.reset(options={"task_id": "no-such-task-id-for-check-env"})
    except KeyError:
        return
    raise _Failed("reset with an unknown task id must raise KeyError")


def check_reference_episode(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    u = _u(env)
    task_id = u.task_ids[0]
    env.reset(seed=1, options={"task_id": task_id})
    total = np.zeros(len(u.reward_names), np.float64)
    actions = _actions(env, task_id)
    for i, action in enumerate(actions):
        out = env.step(action)
        _check_step(env, out, f"reference turn {i + 1} on {task_id!r}")
        total += out[1]
        if out[2] or out[3]:
            break
    else:
        raise _Failed(f"the {len(actions)} reference message(s) did not end the episode on {task_id!r}")
    record = {
        "task_id": task_id,
        "reward_components": dict(zip(u.reward_names, map(float, total))),
        "info": out[4],
        "text": actions[-1],
    }
    metrics = u.metrics([record])
    _require(
        isinstance(metrics, dict) and metrics and all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items()),
        f"metrics([record]) must be a non-empty dict[str, float], got {metrics!r:.200}",
    )
    _require(u.metrics([]) == {}, "metrics([]) must be {}")


def check_sampled_actions(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    env.action_space.seed(3)
    for i in range(3):
        env.reset(seed=3 + i)
        _check_step(env, env.step(env.action_space.sample()), f"sampled action {i + 1}")


def check_determinism(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    other = make()
    try:
        a_obs, a_info = env.reset(seed=42)
        b_obs, b_info = other.reset(seed=42)
        _require(a_obs == b_obs and a_info == b_info, "two instances reset with seed=42 differ")
        action = _actions(env, a_info["task_id"])[0]
        a, b = env.step(action), other.step(action)
        _require(a[0] == b[0], "the same action after the same seed gives different observations")
        _require(
            np.array_equal(a[1], b[1]),
            f"the same action after the same seed gives rewards {a[1].tolist()} and {b[1].tolist()}",
        )
        _require(a[2:4] == b[2:4], "the same action after the same seed ends the episode differently")
    finally:
        other.close()


def check_fresh_observations(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    task_id = _u(env).task_ids[0]
    obs, _ = env.reset(options={"task_id": task_id})
    again, _ = env.reset(options={"task_id": task_id})
    _require(obs == again, "two resets on one task give different observations")
    again["messages"].append({"role": "user", "content": "edited-by-the-caller"})
    out = env.step(_actions(env, task_id)[0])
    _require("edited-by-the-caller" not in str(out[0]), "editing a returned observation changed the env's state")


def check_bad_actions(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    u = _u(env)
    for kind, action in BAD_ACTIONS.items():
        env.reset(seed=0)
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except Exception as exc:
            raise _Failed(f"a {kind} action raised {type(exc).__name__}: {exc}") from exc
        _require(
            np.array_equal(reward, u.reward_space.low),
            f"a {kind} action scored {np.asarray(reward).tolist()}, not the lowest reward {u.reward_space.low.tolist()}",
        )
        _require(isinstance(info.get("error"), str) and info["error"], f"a {kind} action has no info['error']")
        _require(terminated or truncated, f"a {kind} action did not end the episode")


def check_max_turns(env: gym.Env, make: Callable[[], gym.Env]) -> None:
    turns = getattr(_u(env), "max_turns", None)
    if turns is None:
        return
    _require(
        isinstance(turns, int) and not isinstance(turns, bool) and turns >= 1,
        f"max_turns must be a positive int (or absent), got {turns!r}",
    )


#: every check, in the order it runs: (name, function(env, make_another))
CHECKS: list[tuple[str, Callable[[gym.Env, Callable[[], gym.Env]], None]]] = [
    ("reward declaration", check_reward_declaration),
    ("gymnasium check_env", check_gymnasium),
    ("reset", check_reset),
    ("reference episode and metrics", check_reference_episode),
    ("sampled actions stay in bounds", check_sampled_actions),
    ("same seed and action, same rewards", check_determinism),
    ("fresh observations", check_fresh_observations),
    ("unusable actions score the lowest reward", check_bad_actions),
    ("max_turns", check_max_turns),
]


def check_env(
    env_or_id: gym.Env | str | Path | list[str],
    *,
    raise_on_error: bool = True,
    **make_kwargs: Any,
) -> list[CheckResult]:
    """Check ``env_or_id``: an env, or anything :func:`corrgrpo_envs.registry.resolve` reads (a
    registered id, a YAML file, ``package.module:Class``, OpenEnv servers).

    ``make_kwargs`` go to the env's ``make`` (for an id), e.g. a small data set.
    For an env instance, the determinism check builds a second one from the env's spec, or
    else by calling its class with ``make_kwargs``; when neither works that check is skipped
    with a note (it still counts as passed).

    Raises:
        EnvCheckError: listing every failed check (unless ``raise_on_error=False``).
    """
    from corrgrpo_envs.registry import resolve

    built_here = not isinstance(env_or_id, gym.Env)
    if built_here:
        resolved = resolve(env_or_id)
        env = resolved.make(**make_kwargs)

        def make() -> gym.Env:
            return resolved.make(**make_kwargs)

        name = str(env_or_id)
    else:
        env = env_or_id
        spec = getattr(env, "spec", None)
        name = spec.id if spec is not None else type(_u(env)).__name__

        def make() -> gym.Env:
            if spec is not None:
                return gym.make(spec, **make_kwargs)
            try:  # an unregistered instance: its class with no arguments, if that builds
                return type(_u(env))(**make_kwargs)
            except TypeError as exc:
                raise _Skip(f"no spec, and {type(_u(env)).__name__}() cannot be built: {exc}") from exc

    results: list[CheckResult] = []
    try:
        for check_name, check in CHECKS:
            try:
                check(env, make)
                results.append(CheckResult(check_name, True))
            except _Skip as exc:
                results.append(CheckResult(check_name, True, f"skipped: {exc}"))
            except _Failed as exc:
                results.append(CheckResult(check_name, False, str(exc)))
            except Exception as exc:  # the env itself raised: that is a failed check, not a crash
                results.append(CheckResult(check_name, False, f"raised {type(exc).__name__}: {exc}"))
    finally:
        if built_here:
            env.close()
    if raise_on_error and not all(r.passed for r in results):
        raise EnvCheckError(name, results)
    return results


class _Skip(Exception):
    """A check that cannot run on this env (e.g. no way to build a second instance)."""
