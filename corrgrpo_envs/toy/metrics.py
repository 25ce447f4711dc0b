"""The toy domain's evaluation metrics: the default ones, each component's mean and the total.

Keys: the component names and ``"total"`` (the mean weighted sum); see
:func:`corrgrpo_envs.metrics.reward_means`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from corrgrpo_envs.metrics import EpisodeRecord, reward_means

__all__ = ["toy_metrics"]


def toy_metrics(
    records: Iterable[EpisodeRecord],
    reward_names: Sequence[str],
    reward_weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Mean of each component and the mean weighted total (``"total"``) over the episodes."""
    return reward_means(records, reward_names, reward_weights)
