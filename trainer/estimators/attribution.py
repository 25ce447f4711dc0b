"""How much each reward component contributes to a batch's advantages, for every estimator.

Every built-in estimator is linear in the (centred) weighted rewards once its
normalisers are fixed: ``A_i = sum_k a_ik``. ``a_ik`` is component k's part of
response i's advantage, and since the policy gradient is ``sum_i A_i grad log p_i``,
``sum_i a_ik grad log p_i`` is component k's part of the update. Each estimator
in :mod:`corrgrpo.trainer.estimators` is written once, as that decomposition
(``corrgrpo.trainer.estimators.Decomposition``, made into the estimator by
``corrgrpo.trainer.estimators.decomposed``), so the parts are the advantages' own terms;
each estimator's docstring (and ``docs/advantages.md``) gives its ``a_ik``.

A decomposition also gives an *effective weight per group*: the factor its
centred weighted rewards are multiplied by (``[G]``, or ``[G, K]`` for the
per-component estimators; batch-level centring, as in GDPO, is not a factor and
is left out). GRPO's is ``1 / std_q t``, CorrGRPO's ``1 / sqrt(S_corr)`` (so
``c_q`` is the ratio of the two), GDPO's ``1 / (std_q r_k * std A')`` per component.

An estimator plugged in by name or entry point gets its exact parts when it is
made by ``decomposed`` (or has an ``attribution`` attribute
``parts(groups, **options) -> (parts [N, K], group_weight [G] | [G, K] | None)``,
which :func:`register_attribution` sets). A plain advantage function gets the
advantage split in proportion to ``c_ik``: ``a_ik = A_i c_ik / N_i``
(``N_i = sum_k c_ik``), exact for any estimator of the form ``A_i = s_i N_i`` (a
per-response or per-group scale of the centred total); what that split cannot
place (``A_i`` where ``N_i = 0``) is the ``residual`` and the attribution is
flagged as not exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from corrgrpo.trainer.estimators.groups import ACTIVITY_RTOL, RewardGroups
from corrgrpo.trainer.estimators.registry import (
    Decomposition,
    DecompositionFn,
    as_decomposition,
    get_estimator,
)

__all__ = ["Attribution", "attribute", "attribution_metrics", "register_attribution"]

#: Quantiles of the per-group effective weight that are logged.
QUANTILES = {"p10": 10.0, "median": 50.0, "p90": 90.0}


@dataclass(frozen=True)
class Attribution:
    """Each component's part of each advantage.

    Attributes:
        parts: ``[N, K]`` float64, ``a_ik``.
        residual: ``[N]`` float64, what the parts do not hold (0 when ``exact``).
        group_weight: ``[G]`` or ``[G, K]`` effective weight of each group (NaN for a group
            without reward variance, or where a component is constant), or None when the
            estimator does not say.
        exact: the estimator declared its decomposition.
    """

    parts: torch.Tensor
    residual: torch.Tensor
    group_weight: torch.Tensor | None
    exact: bool

    @property
    def advantages(self) -> torch.Tensor:
        """``[N]`` the advantages the parts recompose: ``sum_k a_ik + residual_i``."""
        return self.parts.sum(dim=1) + self.residual

    def signed_shares(self) -> tuple[torch.Tensor, float]:
        """``[K]`` ``sum_i sign(A_i) a_ik / sum_i |A_i|`` and the residual's share.

        Together they sum to 1 (0 when every advantage is 0): component k's part of
        the size of the advantages, negative where it pushes against the result.
        """
        adv = self.advantages
        sign = torch.sign(adv)
        total = float(adv.abs().sum())
        if total == 0.0:
            return torch.zeros(self.parts.shape[1], dtype=torch.float64), 0.0
        return (sign[:, None] * self.parts).sum(dim=0) / total, float((sign * self.residual).sum()) / total

    def abs_shares(self) -> tuple[torch.Tensor, float]:
        """``[K]`` ``sum_i |a_ik|`` over all absolute parts (residual included) and the residual's share."""
        absolute = self.parts.abs().sum(dim=0)
        residual = float(self.residual.abs().sum())
        total = float(absolute.sum()) + residual
        if total == 0.0:
            return torch.zeros_like(absolute), 0.0
        return absolute / total, residual / total


def register_attribution(name: str) -> Callable[[DecompositionFn], DecompositionFn]:
    """Decorator: ``parts(groups, **options)`` is the decomposition of estimator ``name``.

    It becomes the ``attribution`` attribute of the estimator ``name`` resolves to (a
    registered name or an entry point; ValueError for an unknown one). An estimator made by
    ``corrgrpo.trainer.estimators.decomposed`` already has its own and needs none.
    """

    def decorator(fn: DecompositionFn) -> DecompositionFn:
        get_estimator(name).attribution = fn  # type: ignore[attr-defined]
        return fn

    return decorator


def attribute(groups: RewardGroups, estimator: str, options: dict[str, Any] | None = None,
              advantages: torch.Tensor | None = None,
              decomposition: Decomposition | None = None) -> Attribution:
    """Each component's part of the advantages of ``estimator`` on ``groups``.

    ``advantages`` (the estimator's output, ``[N]``) is needed only for an estimator
    without a declared decomposition (computed here when not given); ``decomposition``
    (``compute_advantages``'s, on the same groups) saves computing the declared one again.
    """
    options = dict(options or {})
    fn = get_estimator(estimator)
    decompose = getattr(fn, "attribution", None)
    valid = groups.valid[:, None]
    if decompose is not None:
        parts, weight, *_ = decomposition if decomposition is not None \
            else as_decomposition(decompose(groups, **options))
        parts = torch.where(valid, parts.to(torch.float64), 0.0)
        if weight is not None and weight.dim() == 1:  # undefined where nothing varies (1/eps for GRPO)
            weight = torch.where(groups.active.any(dim=1), weight.to(torch.float64), float("nan"))
        return Attribution(parts, torch.zeros_like(parts[:, 0]), weight, exact=True)
    if advantages is None:
        advantages = fn(groups, **options)
    adv = torch.where(groups.valid, advantages.to(torch.float64), 0.0)
    numerator = groups.numerator
    scale = groups.weighted.abs().sum(dim=1).clamp(min=1.0)
    placed = numerator.abs() > ACTIVITY_RTOL * scale
    ratio = torch.where(placed, adv / torch.where(placed, numerator, 1.0), 0.0)
    parts = torch.where(valid, groups.weighted * ratio[:, None], 0.0)
    return Attribution(parts, adv - parts.sum(dim=1), None, exact=False)


def attribution_metrics(attribution: Attribution, names: Sequence[str]) -> dict[str, Any]:
    """Flat per-step metrics: signed and absolute shares, the group weights' quantiles.

    ``advantage_share/<name>`` (signed) and ``advantage_share_abs/<name>`` sum to 1 over
    the components (with ``advantage_share/residual`` when the split is not exact);
    ``group_weight/<quantile>`` (or ``group_weight/<name>/<quantile>`` per component).
    """
    out: dict[str, Any] = {"attribution/exact": 1.0 if attribution.exact else 0.0}
    signed, signed_residual = attribution.signed_shares()
    absolute, abs_residual = attribution.abs_shares()
    for k, name in enumerate(names):
        out[f"advantage_share/{name}"] = float(signed[k])
        out[f"advantage_share_abs/{name}"] = float(absolute[k])
    if not attribution.exact:
        out["advantage_share/residual"] = signed_residual
        out["advantage_share_abs/residual"] = abs_residual
    weight = attribution.group_weight
    if weight is not None:
        w = weight.detach().to(torch.float64).cpu().numpy()
        columns = [("", w.ravel())] if w.ndim == 1 else [(f"{n}/", w[:, k]) for k, n in enumerate(names)]
        for prefix, values in columns:
            finite = values[np.isfinite(values)]
            if finite.size:
                for label, q in QUANTILES.items():
                    out[f"group_weight/{prefix}{label}"] = float(np.percentile(finite, q))
    return out
