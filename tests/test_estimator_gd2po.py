"""GD²PO equals its authors' code, and DARA's port of it.

``gd2po_reference`` re-derives, one loop at a time, what Qwen-Applications/GD2PO
``tool-calling/verl/trainer/ppo/ray_trainer.py`` computes at commit
f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02: each reward's verl GRPO advantage on the response's
tokens, a response's summed token advantage per reward tested against +-1e-8 for mixed signs
(``_get_mixed_sign_conflict_mask``), for GD²PO-SNR the ratio ``sum / (sum |.| + 1e-8)`` against
``tau`` (``_compute_gdpo_ratio_conflict_advantages``), each group's share of kept responses
(``_compute_gdpo_group_keep_ratio``) multiplied into the summed advantage, and
``masked_whiten`` over the kept responses' tokens (``_apply_gdpo_keep_mask``).

``dara_reference`` re-derives zhaihaotian/DARA ``tool_calling/vendor/verl/verl/trainer/ppo/
multi_reward_algos.py`` (``gd2po_hard``) at commit 0459102045705674a9ad07748708facb8c5dc0b2:
signs tested token by token, the kept summed advantages whitened when more than one token is
kept (else 0), and the group's share kept returned as ``gd2po_query_weight``, which
``compute_policy_loss`` multiplies into the clipped per-token loss.

The authors' code has no reward weights; the reference multiplies each reward's advantage by
its weight before anything else (1 in their runs), as the estimator documents.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import compute_advantages
from tests.verl_reference import (
    Batch,
    batches,
    grpo_outcome,
    masked_whiten,
    per_response,
    random_batch,
    token_matrix,
)

BATCHES = batches()


def _per_reward(batch: Batch) -> list[np.ndarray]:
    return [batch.weights[j] * grpo_outcome(batch.rewards[:, j], batch.index)
            for j in range(batch.rewards.shape[1])]


def _groups(index) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for i, g in enumerate(index):
        members.setdefault(int(g), []).append(i)
    return members


def gd2po_reference(batch: Batch, variant: str, tau: float = 0.8, lengths=None) -> dict:
    """The authors' advantages and logged ratios (``advantages`` None where verl would raise)."""
    n = len(batch.index)
    lengths = np.ones(n) if lengths is None else lengths
    per_reward = _per_reward(batch)
    keep, conflict = [], []
    for i in range(n):
        rollout = [adv[i] * lengths[i] for adv in per_reward]  # summed token advantages
        mixed = any(v > 1e-8 for v in rollout) and any(v < -1e-8 for v in rollout)
        drop = mixed
        if variant == "snr":
            ratio = sum(rollout) / (sum(abs(v) for v in rollout) + 1e-8)
            drop = mixed and abs(ratio) < tau
        conflict.append(mixed)
        keep.append(not drop)
    ratio = np.zeros(n)
    for rows in _groups(batch.index).values():
        share = sum(keep[i] for i in rows) / len(rows)
        for i in rows:
            ratio[i] = share
    combined = np.array([sum(adv[i] for adv in per_reward) * ratio[i] * keep[i] for i in range(n)])
    tokens, mask = token_matrix(combined, lengths)
    keep_mask = mask * np.array(keep, dtype=float)[:, None]
    if keep_mask.sum() == 0:
        advantages = np.zeros(n)
    else:
        try:
            advantages = per_response(masked_whiten(tokens, keep_mask) * keep_mask, lengths)
        except ValueError:  # one kept token: the authors' code stops here
            advantages = None
    return {"advantages": advantages, "conflict_ratio": np.mean(conflict), "keep_ratio": np.mean(keep),
            "group_keep_ratio_mean": ratio.mean(), "group_keep_ratio_min": ratio.min()}


def dara_reference(batch: Batch, lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """DARA's port: advantages and the query weight of each response."""
    n = len(batch.index)
    lengths = np.ones(n) if lengths is None else lengths
    per_reward = _per_reward(batch)
    keep = []
    for i in range(n):
        token_values = [adv[i] for adv in per_reward for _ in range(int(lengths[i]))]
        keep.append(not (any(v > 1e-8 for v in token_values) and any(v < -1e-8 for v in token_values)))
    combined = np.array([sum(adv[i] for adv in per_reward) for i in range(n)])
    tokens, mask = token_matrix(combined, lengths)
    keep_mask = mask * np.array(keep, dtype=float)[:, None]
    if keep_mask.sum() > 1:
        advantages = per_response(masked_whiten(tokens, keep_mask) * keep_mask, lengths)
    else:
        advantages = np.zeros(n)
    weight = np.zeros(n)
    for rows in _groups(batch.index).values():
        for i in rows:
            weight[i] = sum(keep[j] for j in rows) / len(rows)
    return advantages, weight


def _gd2po(batch: Batch, tokens: bool, **options):
    return compute_advantages(batch.rewards, batch.index, "gd2po", batch.weights,
                              token_counts=batch.lengths if tokens else None, **options)


def _assert_equal(result, want: np.ndarray) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    exact = result.decomposition.parts.sum(dim=1).numpy()
    np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-9 * scale)
    np.testing.assert_allclose(result.advantages.numpy(), want, rtol=1e-6, atol=1e-6 * scale)


CASES = [("hard", 0.8), ("snr", 0.8), ("snr", 0.2)]


@pytest.mark.parametrize(("variant", "tau"), CASES)
@pytest.mark.parametrize("tokens", [True, False], ids=["token_counts", "no_token_counts"])
@pytest.mark.parametrize("batch", BATCHES, ids=[b.name for b in BATCHES])
def test_gd2po_equals_the_authors_code(batch, tokens, variant, tau):
    want = gd2po_reference(batch, variant, tau, batch.lengths if tokens else None)
    result = _gd2po(batch, tokens, variant=variant, tau=tau)
    if want["advantages"] is None:  # one kept token: verl raises; the estimator whitens nothing
        assert (result.advantages == 0).all()
    else:
        _assert_equal(result, want["advantages"])
    assert result.loss_weight is None  # the authors' keep weight is inside the advantage
    for key in ("conflict_ratio", "keep_ratio", "group_keep_ratio_mean", "group_keep_ratio_min"):
        assert result.metrics[key] == pytest.approx(want[key], rel=1e-12), key


@pytest.mark.parametrize("tokens", [True, False], ids=["token_counts", "no_token_counts"])
@pytest.mark.parametrize("batch", BATCHES, ids=[b.name for b in BATCHES])
def test_keep_weight_on_the_loss_equals_daras_port(batch, tokens):
    want, weight = dara_reference(batch, batch.lengths if tokens else None)
    result = _gd2po(batch, tokens, keep_weight="loss")
    _assert_equal(result, want)
    np.testing.assert_allclose(result.loss_weight.numpy(), weight, rtol=1e-7)


def test_the_two_versions_differ_where_a_group_loses_responses():
    batch = next(b for b in BATCHES if b.name == "random")
    own, port = _gd2po(batch, True), _gd2po(batch, True, keep_weight="loss")
    kept_all = port.loss_weight == 1.0
    assert 0 < own.metrics["keep_ratio"] < 1 and not kept_all.all()
    assert not torch.allclose(own.advantages, port.advantages, rtol=1e-3)
    # where a response is dropped both give it 0
    dropped = own.decomposition.parts.abs().sum(dim=1) == 0
    assert (port.advantages[dropped] == 0).all()


def test_a_batch_without_conflicts_is_gdpo_whitened_over_tokens():
    rewards = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [3.0, 2.0], [1.0, 1.0]])
    ids = [0, 0, 1, 1, 2, 2]
    lengths = np.array([3.0, 5.0, 2.0, 7.0, 4.0, 1.0])
    result = compute_advantages(rewards, ids, "gd2po", token_counts=lengths)
    assert result.metrics == {"conflict_ratio": 0.0, "keep_ratio": 1.0, "group_keep_ratio_mean": 1.0,
                              "group_keep_ratio_min": 1.0}
    z = 1.0 / (math.sqrt(0.5) + 1e-6)  # the z-score of a pair (1, 0)
    summed = np.array([2 * z, -2 * z, 0.0, 0.0, 2 * z, -2 * z])  # group 1: constant
    mean = (lengths * summed).sum() / lengths.sum()
    var = (lengths * (summed - mean) ** 2).sum() / (lengths.sum() - 1)
    np.testing.assert_allclose(result.advantages.numpy(), (summed - mean) / math.sqrt(var + 1e-8), rtol=1e-6)


def test_every_response_dropped_gives_zero_advantages():
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 2.0]])
    result = compute_advantages(rewards, [0, 0, 1, 1], "gd2po", keep_weight="loss")
    assert (result.advantages == 0).all() and (result.loss_weight == 0).all()
    assert result.metrics["conflict_ratio"] == 1.0 and result.metrics["keep_ratio"] == 0.0


def test_one_kept_token_whitens_nothing():
    """verl's ``masked_var`` raises on a single kept token (GD²PO's code stops); DARA's port and
    the estimator give 0."""
    # groups 0 and 2 conflict in every response; group 1 is one response, its raw rewards agree
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [2.0, 0.0], [0.0, 2.0]])
    batch = Batch("one_kept", rewards, np.array([0, 0, 1, 2, 2]), np.ones(2), np.ones(5))
    assert gd2po_reference(batch, "hard")["advantages"] is None
    assert (dara_reference(batch)[0] == 0).all()
    for keep_weight in ("advantage", "loss"):
        result = _gd2po(batch, True, keep_weight=keep_weight)
        assert result.metrics["keep_ratio"] == 0.2 and (result.advantages == 0).all()


def test_snr_keeps_a_conflicted_response_with_a_strong_net_signal():
    # response 0: advantages (+z, -z/3 ...): mixed signs but a net ratio above tau
    rewards = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    hard = compute_advantages(rewards, [0, 0, 0], "gd2po")
    snr = compute_advantages(rewards, [0, 0, 0], "gd2po", variant="snr", tau=0.2)
    assert hard.metrics["keep_ratio"] < snr.metrics["keep_ratio"]
    assert snr.metrics["conflict_ratio"] == hard.metrics["conflict_ratio"]


@pytest.mark.parametrize(("options", "match"), [
    ({"variant": "soft"}, "variant must be one of"),
    ({"tau": 1.5}, r"tau must be a number in \[0, 1\]"),
    ({"keep_weight": "both"}, "keep_weight must be one of"),
    ({"batch_weighting": "sequence"}, "batch_weighting must be one of"),
    ({"snr_eps": float("nan")}, "snr_eps must be a finite number"),
])
def test_bad_options_raise(options, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages(np.ones((4, 2)), [0, 0, 1, 1], "gd2po", **options)


def test_the_trainer_applies_the_keep_weight_and_logs_the_ratios(tmp_path, monkeypatch):
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.trainer import Trainer

    trainer = Trainer(config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 8},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "gd2po", "estimator_options": {"keep_weight": "loss"},
                      "group_size": 4, "prompts_per_step": 2},
        "rollout": {"max_new_tokens": 8, "torch_threads": 1},
        "optim": {"lr": 1e-2, "max_grad_norm": 0.0},
        "train": {"steps": 1, "seed": 1, "split": "all", "progress": False, "tensorboard": False,
                  "save_final": False, "log_samples": 0, "output_dir": str(tmp_path / "run")},
    }))
    seen = {}
    update = trainer.updater.update

    def spy(packed, advantages, **kw):
        seen["lengths"] = packed.loss_mask.sum(dim=1)
        seen.update(kw)
        return update(packed, advantages, **kw)

    def spy_advantages(*args, token_counts=None, **kw):
        seen["token_counts"] = token_counts
        return compute_advantages(*args, token_counts=token_counts, **kw)

    monkeypatch.setattr(trainer.updater, "update", spy)
    monkeypatch.setattr("corrgrpo.trainer.trainer.compute_advantages", spy_advantages)
    record = trainer.train_step(0)
    trainer.venv.close()
    weights = seen["sequence_weights"]
    assert weights is not None and weights.shape == (8,)
    assert float(weights.mean()) == pytest.approx(record["estimator/group_keep_ratio_mean"], rel=1e-6)
    assert 0.0 <= record["estimator/conflict_ratio"] <= 1.0
    assert record["estimator/keep_ratio"] + record["estimator/conflict_ratio"] >= 1.0 - 1e-12  # hard
    # the advantages were computed with the trained tokens of each episode
    torch.testing.assert_close(seen["token_counts"], seen["lengths"].double())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.booleans(), st.sampled_from(CASES))
def test_gd2po_equals_the_authors_code_on_random_batches(seed, with_lengths, case):
    batch = random_batch(seed, with_lengths)
    variant, tau = case
    want = gd2po_reference(batch, variant, tau, batch.lengths)
    result = _gd2po(batch, True, variant=variant, tau=tau)
    if want["advantages"] is None:
        assert (result.advantages == 0).all()
    else:
        _assert_equal(result, want["advantages"])
    port, weight = dara_reference(batch, batch.lengths)
    result = _gd2po(batch, True, keep_weight="loss")
    _assert_equal(result, port)
    np.testing.assert_allclose(result.loss_weight.numpy(), weight, rtol=1e-7)
