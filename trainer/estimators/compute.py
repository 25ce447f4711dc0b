"""The entry point: :func:`compute_advantages` runs a registered estimator on a batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from corrgrpo.trainer.estimators.diagnostics import AdvantageStats, diagnose
from corrgrpo.trainer.estimators.groups import RewardGroups, group_rewards
from corrgrpo.trainer.estimators.registry import (
    Decomposition,
    as_decomposition,
    get_estimator,
    is_decomposed,
    option_names,
)

__all__ = ["AdvantageResult", "check_estimator", "compute_advantages"]


@dataclass(frozen=True)
class AdvantageResult:
    """Output of :func:`compute_advantages`.

    Attributes:
        advantages: ``[N]`` float32, one per response, in the input order.
        stats: diagnostics of the batch (:class:`AdvantageStats`).
        groups: the batch's group statistics (float64), e.g. for attribution.
        decomposition: the estimator's parts when it is written as one (``decomposed``),
            the same ones its advantages were summed from; None otherwise.
    """

    advantages: torch.Tensor
    stats: AdvantageStats
    groups: RewardGroups | None = None
    decomposition: Decomposition | None = None

    @property
    def loss_weight(self) -> torch.Tensor | None:
        """``[N]`` float32 factor on each response's policy-gradient term, for ``LossInputs.sequence_weights``
        (None: 1 for every response)."""
        weight = None if self.decomposition is None else self.decomposition.loss_weight
        return None if weight is None else weight.to(torch.float32)

    @property
    def loss_weighted_advantages(self) -> torch.Tensor:
        """``[N]`` float32 ``advantages * loss_weight``: what to give a loss that takes no
        per-response weight (TRL's, verl's), so that it weighs each response's policy term.

        The weight is >= 0 and a PPO-clip term ``min(r A, clip(r) A)`` (and every other policy
        term that is a sign-dependent multiple of ``A``) is positively homogeneous in ``A``:
        ``min(r wA, clip(r) wA) = w min(r A, clip(r) A)`` for ``w >= 0``. A KL or entropy term,
        which does not contain ``A``, keeps its weight of 1.
        """
        weight = self.loss_weight
        return self.advantages if weight is None else self.advantages * weight

    @property
    def metrics(self) -> dict[str, float]:
        """The estimator's own diagnostics of the batch (empty when it reports none)."""
        found = None if self.decomposition is None else self.decomposition.metrics
        return {name: float(value) for name, value in (found or {}).items()}


def compute_advantages(
    rewards: Any,
    group_ids: Any,
    estimator: str = "corrgrpo",
    weights: Any = None,
    token_counts: Any = None,
    **options: Any,
) -> AdvantageResult:
    """Compute per-response advantages from vector rewards.

    Args:
        rewards: ``[N, K]`` float tensor or array; NaN = component not applicable.
        group_ids: ``[N]`` integer group id per response (any order, groups need
            not be contiguous).
        estimator: a name from ``available_estimators()`` (``grpo``, ``corrgrpo``, ``gdpo``,
            ``saw``, ``gd2po`` ... or a registered one) or an entry point
            ``package.module:function``.
        weights: ``[K]`` finite reward weights, default ones.
        token_counts: ``[N]`` trained tokens of each response, or None: the one source of
            token counts (``RewardGroups.token_counts``). Estimators whose authors weigh batch
            means by tokens (verl's ``masked_whiten``: ``saw``, ``gd2po``, ``dara``, ``rvpo``)
            read them; without them every response counts once.
        **options: the estimator's options (e.g. ``scale`` for grpo, ``eps``,
            ``min_denominator`` for corrgrpo).

    Returns:
        :class:`AdvantageResult` with float32 advantages ``[N]`` on the rewards'
        device and the batch diagnostics.

    Raises:
        ValueError: bad shapes or dtypes, non-finite weights, inf rewards, an
            unknown estimator or option.
    """
    fn = get_estimator(estimator)
    allowed = option_names(fn)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for estimator {estimator!r}; "
            f"accepted: {', '.join(allowed) if allowed else 'none'}"
        )
    groups = group_rewards(rewards, group_ids, weights, token_counts)
    decomposition = None
    if is_decomposed(fn):
        decomposition = as_decomposition(fn.attribution(groups, **options))  # type: ignore[attr-defined]
        advantages = decomposition.parts.sum(dim=1)  # what fn(groups) computes, kept for attribution
    else:
        advantages = fn(groups, **options)
    if advantages.shape != groups.index.shape:
        raise ValueError(
            f"estimator {estimator!r} returned shape {tuple(advantages.shape)}, "
            f"expected {tuple(groups.index.shape)}"
        )
    advantages = torch.where(groups.valid, advantages, 0.0)
    if not torch.isfinite(advantages).all():
        row = int(torch.nonzero(~torch.isfinite(advantages))[0])
        raise ValueError(
            f"estimator {estimator!r} returned a non-finite advantage "
            f"({float(advantages[row])}) for response {row}"
        )
    if decomposition is not None and decomposition.loss_weight is not None:
        _check_loss_weight(decomposition.loss_weight, groups, estimator)
    diag_options: dict[str, Any] = {}
    if estimator == "corrgrpo":
        diag_options = {k: v for k, v in options.items() if k in ("eps", "min_denominator")}
    stats = diagnose(groups, **diag_options)
    return AdvantageResult(advantages=advantages.to(torch.float32), stats=stats, groups=groups,
                           decomposition=decomposition)


def _check_loss_weight(weight: torch.Tensor, groups: RewardGroups, estimator: str) -> None:
    if weight.shape != groups.index.shape:
        raise ValueError(
            f"estimator {estimator!r} returned a loss weight of shape {tuple(weight.shape)}, "
            f"expected {tuple(groups.index.shape)}"
        )
    if not (torch.isfinite(weight).all() and (weight >= 0).all()):
        raise ValueError(f"estimator {estimator!r} returned a loss weight that is not finite and >= 0")


def check_estimator(name: str, options: dict[str, Any] | None = None) -> None:
    """Raise ValueError unless ``name`` resolves and accepts ``options`` (a 2-response dry run)."""
    compute_advantages(
        torch.tensor([[0.0], [1.0]], dtype=torch.float64),
        torch.tensor([0, 0]),
        estimator=name,
        **(options or {}),
    )
