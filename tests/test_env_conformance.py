"""Conformance of every registered env (present and future) with the multi-reward API.

Ids whose entry-point module or optional dependency does not import here are
skipped with the reason. Expensive domains get small keyword arguments from
``ID_KWARGS`` (default: none). Every env also passes Gymnasium's own
``check_env``, apart from its warning that the reward is not a scalar (the
vector-reward convention MO-Gymnasium's envs share).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import corrgrpo_envs
from corrgrpo_envs import StepOutcome, Task, TaskSource
from corrgrpo_envs.core import MultiRewardEnv


class TwoTurnEnv(MultiRewardEnv):
    """A user's env as the README describes one: two turns, a reference, the default metrics."""

    def __init__(self, split: str = "all", **kwargs):
        tasks = TaskSource([Task(f"pair-{i}", {"word": w}) for i, w in enumerate(["ab", "cd", "ef"])])
        super().__init__(tasks.split(split), ("echo", "short"), (0.0, 0.0), (2.0, 1.0), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"Say {task['word']} twice."}], "tools": []}

    def _act(self, action):
        turn = sum(m["role"] == "assistant" for m in self._obs["messages"]) + 1
        messages = [*self._obs["messages"], {"role": "assistant", "content": action}]
        if turn == 1:
            messages.append({"role": "user", "content": "Again."})
        return StepOutcome(
            rewards={"echo": float(self.task["word"] in action), "short": float(turn == 2 and len(action) < 9)},
            terminated=turn == 2,
            observation={"messages": messages, "tools": []},
        )

    def reference_action(self, task_id):
        return [self.tasks.get(task_id)["word"]] * 2


#: a user-registered env: the suite runs on it as on the built-in ones
corrgrpo_envs.register("conformance/TwoTurn-v0", TwoTurnEnv, description="test: a user's two-turn env")

#: keyword arguments that keep an id cheap to build and step in tests
ID_KWARGS: dict[str, dict] = {
    "corrgrpo/ScaleDominance-v0": {"num_tasks": 16},
    # efficiency times the program: not bit-reproducible, and it caches reference timings on disk
    "corrgrpo/Code-v0": {"efficiency": "off"},
    "corrgrpo/AgentDojo-v0": {"suites": ["banking"]},
}

#: the conformance suite; bad actions must never raise
BAD_ACTIONS = {
    "empty": "",
    "whitespace": "   \n\t ",
    "one_megabyte": "x" * 1_000_000,
    "binary_junk": "".join(chr(i % 32) for i in range(2048)),
    "nul_bytes": "ok\x00\x00\x00",
    "lone_surrogate": "text \udc80 more",
    "bytes": b"\x89PNG\r\n\x1a\n",
    "int": 12345,
    "none": None,
    "list": ["not", "a", "string"],
}

IDS = corrgrpo_envs.registered_ids()
_CACHE: dict[str, object] = {}


def make_env(env_id: str):
    """Build ``env_id`` with its test kwargs, or skip the test with the reason it cannot be built."""
    try:
        return corrgrpo_envs.make(env_id, **ID_KWARGS.get(env_id, {}))
    except ImportError as exc:
        pytest.skip(f"{env_id} needs a module that does not import here: {exc}")


@pytest.fixture(params=IDS)
def env(request):
    env = make_env(request.param)
    yield env
    env.close()


def first_actions(env, task_id: str) -> list[str]:
    """Actions to play on ``task_id``: the reference's messages, else a sampled string."""
    try:
        ref = env.unwrapped.reference_action(task_id)
    except NotImplementedError:
        return [env.action_space.sample()]
    assert isinstance(ref, list) and ref and all(isinstance(m, str) for m in ref), ref
    return ref


#: the one warning check_env gives every vector-reward env (MO-Gymnasium's envs get it too)
VECTOR_REWARD_WARNING = "The reward returned by `step()` must be a float"


def gymnasium_check(env) -> list[str]:
    """Run Gymnasium's ``check_env`` on ``env``; returns its warnings but the vector-reward one."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    return [str(w.message) for w in caught if VECTOR_REWARD_WARNING not in str(w.message)]


def check_step(env, step_out) -> None:
    obs, reward, terminated, truncated, info = step_out
    u = env.unwrapped
    assert env.observation_space.contains(obs), obs
    assert isinstance(reward, np.ndarray) and reward.dtype == np.float32
    assert reward.shape == (len(u.reward_names),)
    assert u.reward_space.contains(reward), (reward, u.reward_space)
    assert isinstance(terminated, bool) and isinstance(truncated, bool)
    assert info["task_id"] in u.task_ids
    assert list(info["reward_components"]) == list(u.reward_names)
    np.testing.assert_array_equal(
        np.array(list(info["reward_components"].values()), np.float32), reward
    )


def test_api_surface(env):
    u = env.unwrapped
    assert isinstance(u, MultiRewardEnv)
    k = len(u.reward_names)
    assert k >= 1 and len(set(u.reward_names)) == k
    assert u.reward_space.shape == (k,) and u.reward_space.dtype == np.float32
    assert np.all(u.reward_space.low <= u.reward_space.high)
    assert u.reward_weights.shape == (k,) and u.reward_weights.dtype == np.float32
    assert len(u.task_ids) >= 1 and len(set(u.task_ids)) == len(u.task_ids)
    assert callable(u.reference_action) and callable(u.metrics)


def test_gymnasium_check_env(env):
    assert gymnasium_check(env) == []


def test_observations_are_fresh_objects(env):
    """A caller may change what reset/step return without changing the env's next observation."""
    task_id = env.unwrapped.task_ids[0]
    obs, _ = env.reset(options={"task_id": task_id})
    again, _ = env.reset(options={"task_id": task_id})
    assert obs == again
    obs["messages"].append({"role": "user", "content": "injected"})
    obs["messages"][0]["content"] = "changed"
    out = env.step(first_actions(env, task_id)[0])
    assert "injected" not in str(out[0]) and out[0]["messages"][0] == again["messages"][0]


def test_reset_contract(env):
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs), obs
    assert info["task_id"] in env.unwrapped.task_ids
    wanted = env.unwrapped.task_ids[-1]
    obs, info = env.reset(options={"task_id": wanted})
    assert info["task_id"] == wanted and env.observation_space.contains(obs)
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "no-such-task-id"})


def test_reference_episode_in_contract_and_metrics(env):
    task_id = env.unwrapped.task_ids[0]
    env.reset(seed=1, options={"task_id": task_id})
    records = []
    total = np.zeros(len(env.unwrapped.reward_names), np.float32)
    for action in first_actions(env, task_id):
        out = env.step(action)
        check_step(env, out)
        total += out[1]
        if out[2] or out[3]:
            components = dict(zip(env.unwrapped.reward_names, map(float, total)))
            records.append({"task_id": task_id, "reward_components": components, "info": out[4], "text": action})
            break
    assert records, "the reference did not end the episode"
    metrics = env.unwrapped.metrics(records)
    assert isinstance(metrics, dict) and metrics
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items())
    assert env.unwrapped.metrics([]) == {}


def test_sampled_actions_stay_in_reward_space(env):
    env.action_space.seed(3)
    for _ in range(5):
        env.reset(seed=3)
        check_step(env, env.step(env.action_space.sample()))


def test_same_seed_same_episode(env):
    env_id = env.spec.id
    other = make_env(env_id)
    try:
        a_obs, a_info = env.reset(seed=42)
        b_obs, b_info = other.reset(seed=42)
        assert a_obs == b_obs and a_info == b_info
        action = first_actions(env, a_info["task_id"])[0]
        a = env.step(action)
        b = other.step(action)
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2:4] == b[2:4]
        # a different seed sequence on one instance replays the same way
        seq1 = [env.reset(seed=s)[1]["task_id"] for s in range(6)]
        seq2 = [env.reset(seed=s)[1]["task_id"] for s in range(6)]
        assert seq1 == seq2
    finally:
        other.close()


@pytest.mark.parametrize("kind", list(BAD_ACTIONS))
def test_bad_action_gets_lowest_reward_and_error(env, kind):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(BAD_ACTIONS[kind])
    assert env.observation_space.contains(obs)
    np.testing.assert_array_equal(reward, env.unwrapped.reward_space.low)
    assert reward.dtype == np.float32
    assert isinstance(info.get("error"), str) and info["error"]
    assert info["task_id"] in env.unwrapped.task_ids
    assert isinstance(terminated, bool) and isinstance(truncated, bool)


def test_step_before_reset_and_after_end_raise(env):
    fresh = make_env(env.spec.id)
    try:
        with pytest.raises(Exception):  # noqa: B017 - Gymnasium's OrderEnforcing or our RuntimeError
            fresh.step("hello")
    finally:
        fresh.close()
    env.reset(seed=0)
    env.step("")  # invalid actions end the episode
    with pytest.raises(RuntimeError):
        env.step("hello")


def test_splits_partition_the_tasks(env):
    env_id = env.spec.id
    kwargs = dict(ID_KWARGS.get(env_id, {}))
    ids = {}
    for split in ("all", "train", "eval"):
        try:
            e = corrgrpo_envs.make(env_id, **{**kwargs, "split": split})
        except ValueError as exc:  # a split may be empty on a tiny data set
            ids[split] = set()
            assert "no tasks" in str(exc)
            continue
        ids[split] = set(e.unwrapped.task_ids)
        e.close()
    assert ids["train"] | ids["eval"] == ids["all"]
    assert not ids["train"] & ids["eval"]
