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

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["EpisodeRecord", "mcnemar_exact", "reward_means", "TOTAL_KEY", "wilson_interval"]

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


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % for the default ``z``), in [0, 1].

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n
    successes, which matters for the small evaluation sets of a CPU.
    """
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * float(np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value of a paired before/after comparison of a 0/1 outcome.

    ``gained`` tasks went from 0 to 1 and ``lost`` from 1 to 0 (the tasks that did not change
    carry no information). Under no effect the changed tasks split like a fair coin, so the
    p-value is the two-sided binomial tail of ``min(gained, lost)`` out of their sum.
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"counts must be >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)
