"""Reward weight schedules: values over steps, errors naming the key, the weights in force
logged each step, and a resumed run continuing the schedule exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from corrgrpo.trainer.config import ConfigError, config_from_dict, load_config
from corrgrpo.trainer.estimators.reward_weights import Schedule, resolve_reward_weights
from corrgrpo.trainer.trainer import Trainer

NAMES = ["digits", "has_a", "word_with_a"]


def test_schedules_are_piecewise_linear_and_constant_outside():
    weights = resolve_reward_weights(
        {"has_a": {"values": [[0, 0.5], [100, 1.5]]}, "digits": 2}, NAMES, [1.0, 1.0, 1.0]
    )
    assert weights.scheduled
    assert isinstance(weights.entries[1], Schedule)
    np.testing.assert_allclose(weights.at(0), [2.0, 0.5, 1.0])
    np.testing.assert_allclose(weights.at(25), [2.0, 0.75, 1.0])
    np.testing.assert_allclose(weights.at(100), [2.0, 1.5, 1.0])
    np.testing.assert_allclose(weights.at(10_000), [2.0, 1.5, 1.0])
    stepped = resolve_reward_weights([1, {"values": [[10, 0.0], [20, 1.0], [30, 0.0]]}, 3], NAMES, [0, 0, 0])
    np.testing.assert_allclose([stepped.at(s)[1] for s in (0, 10, 15, 20, 29, 40)], [0, 0, 0.5, 1, 0.1, 0])
    assert not resolve_reward_weights(None, NAMES, [1, 2, 3]).scheduled


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.reward_weights=[1, .nan, 1]", "algorithm.reward_weights[1]: nan is out of range"),
        ("algorithm.reward_weights={has_a: .inf}", "algorithm.reward_weights.has_a: inf is out of range"),
        ("algorithm.reward_weights=[1, {values: [[0, 1], [50, .inf]]}, 1]",
         "algorithm.reward_weights[1].values[1]: inf is out of range"),
        ("algorithm.reward_weights={has_a: {values: [[100, 1], [50, 2]]}}",
         "algorithm.reward_weights.has_a.values[1]: step 50 is not after step 100"),
        ("algorithm.reward_weights={has_a: {values: [[0, 1], [0, 2]]}}",
         "algorithm.reward_weights.has_a.values[1]: step 0 is not after step 0"),
        ("algorithm.reward_weights={has_a: {values: [[-1, 1]]}}",
         "algorithm.reward_weights.has_a.values[0]: step -1 is not allowed"),
        ("algorithm.reward_weights={has_a: {points: [[0, 1]]}}",
         "algorithm.reward_weights.has_a: a schedule has exactly one key, 'values'"),
        ("algorithm.reward_weights={has_a: {values: [[0, 1, 2]]}}",
         "algorithm.reward_weights.has_a.values[0]: expected a [step, weight] pair"),
    ],
)
def test_bad_weights_are_errors_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("env_configs/quickstart.yaml", [override])
    assert message in str(info.value)


def test_names_and_length_are_checked_against_the_env():
    with pytest.raises(ValueError, match=r"algorithm.reward_weights.has_b: no reward component is named 'has_b'"):
        resolve_reward_weights({"has_b": 1.0}, NAMES, [1, 1, 1])
    with pytest.raises(ValueError, match=r"algorithm.reward_weights has 2 entries for 3 rewards"):
        resolve_reward_weights([1, 2], NAMES, [1, 1, 1])


SCHEDULE = {"digits": {"values": [[0, 0.1], [2, 0.0]]}, "has_a": {"values": [[0, 1.0], [3, 4.0]]}}


def _trainer(run: Path, steps: int, resume: str | None = None) -> Trainer:
    return Trainer(config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 8},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "grpo", "group_size": 4, "prompts_per_step": 2, "reward_weights": SCHEDULE},
        "rollout": {"max_new_tokens": 8, "torch_threads": 1},
        "train": {"steps": steps, "seed": 2, "split": "all", "progress": False, "tensorboard": False,
                  "save_every": 2, "save_final": False, "log_samples": 0, "output_dir": str(run),
                  "resume": resume},
    }))


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_weights_in_force_are_logged_and_a_resumed_run_continues_the_schedule(tmp_path):
    whole = tmp_path / "whole"
    _trainer(whole, 4).train()
    records = _records(whole)
    assert [r["reward_weight/digits"] for r in records] == pytest.approx([0.1, 0.05, 0.0, 0.0])
    assert [r["reward_weight/has_a"] for r in records] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert [r["reward_weight/word_with_a"] for r in records] == [1.0] * 4  # the env's weight

    torn = tmp_path / "torn"
    _trainer(torn, 2).train()  # stops after step 2 with checkpoint-2
    _trainer(torn, 4, resume="auto").train()
    resumed = _records(torn)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(records, resumed):
        for key in ("reward_weight/digits", "reward_weight/has_a", "reward/weighted/mean", "advantage/abs_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (a["step"], key)
