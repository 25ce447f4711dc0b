"""Tests of trainer/losses.py: policy-gradient values, clipping, aggregation, masking, KL and
micro-batching, with hand-computed numbers."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer import losses
from corrgrpo.trainer.losses import (
    LossConfig,
    LossInputs,
    LossOutput,
    available_losses,
    default_config,
    get_loss,
    k3_kl,
    register_loss,
)

#: the policy-gradient losses (``sft``, supervised cross-entropy, is tested on its own)
ALL = ["cispo", "dapo", "dr_grpo", "grpo", "gspo"]
DT = torch.float64

# Two sequences of unequal length: 3 tokens and 1 token (T = 3).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=DT)
ADV = torch.tensor([1.0, -2.0], dtype=DT)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=DT)


def _normaliser(name: str, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Per-token divisor n_it such that d loss / d logp_it = -A_i m_it / n_it at rho = 1."""
    batch, length = mask.shape
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)
    if name in ("grpo", "gspo"):
        return (lengths * batch).expand_as(mask)
    if name in ("dapo", "cispo"):
        return mask.sum().expand_as(mask)
    assert name == "dr_grpo"
    return torch.full_like(mask, float((cfg.max_completion_length or length) * batch))


def _inputs(name, logp, old_logp, adv, mask, cfg=None, **kw) -> LossInputs:
    """The inputs of loss ``name`` (its default options unless ``cfg``)."""
    return LossInputs(logp=logp, old_logp=old_logp, advantages=adv, mask=mask,
                      options=cfg or default_config(name), **kw)


def _call(name, *args, **kw) -> LossOutput:
    return get_loss(name)(_inputs(name, *args, **kw))


def _run(name, logp, old_logp, adv, mask, cfg=None, **kw) -> tuple[LossOutput, torch.Tensor]:
    logp = logp.clone().requires_grad_(True)
    out = _call(name, logp, old_logp, adv, mask, cfg, **kw)
    out.loss.backward()
    return out, logp.grad


def _single(name, log_ratio, adv, cfg=None):
    """One token of one sequence (every normaliser is 1): returns loss, grad, clip_fraction."""
    logp = _t([[log_ratio]])
    out, grad = _run(name, logp, torch.zeros_like(logp), _t([adv]), _t([[1.0]]), cfg)
    return out.loss.item(), grad.item(), out.metrics["clip_fraction"]


# ----------------------------------------------------------------------------- registry


def test_registry_lists_all_losses_and_rejects_unknown():
    assert available_losses() == [*ALL, "sft"]
    with pytest.raises(ValueError, match="available: cispo, dapo, dr_grpo, grpo, gspo, sft"):
        get_loss("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_loss("grpo")(lambda *a, **k: None)


def test_default_configs_follow_the_papers():
    assert (default_config("grpo").clip_low, default_config("grpo").clip_high) == (0.2, 0.2)
    assert (default_config("dapo").clip_low, default_config("dapo").clip_high) == (0.2, 0.28)
    gspo = default_config("gspo")
    assert (gspo.clip_low, gspo.clip_high) == (3e-4, 4e-4)
    assert default_config("cispo").cispo_clip_low is None
    assert all(default_config(n).kl_beta == 0.0 and default_config(n).dual_clip is None for n in ALL)
    changed = default_config("dapo")
    changed.clip_high = 0.5  # a copy: the registered default is untouched
    assert default_config("dapo").clip_high == 0.28
    with pytest.raises(ValueError, match="unknown loss"):
        default_config("nope")


@pytest.fixture
def scratch_registry():
    """Losses a test registers are gone after it."""
    restore = losses.LOSSES.snapshot()
    yield
    restore()


def test_user_can_register_a_loss(scratch_registry):
    @register_loss("reinforce", defaults=LossConfig(kl_beta=0.1))
    def reinforce(inputs: LossInputs) -> LossOutput:
        x = inputs
        return LossOutput(-(x.advantages[:, None] * x.logp * x.mask).sum() / x.token_denominator)

    assert "reinforce" in available_losses() and default_config("reinforce").kl_beta == 0.1
    assert _call("reinforce", _t([[2.0]]), _t([[0.0]]), _t([1.0]), _t([[1.0]])).loss == -2
    # override= replaces it (here: the same loss with other defaults)
    register_loss("reinforce", defaults=LossConfig(kl_beta=0.2), override=True)(reinforce)
    assert default_config("reinforce").kl_beta == 0.2


# ----------------------------------------------------------------------------- rho = 1


@pytest.mark.parametrize("name", ALL)
def test_on_policy_gradient_is_the_policy_gradient(name):
    logp = _t([[-0.5, -1.0, -2.0], [-0.3, -7.0, -9.0]])
    cfg = LossConfig(max_completion_length=4)
    _, grad = _run(name, logp, logp.clone(), ADV, MASK, cfg)
    expected = -ADV[:, None] * MASK / _normaliser(name, MASK, cfg)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)


def test_on_policy_gradients_hand_computed():
    logp = _t([[-0.5, -1.0, -2.0], [-0.3, -7.0, -9.0]])
    cfg = LossConfig(max_completion_length=4)
    # grpo/gspo: seq 0 -> -1 / (3 tokens * 2 seqs); seq 1 -> +2 / (1 * 2)
    seq_mean = _t([[-1 / 6, -1 / 6, -1 / 6], [1.0, 0.0, 0.0]])
    token_mean = _t([[-0.25, -0.25, -0.25], [0.5, 0.0, 0.0]])  # / 4 tokens
    constant = _t([[-1 / 8, -1 / 8, -1 / 8], [0.25, 0.0, 0.0]])  # / (L=4 * 2 seqs)
    for name, expected in [
        ("grpo", seq_mean),
        ("gspo", seq_mean),
        ("dapo", token_mean),
        ("cispo", token_mean),
        ("dr_grpo", constant),
    ]:
        out, grad = _run(name, logp, logp.clone(), ADV, MASK, cfg)
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
        assert out.metrics["clip_fraction"] == 0.0
        assert out.metrics["ratio_mean"] == out.metrics["ratio_max"] == 1.0
    # values at rho = 1: grpo -(1 + (-2)) / 2; dapo -(3 * 1 + 1 * (-2)) / 4
    assert _run("grpo", logp, logp.clone(), ADV, MASK)[0].loss.item() == pytest.approx(0.5)
    assert _run("dapo", logp, logp.clone(), ADV, MASK)[0].loss.item() == pytest.approx(-0.25)
    # cispo's value is -sum(w A logp) / tokens: -(1 * -3.5 + -2 * -0.3) / 4
    assert _run("cispo", logp, logp.clone(), ADV, MASK)[0].loss.item() == pytest.approx(0.725)


# ----------------------------------------------------------------------------- clipping


@pytest.mark.parametrize(
    ("rho", "adv", "loss", "grad", "clipped"),
    [
        (1.5, 1.0, -1.2, 0.0, 1.0),  # A > 0, above 1 + e: clipped, no gradient
        (0.5, 1.0, -0.5, -0.5, 0.0),  # A > 0, below 1 - e: unclipped (pessimistic min)
        (0.5, -1.0, 0.8, 0.0, 1.0),  # A < 0, below 1 - e: clipped, no gradient
        (1.5, -1.0, 1.5, 1.5, 0.0),  # A < 0, above 1 + e: unclipped
        (1.1, 2.0, -2.2, -2.2, 0.0),  # inside the range
    ],
)
@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo"])
def test_ppo_clip_values(name, rho, adv, loss, grad, clipped):
    cfg = LossConfig(clip_low=0.2, clip_high=0.2)
    got = _single(name, math.log(rho), adv, cfg)
    assert got == pytest.approx((loss, grad, clipped))


def test_dapo_clip_higher_keeps_gradient_that_grpo_clips():
    rho = math.log(1.25)
    assert _single("grpo", rho, 1.0) == pytest.approx((-1.2, 0.0, 1.0))
    assert _single("dapo", rho, 1.0) == pytest.approx((-1.25, -1.25, 0.0))
    assert _single("dapo", math.log(1.3), 1.0) == pytest.approx((-1.28, 0.0, 1.0))


@pytest.mark.parametrize(
    ("rho", "adv", "cispo_clip_low", "weight", "clipped"),
    [
        (1.5, 1.0, None, 1.2, 1.0),  # weight capped at 1 + 0.2, gradient kept
        (1.5, -1.0, None, 1.2, 1.0),
        (0.5, -1.0, None, 0.5, 0.0),  # no lower bound by default
        (0.5, -1.0, 0.2, 0.8, 1.0),  # with a lower bound of 1 - 0.2
        (1.1, 3.0, None, 1.1, 0.0),
    ],
)
def test_cispo_clips_the_weight_and_keeps_the_gradient(rho, adv, cispo_clip_low, weight, clipped):
    cfg = LossConfig(clip_high=0.2, cispo_clip_low=cispo_clip_low)
    loss, grad, clip_fraction = _single("cispo", math.log(rho), adv, cfg)
    assert loss == pytest.approx(-weight * adv * math.log(rho))
    assert grad == pytest.approx(-weight * adv)
    assert clip_fraction == clipped


def test_dual_clip_caps_the_loss_for_negative_advantages():
    cfg = LossConfig(dual_clip=3.0)
    # A < 0 and rho = 5: plain PPO loss -A rho = 5 (gradient 5); dual clip caps it at -c A = 3
    assert _single("grpo", math.log(5.0), -1.0) == pytest.approx((5.0, 5.0, 0.0))
    assert _single("grpo", math.log(5.0), -1.0, cfg) == pytest.approx((3.0, 0.0, 1.0))
    assert _single("grpo", math.log(5.0), -2.0, cfg) == pytest.approx((6.0, 0.0, 1.0))
    # below the cap, and A > 0, and the ordinary lower clip: unchanged
    assert _single("grpo", math.log(2.0), -1.0, cfg) == pytest.approx((2.0, 2.0, 0.0))
    assert _single("grpo", math.log(5.0), 1.0, cfg) == pytest.approx((-1.2, 0.0, 1.0))
    assert _single("grpo", math.log(0.5), -1.0, cfg) == pytest.approx((0.8, 0.0, 1.0))
    assert _single("dapo", math.log(4.0), -0.5, cfg) == pytest.approx((1.5, 0.0, 1.0))


# ----------------------------------------------------------------------------- aggregation


def test_token_level_and_sequence_level_aggregation_differ_on_unequal_lengths():
    mask = _t([[1, 1, 1, 1], [1, 0, 0, 0]])
    adv = _t([1.0, 2.0])
    logp = torch.zeros(2, 4, dtype=DT)
    # each token's loss is -A_i at rho = 1
    grpo = _run("grpo", logp, logp, adv, mask)[0].loss.item()
    dapo = _run("dapo", logp, logp, adv, mask)[0].loss.item()
    assert grpo == pytest.approx((-1.0 + -2.0) / 2)  # mean of sequence means
    assert dapo == pytest.approx((-4 * 1.0 - 2.0) / 5)  # mean over the 5 tokens
    assert _run("dr_grpo", logp, logp, adv, mask, LossConfig(max_completion_length=10))[
        0
    ].loss.item() == pytest.approx(-6.0 / (10 * 2))
    # without max_completion_length the padded length T = 4 is the constant
    assert _run("dr_grpo", logp, logp, adv, mask)[0].loss.item() == pytest.approx(-6.0 / 8)


def test_dr_grpo_constant_does_not_depend_on_lengths():
    cfg = LossConfig(max_completion_length=8)
    adv = _t([1.0])
    for length in (1, 3, 6):
        mask = torch.zeros(1, 6, dtype=DT)
        mask[0, :length] = 1
        logp = torch.zeros(1, 6, dtype=DT)
        _, grad = _run("dr_grpo", logp, logp, adv, mask, cfg)
        torch.testing.assert_close(grad, -mask / 8)


# ----------------------------------------------------------------------------- gspo


def test_gspo_uses_the_sequence_ratio():
    mask = _t([[1.0, 1.0]])
    old = torch.zeros(1, 2, dtype=DT)
    # token ratios exp(+-0.4) are far outside a token clip range, the sequence ratio is 1
    out, grad = _run("gspo", _t([[0.4, -0.4]]), old, _t([1.0]), mask)
    assert out.loss.item() == pytest.approx(-1.0)
    torch.testing.assert_close(grad, _t([[-0.5, -0.5]]))
    assert out.metrics["clip_fraction"] == 0.0 and out.metrics["ratio_mean"] == pytest.approx(1)
    # inside the tiny range: s = exp(1e-4), loss -A s, gradient -A s / |y| per token
    s = math.exp(1e-4)
    out, grad = _run("gspo", _t([[2e-4, 0.0]]), old, _t([1.0]), mask)
    assert out.loss.item() == pytest.approx(-s)
    torch.testing.assert_close(grad, _t([[-s / 2, -s / 2]]))
    assert out.metrics["ratio_max"] == pytest.approx(s)


def test_gspo_clipping():
    mask = _t([[1.0, 1.0]])
    old = torch.zeros(1, 2, dtype=DT)
    # A > 0, s = exp(0.1) > 1 + 4e-4: clipped
    out, grad = _run("gspo", _t([[0.2, 0.0]]), old, _t([1.0]), mask)
    assert out.loss.item() == pytest.approx(-(1 + 4e-4))
    assert torch.all(grad == 0) and out.metrics["clip_fraction"] == 1.0
    # A < 0, s = exp(-0.1) < 1 - 3e-4: clipped
    out, grad = _run("gspo", _t([[-0.2, 0.0]]), old, _t([-1.0]), mask)
    assert out.loss.item() == pytest.approx(1 - 3e-4)
    assert torch.all(grad == 0)
    # A < 0, s = exp(0.1) above the range: unclipped, loss -A s, gradient -A s / 2
    s = math.exp(0.1)
    out, grad = _run("gspo", _t([[0.2, 0.0]]), old, _t([-1.0]), mask)
    assert out.loss.item() == pytest.approx(s)
    torch.testing.assert_close(grad, _t([[s / 2, s / 2]]))


def test_gspo_ignores_sequences_without_tokens():
    logp = torch.zeros(2, 2, dtype=DT)
    mask = _t([[1.0, 1.0], [0.0, 0.0]])
    out, _ = _run("gspo", logp, logp, _t([1.0, 5.0]), mask)
    assert out.loss.item() == pytest.approx(-1.0 / 2)


# ----------------------------------------------------------------------------- KL


def test_k3_values():
    assert k3_kl(_t(0.0), _t(-1.0)).item() == pytest.approx(math.exp(-1.0))  # e^-1 + 1 - 1
    assert k3_kl(_t(-1.0), _t(0.0)).item() == pytest.approx(math.e - 2)
    assert k3_kl(_t(-0.7), _t(-0.7)).item() == 0.0


@settings(max_examples=200, deadline=None)
@given(st.floats(-15, 0), st.floats(-15, 0))
def test_k3_is_nonnegative(logp, ref):
    assert k3_kl(_t(logp), _t(ref)).item() >= 0.0


@pytest.mark.parametrize("name", ALL)
def test_kl_is_aggregated_like_the_policy_term(name):
    logp = _t([[-1.0, -2.0, -0.5], [-1.5, 3.0, 3.0]])
    ref = _t([[-1.5, -1.0, -0.5], [-0.5, 9.0, 9.0]])
    cfg = LossConfig(kl_beta=0.5, max_completion_length=5)
    zero_adv = torch.zeros(2, dtype=DT)
    out, grad = _run(name, logp, logp.clone(), zero_adv, MASK, cfg, ref_logp=ref)
    k3 = k3_kl(logp, ref) * MASK
    norm = _normaliser(name, MASK, cfg)
    assert out.loss.item() == pytest.approx(0.5 * (k3 / norm).sum().item())
    # d k3 / d logp = 1 - exp(ref - logp)
    torch.testing.assert_close(grad, 0.5 * (1 - torch.exp(ref - logp)) * MASK / norm)
    assert out.metrics["kl"] == pytest.approx((k3.sum() / 4).item())
    # at ref == logp the penalty is 0, and without ref_logp there is no kl metric
    out = _run(name, logp, logp.clone(), zero_adv, MASK, cfg, ref_logp=logp.clone())[0]
    assert out.loss.item() == 0.0 and out.metrics["kl"] == 0.0
    assert "kl" not in _run(name, logp, logp.clone(), zero_adv, MASK, cfg)[0].metrics


# ----------------------------------------------------------------------------- masking


def _random_batch(seed: int, batch: int, length: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=DT) * 3
    logp = old + torch.randn(batch, length, generator=g, dtype=DT) * 0.3
    ref = old + torch.randn(batch, length, generator=g, dtype=DT) * 0.3
    adv = torch.randn(batch, generator=g, dtype=DT)
    mask = (torch.rand(batch, length, generator=g) < 0.7).to(DT)
    mask[0, 0] = 1.0
    return logp, old, ref, adv, mask


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(ALL),
    st.integers(0, 10_000),
    st.sampled_from([0.0, 1e6, -1e6, float("inf"), float("-inf"), float("nan")]),
)
def test_masked_positions_change_nothing(name, seed, garbage):
    logp, old, ref, adv, mask = _random_batch(seed, 3, 5)
    cfg = LossConfig(kl_beta=0.1, dual_clip=3.0)
    out, grad = _run(name, logp, old, adv, mask, cfg, ref_logp=ref)
    dirty = torch.where(mask.bool(), logp, _t(garbage))
    dirty_old = torch.where(mask.bool(), old, _t(-garbage))
    dirty_ref = torch.where(mask.bool(), ref, _t(garbage))
    out2, grad2 = _run(name, dirty, dirty_old, adv, mask, cfg, ref_logp=dirty_ref)
    torch.testing.assert_close(out2.loss, out.loss, rtol=0, atol=0)
    torch.testing.assert_close(grad2, grad, rtol=0, atol=0)
    assert torch.all(grad[~mask.bool()] == 0)
    assert out2.metrics == out.metrics


# ----------------------------------------------------------------------------- micro-batching


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(ALL),
    st.integers(0, 10_000),
    st.integers(2, 6),
    st.integers(1, 7),
    st.data(),
)
def test_micro_batches_reproduce_the_full_batch(name, seed, batch, length, data):
    split = data.draw(st.integers(1, batch - 1))
    logp, old, ref, adv, mask = _random_batch(seed, batch, length)
    cfg = LossConfig(kl_beta=0.05, dual_clip=3.0, max_completion_length=length + 2)
    full, full_grad = _run(name, logp, old, adv, mask, cfg, ref_logp=ref)

    denominators = {"seq_denominator": batch, "token_denominator": mask.sum().item()}
    total = torch.zeros((), dtype=DT)
    grads = []
    for rows in (slice(0, split), slice(split, batch)):
        part, part_grad = _run(
            name, logp[rows], old[rows], adv[rows], mask[rows], cfg, ref_logp=ref[rows],
            **denominators,
        )
        total = total + part.loss.detach()
        grads.append(part_grad)
    torch.testing.assert_close(total, full.loss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat(grads), full_grad, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ALL)
def test_bad_shapes_raise(name):
    logp = torch.zeros(2, 3, dtype=DT)
    adv = torch.zeros(2, dtype=DT)
    with pytest.raises(ValueError, match="old_logp"):
        _call(name, logp, torch.zeros(2, 4, dtype=DT), adv, MASK)
    with pytest.raises(ValueError, match="mask"):
        _call(name, logp, logp, adv, torch.ones(3, 3, dtype=DT))
    with pytest.raises(ValueError, match="advantages"):
        _call(name, logp, logp, torch.zeros(2, 1, dtype=DT), MASK)
    with pytest.raises(ValueError, match="ref_logp"):
        _call(name, logp, logp, adv, MASK, ref_logp=torch.zeros(2, dtype=DT))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        _call(name, torch.zeros(6, dtype=DT), torch.zeros(6, dtype=DT), adv, MASK)
    with pytest.raises(ValueError, match="only 0 and 1"):
        _call(name, logp, logp, adv, MASK * 0.5)
    with pytest.raises(ValueError, match="denominators"):
        _call(name, logp, logp, adv, MASK, token_denominator=0)


def test_inputs_fill_in_the_denominators_of_a_batch_on_its_own():
    logp = torch.zeros(2, 3, dtype=DT)
    x = _inputs("grpo", logp, logp, ADV, MASK)
    assert (x.seq_denominator, x.token_denominator) == (2.0, 4.0)
    x = _inputs("grpo", logp, logp, ADV, MASK, seq_denominator=8, token_denominator=30)
    assert (x.seq_denominator, x.token_denominator) == (8.0, 30.0)
    empty = _inputs("grpo", logp, logp, ADV, torch.zeros_like(MASK))
    assert empty.token_denominator == 1.0  # never a division by zero
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.logp = logp


@pytest.mark.parametrize(
    "kwargs",
    [
        {"clip_low": -0.1},
        {"clip_low": 1.5},
        {"dual_clip": 1.0},
        {"kl_beta": -1.0},
        {"max_completion_length": 0},
        {"cispo_clip_low": 2.0},
    ],
)
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LossConfig(**kwargs)


def test_bool_mask_is_accepted():
    logp = torch.zeros(2, 3, dtype=DT)
    a = _call("grpo", logp, logp, ADV, MASK, LossConfig()).loss
    b = _call("grpo", logp, logp, ADV, MASK.bool(), LossConfig()).loss
    assert a.item() == b.item() == pytest.approx(0.5)


@pytest.mark.parametrize("name", ALL)
def test_half_precision_log_probs_are_computed_in_float32(name):
    logp64, old, _, adv, mask = _random_batch(7, 3, 4)
    out64, _ = _run(name, logp64, old, adv, mask)
    out16, grad16 = _run(name, logp64.bfloat16(), old.bfloat16(), adv, mask)
    assert out16.loss.dtype == torch.float32 and grad16.dtype == torch.bfloat16
    # only the inputs' rounding to bfloat16 differs
    torch.testing.assert_close(out16.loss.double(), out64.loss, rtol=0.05, atol=0.02)


# ----------------------------------------------------------------------------- options


def test_gspo_honours_clip_low_and_clip_high():
    from corrgrpo.trainer.losses import resolve_loss_config

    cfg = resolve_loss_config("gspo", {"clip_low": 0.05, "clip_high": 0.1})
    assert (cfg.clip_low, cfg.clip_high) == (0.05, 0.1)
    mask, old = _t([[1.0, 1.0]]), torch.zeros(1, 2, dtype=DT)
    # A < 0, s = exp(-0.2) < 1 - 0.05: clipped at 0.95 (the default 3e-4 would clip at 0.9997)
    out, grad = _run("gspo", _t([[-0.4, 0.0]]), old, _t([-1.0]), mask, cfg)
    assert out.loss.item() == pytest.approx(0.95) and torch.all(grad == 0)
    # s = exp(-0.02) lies inside [0.95, 1.1]: unclipped
    out, _ = _run("gspo", _t([[-0.04, 0.0]]), old, _t([-1.0]), mask, cfg)
    assert out.loss.item() == pytest.approx(math.exp(-0.02))


def test_loss_options_are_validated():
    from corrgrpo.trainer.losses import LossConfigError, resolve_loss_config

    with pytest.raises(LossConfigError, match="unknown option 'clip_lo' of loss 'grpo'") as info:
        resolve_loss_config("grpo", {"clip_lo": 0.1})
    assert info.value.key == "clip_lo"
    with pytest.raises(LossConfigError, match=r"clip_low: 1.5 is out of range; allowed: >= 0 and <= 1"):
        resolve_loss_config("gspo", {"clip_low": 1.5})
    with pytest.raises(LossConfigError, match="clip_high: inf is out of range"):
        resolve_loss_config("dapo", {"clip_high": float("inf")})
    with pytest.raises(LossConfigError, match="agg_mode"):
        resolve_loss_config("grpo", {}, agg_mode="sum")
    assert resolve_loss_config("cispo", {"cispo_clip_low": 0.5}).cispo_clip_low == 0.5


# MASK/ADV: a 3-token sequence with A = 1 and a 1-token sequence with A = -2; at ratio 1 each
# PPO token term is -A, so the loss is minus these means of A:
@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("token-mean", (3 * 1.0 + 1 * -2.0) / 4),
        ("seq-mean-token-sum", (3 * 1.0 + 1 * -2.0) / 2),
        ("seq-mean-token-mean", (1.0 + -2.0) / 2),
        ("seq-mean-token-sum-norm", (3 * 1.0 + 1 * -2.0) / (5 * 2)),
    ],
)
def test_aggregation_modes_hand_computed(mode, want):
    from corrgrpo.trainer.losses import resolve_loss_config

    logp = torch.zeros(2, 3, dtype=DT)
    for name in ("grpo", "dapo", "dr_grpo", "gspo"):
        cfg = resolve_loss_config(name, {"max_completion_length": 5}, agg_mode=mode)
        out = _call(name, logp, logp, ADV, MASK, cfg)
        assert out.loss.item() == pytest.approx(-want), (name, mode)


def test_nan_advantage_on_a_fully_masked_row_never_reaches_the_loss():
    logp = torch.zeros(2, 3, dtype=DT)
    mask = _t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    for name in ALL:
        out, grad = _run(name, logp, logp, _t([1.0, float("nan")]), mask)
        assert math.isfinite(out.loss.item()) and torch.isfinite(grad).all(), name
        with pytest.raises(ValueError, match="row 0"):
            _call(name, logp, logp, _t([float("nan"), 1.0]), mask)


def test_token_weights_scale_the_policy_term_only():
    logp = torch.zeros(2, 3, dtype=DT)
    weights = _t([[2.0, 2.0, 2.0], [0.5, 9.0, 9.0]])
    for name in ALL:
        plain, g_plain = _run(name, logp, logp, ADV, MASK)
        weighted, g_weighted = _run(name, logp, logp, ADV, MASK, token_weights=weights)
        if name == "gspo":  # one term per sequence, given to each token: the row's mean weight
            torch.testing.assert_close(g_weighted, g_plain * _t([[2.0], [0.5]]))
        else:
            torch.testing.assert_close(g_weighted, g_plain * weights * MASK)


def test_loss_entry_point(tmp_path, monkeypatch):
    import sys
    import textwrap

    (tmp_path / "my_losses.py").write_text(textwrap.dedent("""
        from corrgrpo.trainer.losses import LossInputs, LossOutput

        def reinforce(inputs: LossInputs) -> LossOutput:
            x = inputs
            return LossOutput(-(x.advantages[:, None] * x.logp * x.mask).sum() / x.token_denominator)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_loss("my_losses:reinforce").__name__ == "reinforce"
    assert _call("my_losses:reinforce", _t([[2.0]]), _t([[0.0]]), _t([1.0]), _t([[1.0]])).loss == -2
    with pytest.raises(ValueError, match="cannot import"):
        get_loss("no_such_module_abc:fn")
    sys.modules.pop("my_losses", None)


# ----------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("name", ALL)
def test_micro_batch_metrics_combine_to_the_full_batch_metrics(name):
    """Means keep their weights and maxima stay maxima when a batch is split unevenly."""
    from corrgrpo.trainer.loss_metrics import MetricAccumulator

    logp, old, ref, adv, mask = _random_batch(11, 8, 5)
    logp = logp + torch.linspace(-0.6, 0.6, 40, dtype=DT).view(8, 5)  # ratios far from 1
    cfg = LossConfig(kl_beta=0.05, dual_clip=3.0)
    full = _call(name, logp, old, adv, mask, cfg, ref_logp=ref)
    acc = MetricAccumulator()
    for rows in (slice(0, 5), slice(5, 8)):
        part = _call(name, logp[rows], old[rows], adv[rows], mask[rows], cfg, ref_logp=ref[rows])
        acc.add(part.metrics)
    combined = acc.reduce()
    for key in ("clip_fraction", "ratio_mean", "ratio_max", "kl"):
        assert combined[key] == pytest.approx(float(full.metrics[key]), rel=1e-12), key


# ----------------------------------------------------------------------------- sft


def _sft(logp, mask, **kw) -> tuple[LossOutput, torch.Tensor]:
    logp = logp.clone().requires_grad_(True)
    out = get_loss("sft")(LossInputs(logp=logp, mask=mask, options=default_config("sft"), **kw))
    out.loss.backward()
    return out, logp.grad


def test_sft_loss_is_the_hand_computed_cross_entropy():
    # the trained tokens had probabilities 1/2, 1/4 (row 0) and 1/8 (row 1): cross-entropies
    # ln 2, 2 ln 2, 3 ln 2, mean 2 ln 2; the masked positions hold garbage that must not count
    logp = _t([[math.log(1 / 2), math.log(1 / 4), float("nan")], [math.log(1 / 8), -float("inf"), 0.0]])
    mask = _t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out, grad = _sft(logp, mask)
    assert out.loss.item() == pytest.approx(2 * math.log(2), rel=1e-12)
    assert out.metrics["cross_entropy"] == pytest.approx(2 * math.log(2), rel=1e-12)
    assert out.metrics["cross_entropy"].weight == 3
    # d loss / d logp = -1 / (trained tokens) on each trained token, 0 elsewhere
    torch.testing.assert_close(grad, _t([[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]]))
    # no advantages, no old log-probabilities: the policy-gradient losses refuse such inputs
    for name in ALL:
        with pytest.raises(ValueError, match="needs LossInputs.advantages, got None"):
            get_loss(name)(LossInputs(logp=logp, mask=mask, options=default_config(name)))
    with pytest.raises(ValueError, match="needs LossInputs.old_logp, got None"):
        get_loss("grpo")(LossInputs(logp=logp, mask=mask, advantages=ADV, options=default_config("grpo")))


def test_sft_micro_batches_with_the_whole_batch_denominator_add_up():
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand((4, 5), generator=g, dtype=DT) * 4
    mask = (torch.rand((4, 5), generator=g) < 0.6).to(DT)
    whole, whole_grad = _sft(logp, mask)
    tokens = float(mask.sum())
    assert whole.loss.item() == pytest.approx(float(-(logp * mask).sum()) / tokens, rel=1e-12)
    parts = [_sft(logp[rows], mask[rows], seq_denominator=4, token_denominator=tokens)
             for rows in (slice(0, 1), slice(1, 4))]
    assert sum(p[0].loss.item() for p in parts) == pytest.approx(whole.loss.item(), rel=1e-12)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole_grad)
    # another averaging is the configured one's, as for every loss: each row's mean
    cfg = dataclasses.replace(default_config("sft"), agg_mode="seq-mean-token-mean")
    out = get_loss("sft")(LossInputs(logp=logp, mask=mask, options=cfg))
    rows = (-(logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    assert out.loss.item() == pytest.approx(rows.item(), rel=1e-12)
    # the shapes are checked as for every loss
    with pytest.raises(ValueError, match=r"old_logp must have the shape of logp \(4, 5\)"):
        LossInputs(logp=logp, mask=mask, old_logp=logp[:, :2], options=cfg)
