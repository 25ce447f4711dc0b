"""Loop-based numpy re-derivations of the verl pieces the DARA repository's estimators stand on,
and the shared edge-case batches their equality tests run on.

Re-derived (not copied) from zhaihaotian/DARA, vendor/verl/verl/trainer/ppo/core_algos.py at
878c983dcb3bf3f6841d380479b428965484fb1e (``compute_grpo_outcome_advantage``: per response, the
group mean and the sample std, ``(s - mean) / (std + eps)``, a group of one taking mean 0 and std
1; the advantage is the same on every token of the response) and verl's ``masked_whiten`` as the
repository documents it (tool_calling/docs/ALGORITHMS.md at 0459102045705674a9ad07748708facb8c5dc0b2:
mean and sample variance over all valid tokens, ``(x - mean) / sqrt(var + 1e-8)``). Everything here
works token by token on a ``[N, T]`` mask, as the authors' tensors do, so the per-response
shortcuts of the estimators are checked, not repeated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class Batch(NamedTuple):
    """One shared test batch: rewards ``[N, K]``, group ids ``[N]``, weights ``[K]``, token counts ``[N]``."""

    name: str
    rewards: np.ndarray
    ids: np.ndarray
    weights: np.ndarray
    lengths: np.ndarray


def token_mask(lengths: np.ndarray) -> np.ndarray:
    """``[N, T]`` 0/1 response mask: response i has its first ``lengths[i]`` tokens."""
    width = int(max(lengths))
    mask = np.zeros((len(lengths), width))
    for i, length in enumerate(lengths):
        for t in range(int(length)):
            mask[i, t] = 1.0
    return mask


def groups_in_order(ids: np.ndarray) -> dict[int, list[int]]:
    """Rows of each group id, groups in first-seen order (as the authors' ``defaultdict``)."""
    rows: dict[int, list[int]] = {}
    for i, uid in enumerate(ids):
        rows.setdefault(int(uid), []).append(i)
    return rows


def grpo_outcome(scores: np.ndarray, ids: np.ndarray, mask: np.ndarray, eps: float = 1e-6,
                 singleton: str = "raw") -> np.ndarray:
    """``[N, T]`` verl's GRPO outcome advantage of one reward channel ``scores`` ``[N]``."""
    out = np.zeros_like(mask)
    for rows in groups_in_order(ids).values():
        values = [float(scores[i]) for i in rows]
        if len(values) == 1:
            mean, std = 0.0, 1.0
            if singleton == "zero":
                mean, std = values[0], 1.0
        else:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in rows:
            z = (float(scores[i]) - mean) / (std + eps)
            for t in range(mask.shape[1]):
                out[i, t] = z * mask[i, t]
    return out


def masked_whiten(values: np.ndarray, mask: np.ndarray, whiten_eps: float = 1e-8) -> np.ndarray:
    """``[N, T]`` verl's ``masked_whiten(values, mask) * mask``, token by token."""
    total = count = 0.0
    for i in range(values.shape[0]):
        for t in range(values.shape[1]):
            total += values[i, t] * mask[i, t]
            count += mask[i, t]
    mean = total / count
    square = 0.0
    for i in range(values.shape[0]):
        for t in range(values.shape[1]):
            square += (values[i, t] - mean) ** 2 * mask[i, t]
    var = square / count * count / (count - 1.0)
    out = np.zeros_like(values)
    for i in range(values.shape[0]):
        for t in range(values.shape[1]):
            out[i, t] = (values[i, t] - mean) / math.sqrt(var + whiten_eps) * mask[i, t]
    return out


def normalize_responses(values: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``[N]`` the math stack's ``normalize_responses``: ``(x - mean) / (sample std + eps)``."""
    n = len(values)
    if n < 2:
        return np.zeros(n)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return np.array([(v - mean) / (std + eps) for v in values])


def first_token(values: np.ndarray) -> np.ndarray:
    """``[N]`` each response's advantage (the value on its first token; all its tokens agree)."""
    return np.array([values[i, 0] for i in range(values.shape[0])])


def edge_batches(k: int = 3) -> Iterator[Batch]:
    """Random batches, ties, a reward constant in a group, a constant group, groups of one and two,
    weights of 0 and below 0, rows not sorted by group, and a reward with signal in few groups."""
    rng = np.random.default_rng(48)
    ones = np.ones(k)
    for seed in range(3):
        r = np.random.default_rng(seed)
        yield Batch(f"random{seed}", r.normal(size=(24, k)) * r.uniform(0.1, 10, k),
                    np.repeat(np.arange(6), 4), ones, r.integers(1, 7, 24))
    ties = rng.integers(0, 3, size=(24, k)).astype(float)
    yield Batch("ties", ties, np.repeat(np.arange(6), 4), ones, rng.integers(1, 7, 24))
    constant = rng.normal(size=(16, k))
    constant[:4, 1] = 2.5  # one reward constant in group 0
    constant[4:8, :] = 1.0  # group 1 constant in every reward
    yield Batch("constant", constant, np.repeat(np.arange(4), 4), ones, rng.integers(1, 7, 16))
    sizes = [1, 2, 1, 3, 4, 2]
    ids = np.repeat(np.arange(len(sizes)), sizes)
    yield Batch("sizes_1_2", rng.integers(-3, 4, size=(len(ids), k)).astype(float), ids, ones,
                rng.integers(1, 7, len(ids)))
    weights = np.array([1.5, 0.0, -0.5, 2.0][:k])
    yield Batch("weights", rng.normal(size=(16, k)), np.repeat(np.arange(4), 4), weights,
                rng.integers(1, 7, 16))
    order = rng.permutation(20)
    shuffled = np.array([7, 3, 100, 3, 7, 42, 100, 42, 3, 7, 42, 100, 3, 7, 100, 42, 9, 9, 9, 9])[order]
    yield Batch("unsorted", rng.normal(size=(20, k)), shuffled, ones, rng.integers(1, 7, 20))
    sparse = rng.normal(size=(24, k))
    sparse[:, 0] = 0.0
    sparse[[1, 6], 0] = 1.0  # reward 0 has signal in 2 of 6 groups
    if k > 2:
        sparse[:, 2] = np.where(np.arange(24) < 12, rng.integers(0, 2, 24), 0.0)  # in some of 3
    yield Batch("sparse", sparse, np.repeat(np.arange(6), 4), ones, rng.integers(1, 7, 24))
