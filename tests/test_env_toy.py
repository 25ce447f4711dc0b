"""The toy domain ScaleDominance-v0: reward values, ranges, correlations, data sets, metrics."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corrgrpo_envs
from corrgrpo_envs.toy.env import ScaleDominanceEnv, score_text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("hello world", (0.0, 0.0, 0.0)),
        ("a 123", (3.0, 1.0, 0.0)),  # a lone letter is no word
        ("cat 7", (1.0, 1.0, 1.0)),
        ("b4a", (1.0, 1.0, 0.0)),  # digits split words: "b", "a"
        ("9" * 50 + " banana", (32.0, 1.0, 1.0)),  # digits capped at 32
        ("٣ ABBA", (0.0, 0.0, 0.0)),  # only ASCII digits count; the letter is case-sensitive
    ],
)
def test_score_text_values(text, expected):
    assert score_text(text) == expected


def test_other_letter_and_cap():
    assert score_text("xyz 12345", letter="y", max_digits=4) == (4.0, 1.0, 1.0)
    env = ScaleDominanceEnv(letter="q", max_digits=8)
    assert env.reward_names == ("digits", "has_q", "word_with_q")
    assert env.reward_space.high.tolist() == [8.0, 1.0, 1.0]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_rewards_always_inside_reward_space(text):
    env = ScaleDominanceEnv(num_tasks=2)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(text)
    assert env.reward_space.contains(reward)
    assert terminated
    if "error" not in info:
        np.testing.assert_array_equal(reward, np.array(score_text(text), np.float32))


def test_scales_and_unit_ranges():
    env = ScaleDominanceEnv(scales=[0.5, 2.0, 3.0])
    assert env.reward_space.high.tolist() == [16.0, 2.0, 3.0]
    env.reset(seed=0)
    _, r, *_ = env.step("cat 1234")
    assert r.tolist() == [2.0, 2.0, 3.0]
    unit = ScaleDominanceEnv(scales="unit")
    assert unit.reward_space.high.tolist() == [1.0, 1.0, 1.0]
    unit.reset(seed=0)
    _, r, *_ = unit.step("cat " + "1" * 8)
    assert r.tolist() == [0.25, 1.0, 1.0]
    for bad in ("half", [1, 2], [1.0, -1.0, 1.0]):
        with pytest.raises(ValueError, match="scales"):
            ScaleDominanceEnv(scales=bad)
    with pytest.raises(ValueError, match="letter"):
        ScaleDominanceEnv(letter="ab")


def test_reference_action_is_best_and_metrics():
    env = ScaleDominanceEnv(num_tasks=4, reward_weights=[0.5, 1.0, 2.0])
    ref = env.reference_action("prompt-0003")
    env.reset(options={"task_id": "prompt-0003"})
    _, r, *_ = env.step(ref[0])
    np.testing.assert_array_equal(r, env.reward_space.high)
    with pytest.raises(KeyError):
        env.reference_action("prompt-9999")
    results = [
        {"task_id": "p", "reward_components": {"digits": 4.0, "has_a": 1.0, "word_with_a": 0.0}},
        {"task_id": "q", "reward_components": {"digits": 8.0, "has_a": 1.0, "word_with_a": 1.0}},
    ]
    m = env.metrics(results)
    assert m == {"digits": 6.0, "has_a": 1.0, "word_with_a": 0.5, "total": 0.5 * 6 + 1 + 2 * 0.5}
    assert env.metrics([]) == {}


def test_tasks_ids_prompts_and_hash_split():
    env = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", num_tasks=100)
    ids = env.unwrapped.task_ids
    assert ids[:2] == ["prompt-0000", "prompt-0001"] and len(ids) == 100
    obs, _ = env.reset(options={"task_id": "prompt-0007"})
    assert obs == {"messages": [{"role": "user", "content": "write a short string: 7"}], "tools": []}
    train = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", num_tasks=100, split="train")
    evl = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", num_tasks=100, split="eval")
    t, e = set(train.unwrapped.task_ids), set(evl.unwrapped.task_ids)
    assert t | e == set(ids) and not t & e
    assert 10 <= len(e) <= 30  # about 20 % by hash
    with pytest.raises(ValueError, match="num_tasks"):
        ScaleDominanceEnv(num_tasks=0)


def test_prompt_files(tmp_path):
    txt = tmp_path / "prompts.txt"
    txt.write_text("say hi\n\nsay 42\n", encoding="utf-8")
    env = ScaleDominanceEnv(dataset=str(txt))
    assert env.task_ids == ["prompt-0000", "prompt-0001"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"id": "x1", "prompt": "go"}\n{"prompt": "again"}\n', encoding="utf-8")
    env = ScaleDominanceEnv(dataset=jsonl)
    assert env.task_ids == ["x1", "prompt-0001"]
    assert env.reset(options={"task_id": "x1"})[0]["messages"][0]["content"] == "go"
    with pytest.raises(ValueError, match="neither a built-in"):
        ScaleDominanceEnv(dataset=str(tmp_path / "missing.txt"))


def test_correlation_structure_on_random_text():
    """On random word/number text: the letter rewards nearly coincide, digits barely relate,
    and the digit reward's spread dwarfs theirs (the paper's worked example's shape)."""
    rng = random.Random(0)
    rows = []
    for _ in range(3000):
        toks = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.3:
                toks.append(str(rng.randint(0, 9999)))
            else:
                toks.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 4))))
        rows.append(score_text(" ".join(toks)))
    x = np.array(rows)
    corr = np.corrcoef(x.T)
    assert corr[1, 2] > 0.9
    assert abs(corr[0, 1]) < 0.3 and abs(corr[0, 2]) < 0.3
    assert x[:, 0].std() > 5 * x[:, 1].std()
