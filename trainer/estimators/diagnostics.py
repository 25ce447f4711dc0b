"""Diagnostics of a batch, the same for every estimator: what the rewards do to the update."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from corrgrpo.trainer.estimators.corrgrpo import corrgrpo_denominator
from corrgrpo.trainer.estimators.groups import ACTIVITY_RTOL, RewardGroups
from corrgrpo.trainer.estimators.registry import DEFAULT_EPS

__all__ = ["NEAR_CANCELLING_S_CORR", "AdvantageStats", "diagnose", "plain"]

#: A group with at least one active component is "near-cancelling" when its
#: correlation sum S_corr is below this value. Then CorrGRPO's multiplier
#: 1/sqrt(S_corr + eps) exceeds ~31.6, i.e. more than 31x the multiplier of a
#: group with a single active component (S_corr = 1): the components nearly
#: cancel (e.g. two anti-correlated ones) and the advantages blow up.
NEAR_CANCELLING_S_CORR = 1e-3


@dataclass(frozen=True)
class AdvantageStats:
    """Diagnostics of a batch, the same for every estimator (docs/method.md).

    Per group (row g is group ``group_keys[g]``): ``s_cov``, ``s_corr``,
    ``c_q``, ``k_eff``, ``zero_variance``, ``near_cancelling`` ``[G]`` and
    ``cov_share`` ``[G, K]``. Per batch: ``mean_correlation`` ``[K, K]``,
    ``zero_variance_fraction``, ``num_near_cancelling``, ``mean_cov_share`` ``[K]`` and
    ``active_fraction`` ``[K]``.

    - ``s_cov``: GRPO's variance sum, the sum of all covariance entries.
    - ``s_corr``: CorrGRPO's correlation sum over active components.
    - ``c_q``: CorrGRPO's multiplier over GRPO's (group scale), so that
      ``A_corrgrpo = c_q * A_grpo`` within the group; NaN for a zero-variance
      group (both give 0 there, c_q is undefined).
    - ``cov_share``: row sums of the covariance matrix divided by ``s_cov``
      (sums to 1; 0 where ``s_cov`` is 0). A share may be negative.
    - ``k_eff``: ``K_active^2 / s_corr`` (K for independent, 1 for identical
      components); NaN when no component is active or the group is near-cancelling.
    - ``zero_variance``: no component varies within the group (all advantages 0).
    - ``near_cancelling``: some component is active but ``s_corr <
      NEAR_CANCELLING_S_CORR``.
    - ``mean_correlation``: entry (k, l) averages the correlation over the
      groups where both k and l are active; NaN where there are none (undefined, not
      uncorrelated: a 0 there would pull a run's mean of two identical rewards below 1).
    - ``mean_cov_share``: mean of ``cov_share`` over groups with ``s_cov > 0``.
    - ``active_fraction``: the share of groups in which each component varies.
    """

    group_keys: torch.Tensor
    s_cov: torch.Tensor
    s_corr: torch.Tensor
    c_q: torch.Tensor
    cov_share: torch.Tensor
    k_eff: torch.Tensor
    zero_variance: torch.Tensor
    near_cancelling: torch.Tensor
    mean_correlation: torch.Tensor
    zero_variance_fraction: float
    num_near_cancelling: int
    mean_cov_share: torch.Tensor
    active_fraction: torch.Tensor | None = None

    def to_dict(self, per_group: bool = True) -> dict[str, Any]:
        """Plain python floats/ints/lists for logging (strict JSON: NaN -> None).

        ``per_group=False`` keeps only the batch-level entries.
        """
        out: dict[str, Any] = {
            "mean_correlation": plain(self.mean_correlation),
            "zero_variance_fraction": float(self.zero_variance_fraction),
            "num_near_cancelling": int(self.num_near_cancelling),
            "mean_cov_share": plain(self.mean_cov_share),
        }
        if self.active_fraction is not None:
            out["active_fraction"] = plain(self.active_fraction)
        if per_group:
            out.update(
                group_keys=self.group_keys.tolist(),
                s_cov=plain(self.s_cov),
                s_corr=plain(self.s_corr),
                c_q=plain(self.c_q),
                cov_share=plain(self.cov_share),
                k_eff=plain(self.k_eff),
                zero_variance=self.zero_variance.tolist(),
                near_cancelling=self.near_cancelling.tolist(),
            )
        return out


def plain(t: torch.Tensor) -> Any:
    """Nested python floats with NaN replaced by None."""
    values = t.tolist()

    def clean(v: Any) -> Any:
        if isinstance(v, list):
            return [clean(x) for x in v]
        return None if isinstance(v, float) and math.isnan(v) else v

    return clean(values)


def diagnose(
    groups: RewardGroups, *, eps: float = DEFAULT_EPS, min_denominator: float | None = None
) -> AdvantageStats:
    """Compute :class:`AdvantageStats` of a batch (vectorised, float64).

    ``eps`` and ``min_denominator`` are those of GRPO/CorrGRPO used for ``c_q``.
    """
    active, dtype = groups.corr_active, groups.var.dtype
    s_cov, s_corr = groups.s_cov, groups.s_corr  # [G]
    c_q = (s_cov.sqrt() + eps) / corrgrpo_denominator(s_corr, eps, min_denominator)
    # share of S_cov: covariance row sums sum_l Cov(c_k, c_l) = Cov(c_k, N), over S_cov;
    # undefined (0) where S_cov is round-off (e.g. components that cancel)
    row_sums = groups.group_sum(groups.weighted * groups.numerator.unsqueeze(1)) / groups.dof[:, None]
    has_cov = s_cov > ACTIVITY_RTOL * groups.var.sum(dim=1).clamp(min=1.0)
    cov_share = torch.where(has_cov[:, None], row_sums / torch.where(has_cov, s_cov, 1.0)[:, None], 0.0)
    k_active = active.sum(dim=1).to(dtype)
    zero_variance = ~groups.active.any(dim=1)
    near_cancelling = (k_active > 0) & (s_corr < NEAR_CANCELLING_S_CORR)
    defined = (k_active > 0) & ~near_cancelling
    k_eff = torch.where(defined, k_active.square() / torch.where(defined, s_corr, 1.0), math.nan)
    c_q = torch.where(zero_variance, math.nan, c_q)

    # sum over groups of the correlation matrices: one [K, N] x [N, K] product of
    # the standardised components, each group's rows scaled by 1 / (n_q - 1)
    z = groups.weighted * groups.per_response(groups.inv_std)
    corr_sum = (z * groups.per_response(1.0 / groups.dof).unsqueeze(1)).T @ z
    activef = active.to(dtype)
    n_both = activef.T @ activef  # [K, K] groups where both components vary
    mean_correlation = torch.where(n_both > 0, corr_sum / n_both.clamp(min=1.0), math.nan)
    if has_cov.any():
        mean_cov_share = cov_share[has_cov].mean(dim=0)
    else:
        mean_cov_share = s_cov.new_zeros(groups.num_components)
    return AdvantageStats(
        group_keys=groups.group_keys,
        s_cov=s_cov,
        s_corr=s_corr,
        c_q=c_q,
        cov_share=cov_share,
        k_eff=k_eff,
        zero_variance=zero_variance,
        near_cancelling=near_cancelling,
        mean_correlation=mean_correlation,
        zero_variance_fraction=float(zero_variance.to(dtype).mean()),
        num_near_cancelling=int(near_cancelling.sum()),
        mean_cov_share=mean_cov_share,
        active_fraction=groups.active.to(dtype).mean(dim=0),
    )


