"""The arena's regimes (``corrgrpo/Regime-v0``): each reward's value on known texts, the ranges,
and that the shipped configs train under every regime."""

from __future__ import annotations

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo_envs.toy.regimes import REGIMES
from corrgrpo_envs.toy.settings import REGIME_NAMES

TEXT = "a cab 12345 zz 9"  # 16 characters: 6 letters (2 vowels), 6 digits, 4 spaces


def _score(regime: str, text: str) -> dict[str, float]:
    return {c.name: c.score(text) for c in REGIMES[regime].components}


def test_the_settings_list_every_regime():
    assert tuple(REGIMES) == REGIME_NAMES


def test_each_regime_scores_a_known_text():
    assert _score("scale", TEXT) == {"digits": 6 * 100 / 32, "has_a": 1.0, "has_b": 1.0}
    assert _score("redundant", TEXT) == {"has_a": 1.0, "word_with_a": 1.0, "has_b": 1.0}
    assert _score("redundant", "a 1") == {"has_a": 1.0, "word_with_a": 0.0, "has_b": 0.0}
    assert _score("tradeoff", TEXT) == {"letters": 6 / 16, "digits": 6 / 16}
    assert _score("sparse", TEXT) == {"has_a": 1.0, "digit_run": 1.0}
    assert _score("sparse", "1234 5678") == {"has_a": 0.0, "digit_run": 0.0}
    assert _score("mixed", TEXT) == {"digits": 6.0, "spaces": 4.0, "has_a": 1.0, "word_with_a": 1.0,
                                     "has_b": 1.0, "digit_run": 1.0, "vowels": 2 / 16}


def test_empty_and_capped_texts_stay_in_range():
    assert _score("tradeoff", "") == {"letters": 0.0, "digits": 0.0}
    capped = _score("mixed", "7" * 100 + " " * 40)
    assert capped["digits"] == 32.0 and capped["spaces"] == 16.0
    assert _score("scale", "7" * 100)["digits"] == 100.0


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_the_env_reports_each_regime_in_its_range(regime):
    env = corrgrpo_envs.make("corrgrpo/Regime-v0", regime=regime, num_tasks=16)
    u = env.unwrapped
    assert u.reward_names == REGIMES[regime].reward_names
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step(TEXT)
    assert terminated and reward.shape == (len(u.reward_names),)
    assert np.all(reward >= u.reward_space.low) and np.all(reward <= u.reward_space.high)
    assert reward.tolist() == pytest.approx(list(_score(regime, TEXT).values()), rel=1e-6)
    env.reset(seed=1)
    best = env.step(u.reference_action("prompt-0000")[0])[1]
    assert np.all(best[[i for i, n in enumerate(u.reward_names) if n.startswith(("has_", "word_", "digit_"))]] == 1)


def test_an_unknown_regime_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="regime"):
        corrgrpo_envs.make("corrgrpo/Regime-v0", regime="nope")


@pytest.mark.parametrize("regime", REGIME_NAMES)
def test_the_shipped_config_of_each_regime_loads(regime):
    from corrgrpo.trainer.config import load_config

    cfg = load_config(f"arena/{regime}.yaml")
    assert cfg.env.id == "corrgrpo/Regime-v0" and cfg.env.regime == regime
    assert cfg.algorithm.estimator == "grpo" and cfg.train.split == "train"
