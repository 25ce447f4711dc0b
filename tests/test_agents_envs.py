"""The tiny model and the scripted policies play every registered env through GroupedVectorEnv."""

from __future__ import annotations

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo.agents import HFPolicy, RandomPolicy, ReferencePolicy, SamplingParams, load_model

try:
    from corrgrpo_envs.vector import GroupedVectorEnv
except ImportError:  # pragma: no cover - the vector env is part of the env package
    GroupedVectorEnv = None

# Prompts of some domains are thousands of tokens: play one short task with a small group.
SHORT_TASKS = {"corrgrpo/AgentDojo-v0": "slack/user_task_0"}


def make_vector(env_id: str, num_groups: int, group_size: int):
    if GroupedVectorEnv is None:
        pytest.skip("corrgrpo_envs.vector is not available")
    try:
        return GroupedVectorEnv(env_id, num_groups=num_groups, group_size=group_size)
    except ImportError as exc:
        pytest.skip(f"{env_id} does not import here: {exc}")


def play(venv, policy, max_turns: int, sampling=None, task_ids=None):
    """Roll every member until it finishes (or ``max_turns``) with the trainer's rollout loop."""
    from corrgrpo.trainer.rollout import play_episodes

    if task_ids is None:  # the same draw as venv.reset(seed=0)
        picks = np.random.default_rng(0).choice(
            len(venv.task_ids), size=venv.num_groups, replace=len(venv.task_ids) < venv.num_groups
        )
        task_ids = [venv.task_ids[int(j)] for j in picks]
    batch = play_episodes(venv, policy.act, task_ids, sampling or SamplingParams(), max_turns)
    assert batch.rewards.shape == (venv.num_envs, venv.num_rewards) and batch.rewards.dtype == np.float32
    return batch.episodes


@pytest.fixture(scope="module")
def tiny_policy():
    model, tokenizer = load_model("tiny")
    return HFPolicy(model, tokenizer)


@pytest.mark.parametrize("env_id", corrgrpo_envs.registered_ids())
def test_tiny_model_plays_every_env(env_id, tiny_policy):
    venv = make_vector(env_id, num_groups=1, group_size=2)
    task_ids = [SHORT_TASKS[env_id]] if env_id in SHORT_TASKS else None
    try:
        sampling = SamplingParams(max_new_tokens=4, seed=0)
        episodes = play(venv, tiny_policy, max_turns=2, sampling=sampling, task_ids=task_ids)
    finally:
        venv.close()
    for ep in episodes:
        assert ep.num_turns >= 1
        assert ep.token_ids[: ep.prompt_length] == ep.turns[0].prompt_ids
        assert ep.token_ids == ep.turns[-1].prompt_ids + ep.turns[-1].completion_ids
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
        assert ep.completion_length == sum(len(a.completion_ids) for a in ep.turns)
    # members of a group share the task, so they share the first prompt
    assert episodes[0].turns[0].prompt_ids == episodes[1].turns[0].prompt_ids


@pytest.mark.parametrize("env_id", corrgrpo_envs.registered_ids())
def test_reference_beats_random(env_id):
    venv = make_vector(env_id, num_groups=2, group_size=1)
    try:
        play(venv, ReferencePolicy(venv), max_turns=20)
        reference = venv.returns.copy()
        play(venv, RandomPolicy(seed=0), max_turns=20)
        rand = venv.returns.copy()
    finally:
        venv.close()
    weights = venv.reward_weights
    assert (reference @ weights).mean() > (rand @ weights).mean()
