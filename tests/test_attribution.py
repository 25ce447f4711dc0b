"""Each component's part of the advantages: every estimator is the sum of its parts (to the
float32 rounding of its output), the parts agree with the proportional split where the estimator
scales the centred total per group, separable estimators give each component a part of its own,
shares sum to 1, group weights (c_q is CorrGRPO's over GRPO's), plug-ins, and the trainer's
per-step attribution, gradient norm before clipping and parameter update norm."""

from __future__ import annotations

import math
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.estimators import (
    ESTIMATORS,
    available_estimators,
    compute_advantages,
    get_estimator,
    group_rewards,
    register_estimator,
)
from corrgrpo.trainer.estimators.attribution import (
    attribute,
    attribution_metrics,
    register_attribution,
)
from corrgrpo.trainer.trainer import Trainer
from tests.tolerances import reduction_atol

K = 3
CASES = [(name, {}) for name in available_estimators()] + [
    ("grpo", {"scale": "batch"}), ("grpo", {"scale": "none"}), ("reinforce_pp", {"baseline": "none"}),
    ("corrgrpo", {"min_denominator": 0.5}),
]
#: A_i = s_q N_i: a per-group scale of the centred total, where the proportional split is exact.
GROUP_SCALED = [("grpo", {}), ("grpo", {"scale": "batch"}), ("grpo", {"scale": "none"}), ("dr_grpo", {}),
                ("corrgrpo", {}), ("corrgrpo", {"min_denominator": 0.5}), ("rloo", {})]
#: a_ik depends on component k's rewards alone.
SEPARABLE = [("dr_grpo", {}), ("grpo", {"scale": "none"}), ("mo_grpo", {}), ("rloo", {})]


def _batch(seed: int, n_groups: int = 5, size: int = 4, k: int = K):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=(n_groups * size, k)).astype(np.float64) * rng.uniform(0.1, 30, k)
    rewards[rng.random(rewards.shape) < 0.1] = np.nan  # some components do not apply
    rewards[:size, 1] = 2.0  # a component constant in group 0
    rewards[size : 2 * size] = 1.0  # a zero-variance group
    return rewards, np.repeat(np.arange(n_groups), size), rng.uniform(-1, 2, k)


def _scale(values: torch.Tensor) -> float:
    return float(values.abs().max()) if values.numel() else 0.0


def _attributed(seed: int, estimator: str, options: dict):
    """The batch of ``seed``, its group statistics and ``estimator``'s attribution on them."""
    rewards, ids, weights = _batch(seed)
    groups = group_rewards(rewards, ids, weights)
    return (rewards, ids, weights), groups, attribute(groups, estimator, options)


@pytest.mark.parametrize(("estimator", "options"), CASES)
def test_compute_advantages_keeps_the_decomposition_it_summed(estimator, options):
    """The trainer computes a step's decomposition once: ``compute_advantages`` sums it and
    keeps it, and the attribution made from it is the one computed afresh."""
    rewards, ids, weights = _batch(3)
    result = compute_advantages(rewards, ids, estimator, weights, **options)
    assert result.decomposition is not None
    again = attribute(result.groups, estimator, options)
    kept = attribute(result.groups, estimator, options, result.advantages, result.decomposition)
    assert torch.equal(kept.parts, again.parts)
    assert torch.equal(result.decomposition.parts.sum(dim=1).float(), result.advantages)


@pytest.mark.parametrize(("estimator", "options"), CASES)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_estimator_is_the_sum_of_its_parts(estimator, options, seed):
    (rewards, ids, weights), groups, attribution = _attributed(seed, estimator, options)
    assert attribution.exact
    assert attribution.parts.shape == (len(ids), K)
    assert attribution.residual.abs().max() == 0.0
    # compute_advantages' float32 output is the sum of the float64 parts, rounded once
    want = compute_advantages(rewards, ids, estimator, weights, **options).advantages
    got = attribution.parts.sum(dim=1)
    atol = reduction_atol(torch.float32, K, _scale(got))
    assert float((got - want.double()).abs().max()) <= atol, (estimator, options)
    assert (attribution.parts[~groups.valid] == 0).all()  # a response with no reward has no part
    signed, residual = attribution.signed_shares()
    absolute, _ = attribution.abs_shares()
    if got.abs().sum() > 0:
        assert float(signed.sum()) + residual == pytest.approx(1.0, abs=1e-9)
        assert float(absolute.sum()) == pytest.approx(1.0, abs=1e-9)
        # the signed shares recompose the advantages' total size
        total = float(got.abs().sum())
        assert float((signed * total).sum()) == pytest.approx(total, rel=1e-9)


@pytest.mark.parametrize(("estimator", "options"), CASES)
def test_a_component_of_weight_zero_has_no_part(estimator, options):
    rewards, ids, weights = _batch(3)
    weights[2] = 0.0
    attribution = attribute(group_rewards(rewards, ids, weights), estimator, options)
    assert (attribution.parts[:, 2] == 0).all()
    assert attribution.parts[:, :2].abs().sum() > 0


@contextmanager
def _plain(name: str):
    """``name``'s advantages registered as a plain function (no decomposition) under ``plain``."""
    restore = ESTIMATORS.snapshot()

    @register_estimator("plain", override=True)
    def plain(groups, **options):
        return get_estimator(name)(groups, **options)

    try:
        yield "plain"
    finally:
        restore()


@pytest.mark.parametrize(("estimator", "options"), GROUP_SCALED)
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_parts_of_a_group_scaled_estimator_are_its_proportional_split(estimator, options, seed):
    _, groups, declared = _attributed(seed, estimator, options)
    with _plain(estimator) as plain:
        split = attribute(groups, plain, options)  # a_ik = A_i c_ik / N_i
    assert not split.exact
    # the split divides by N_i = sum_k c_ik, whose rounding is amplified by its condition number
    # sum_k |c_ik| / |N_i|; rows where N_i is round-off it cannot place (their residual is A_i)
    c = groups.weighted
    n = c.sum(dim=1).abs()
    placed = n > 1e-12 * c.abs().sum(dim=1).clamp(min=1.0)
    condition = c.abs().sum(dim=1) / torch.where(placed, n, 1.0)
    for i in torch.nonzero(placed).squeeze(1).tolist():
        atol = reduction_atol(torch.float64, K, _scale(declared.parts[i]) * float(condition[i]))
        assert float((split.parts[i] - declared.parts[i]).abs().max()) <= atol, i
        assert abs(float(split.residual[i])) <= atol, i


@pytest.mark.parametrize(("estimator", "options"), SEPARABLE)
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), other=st.integers(0, 10_000))
def test_a_separable_estimators_parts_of_a_component_ignore_the_others(estimator, options, seed, other):
    rewards, ids, weights = _batch(seed)
    changed = rewards.copy()
    column = np.random.default_rng(other).normal(size=len(ids)) * 7.0
    changed[:, 0] = np.where(np.isnan(rewards[:, 0]), np.nan, column)  # same responses apply
    before = attribute(group_rewards(rewards, ids, weights), estimator, options).parts
    after = attribute(group_rewards(changed, ids, weights), estimator, options).parts
    assert torch.equal(before[:, 1:], after[:, 1:])


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
    assert grpo["advantage_share_abs/digits"] > 0.85  # measured 0.883
    assert gdpo["advantage_share_abs/digits"] < 0.5
    assert gdpo["advantage_share_abs/has_a"] == pytest.approx(gdpo["advantage_share_abs/word_with_a"])
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

        def late(groups):
            return 2.0 * groups.numerator
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
    # register_attribution gives a plain function (here an entry point) its decomposition
    assert not attribute(groups, "my_estimators:late").exact
    register_attribution("my_estimators:late")(lambda groups: (2.0 * groups.weighted, None))
    assert attribute(groups, "my_estimators:late").exact
    with pytest.raises(ValueError, match="unknown estimator 'nowhere'"):
        register_attribution("nowhere")(lambda groups: (groups.weighted, None))
    sys.modules.pop("my_estimators", None)


def test_an_estimator_written_as_its_decomposition(tmp_path, monkeypatch):
    (tmp_path / "my_decomposed.py").write_text(textwrap.dedent("""
        import torch

        from corrgrpo.trainer.estimators import Decomposition, decomposed

        @decomposed
        def half(groups, *, factor: float = 0.5):
            \"\"\"A fraction of Dr. GRPO's centred total.\"\"\"
            return Decomposition(factor * groups.weighted, torch.full_like(groups.counts, factor))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards, ids, weights = _batch(5)
    groups = group_rewards(rewards, ids, weights)
    half = get_estimator("my_decomposed:half")
    assert half.__doc__ == "A fraction of Dr. GRPO's centred total."
    # its keyword-only parameters are its options, checked as any estimator's
    result = compute_advantages(rewards, ids, "my_decomposed:half", weights, factor=2.0)
    np.testing.assert_allclose(result.advantages.numpy(),
                               torch.where(groups.valid, 2.0 * groups.numerator, 0.0).float().numpy())
    with pytest.raises(ValueError, match="accepted: factor"):
        compute_advantages(rewards, ids, "my_decomposed:half", weights, scale=2.0)
    attribution = attribute(groups, "my_decomposed:half", {"factor": 2.0})
    assert attribution.exact
    torch.testing.assert_close(attribution.parts, torch.where(groups.valid[:, None], 2.0 * groups.weighted, 0.0))
    active = groups.active.any(dim=1)
    assert (attribution.group_weight[active] == 2.0).all() and attribution.group_weight[~active].isnan().all()
    sys.modules.pop("my_decomposed", None)


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
    assert sum(record[f"advantage_share_abs/{n}"] for n in names) == pytest.approx(1.0, abs=1e-9)
    assert record["attribution/exact"] == 1.0
    assert f"group_weight/{names[0]}/median" in record
    assert 0.0 <= record[f"active_fraction/{names[0]}"] <= 1.0
    trainer.venv.close()
