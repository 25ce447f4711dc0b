"""Each component's part of the advantages: recomposes every estimator's output to 1e-9, shares
sum to 1, group weights (c_q is CorrGRPO's over GRPO's), plug-ins, and the trainer's per-step
attribution, gradient norm before clipping and parameter update norm."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.advantages import (
    available_estimators,
    compute_advantages,
    get_estimator,
    group_rewards,
)
from trainer.attribution import attribute, attribution_metrics
from trainer.config import config_from_dict
from trainer.trainer import Trainer

CASES = [(name, {}) for name in available_estimators()] + [
    ("grpo", {"scale": "batch"}), ("grpo", {"scale": "none"}), ("reinforce_pp", {"baseline": "none"}),
    ("corrgrpo", {"min_denominator": 0.5}),
]


def _batch(seed: int, n_groups: int = 5, size: int = 4, k: int = 3):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=(n_groups * size, k)).astype(np.float64) * rng.uniform(0.1, 30, k)
    rewards[rng.random(rewards.shape) < 0.1] = np.nan  # some components do not apply
    rewards[:size, 1] = 2.0  # a component constant in group 0
    rewards[size : 2 * size] = 1.0  # a zero-variance group
    return rewards, np.repeat(np.arange(n_groups), size), rng.uniform(-1, 2, k)


@pytest.mark.parametrize(("estimator", "options"), CASES)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_parts_recompose_every_estimators_advantages(estimator, options, seed):
    rewards, ids, weights = _batch(seed)
    groups = group_rewards(rewards, ids, weights)
    want = torch.where(groups.valid, get_estimator(estimator)(groups, **options), 0.0)
    attribution = attribute(groups, estimator, options)
    assert attribution.exact
    assert attribution.parts.shape == (len(ids), 3)
    np.testing.assert_allclose(attribution.parts.sum(dim=1).numpy(), want.numpy(), rtol=0, atol=1e-9)
    assert attribution.residual.abs().max() == 0.0
    signed, residual = attribution.signed_shares()
    absolute, _ = attribution.abs_shares()
    if want.abs().sum() > 0:
        assert float(signed.sum()) + residual == pytest.approx(1.0, abs=1e-9)
        assert float(absolute.sum()) == pytest.approx(1.0, abs=1e-9)
        # the signed shares recompose the advantages' total size
        total = float(want.abs().sum())
        assert float((signed * total).sum()) == pytest.approx(total, rel=1e-9)


def test_a_dominant_component_holds_the_grpo_share_and_gdpo_evens_it_out():
    # group-wise: digits in [0, 32] varies a lot, the two letters 0/1 vary in the same groups
    rng = np.random.default_rng(0)
    digits = rng.integers(0, 33, 64).astype(float)
    letters = rng.integers(0, 2, 64).astype(float)
    rewards = np.stack([digits, letters, letters], 1)
    ids = np.repeat(np.arange(8), 8)
    names = ["digits", "has_a", "word_with_a"]
    groups = group_rewards(rewards, ids)
    grpo = attribution_metrics(attribute(groups, "grpo"), names)
    gdpo = attribution_metrics(attribute(groups, "gdpo"), names)
    assert grpo["advantage_share/digits/abs"] > 0.85  # measured 0.883
    assert gdpo["advantage_share/digits/abs"] < 0.5
    assert gdpo["advantage_share/has_a/abs"] == pytest.approx(gdpo["advantage_share/word_with_a/abs"])
    assert {"group_weight/digits/median", "group_weight/has_a/p90"} <= set(gdpo)  # per component
    assert {"group_weight/p10", "group_weight/median", "group_weight/p90"} <= set(grpo)


def test_corrgrpo_group_weight_over_grpo_is_c_q():
    rewards, ids, weights = _batch(7)
    result = compute_advantages(rewards, ids, weights=weights)
    grpo = attribute(result.groups, "grpo").group_weight
    corr = attribute(result.groups, "corrgrpo").group_weight
    c_q = result.stats.c_q
    defined = ~torch.isnan(c_q)
    torch.testing.assert_close((corr / grpo)[defined], c_q[defined], rtol=1e-9, atol=0)
    # a group without reward variance has no weight (GRPO would divide by eps there)
    assert torch.isnan(c_q[1]) and torch.isnan(grpo[1]) and torch.isnan(corr[1])
    assert (grpo[defined] < 1e3).all()


def test_plug_in_estimators(tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(textwrap.dedent("""
        import torch

        def scaled(groups):
            return 3.0 * groups.numerator / groups.per_response(groups.counts)

        def ones(groups):
            return torch.ones_like(groups.numerator)

        def declared(groups):
            return 2.0 * groups.numerator

        declared.attribution = lambda groups: (2.0 * groups.weighted, None)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards, ids, weights = _batch(11)
    groups = group_rewards(rewards, ids, weights)
    # a per-group scale of the centred total: the proportional split is exact
    scaled = attribute(groups, "my_estimators:scaled")
    assert not scaled.exact
    want = torch.where(groups.valid, get_estimator("my_estimators:scaled")(groups), 0.0)
    np.testing.assert_allclose(scaled.advantages.numpy(), want.numpy(), atol=1e-12)
    assert scaled.residual.abs().max() < 1e-12
    metrics = attribution_metrics(scaled, ["a", "b", "c"])
    assert metrics["attribution/exact"] == 0.0 and abs(metrics["advantage_share/residual"]) < 1e-12
    # not of that form: what cannot be placed is the residual, and the whole still recomposes
    ones = attribute(groups, "my_estimators:ones")
    np.testing.assert_allclose(ones.advantages.numpy(), groups.valid.double().numpy(), atol=1e-12)
    assert ones.residual.abs().sum() > 0
    signed, residual = ones.signed_shares()
    assert float(signed.sum()) + residual == pytest.approx(1.0, abs=1e-9)
    # a declared decomposition is used as is
    declared = attribute(groups, "my_estimators:declared")
    assert declared.exact
    np.testing.assert_allclose(declared.advantages.numpy(), (2.0 * groups.numerator).numpy(), atol=1e-12)
    sys.modules.pop("my_estimators", None)


def _trainer(tmp_path: Path, **algorithm) -> Trainer:
    return Trainer(config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 8},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "gdpo", "group_size": 4, "prompts_per_step": 2, **algorithm},
        "rollout": {"max_new_tokens": 8, "torch_threads": 1},
        "optim": {"lr": 1e-2, "max_grad_norm": 0.0},
        "train": {"steps": 1, "seed": 1, "split": "all", "progress": False, "tensorboard": False,
                  "save_final": False, "log_samples": 0, "output_dir": str(tmp_path / "run")},
    }))


def test_trainer_logs_attribution_and_the_update_it_made(tmp_path):
    trainer = _trainer(tmp_path)
    before = [p.detach().clone() for p in trainer.unwrapped.parameters()]
    record = trainer.train_step(0)
    delta = math.sqrt(sum(float((p.detach() - b).double().square().sum())
                          for p, b in zip(trainer.unwrapped.parameters(), before)))
    assert record["update_norm"] == pytest.approx(delta, rel=1e-6)
    assert record["param_norm"] > record["update_norm"] > 0
    assert record["grad_norm"] > 0  # measured although clipping is off
    names = record["reward_names"]
    assert sum(record[f"advantage_share/{n}"] for n in names) == pytest.approx(1.0, abs=1e-9)
    assert sum(record[f"advantage_share/{n}/abs"] for n in names) == pytest.approx(1.0, abs=1e-9)
    assert record["attribution/exact"] == 1.0
    assert f"group_weight/{names[0]}/median" in record
    assert 0.0 <= record[f"active_fraction/{names[0]}"] <= 1.0
    trainer.venv.close()
