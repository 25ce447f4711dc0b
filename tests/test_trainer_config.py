"""Config loading, overrides and validation errors; task sampler; overlong shaping."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.config import ConfigError, apply_overrides, config_from_dict, load_config
from trainer.rollout import overlong_penalty
from trainer.sampler import TaskSampler


def test_quickstart_loads_with_overrides():
    cfg = load_config("env_configs/quickstart.yaml", ["algorithm.estimator=grpo", "train.seed=3"])
    assert cfg.name == "quickstart"
    assert cfg.algorithm.estimator == "grpo"
    assert cfg.train.seed == 3
    assert cfg.env["id"] == "corrgrpo/ScaleDominance-v0"
    assert cfg.optim.lr == pytest.approx(1e-2)


def test_config_files_in_env_configs_all_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "env_configs"
    for path in sorted(root.glob("*.yaml")):
        import yaml

        data = yaml.safe_load(path.read_text())
        if "model" not in data:  # env-only files (make() reads their env section)
            continue
        cfg = load_config(path)
        assert cfg.env["id"].startswith("corrgrpo/"), path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"algorithm": {"estimatr": "grpo"}}, "unknown key 'algorithm.estimatr'; allowed keys:"),
        ({"rollout": {"backend": "tpu"}}, "rollout.backend: 'tpu' is not allowed; allowed values: one of 'hf', 'vllm'"),
        ({"optim": {"lr": "fast"}}, "optim.lr: expected a number"),
        ({"algorithm": {"group_size": 2.5}}, "algorithm.group_size: expected an integer"),
        ({"train": {"progress": "yes"}}, "train.progress: expected true or false"),
        ({"algorithm": {"group_size": 1}}, "algorithm.group_size: 1 is out of range; allowed: >= 2"),
        ({"env": {"dataset": "x"}}, "needs an 'id'"),
        ({"bogus": 1}, "unknown key 'bogus'"),
    ],
)
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError, match=None) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_override_parsing():
    data = apply_overrides({}, ["a.b.c=3", "a.d=[1, 2]", "e=null", "f=text"])
    assert data == {"a": {"b": {"c": 3}, "d": [1, 2]}, "e": None, "f": "text"}
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["novalue"])


def test_exponent_without_dot_is_a_number():
    cfg = load_config("env_configs/quickstart.yaml", ["optim.lr=3e-3"])
    assert cfg.optim.lr == pytest.approx(3e-3)


def test_ints_accepted_for_floats_and_optional_lists():
    cfg = config_from_dict({"optim": {"lr": 1}, "algorithm": {"reward_weights": [1, 2, 3]}})
    assert isinstance(cfg.optim.lr, float)
    assert cfg.algorithm.reward_weights == [1.0, 2.0, 3.0]


def test_sampler_is_epoch_permutation_and_pure_function_of_step():
    ids = [f"t{i}" for i in range(10)]
    s = TaskSampler(ids, prompts_per_step=4, seed=1)
    first_epoch = s.tasks_for_step(0) + s.tasks_for_step(1) + s.tasks_for_step(2)[:2]
    assert sorted(first_epoch) == sorted(ids)  # every task once per epoch
    again = TaskSampler(ids, prompts_per_step=4, seed=1)
    assert [again.tasks_for_step(k) for k in (5, 2, 0)] == [s.tasks_for_step(k) for k in (5, 2, 0)]
    assert TaskSampler(ids, 4, seed=2).tasks_for_step(0) != s.tasks_for_step(0)
    assert len(s.extra_tasks(3, 1, 6)) == 6


def test_overlong_penalty_matches_dapo_shaping():
    lengths = np.array([10, 24, 28, 32, 40])
    got = overlong_penalty(lengths, max_length=32, buffer=8)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0])
