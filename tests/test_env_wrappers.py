"""LinearReward (MO-Gymnasium's contract) and per-component episode statistics."""

from __future__ import annotations

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo_envs.wrappers import LinearReward, RecordEpisodeComponents

TOY = "corrgrpo/ScaleDominance-v0"


def test_linear_reward_uses_domain_weights_and_keeps_vector():
    env = LinearReward(corrgrpo_envs.make(TOY, reward_weights=[0.5, 2.0, 4.0]))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("cat 123")
    assert isinstance(reward, float) and reward == 0.5 * 3 + 2.0 + 4.0
    np.testing.assert_array_equal(info["vector_reward"], [3.0, 1.0, 1.0])
    assert info["vector_reward"].dtype == np.float32
    np.testing.assert_array_equal(info["reward_weights"], [0.5, 2.0, 4.0])
    assert terminated


def test_linear_reward_explicit_and_set_weight():
    env = LinearReward(corrgrpo_envs.make(TOY), weight=np.array([0.0, 1.0, 0.0]))
    env.reset(seed=0)
    assert env.step("cat 123")[1] == 1.0
    env.set_weight(np.array([1.0, 0.0, 0.0]))
    env.reset(seed=0)
    assert env.step("cat 123")[1] == 3.0
    with pytest.raises(ValueError, match="shape"):
        env.set_weight(np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        env.set_weight(np.array([1.0, np.nan, 0.0]))


def test_episode_components_over_and_under_linear_reward():
    for env in (
        RecordEpisodeComponents(corrgrpo_envs.make(TOY), buffer_length=2),
        RecordEpisodeComponents(LinearReward(corrgrpo_envs.make(TOY)), buffer_length=2),
        LinearReward(RecordEpisodeComponents(corrgrpo_envs.make(TOY), buffer_length=2)),
    ):
        stats = env if isinstance(env, RecordEpisodeComponents) else env.env
        for text in ("cat 1", "b 22", "at 333"):
            env.reset(seed=0)
            _, _, _, _, info = env.step(text)
        ep = info["episode"]
        np.testing.assert_array_equal(ep["r"], [3.0, 1.0, 1.0])
        assert ep["components"] == {"digits": 3.0, "has_a": 1.0, "word_with_a": 1.0}
        assert ep["l"] == 1 and ep["t"] >= 0
        assert len(stats.return_queue) == 2  # buffer_length
        assert stats.mean_returns() == {"digits": 2.5, "has_a": 0.5, "word_with_a": 0.5}


def test_wrappers_reject_single_reward_envs():
    import gymnasium as gym

    with pytest.raises(ValueError, match="reward_space"):
        LinearReward(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="reward_names"):
        RecordEpisodeComponents(gym.make("CartPole-v1"))


def test_mo_gymnasium_linear_reward_on_our_envs():
    mo_wrappers = pytest.importorskip("mo_gymnasium.wrappers", reason="mo-gymnasium not installed")
    ours = LinearReward(corrgrpo_envs.make(TOY), weight=np.array([0.25, 1.0, 3.0], np.float32))
    theirs = mo_wrappers.LinearReward(
        corrgrpo_envs.make(TOY), weight=np.array([0.25, 1.0, 3.0], np.float32)
    )
    for text in ("cat 12345678", "zz", "a 1"):
        ours.reset(seed=1)
        theirs.reset(seed=1)
        a = ours.step(text)
        b = theirs.step(text)
        assert a[1] == pytest.approx(float(b[1]))
        np.testing.assert_array_equal(a[4]["vector_reward"], b[4]["vector_reward"])
        np.testing.assert_array_equal(a[4]["reward_weights"], b[4]["reward_weights"])
    # MO-Gymnasium's per-objective statistics also run on our vector rewards
    stats = mo_wrappers.MORecordEpisodeStatistics(corrgrpo_envs.make(TOY), gamma=1.0)
    stats.reset(seed=0)
    info = stats.step("cat 12")[4]
    np.testing.assert_array_equal(info["episode"]["r"], [2.0, 1.0, 1.0])
