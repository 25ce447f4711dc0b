"""Policy-gradient losses for grouped rollouts (GRPO and its variants).

Every loss has the signature

    fn(logp, old_logp, advantages, mask, cfg, *, ref_logp=None,
       seq_denominator=None, token_denominator=None) -> LossOutput

with ``logp``, ``old_logp``, ``ref_logp`` and ``mask`` of shape ``[B, T]`` (``mask`` is 1 on
the completion tokens the policy generated, 0 on prompt, tool-result and padding tokens) and
``advantages`` of shape ``[B]`` (one advantage per sequence).

The losses differ in how per-token terms are aggregated:

- ``grpo``: mean over a sequence's tokens, then over sequences;
- ``dapo`` and ``cispo``: mean over all tokens of the batch (token level);
- ``dr_grpo``: token sum divided by ``max_completion_length`` and the number of sequences;
- ``gspo``: one term per sequence (a sequence-level ratio), mean over sequences.

The denominators are arguments so that gradient accumulation reproduces the full-batch
loss exactly: when a batch is split into micro-batches (or spread over processes), pass the
full batch's ``seq_denominator`` (number of sequences) and ``token_denominator`` (number of
masked tokens) to every call, and the sum of the micro-batch losses equals the full-batch
loss, and so do the gradients.

The optional KL penalty (k3 estimator against a frozen reference, weight ``kl_beta``) is added
to each token's term before aggregation, so it is aggregated like the policy term.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = [
    "LossConfig",
    "LossFn",
    "LossOutput",
    "available_losses",
    "default_config",
    "get_loss",
    "k3_kl",
    "register_loss",
]

# exp() of a log-ratio beyond this is a numerical accident, not a policy change; clamping keeps
# the ratio finite (the clamped region gets no gradient, as it would under clipping anyway).
_MAX_LOG_RATIO = 20.0


@dataclass
class LossConfig:
    """Hyper-parameters of the policy losses (each loss reads the fields it needs)."""

    clip_low: float = 0.2
    """PPO clip range below 1: ratios under ``1 - clip_low`` are clipped (grpo, dapo, dr_grpo)."""

    clip_high: float = 0.2
    """Clip range above 1: ratios over ``1 + clip_high`` are clipped (grpo, dapo, dr_grpo,
    and the upper bound of cispo's importance weight). DAPO's clip-higher uses 0.28."""

    dual_clip: float | None = None
    """Dual-clip constant c (> 1) for tokens with A < 0: the token loss is capped at ``-c * A``
    (grpo, dapo, dr_grpo). ``None`` disables it; the paper's runs use 3."""

    kl_beta: float = 0.0
    """Weight of the k3 KL penalty to the reference policy; used only when ``ref_logp`` is
    given."""

    max_completion_length: int | None = None
    """dr_grpo's constant normaliser (the maximum completion length in tokens); ``None`` uses
    the padded length T of the batch, which is only right when T is that maximum."""

    gspo_clip_low: float = 3e-4
    """gspo's clip range below 1 for the sequence-level ratio."""

    gspo_clip_high: float = 4e-4
    """gspo's clip range above 1 for the sequence-level ratio."""

    cispo_clip_low: float | None = None
    """Lower clip range of cispo's importance weight (bound ``1 - cispo_clip_low``). ``None``
    means no lower bound, as in MiniMax-M1, which only bounds the weight from above (with
    ``1 + clip_high``)."""

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high", "gspo_clip_low", "gspo_clip_high", "kl_beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"LossConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.clip_low > 1 or self.gspo_clip_low > 1:
            raise ValueError("LossConfig.clip_low and gspo_clip_low must be <= 1")
        if self.cispo_clip_low is not None and not 0 <= self.cispo_clip_low <= 1:
            raise ValueError(
                f"LossConfig.cispo_clip_low must be None or in [0, 1], got {self.cispo_clip_low}"
            )
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"LossConfig.dual_clip must be None or > 1, got {self.dual_clip}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(
                "LossConfig.max_completion_length must be None or >= 1, "
                f"got {self.max_completion_length}"
            )


@dataclass
class LossOutput:
    """A loss value to back-propagate and scalar diagnostics of this (micro-)batch."""

    loss: torch.Tensor
    """Scalar loss; its gradient flows to ``logp``."""

    metrics: dict[str, float] = field(default_factory=dict)
    """``clip_fraction`` (share of masked tokens where clipping acts), ``ratio_mean``,
    ``ratio_max`` (of the ratio the loss clips: per token, or per sequence for gspo) and
    ``kl`` (mean k3 over masked tokens, only when ``ref_logp`` is given)."""


LossFn = Callable[..., LossOutput]

_LOSSES: dict[str, LossFn] = {}
_DEFAULTS: dict[str, LossConfig] = {}


def register_loss(name: str, *, defaults: LossConfig | None = None) -> Callable[[LossFn], LossFn]:
    """Decorator that registers a loss under ``name``, with its paper's default config."""

    def decorator(fn: LossFn) -> LossFn:
        if name in _LOSSES:
            raise ValueError(f"a loss named {name!r} is already registered")
        _LOSSES[name] = fn
        _DEFAULTS[name] = defaults if defaults is not None else LossConfig()
        return fn

    return decorator


def available_losses() -> list[str]:
    """Names of the registered losses, sorted."""
    return sorted(_LOSSES)


def get_loss(name: str) -> LossFn:
    """The loss registered under ``name``."""
    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(available_losses())}")
    return _LOSSES[name]


def default_config(name: str) -> LossConfig:
    """A fresh copy of the default config of loss ``name`` (its paper's settings)."""
    get_loss(name)  # raises for unknown names
    return dataclasses.replace(_DEFAULTS[name])


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp.

    It is >= 0 and 0 where ``logp == ref_logp``.
    """
    delta = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(delta) - delta - 1.0


# ----------------------------------------------------------------------------- shared pieces


@dataclass
class _Batch:
    """Validated inputs, with masked-out positions zeroed (so garbage there, even inf or nan,
    cannot leak into the loss or its gradient)."""

    logp: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor  # [B, 1], broadcasts over tokens
    mask: torch.Tensor  # float {0, 1}
    seq_denominator: float
    token_denominator: float


def _prepare(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    seq_denominator: float | None,
    token_denominator: float | None,
) -> _Batch:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}")
    shape = logp.shape
    named = {"old_logp": old_logp, "mask": mask}
    if ref_logp is not None:
        named["ref_logp"] = ref_logp
    for name, tensor in named.items():
        if tensor.shape != shape:
            raise ValueError(
                f"{name} must have the shape of logp {tuple(shape)}, got {tuple(tensor.shape)}"
            )
    if advantages.shape != shape[:1]:
        raise ValueError(f"advantages must have shape [{shape[0]}], got {tuple(advantages.shape)}")
    keep = mask.bool()
    if mask.dtype != torch.bool and not torch.equal(mask, keep.to(mask.dtype)):
        raise ValueError("mask must hold only 0 and 1")
    if seq_denominator is None:
        seq_denominator = shape[0]
    if token_denominator is None:
        token_denominator = max(1.0, float(keep.sum()))
    if float(seq_denominator) <= 0 or float(token_denominator) <= 0:
        raise ValueError(
            f"denominators must be > 0, got seq_denominator={seq_denominator}, "
            f"token_denominator={token_denominator}"
        )

    # Half-precision log-probs lose the small differences the ratio is made of: compute in
    # at least float32 (the gradient still flows back to logp in its own dtype).
    dtype = torch.promote_types(logp.dtype, torch.float32)

    def clean(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).masked_fill(~keep, 0.0)

    return _Batch(
        logp=clean(logp),
        # old and reference log-probs are constants of the update
        old_logp=clean(old_logp.detach()),
        ref_logp=None if ref_logp is None else clean(ref_logp.detach()),
        advantages=advantages.detach().to(dtype).unsqueeze(-1),
        mask=keep.to(dtype),
        seq_denominator=float(seq_denominator),
        token_denominator=float(token_denominator),
    )


def _token_ratio(b: _Batch) -> torch.Tensor:
    return torch.exp((b.logp - b.old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def _ppo_clip_terms(
    b: _Batch, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped loss (with optional dual clip), the ratio and the clip indicator."""
    ratio = _token_ratio(b)
    unclipped = -b.advantages * ratio
    clipped = -b.advantages * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    # max of the two losses == -min of the two objectives (the pessimistic bound)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    if cfg.dual_clip is not None:
        # Dual clip (Ye et al. 2020): for A < 0 a huge ratio would make the loss unbounded;
        # cap it at -c * A (> 0), which also removes its gradient there.
        cap = -b.advantages * cfg.dual_clip
        dual_active = (b.advantages < 0) & (loss > cap)
        loss = torch.where(dual_active, cap.expand_as(loss), loss)
        clip_active = clip_active | dual_active
    return loss, ratio, clip_active


def _add_kl(token_loss: torch.Tensor, b: _Batch, cfg: LossConfig) -> torch.Tensor:
    if b.ref_logp is None or cfg.kl_beta == 0:
        return token_loss
    return token_loss + cfg.kl_beta * k3_kl(b.logp, b.ref_logp)


def _metrics(
    b: _Batch, ratio: torch.Tensor, clip_active: torch.Tensor, ratio_mask: torch.Tensor
) -> dict[str, float]:
    """Diagnostics of this micro-batch; ``ratio_mask`` selects the ratios to summarise."""
    with torch.no_grad():
        n_tokens = b.mask.sum().clamp(min=1.0)
        n_ratios = ratio_mask.sum()
        metrics = {
            "clip_fraction": float((clip_active.to(b.mask.dtype) * b.mask).sum() / n_tokens),
            "ratio_mean": float((ratio * ratio_mask).sum() / n_ratios.clamp(min=1.0)),
            "ratio_max": float(ratio[ratio_mask.bool()].max()) if n_ratios > 0 else 1.0,
        }
        if b.ref_logp is not None:
            metrics["kl"] = float((k3_kl(b.logp, b.ref_logp) * b.mask).sum() / n_tokens)
    return metrics


def _sequence_mean_loss(token_loss: torch.Tensor, b: _Batch) -> torch.Tensor:
    """sum_i (sum_t l_it m_it / max(1, |y_i|)) / seq_denominator."""
    lengths = b.mask.sum(-1).clamp(min=1.0)
    return ((token_loss * b.mask).sum(-1) / lengths).sum() / b.seq_denominator


def _token_mean_loss(token_loss: torch.Tensor, b: _Batch) -> torch.Tensor:
    """sum_it l_it m_it / token_denominator."""
    return (token_loss * b.mask).sum() / b.token_denominator


# ----------------------------------------------------------------------------- losses


@register_loss("grpo")
def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_denominator: float | None = None,
    token_denominator: float | None = None,
) -> LossOutput:
    """GRPO (DeepSeekMath): PPO clip per token, mean over each sequence, then over sequences."""
    b = _prepare(logp, old_logp, advantages, mask, ref_logp, seq_denominator, token_denominator)
    token_loss, ratio, clip_active = _ppo_clip_terms(b, cfg)
    loss = _sequence_mean_loss(_add_kl(token_loss, b, cfg), b)
    return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))


@register_loss("dapo", defaults=LossConfig(clip_low=0.2, clip_high=0.28))
def dapo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_denominator: float | None = None,
    token_denominator: float | None = None,
) -> LossOutput:
    """DAPO: PPO clip with clip-higher (0.2 / 0.28), mean over all tokens of the batch.

    Dynamic sampling and overlong shaping act on the data and rewards, not here.
    """
    b = _prepare(logp, old_logp, advantages, mask, ref_logp, seq_denominator, token_denominator)
    token_loss, ratio, clip_active = _ppo_clip_terms(b, cfg)
    loss = _token_mean_loss(_add_kl(token_loss, b, cfg), b)
    return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))


@register_loss("dr_grpo")
def dr_grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_denominator: float | None = None,
    token_denominator: float | None = None,
) -> LossOutput:
    """Dr. GRPO: PPO clip, token sum over a constant (max completion length x sequences).

    A constant normaliser removes GRPO's length bias; pair it with the ``none`` advantage
    divisor.
    """
    b = _prepare(logp, old_logp, advantages, mask, ref_logp, seq_denominator, token_denominator)
    token_loss, ratio, clip_active = _ppo_clip_terms(b, cfg)
    max_length = cfg.max_completion_length or logp.shape[1]
    loss = (_add_kl(token_loss, b, cfg) * b.mask).sum() / (max_length * b.seq_denominator)
    return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))


@register_loss("cispo", defaults=LossConfig(clip_high=0.28, cispo_clip_low=None))
def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_denominator: float | None = None,
    token_denominator: float | None = None,
) -> LossOutput:
    """CISPO (MiniMax-M1): -sg(clip(rho, 1 - e_low, 1 + e_high)) * A * logp, token mean.

    The importance weight is clipped and detached instead of the update, so clipped tokens
    still get a gradient (scaled by the clipped weight). The lower bound is
    ``1 - cfg.cispo_clip_low`` (none by default); the upper bound is ``1 + cfg.clip_high``.
    """
    b = _prepare(logp, old_logp, advantages, mask, ref_logp, seq_denominator, token_denominator)
    ratio = _token_ratio(b)
    low = 0.0 if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
    high = 1.0 + cfg.clip_high
    weight = ratio.detach().clamp(low, high)
    token_loss = -weight * b.advantages * b.logp
    loss = _token_mean_loss(_add_kl(token_loss, b, cfg), b)
    clip_active = (ratio < low) | (ratio > high)
    return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))


@register_loss("gspo")
def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    seq_denominator: float | None = None,
    token_denominator: float | None = None,
) -> LossOutput:
    """GSPO: PPO clip on the sequence ratio s_i = exp(mean_t(logp - old_logp)), per sequence.

    The clip range is tiny (3e-4 / 4e-4) because s_i is a geometric mean of token ratios.
    Sequences without masked tokens contribute nothing. The KL term, if any, is a per-sequence
    token mean, as in ``grpo``.
    """
    b = _prepare(logp, old_logp, advantages, mask, ref_logp, seq_denominator, token_denominator)
    lengths = b.mask.sum(-1)
    has_tokens = (lengths > 0).to(b.mask.dtype)
    mean_log_ratio = (b.logp - b.old_logp).sum(-1) / lengths.clamp(min=1.0)
    seq_ratio = torch.exp(mean_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    adv = b.advantages.squeeze(-1)
    unclipped = -adv * seq_ratio
    clipped = -adv * seq_ratio.clamp(1.0 - cfg.gspo_clip_low, 1.0 + cfg.gspo_clip_high)
    seq_loss = torch.maximum(unclipped, clipped) * has_tokens
    if b.ref_logp is not None and cfg.kl_beta != 0:
        kl = (k3_kl(b.logp, b.ref_logp) * b.mask).sum(-1) / lengths.clamp(min=1.0)
        seq_loss = seq_loss + cfg.kl_beta * kl
    loss = seq_loss.sum() / b.seq_denominator
    clip_active = (clipped > unclipped).unsqueeze(-1).expand_as(b.mask)
    return LossOutput(
        loss, _metrics(b, seq_ratio.unsqueeze(-1), clip_active, has_tokens.unsqueeze(-1))
    )
