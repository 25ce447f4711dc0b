"""Reward gates: on the code env a correct answer without the required format scores correct = 0;
thresholds per gate; errors naming the key; applied to the raw vectors before dynamic sampling
and advantages, with raw and gated means logged."""

from __future__ import annotations

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo.trainer.config import ConfigError, config_from_dict, load_config
from corrgrpo.trainer.estimators.reward_gates import RewardGates
from corrgrpo.trainer.rollout import informative_groups
from corrgrpo.trainer.trainer import Trainer

TASK = "HumanEval/2"  # truncate_number: return number % 1.0
ANSWERS = {
    "reference": None,
    # passes the tests but does not define the entry point with `def`: format 0
    "lambda": "```python\ntruncate_number = lambda number: number % 1.0\n```",
    "broken": "```python\ndef truncate_number(number):\n    return number % 1.0 +\n```",
}


@pytest.fixture(scope="module")
def code_rewards(tmp_path_factory):
    env = corrgrpo_envs.make("corrgrpo/Code-v0", timeout=2.0, efficiency="lazy",
                             reference_cache_dir=str(tmp_path_factory.mktemp("refs")))
    u = env.unwrapped
    rows = {}
    for name, answer in ANSWERS.items():
        env.reset(options={"task_id": TASK})
        _, reward, *_ = env.step(answer or u.reference_action(TASK)[0])
        rows[name] = reward
    env.close()
    return u.reward_names, u.reward_space, np.stack([rows[n] for n in ANSWERS])


def test_code_env_correct_counts_only_with_format_and_compile(code_rewards):
    names, space, raw = code_rewards
    col = {n: k for k, n in enumerate(names)}
    # the raw vectors: the lambda answer is correct without the format
    assert raw[:, col["correct"]].tolist() == [1.0, 1.0, 0.0]
    assert raw[:, col["format"]].tolist() == [1.0, 0.0, 1.0]
    gates = RewardGates({"correct": ["format", "compile"]}, names, space.low, space.high)
    gated = gates.apply(raw)
    assert gated[:, col["correct"]].tolist() == [1.0, 0.0, 0.0]
    untouched = [k for k in range(len(names)) if k != col["correct"]]
    np.testing.assert_array_equal(gated[:, untouched], raw[:, untouched])
    metrics = gates.metrics(raw)
    assert metrics["reward_raw/correct/mean"] == pytest.approx(2 / 3)
    assert metrics["gate/correct/open_fraction"] == pytest.approx(1 / 3)
    # thresholds per gate: ast_similarity of the lambda answer is 0.57
    loose = RewardGates({"correct": {"ast_similarity": 0.5}}, names, space.low, space.high)
    strict = RewardGates({"correct": {"ast_similarity": 0.9, "compile": None}}, names, space.low, space.high)
    assert loose.apply(raw)[:, col["correct"]].tolist() == [1.0, 1.0, 0.0]
    assert strict.apply(raw)[:, col["correct"]].tolist() == [1.0, 0.0, 0.0]


def test_gates_read_raw_values_and_nan_is_not_met():
    names, low, high = ["a", "b", "c"], [-1.0, 0.0, 0.0], [1.0, 1.0, 2.0]
    gates = RewardGates({"a": ["b"], "b": {"c": 1.5}}, names, low, high)
    raw = np.array([[0.5, 1.0, 2.0], [0.5, 1.0, 1.0], [0.5, np.nan, 2.0], [np.nan, 0.0, 2.0]], np.float32)
    out = gates.apply(raw)
    # a is gated by b's RAW value (row 1: b = 1 opens a although b itself is closed by c)
    np.testing.assert_array_equal(out[:, 0], [0.5, 0.5, -1.0, np.nan])
    np.testing.assert_array_equal(out[:, 1], [1.0, 0.0, np.nan, 0.0])
    np.testing.assert_array_equal(raw[2], np.array([0.5, np.nan, 2.0], np.float32))  # a copy


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.reward_gates={correct: format}", None),
        ("algorithm.reward_gates={correct: [correct]}", "algorithm.reward_gates.correct.correct: a component cannot gate itself"),
        ("algorithm.reward_gates={correct: {format: .nan}}", "algorithm.reward_gates.correct.format: threshold nan is not allowed"),
        ("algorithm.reward_gates={correct: []}", "algorithm.reward_gates.correct: expected a non-empty list"),
        ("algorithm.reward_gates=[correct]", "algorithm.reward_gates: expected a mapping"),
    ],
)
def test_bad_gates_are_config_errors_naming_the_key(override, message):
    if message is None:
        load_config("env_configs/quickstart.yaml", [override])  # a single gate may be a string
        return
    with pytest.raises(ConfigError) as info:
        load_config("env_configs/quickstart.yaml", [override])
    assert message in str(info.value)


def test_unknown_components_are_errors_naming_them():
    names = ["digits", "has_a", "word_with_a"]
    with pytest.raises(ValueError, match=r"algorithm.reward_gates.correct: no reward component is named 'correct'; components: digits"):
        RewardGates({"correct": ["has_a"]}, names, [0] * 3, [1] * 3)
    with pytest.raises(ValueError, match=r"algorithm.reward_gates.digits: gate 'format' is not a reward component"):
        RewardGates({"digits": ["format"]}, names, [0] * 3, [1] * 3)


def test_trainer_gates_before_dynamic_sampling_and_logs_raw_and_gated(tmp_path):
    trainer = Trainer(config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 8},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "grpo", "group_size": 4, "prompts_per_step": 2, "dynamic_sampling": True,
                      "reward_gates": {"digits": ["has_a"]}},
        "rollout": {"max_new_tokens": 8, "torch_threads": 1},
        "train": {"steps": 1, "seed": 3, "split": "all", "progress": False, "tensorboard": False,
                  "save_final": False, "log_samples": 0, "output_dir": str(tmp_path / "run")},
    }))
    batch = trainer._collect(0)
    assert batch.raw_rewards is not None
    np.testing.assert_array_equal(batch.rewards, trainer.gates.apply(batch.raw_rewards))
    assert len(informative_groups(batch)) == len(batch)  # dynamic sampling kept gated-informative groups
    closed = batch.raw_rewards[:, 1] < 1
    assert (batch.rewards[closed, 0] == 0).all()
    record = trainer.train_step(0)
    assert {"reward_raw/digits/mean", "gate/digits/open_fraction", "reward/digits/mean"} <= set(record)
    assert record["reward/digits/mean"] <= record["reward_raw/digits/mean"]
    trainer.venv.close()
