"""A per-sequence loss weight (``LossInputs.sequence_weights``, an estimator's ``loss_weight``)
multiplies that sequence's policy term in every loss, not its KL term nor the denominators, as
the public GD²PO code applies its keep weight; and the updater applies it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.losses import LossConfig, LossInputs, get_loss, k3_kl

ALL = ["cispo", "dapo", "dr_grpo", "grpo", "gspo"]
DT = torch.float64


def _batch(seed: int, batch: int = 4, length: int = 5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=DT) * 3
    logp = old + torch.randn(batch, length, generator=g, dtype=DT) * 0.4
    ref = old + torch.randn(batch, length, generator=g, dtype=DT) * 0.3
    adv = torch.randn(batch, generator=g, dtype=DT) * 2
    mask = (torch.rand(batch, length, generator=g) < 0.7).to(DT)
    mask[:, 0] = 1.0
    weights = torch.rand(batch, generator=g, dtype=DT) * 2
    return logp, old, ref, adv, mask, weights


def _run(name, logp, old, adv, mask, cfg, **kw):
    logp = logp.clone().requires_grad_(True)
    out = get_loss(name)(LossInputs(logp=logp, old_logp=old, advantages=adv, mask=mask, options=cfg, **kw))
    out.loss.backward()
    return out.loss.detach(), logp.grad


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ALL), st.integers(0, 10_000), st.booleans(), st.booleans())
def test_a_weight_is_a_factor_of_the_advantage(name, seed, with_kl, with_token_weights):
    """GD²PO's code multiplies the advantage by its keep weight; DARA's port the clipped loss:
    for a factor >= 0 both are the same loss, KL and denominators untouched."""
    logp, old, ref, adv, mask, weights = _batch(seed)
    weights[1] = 0.0
    cfg = LossConfig(kl_beta=0.3 if with_kl else 0.0, dual_clip=3.0, max_completion_length=7)
    extra = {"ref_logp": ref} if with_kl else {}
    if with_token_weights:
        extra["token_weights"] = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=DT)
    weighted = _run(name, logp, old, adv, mask, cfg, sequence_weights=weights, **extra)
    folded = _run(name, logp, old, adv * weights, mask, cfg, **extra)
    torch.testing.assert_close(weighted[0], folded[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(weighted[1], folded[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_weighted_ppo_loss_by_hand(name):
    """The loss written out token by token: the weight on the clipped term, KL unweighted,
    grpo's per-sequence token means and dapo's token mean over every masked token."""
    logp, old, ref, adv, mask, weights = _batch(3)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, kl_beta=0.1)
    got, _ = _run(name, logp, old, adv, mask, cfg, ref_logp=ref, sequence_weights=weights)
    kl = k3_kl(logp, ref)
    sequence_means, total, tokens = [], 0.0, 0.0
    for i in range(mask.shape[0]):
        row = 0.0
        for t in range(mask.shape[1]):
            if mask[i, t] == 0:
                continue
            ratio = math.exp(float(logp[i, t] - old[i, t]))
            a = float(adv[i])
            clipped = max(-a * ratio, -a * min(max(ratio, 0.8), 1.28))
            term = float(weights[i]) * clipped + 0.1 * float(kl[i, t])
            row += term
            total += term
            tokens += 1
        sequence_means.append(row / float(mask[i].sum()))
    want = sum(sequence_means) / len(sequence_means) if name == "grpo" else total / tokens
    assert float(got) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_weight_one_everywhere_is_no_weight(name):
    logp, old, ref, adv, mask, _ = _batch(5)
    cfg = LossConfig(kl_beta=0.2)
    plain = _run(name, logp, old, adv, mask, cfg, ref_logp=ref)
    ones = _run(name, logp, old, adv, mask, cfg, ref_logp=ref, sequence_weights=torch.ones(4, dtype=DT))
    assert torch.equal(plain[0], ones[0]) and torch.equal(plain[1], ones[1])


@pytest.mark.parametrize("name", ALL)
def test_weight_zero_removes_a_sequences_policy_gradient(name):
    logp, old, ref, adv, mask, weights = _batch(9)
    weights[2] = 0.0
    cfg = LossConfig()
    _, grad = _run(name, logp, old, adv, mask, cfg, sequence_weights=weights)
    assert (grad[2] == 0).all() and grad[[0, 1, 3]].abs().sum() > 0
    # the other sequences keep their gradient: same denominators, each row its own weight
    _, plain = _run(name, logp, old, adv, mask, cfg)
    for i in (0, 1, 3):
        torch.testing.assert_close(grad[i], plain[i] * weights[i], rtol=1e-12, atol=1e-15)
    # with a KL term, what is left of the row's gradient is the KL term's
    kl_cfg = LossConfig(kl_beta=0.5)
    _, with_kl = _run(name, logp, old, adv, mask, kl_cfg, ref_logp=ref, sequence_weights=weights)
    _, kl_only = _run(name, logp, old, torch.zeros(4, dtype=DT), mask, kl_cfg, ref_logp=ref)
    torch.testing.assert_close(with_kl[2], kl_only[2], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("weights", "match"), [
    (torch.ones(3, dtype=DT), r"sequence_weights must have shape \[4\]"),
    (torch.tensor([1.0, -0.5, 1.0, 1.0], dtype=DT), "finite and >= 0"),
    (torch.tensor([1.0, float("nan"), 1.0, 1.0], dtype=DT), "finite and >= 0"),
    (torch.tensor([1.0, float("inf"), 1.0, 1.0], dtype=DT), "finite and >= 0"),
])
def test_bad_sequence_weights_raise(weights, match):
    logp, old, _, adv, mask, _ = _batch(1)
    with pytest.raises(ValueError, match=match):
        LossInputs(logp=logp, old_logp=old, advantages=adv, mask=mask, options=LossConfig(),
                   sequence_weights=weights)


def test_the_updater_applies_the_weights():
    """An update with weights moves the model as one with the advantages times the weights
    (micro-batches of two rows, the second epoch in shuffled order)."""
    import copy

    from corrgrpo.agents import Episode, load_model
    from corrgrpo.trainer.config import OptimConfig
    from corrgrpo.trainer.fsdp import build_accelerator
    from corrgrpo.trainer.losses import default_config
    from corrgrpo.trainer.policy_forward import pack_episodes
    from corrgrpo.trainer.update import PolicyUpdater

    torch.manual_seed(0)
    base, tok = load_model("tiny")
    g = torch.Generator().manual_seed(2)
    episodes = [Episode(token_ids=torch.randint(0, 2000, (n,), generator=g).tolist(),
                        loss_mask=[0] * p + [1] * (n - p), logprobs=[0.0] * n)
                for n, p in ((9, 4), (12, 7), (6, 2))]
    advantages = torch.tensor([1.0, -0.5, 2.0])
    weights = torch.tensor([0.5, 0.0, 1.0])
    acc = build_accelerator(cpu=True)
    moved = []
    for adv, seq_w in ((advantages, weights), (advantages * weights, None)):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = acc.prepare(model, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        updater = PolicyUpdater(model, optimizer, scheduler, acc, get_loss("grpo"), default_config("grpo"),
                                OptimConfig(lr=0.1, max_grad_norm=0.0, micro_batch_size=2, epochs=2))
        batch = pack_episodes(episodes, tok.pad_token_id, torch.device("cpu"))
        result = updater.update(batch, adv, any_signal=True, step=0, sequence_weights=seq_w)
        assert result["update_norm"] > 0
        moved.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*moved):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
