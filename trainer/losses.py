"""The training losses: policy-gradient losses for grouped rollouts (GRPO and its variants)
and supervised fine-tuning's cross-entropy (``sft``), one update loop for all
(:class:`corrgrpo.trainer.update.PolicyUpdater`).

A loss is a function of one :class:`LossInputs` that returns one :class:`LossOutput`::

    fn(inputs: LossInputs) -> LossOutput

``inputs`` holds ``logp``, ``old_logp``, ``ref_logp``, ``mask`` and ``token_weights`` of shape
``[B, T]`` (``mask`` is 1 on the tokens being trained: the completion tokens the policy
generated, or SFT's assistant tokens; 0 on prompt, tool-result and padding tokens;
``token_weights`` are constant per-token factors of the policy term, e.g. truncated importance
weights against the sampler), ``advantages`` and ``sequence_weights`` of shape ``[B]`` (the
latter a constant factor of each sequence's policy term, e.g. GD²PO's per-prompt keep weight
from the estimator's ``loss_weight``), the batch denominators and the loss's ``options`` (a
:class:`LossConfig`). ``corrgrpo train`` fills them all; ``corrgrpo sft``
has no rewards and no proximal policy, so its inputs leave ``advantages`` and ``old_logp``
None, and a policy-gradient loss given such inputs raises ValueError. The inputs are checked
when they are built, so every loss, a user's too, sees well-formed tensors.

How per-token terms become one number is ``options.agg_mode`` (verl's ``loss_agg_mode``), by
default the loss's own:

- ``seq-mean-token-mean`` (grpo, gspo): mean over a sequence's tokens, then over sequences;
- ``token-mean`` (dapo, cispo): mean over all tokens of the batch;
- ``seq-mean-token-sum``: each sequence's token sum, mean over sequences;
- ``seq-mean-token-sum-norm`` (dr_grpo): token sums over ``max_completion_length``, mean over
  sequences.

gspo's term is one per sequence (a sequence-level ratio), given to each of its tokens, so its
default mode is exactly the mean over sequences.

The denominators are inputs so that gradient accumulation reproduces the full-batch
loss exactly: when a batch is split into micro-batches (or spread over processes), pass the
full batch's ``seq_denominator`` (number of sequences) and ``token_denominator`` (number of
masked tokens) in every micro-batch's inputs, and the sum of the micro-batch losses equals the full-batch
loss, and so do the gradients. Diagnostics are :mod:`corrgrpo.trainer.loss_metrics` values (means that
keep their weights, maxima) so that they combine exactly over micro-batches and processes.

The optional KL penalty (k3 estimator against a frozen reference, weight ``kl_beta``) is added
to each token's term before aggregation, so it is aggregated like the policy term.

A sequence weight multiplies that sequence's per-token policy terms only: not its KL term, and
not the denominators (a sequence of weight 0 still counts in them). That is how the public
GD²PO code applies its keep weight: Qwen-Applications/GD2PO multiplies the advantage by it
(a factor >= 0 of the advantage is one of every loss's policy term), and DARA's port multiplies
the clipped per-token loss by it before verl's ``masked_mean`` over the unchanged mask, with the
KL loss unweighted. So the loss with weights equals the loss with each advantage multiplied by
its weight, for every loss here.

A loss is looked up by registered name or as an entry point ``package.module:function``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from corrgrpo.trainer.loss_aggregation import AGG_MODES
from corrgrpo.trainer.loss_metrics import Max, Mean
from corrgrpo_registry import Registry
from corrgrpo_registry.settings import ConfigError, Range, num_field, validate

__all__ = [
    "AGG_MODES",
    "LossConfig",
    "LossConfigError",
    "LossFn",
    "LossInputs",
    "LossOutput",
    "LOSSES",
    "aggregate",
    "available_losses",
    "default_config",
    "get_loss",
    "k3_kl",
    "register_loss",
    "resolve_loss_config",
]

# exp() of a log-ratio beyond this is a numerical accident, not a policy change; clamping keeps
# the ratio finite (the clamped region gets no gradient, as it would under clipping anyway).
_MAX_LOG_RATIO = 20.0


class LossConfigError(ConfigError):
    """A loss hyper-parameter is not allowed; ``key`` names the field (of ``loss_options``)."""

    def __init__(self, key: str, message: str):
        super().__init__(message, key)


@dataclass
class LossConfig:
    """Hyper-parameters of the policy losses (each loss reads the fields it needs)."""

    clip_low: float = num_field(0.2, Range(low=0, high=1))
    """Clip range below 1: ratios under ``1 - clip_low`` are clipped (grpo, dapo, dr_grpo, gspo)."""

    clip_high: float = num_field(0.2, Range(low=0))
    """Clip range above 1: ratios over ``1 + clip_high`` are clipped (grpo, dapo, dr_grpo, gspo,
    and the upper bound of cispo's importance weight). DAPO's clip-higher uses 0.28."""

    dual_clip: float | None = num_field(None, Range(low=1, low_open=True))
    """Dual-clip constant c (> 1) for tokens with A < 0: the token loss is capped at ``-c * A``
    (grpo, dapo, dr_grpo). ``None`` disables it; the paper's runs use 3."""

    kl_beta: float = num_field(0.0, Range(low=0))
    """Weight of the k3 KL penalty to the reference policy; used only when ``ref_logp`` is
    given (set by the trainer from ``algorithm.kl_beta``)."""

    max_completion_length: int | None = num_field(None, Range(low=1))
    """The normaliser of ``seq-mean-token-sum-norm`` (the maximum completion length in tokens);
    ``None`` uses the padded length T of the batch, which is only right when T is that maximum.
    The trainer sets it to ``max_new_tokens * max_turns`` unless given."""

    cispo_clip_low: float | None = num_field(None, Range(low=0, high=1))
    """Lower clip range of cispo's importance weight (bound ``1 - cispo_clip_low``). ``None``
    means no lower bound, as in MiniMax-M1, which only bounds the weight from above (with
    ``1 + clip_high``)."""

    agg_mode: str | None = num_field(None, choices=AGG_MODES)
    """One of :data:`AGG_MODES`, or ``None`` for the loss's own (set by the trainer from
    ``algorithm.loss_agg_mode``)."""

    def __post_init__(self) -> None:
        try:  # the ranges above, checked as every setting is (corrgrpo_registry.settings)
            validate(self)
        except ConfigError as exc:
            raise LossConfigError(exc.key or "?", str(exc)) from None


@dataclass(frozen=True, kw_only=True, eq=False)
class LossInputs:
    """Everything a loss reads about one (micro-)batch; checked when built.

    Raises ValueError naming the bad field: a shape that is not ``logp``'s ``[B, T]`` (or
    ``[B]`` for ``advantages``), a mask with values other than 0 and 1, a denominator <= 0, or
    a non-finite advantage on a row with trained tokens. A missing denominator is filled in from
    this batch alone (``B`` sequences, its masked-token count).
    """

    logp: torch.Tensor
    """``[B, T]`` log-probabilities of the tokens under the policy being trained; the loss's
    gradient flows to them."""

    mask: torch.Tensor
    """``[B, T]`` 1 on the tokens being trained (the completion tokens the policy generated;
    SFT's assistant tokens), 0 elsewhere (bool or 0/1)."""

    options: LossConfig
    """The loss's hyper-parameters: its registered defaults with ``algorithm.loss_options``."""

    advantages: torch.Tensor | None = None
    """``[B]`` one advantage per sequence; None without rewards (SFT), which only a loss of the
    tokens alone (``sft``) accepts."""

    old_logp: torch.Tensor | None = None
    """``[B, T]`` log-probabilities under the weights before this step's first update (PPO's
    proximal policy); constants. None without one (SFT), as ``advantages``."""

    ref_logp: torch.Tensor | None = None
    """``[B, T]`` log-probabilities under the frozen reference (for the KL term), or None."""

    token_weights: torch.Tensor | None = None
    """``[B, T]`` constant factors of each token's policy term (truncated importance weights
    against the sampler when ``algorithm.tis_cap`` is set), or None. A loss multiplies its
    policy term by them; a loss that ignores them ignores ``tis_cap``."""

    sequence_weights: torch.Tensor | None = None
    """``[B]`` constant factors (finite, >= 0) of each sequence's policy term (the estimator's
    ``loss_weight``, e.g. GD²PO's keep weight), or None (1 for every sequence). Neither the KL
    term nor the denominators change; ``sft`` ignores them."""

    seq_denominator: float | None = None
    """Number of sequences of the whole (mini-)batch this micro-batch belongs to."""

    token_denominator: float | None = None
    """Number of masked tokens of the whole (mini-)batch this micro-batch belongs to."""

    def __post_init__(self) -> None:
        logp = self.logp
        if logp.dim() != 2:
            raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}")
        shape = logp.shape
        named = {"mask": self.mask, "old_logp": self.old_logp, "ref_logp": self.ref_logp,
                 "token_weights": self.token_weights}
        for name, tensor in named.items():
            if tensor is not None and tensor.shape != shape:
                raise ValueError(
                    f"{name} must have the shape of logp {tuple(shape)}, got {tuple(tensor.shape)}"
                )
        advantages = self.advantages
        if advantages is not None and advantages.shape != shape[:1]:
            raise ValueError(f"advantages must have shape [{shape[0]}], got {tuple(advantages.shape)}")
        weights = self.sequence_weights
        if weights is not None:
            if weights.shape != shape[:1]:
                raise ValueError(f"sequence_weights must have shape [{shape[0]}], got {tuple(weights.shape)}")
            if not (torch.isfinite(weights.detach()).all() and (weights.detach() >= 0).all()):
                raise ValueError("sequence_weights must be finite and >= 0")
        mask = self.mask
        keep = mask.bool()
        if mask.dtype != torch.bool and not torch.equal(mask, keep.to(mask.dtype)):
            raise ValueError("mask must hold only 0 and 1")
        seq_denominator, token_denominator = self.seq_denominator, self.token_denominator
        if seq_denominator is None:
            seq_denominator = shape[0]
        if token_denominator is None:
            token_denominator = max(1.0, float(keep.sum()))
        if float(seq_denominator) <= 0 or float(token_denominator) <= 0:
            raise ValueError(
                f"denominators must be > 0, got seq_denominator={seq_denominator}, "
                f"token_denominator={token_denominator}"
            )
        # A row without trained tokens contributes nothing, whatever its advantage (a NaN there
        # must not turn the loss into NaN); a non-finite advantage on a trained row is a bug upstream.
        if advantages is not None:
            bad = keep.any(dim=1) & ~torch.isfinite(advantages.detach())
            if bad.any():
                row = int(torch.nonzero(bad)[0])
                raise ValueError(f"advantages must be finite on rows with trained tokens; row {row} is "
                                 f"{float(advantages[row])}")
        # frozen: the filled-in denominators are set once, here
        object.__setattr__(self, "seq_denominator", float(seq_denominator))
        object.__setattr__(self, "token_denominator", float(token_denominator))


@dataclass
class LossOutput:
    """A loss value to back-propagate and diagnostics of this (micro-)batch."""

    loss: torch.Tensor
    """Scalar loss; its gradient flows to ``logp``."""

    metrics: dict[str, float] = field(default_factory=dict)
    """``clip_fraction`` (token-weighted share of masked tokens where clipping acts; for gspo
    the share of tokens in clipped sequences), ``ratio_mean`` and ``ratio_max`` (of the ratio
    the loss clips: token-weighted per token, or sequence-weighted per sequence for gspo) and
    ``kl`` (token-weighted mean k3, only when ``ref_logp`` is given); sft's ``cross_entropy``. Values are
    :class:`~corrgrpo.trainer.loss_metrics.Mean` / :class:`~corrgrpo.trainer.loss_metrics.Max` (floats); a plain
    float counts as a mean of weight 1."""


LossFn = Callable[[LossInputs], LossOutput]

#: The losses by name (``algorithm.loss``), each with its paper's default config (metadata
#: ``defaults``); an entry point ``package.module:function`` works without registering.
LOSSES: Registry[LossFn] = Registry("loss")


def register_loss(
    name: str, *, defaults: LossConfig | None = None, override: bool = False
) -> Callable[[LossFn], LossFn]:
    """Decorator that registers a loss under ``name``, with its paper's default config.

    ``defaults`` may be an instance of a ``LossConfig`` subclass that adds the loss's own
    fields; they are then settable from ``algorithm.loss_options`` like the others. Raises
    ValueError when ``name`` is taken unless ``override`` is true.
    """
    return LOSSES.register(name, override=override, defaults=defaults or LossConfig())


def available_losses() -> list[str]:
    """Names of the registered losses, sorted."""
    return LOSSES.names()


def get_loss(name: str) -> LossFn:
    """The loss registered under ``name``, or the function of an entry point ``pkg.mod:fn``."""
    return LOSSES.get(name)


def default_config(name: str) -> LossConfig:
    """A fresh copy of the default config of loss ``name`` (its paper's settings)."""
    get_loss(name)  # raises for unknown names
    return dataclasses.replace(LOSSES.metadata(name).get("defaults") or LossConfig())


def resolve_loss_config(
    name: str, options: Mapping[str, Any] | None = None, *, agg_mode: str | None = None, **fixed: Any
) -> LossConfig:
    """The config of loss ``name``: its defaults, then ``options``, then ``fixed`` and ``agg_mode``.

    Raises :class:`LossConfigError` (with ``.key``) for an unknown option or a value out of
    range, ValueError for an unknown loss.
    """
    cfg = default_config(name)
    allowed = {f.name for f in dataclasses.fields(cfg)} - {"kl_beta", "agg_mode"}
    options = dict(options or {})
    for key in options:
        if key not in allowed:
            raise LossConfigError(
                key, f"unknown option {key!r} of loss {name!r}; accepted: {', '.join(sorted(allowed))}"
            )
    values = {**options, **fixed}
    if agg_mode is not None:
        values["agg_mode"] = agg_mode
    try:
        return dataclasses.replace(cfg, **values)
    except TypeError as exc:
        raise LossConfigError(next(iter(values), "?"), str(exc)) from None


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp.

    It is >= 0 and 0 where ``logp == ref_logp``. Written ``expm1(d) - d``: ``exp(d) - d - 1``
    rounds ``exp(d)`` to 1 for a tiny ``d`` and comes out at ``-d`` (below zero), while
    ``expm1(d) >= d`` holds in floating point as it does exactly.
    """
    delta = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(delta) - delta


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
    token_weights: torch.Tensor | None
    sequence_weights: torch.Tensor | None  # [B, 1]
    seq_denominator: float
    token_denominator: float


def _clean(t: torch.Tensor, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, 0 where ``keep`` is False."""
    return t.to(dtype).masked_fill(~keep, 0.0)


def _prepare(inputs: LossInputs) -> _Batch:
    if inputs.advantages is None or inputs.old_logp is None:
        missing = "advantages" if inputs.advantages is None else "old_logp"
        raise ValueError(f"a policy-gradient loss needs LossInputs.{missing}, got None "
                         "(only a loss of the tokens alone, such as 'sft', runs without)")
    keep = inputs.mask.bool()
    has_tokens = keep.any(dim=1)
    # Half-precision log-probs lose the small differences the ratio is made of: compute in
    # at least float32 (the gradient still flows back to logp in its own dtype).
    dtype = torch.promote_types(inputs.logp.dtype, torch.float32)

    def clean(t: torch.Tensor) -> torch.Tensor:
        return _clean(t, keep, dtype)

    ref_logp, token_weights = inputs.ref_logp, inputs.token_weights
    return _Batch(
        logp=clean(inputs.logp),
        # old and reference log-probs are constants of the update
        old_logp=clean(inputs.old_logp.detach()),
        ref_logp=None if ref_logp is None else clean(ref_logp.detach()),
        advantages=inputs.advantages.detach().to(dtype).masked_fill(~has_tokens, 0.0).unsqueeze(-1),
        mask=keep.to(dtype),
        token_weights=None if token_weights is None else clean(token_weights.detach()),
        sequence_weights=None if inputs.sequence_weights is None
        else inputs.sequence_weights.detach().to(dtype).unsqueeze(-1),
        seq_denominator=float(inputs.seq_denominator),
        token_denominator=float(inputs.token_denominator),
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


def _policy_and_kl(policy_term: torch.Tensor, b: _Batch, cfg: LossConfig) -> torch.Tensor:
    """Per-token loss: the policy term (times the token and sequence weights, if any) plus the
    KL term."""
    if b.token_weights is not None:
        policy_term = policy_term * b.token_weights
    if b.sequence_weights is not None:
        policy_term = policy_term * b.sequence_weights
    if b.ref_logp is None or cfg.kl_beta == 0:
        return policy_term
    return policy_term + cfg.kl_beta * k3_kl(b.logp, b.ref_logp)


def _metrics(
    b: _Batch, ratio: torch.Tensor, clip_active: torch.Tensor, ratio_mask: torch.Tensor
) -> dict[str, float]:
    """Diagnostics of this micro-batch; ``ratio_mask`` selects the ratios to summarise."""
    with torch.no_grad():
        n_tokens = float(b.mask.sum())
        n_ratios = float(ratio_mask.sum())
        selected = ratio.expand_as(ratio_mask)[ratio_mask.bool()]
        metrics: dict[str, float] = {
            "clip_fraction": Mean(float((clip_active.to(b.mask.dtype) * b.mask).sum()), n_tokens),
            "ratio_mean": Mean(float((ratio * ratio_mask).sum()), n_ratios),
            "ratio_max": Max(float(selected.max()) if selected.numel() else -math.inf),
        }
        if b.ref_logp is not None:
            metrics["kl"] = Mean(float((k3_kl(b.logp, b.ref_logp) * b.mask).sum()), n_tokens)
    return metrics


def aggregate(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    seq_denominator: float,
    token_denominator: float,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """One number from per-token terms ``[B, T]`` (masked by ``mask``), by ``mode``.

    ``token-mean``: ``sum_it l m / token_denominator``; ``seq-mean-token-sum``:
    ``sum_i (sum_t l m) / seq_denominator``; ``seq-mean-token-mean``:
    ``sum_i (sum_t l m / max(1, |y_i|)) / seq_denominator``; ``seq-mean-token-sum-norm``:
    ``sum_it l m / (max_completion_length * seq_denominator)`` (T when None).
    """
    masked = token_loss * mask
    if mode == "token-mean":
        return masked.sum() / token_denominator
    if mode == "seq-mean-token-sum":
        return masked.sum() / seq_denominator
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / seq_denominator
    if mode == "seq-mean-token-sum-norm":
        max_length = max_completion_length or token_loss.shape[1]
        return masked.sum() / (max_length * seq_denominator)
    raise ValueError(f"unknown agg_mode {mode!r}; allowed: {', '.join(AGG_MODES)}")


def _aggregate(token_loss: torch.Tensor, b: _Batch, cfg: LossConfig, own: str) -> torch.Tensor:
    return aggregate(
        token_loss,
        b.mask,
        cfg.agg_mode or own,
        seq_denominator=b.seq_denominator,
        token_denominator=b.token_denominator,
        max_completion_length=cfg.max_completion_length,
    )


# ----------------------------------------------------------------------------- losses


def _ppo_loss(own_agg: str):
    """A PPO-clip loss whose per-token terms are aggregated by ``own_agg`` unless configured."""

    def loss_fn(inputs: LossInputs) -> LossOutput:
        b, cfg = _prepare(inputs), inputs.options
        token_loss, ratio, clip_active = _ppo_clip_terms(b, cfg)
        loss = _aggregate(_policy_and_kl(token_loss, b, cfg), b, cfg, own_agg)
        return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))

    return loss_fn


grpo_loss = register_loss("grpo")(_ppo_loss("seq-mean-token-mean"))
grpo_loss.__doc__ = """GRPO (DeepSeekMath): PPO clip per token, mean over each sequence, then over
sequences."""

dapo_loss = register_loss(
    "dapo", defaults=LossConfig(clip_low=0.2, clip_high=0.28)
)(_ppo_loss("token-mean"))
dapo_loss.__doc__ = """DAPO: PPO clip with clip-higher (0.2 / 0.28), mean over all tokens of the
batch. Dynamic sampling and overlong shaping act on the data and rewards, not here."""

dr_grpo_loss = register_loss("dr_grpo")(
    _ppo_loss("seq-mean-token-sum-norm")
)
dr_grpo_loss.__doc__ = """Dr. GRPO: PPO clip, token sum over a constant (max completion length x
sequences). A constant normaliser removes GRPO's length bias; pair it with the ``none``
advantage divisor."""


@register_loss("cispo", defaults=LossConfig(clip_high=0.28, cispo_clip_low=None))
def cispo_loss(inputs: LossInputs) -> LossOutput:
    """CISPO (MiniMax-M1): -sg(clip(rho, 1 - e_low, 1 + e_high)) * A * logp, token mean.

    The importance weight is clipped and detached instead of the update, so clipped tokens
    still get a gradient (scaled by the clipped weight). The lower bound is
    ``1 - options.cispo_clip_low`` (none by default); the upper bound is ``1 + options.clip_high``.
    """
    b, cfg = _prepare(inputs), inputs.options
    ratio = _token_ratio(b)
    low = 0.0 if cfg.cispo_clip_low is None else 1.0 - cfg.cispo_clip_low
    high = 1.0 + cfg.clip_high
    weight = ratio.detach().clamp(low, high)
    token_loss = -weight * b.advantages * b.logp
    loss = _aggregate(_policy_and_kl(token_loss, b, cfg), b, cfg, "token-mean")
    clip_active = (ratio < low) | (ratio > high)
    return LossOutput(loss, _metrics(b, ratio, clip_active, b.mask))


@register_loss("gspo", defaults=LossConfig(clip_low=3e-4, clip_high=4e-4))
def gspo_loss(inputs: LossInputs) -> LossOutput:
    """GSPO: PPO clip on the sequence ratio s_i = exp(mean_t(logp - old_logp)), per sequence.

    The clip range ``[1 - clip_low, 1 + clip_high]`` is tiny by default (3e-4 / 4e-4) because
    s_i is a geometric mean of token ratios. Each sequence's clipped term is given to each of
    its tokens, so the default ``seq-mean-token-mean`` aggregation is the mean over sequences;
    sequences without masked tokens contribute nothing. The KL term, if any, is per token.
    """
    b, cfg = _prepare(inputs), inputs.options
    lengths = b.mask.sum(-1)
    has_tokens = (lengths > 0).to(b.mask.dtype)
    mean_log_ratio = (b.logp - b.old_logp).sum(-1) / lengths.clamp(min=1.0)
    seq_ratio = torch.exp(mean_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    adv = b.advantages.squeeze(-1)
    unclipped = -adv * seq_ratio
    clipped = -adv * seq_ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    seq_loss = torch.maximum(unclipped, clipped)
    token_loss = seq_loss.unsqueeze(-1).expand_as(b.mask)
    loss = _aggregate(_policy_and_kl(token_loss, b, cfg), b, cfg, "seq-mean-token-mean")
    clip_active = (clipped > unclipped).unsqueeze(-1).expand_as(b.mask)
    return LossOutput(
        loss, _metrics(b, seq_ratio.unsqueeze(-1), clip_active, has_tokens.unsqueeze(-1))
    )


@register_loss("sft")
def sft_loss(inputs: LossInputs) -> LossOutput:
    """Supervised fine-tuning: the cross-entropy ``-logp`` of the trained tokens, token mean.

    Reads ``logp``, ``mask`` and the denominators only (no advantages, old or reference
    log-probabilities, token weights). By default (``token-mean``) the loss is the summed
    cross-entropy over the whole batch's ``token_denominator`` trained tokens, so micro-batches
    and processes add up to the single-pass gradient; ``options.agg_mode`` may change that (the
    seq-mean modes count rows, and a packed row holds several examples). Its metric
    ``cross_entropy`` is the token-mean value, whatever the mode.
    """
    keep = inputs.mask.bool()
    dtype = torch.promote_types(inputs.logp.dtype, torch.float32)
    token_loss = -_clean(inputs.logp, keep, dtype)
    mask = keep.to(dtype)
    loss = aggregate(
        token_loss,
        mask,
        inputs.options.agg_mode or "token-mean",
        seq_denominator=float(inputs.seq_denominator),
        token_denominator=float(inputs.token_denominator),
        max_completion_length=inputs.options.max_completion_length,
    )
    with torch.no_grad():
        total = float((token_loss * mask).sum())
    return LossOutput(loss, {"cross_entropy": Mean(total, float(mask.sum()))})
