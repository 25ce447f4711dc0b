"""The default evaluation metrics of a multi-reward env: what every domain can report.

An evaluation plays each task once and hands the env a list of episode
records, one dict per episode::

    {"task_id": str, "reward_components": {name: episode return}, "info": dict, "text": str}

(``info`` is the last step's info, ``text`` the last assistant message; both may
be missing.) :func:`reward_means` turns them into the mean return of each
component and the mean weighted total; domains with metrics of their own
(pass@1, attack success rate, ...) define them in their ``metrics.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["EpisodeRecord", "reward_means", "TOTAL_KEY"]

#: One episode of an evaluation (see the module docstring).
EpisodeRecord = Mapping[str, Any]

#: The key of the mean weighted total in :func:`reward_means`.
TOTAL_KEY = "total"


def reward_means(
    records: Iterable[EpisodeRecord],
    reward_names: Sequence[str],
    reward_weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Mean of each component over the episodes, and the mean weighted total (``"total"``).

    Empty ``records`` give ``{}``. A record missing a component raises
    ``KeyError`` naming the task and the component.
    """
    rows = []
    for record in records:
        components = record.get("reward_components") or {}
        missing = [n for n in reward_names if n not in components]
        if missing:
            raise KeyError(
                f"record of task {record.get('task_id')!r} has no reward_components {missing}"
            )
        rows.append([float(components[n]) for n in reward_names])
    if not rows:
        return {}
    table = np.asarray(rows, dtype=np.float64)
    weights = (
        np.ones(len(reward_names)) if reward_weights is None else np.asarray(reward_weights, np.float64)
    )
    out = {n: float(v) for n, v in zip(reward_names, table.mean(axis=0))}
    out[TOTAL_KEY] = float((table @ weights).mean())
    return out
