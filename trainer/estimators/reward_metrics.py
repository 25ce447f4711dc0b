"""What the rewards are doing: per-step statistics of the reward vectors.

Besides each component's mean and std, this reports the diagnostics of the
advantage estimator (docs/method.md): the mean reward correlation matrix, the
distribution of CorrGRPO's per-group multiplier ``c_q``, each component's
share of GRPO's covariance sum, the effective number of rewards ``K_eff``, the
share of groups in which each component varies and the fraction of zero-variance groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["estimator_metrics", "reward_metrics"]


def _finite(values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def reward_metrics(
    rewards: np.ndarray,
    weights: np.ndarray,
    names: Sequence[str],
    stats: dict[str, Any],
) -> dict[str, Any]:
    """Flat metrics of one step.

    Args:
        rewards: ``[N, K]`` episode reward vectors (NaN = not applicable).
        weights: ``[K]`` component weights.
        names: the K component names.
        stats: ``AdvantageResult.stats.to_dict()`` of the step's batch.
    """
    out: dict[str, Any] = {}
    weighted = np.nansum(rewards * weights[None, :], axis=1)
    out["reward/weighted/mean"] = float(weighted.mean())
    out["reward/weighted/std"] = float(weighted.std())
    for k, name in enumerate(names):
        col = _finite(rewards[:, k])
        out[f"reward/{name}/mean"] = float(col.mean()) if col.size else float("nan")
        out[f"reward/{name}/std"] = float(col.std()) if col.size else float("nan")
    c_q = _finite(stats.get("c_q", []))
    if c_q.size:
        out["c_q/mean"] = float(c_q.mean())
        out["c_q/min"] = float(c_q.min())
        out["c_q/p10"] = float(np.percentile(c_q, 10))
        out["c_q/median"] = float(np.median(c_q))
        out["c_q/p90"] = float(np.percentile(c_q, 90))
        out["c_q/max"] = float(c_q.max())
    k_eff = _finite(stats.get("k_eff", []))
    if k_eff.size:
        out["k_eff/mean"] = float(k_eff.mean())
    share = stats.get("mean_cov_share")
    if share is not None:
        for name, value in zip(names, share):
            out[f"cov_share/{name}"] = None if value is None else float(value)
    active = stats.get("active_fraction")
    if active is not None:
        for name, value in zip(names, active):
            out[f"active_fraction/{name}"] = None if value is None else float(value)
    if "zero_variance_fraction" in stats:
        out["zero_variance_fraction"] = float(stats["zero_variance_fraction"])
    if "num_near_cancelling" in stats:
        out["near_cancelling_groups"] = int(stats["num_near_cancelling"])
    corr = stats.get("mean_correlation")
    if corr is not None:
        out["reward_correlation"] = [[None if v is None else float(v) for v in row] for row in corr]
    return out


def estimator_metrics(metrics: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    """The estimator's own diagnostics (``AdvantageResult.metrics``) under ``estimator/``, as every
    trainer logs them; a key ending in ``/<k>`` (component k's position) ends in the component's
    name instead (``weight/1`` -> ``estimator/weight/format``)."""
    out = {}
    for key, value in metrics.items():
        head, _, tail = key.rpartition("/")
        if head and tail.isdigit() and int(tail) < len(names):
            key = f"{head}/{names[int(tail)]}"
        out[f"estimator/{key}"] = float(value)
    return out
