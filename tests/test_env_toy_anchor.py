"""The toy domain's ``rewards="anchor"`` set: exactly the TRL anchor's three rewards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corrgrpo_envs
from corrgrpo_envs.toy.env import ScaleDominanceEnv, score_anchor_text

DIGITS = "0123456789"


def _anchor_rewards(text: str) -> tuple[float, float, float]:
    """The anchor script's r1_digits, r2_has_a, r3_has_b written out independently."""
    return (
        float(len([c for c in text if c in DIGITS])),
        1.0 if "a" in text else 0.0,
        1.0 if "b" in text else 0.0,
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("hello world", (0.0, 0.0, 0.0)),
        ("a 123", (3.0, 1.0, 0.0)),  # a lone letter counts here (it is no word in the default set)
        ("b", (0.0, 0.0, 1.0)),
        ("9" * 50 + " ab", (50.0, 1.0, 1.0)),  # digits are not capped
        ("٣ ABBA", (0.0, 0.0, 0.0)),  # ASCII digits only; letters are case-sensitive
    ],
)
def test_anchor_values(text, expected):
    assert score_anchor_text(text) == expected
    env = ScaleDominanceEnv(num_tasks=2, rewards="anchor")
    env.reset(seed=0)
    _, r, terminated, _, info = env.step(text)
    assert r.tolist() == list(expected) and terminated
    assert info["reward_components"] == dict(zip(("digits", "has_a", "has_b"), expected))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab01234 xyz9\n"), max_size=400))
def test_anchor_matches_the_anchor_definition(text):
    env = ScaleDominanceEnv(num_tasks=2, rewards="anchor")
    env.reset(seed=0)
    _, r, *_ = env.step(text)
    if text:
        assert r.tolist() == list(_anchor_rewards(text))
    assert env.reward_space.contains(r)


def test_anchor_names_ranges_make_and_reference():
    env = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", rewards="anchor", reward_weights=[1, 1, 1])
    u = env.unwrapped
    assert u.reward_names == ("digits", "has_a", "has_b")
    assert u.reward_space.high.tolist() == [float(u.max_action_chars), 1.0, 1.0]
    assert u.reward_weights.tolist() == [1.0, 1.0, 1.0]
    assert len(u.task_ids) == 64
    obs, _ = env.reset(options={"task_id": "prompt-0005"})
    assert obs["messages"][0]["content"] == "write a short string: 5"
    ref = u.reference_action("prompt-0005")[0]
    _, r, *_ = env.step(ref)
    assert r.tolist() == [32.0, 1.0, 1.0]
    scaled = ScaleDominanceEnv(rewards="anchor", scales=[0.5, 2.0, 3.0])
    scaled.reset(seed=0)
    _, r, *_ = scaled.step("ab 1234")
    np.testing.assert_array_equal(r, np.array([2.0, 2.0, 3.0], np.float32))
    m = u.metrics(
        [
            {"task_id": "p", "reward_components": {"digits": 4.0, "has_a": 1.0, "has_b": 0.0}},
            {"task_id": "q", "reward_components": {"digits": 8.0, "has_a": 0.0, "has_b": 1.0}},
        ]
    )
    assert m == {"digits": 6.0, "has_a": 0.5, "has_b": 0.5, "total": 7.0}


def test_anchor_errors_and_default_unchanged():
    with pytest.raises(ValueError, match="rewards: .trl. is not allowed; allowed values: one of .default., .anchor."):
        ScaleDominanceEnv(rewards="trl")
    with pytest.raises(ValueError, match="uncapped"):
        ScaleDominanceEnv(rewards="anchor", scales="unit")
    default = ScaleDominanceEnv(num_tasks=2)
    assert default.reward_set == "default"
    assert default.reward_names == ("digits", "has_a", "word_with_a")
    default.reset(seed=0)
    _, r, *_ = default.step("a " + "1" * 40)
    assert r.tolist() == [32.0, 1.0, 0.0]
