"""Config loading, overrides and validation errors; task sampler; overlong shaping."""

from __future__ import annotations

import numpy as np
import pytest

from corrgrpo.trainer.config import ConfigError, apply_overrides, config_from_dict, load_config
from corrgrpo.trainer.rollout import overlong_penalty
from corrgrpo.trainer.sampler import TaskSampler


def test_quickstart_loads_with_overrides():
    cfg = load_config("env_configs/quickstart.yaml", ["algorithm.estimator=grpo", "train.seed=3"])
    assert cfg.name == "quickstart"
    assert cfg.algorithm.estimator == "grpo"
    assert cfg.train.seed == 3
    assert cfg.env.id == "corrgrpo/ScaleDominance-v0"
    assert cfg.optim.lr == pytest.approx(1e-2)


def test_config_files_in_env_configs_all_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # the examples a user starts from, and the studies' own configs
    for path in sorted([*root.glob("env_configs/*.yaml"), *root.glob("studies/configs/*.yaml")]):
        import yaml

        data = yaml.safe_load(path.read_text())
        if "model" not in data or "data" in data:  # env-only files and SFT configs
            continue
        cfg = load_config(path)
        assert cfg.env.id.startswith("corrgrpo/"), path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"algorithm": {"estimatr": "grpo"}}, "unknown key 'algorithm.estimatr'; allowed keys:"),
        ({"rollout": {"backend": "tpu"}}, "rollout.backend: 'tpu' is not allowed; allowed values: one of 'hf', 'server', 'vllm'"),
        ({"optim": {"lr": "fast"}}, "optim.lr: expected a number"),
        ({"algorithm": {"group_size": 2.5}}, "algorithm.group_size: expected an integer"),
        ({"train": {"progress": "yes"}}, "train.progress: expected true or false"),
        ({"algorithm": {"group_size": 1}}, "algorithm.group_size: 1 is out of range; allowed: >= 2"),
        ({"env": {"dataset": "x"}}, "needs an 'id'"),
        ({"bogus": 1}, "unknown key 'bogus'"),
        ({"rollout": {"backend": "server"}}, "rollout.server.urls: [] is not allowed with rollout.backend=server"),
        ({"rollout": {"server": {"urls": ["host:8000"]}}}, "rollout.server.urls[0]: 'host:8000' is not allowed"),
        ({"rollout": {"server": {"retries": -1}}}, "rollout.server.retries: -1 is out of range; allowed: >= 0"),
        ({"rollout": {"server": {"weight_sync": "nccl"}}}, "rollout.server.nccl_address: null is not allowed"),
        ({"algorithm": {"loss": "sft"}}, "algorithm.loss: 'sft' is the cross-entropy of `corrgrpo sft`"),
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


# ----------------------------------------------------------------- one home per setting
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"env": {"id": "corrgrpo/ScaleDominance-v0", "split": "eval"}}, "env.split: this setting belongs in train.split"),
        ({"env": {"id": "x/Y-v0", "reward_weights": [1, 1]}}, "env.reward_weights: this setting belongs in algorithm.reward_weights"),
        ({"env": {"id": "x/Y-v0", "max_turns": 3}}, "env.max_turns: this setting belongs in rollout.max_turns"),
        ({"algorithm": {"clip_low": 0.1}}, "algorithm.clip_low: this setting belongs in algorithm.loss_options.clip_low"),
        ({"algorithm": {"loss_options": {"kl_beta": 0.1}}}, "algorithm.loss_options.kl_beta: this setting belongs in algorithm.kl_beta"),
    ],
)
def test_a_setting_in_the_wrong_section_names_its_home(data, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert message in str(info.value)


def test_duplicated_yaml_key_names_file_key_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("env:\n  id: corrgrpo/ScaleDominance-v0\n  num_tasks: 8\n  num_tasks: 9\nmodel: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:4: duplicate key 'num_tasks' (first set on line 3)" in str(info.value)


def test_env_configs_have_no_duplicated_keys():
    from pathlib import Path

    from corrgrpo_registry.yaml_files import load_yaml

    for path in sorted((Path(__file__).resolve().parents[1] / "env_configs").rglob("*.yaml")):
        load_yaml(path)  # raises on a duplicated key


# ----------------------------------------------------------------- ranges
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.mini_batch_size=-4", "optim.mini_batch_size: -4 is out of range; allowed: >= 1"),
        ("optim.micro_batch_size=0", "optim.micro_batch_size: 0 is out of range; allowed: >= 1"),
        ("optim.warmup_steps=-5", "optim.warmup_steps: -5 is out of range; allowed: >= 0"),
        ("optim.max_grad_norm=-1", "optim.max_grad_norm: -1.0 is out of range; allowed: >= 0"),
        ("train.save_every=-1", "train.save_every: -1 is out of range; allowed: >= 0"),
        ("train.log_samples=-1", "train.log_samples: -1 is out of range; allowed: >= 0"),
        ("optim.lr=.inf", "optim.lr: inf is out of range; allowed: > 0"),
        ("optim.lr=.nan", "optim.lr: nan is out of range"),
        ("optim.betas=[0.9]", "optim.betas: [0.9] has 1 entries; allowed: exactly 2"),
        ("optim.betas=[0.9, 1.0]", "optim.betas[1]: 1.0 is out of range; allowed: >= 0 and < 1"),
        ("optim.adam_eps=0", "optim.adam_eps: 0.0 is out of range; allowed: > 0"),
        ("rollout.top_p=0", "rollout.top_p: 0.0 is out of range; allowed: > 0 and <= 1"),
        ("rollout.temperature=-1", "rollout.temperature: -1.0 is out of range; allowed: >= 0"),
        ("rollout.reward_workers=0", "rollout.reward_workers: 0 is out of range"),
        ("algorithm.kl_beta=-0.1", "algorithm.kl_beta: -0.1 is out of range; allowed: >= 0"),
        ("algorithm.tis_cap=0.5", "algorithm.tis_cap: 0.5 is out of range; allowed: >= 1"),
        ("algorithm.reward_weights=[1, .inf, 1]", "algorithm.reward_weights[1]: inf is out of range"),
        ("algorithm.overlong_buffer=64", "algorithm.overlong_buffer: 64 is out of range; allowed: <= rollout.max_new_tokens (32)"),
        ("train.steps=0", "train.steps: 0 is out of range; allowed: >= 1"),
        ("algorithm.loss_options={clip_low: 2}", "algorithm.loss_options.clip_low: 2.0 is out of range"),
        ("algorithm.loss_options={clip_hi: 0.3}", "unknown key 'algorithm.loss_options.clip_hi'; allowed keys: "),
        ("algorithm.loss_agg_mode=sum", "algorithm.loss_agg_mode: 'sum' is not allowed; allowed values: one of 'token-mean'"),
        ("algorithm.estimator_options={scale: tribe}", "unknown key 'algorithm.estimator_options.scale'; allowed keys: eps, min_denominator"),
        ("algorithm.estimator_options={nope: 1}", "unknown key 'algorithm.estimator_options.nope'; allowed keys: eps, min_denominator"),
        ("algorithm.estimator=nope", "unknown estimator 'nope'"),
        ("algorithm.loss=nope", "unknown loss 'nope'"),
        ("rollout.backend=tpu", "rollout.backend: 'tpu' is not allowed; allowed values: one of 'hf', 'server', 'vllm'"),
    ],
)
def test_out_of_range_values_name_key_value_and_range(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("env_configs/quickstart.yaml", [override])
    assert message in str(info.value)


def test_every_loss_option_is_settable_from_yaml():
    cfg = load_config("env_configs/quickstart.yaml", [
        "algorithm.loss=gspo", "algorithm.loss_options={clip_low: 0.001, clip_high: 0.002}",
        "algorithm.loss_agg_mode=token-mean", "algorithm.tis_cap=2",
    ])
    from corrgrpo.trainer.setup import build_loss

    _, loss_cfg = build_loss(cfg)
    assert (loss_cfg.clip_low, loss_cfg.clip_high, loss_cfg.agg_mode) == (0.001, 0.002, "token-mean")
    assert loss_cfg.max_completion_length == 32  # max_new_tokens x max_turns


# ----------------------------------------------------------------- env pass-through
def test_env_entry_point_gets_the_trainers_split_and_turn_limit(tmp_path, monkeypatch):
    import sys

    (tmp_path / "turn_env_mod.py").write_text(
        "class TurnEnv:\n    def __init__(self, split='all', max_turns=1, size=2):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from corrgrpo.trainer.setup import env_kwargs

    cfg = config_from_dict({"env": {"id": "turn_env_mod:TurnEnv", "size": 3},
                            "rollout": {"max_turns": 4}, "train": {"split": "eval"}})
    assert env_kwargs(cfg) == {"size": 3, "split": "eval", "max_turns": 4}
    toy = config_from_dict({"rollout": {"max_turns": 4}})
    assert env_kwargs(toy, split="all") == {**toy.env.kwargs(), "split": "all"}
    assert "max_turns" not in env_kwargs(toy)  # the toy env has no turn limit
    sys.modules.pop("turn_env_mod", None)


def test_overlong_budget_is_per_turn():
    from corrgrpo.agents import Episode
    from corrgrpo.agents.policy import Action
    from corrgrpo.trainer.rollout import longest_turn

    ep = Episode()
    ep.append_context([1, 2])
    for n in (20, 20):  # two turns of 20 tokens each, budget 32 per turn
        ep.append_action(Action(text="x", prompt_ids=list(ep.token_ids), completion_ids=[5] * n,
                                logprobs=[0.0] * n))
    assert ep.completion_length == 40 and longest_turn(ep) == 20
    assert overlong_penalty(np.array([longest_turn(ep)]), max_length=32, buffer=8).tolist() == [0.0]


def test_estimator_option_values_are_checked_at_load_time():
    with pytest.raises(ConfigError, match="grpo option scale must be 'group', 'batch' or 'none'"):
        load_config("env_configs/quickstart.yaml", ["algorithm.estimator=grpo",
                                                    "algorithm.estimator_options={scale: tribe}"])
