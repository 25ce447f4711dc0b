"""Loop-based numpy re-derivations of the verl functions that the SAW and GD²PO authors' code
calls, and the batches their equality tests share.

Re-derived from the copies of verl in the authors' repositories, not imported from the
estimators under test:

- ``compute_grpo_outcome_advantage``: Zhaolutuan/SAW ``verl/trainer/ppo/core_algos.py``
  (commit 119951f63fa92f93d4d5878c2cc0791db98a7f06), Qwen-Applications/GD2PO
  ``tool-calling/verl/trainer/ppo/core_algos.py`` (commit f1ad765bc9a330e6cf387f95e9c1e5a6c4bb2d02)
  and zhaihaotian/DARA ``vendor/verl/verl/trainer/ppo/core_algos.py`` (commit
  54024d0e62c3ee77deda8cf28f2c40416ea4d46b) agree: per group the mean and the unbiased std
  (``torch.std``) of the scores, ``(score - mean) / (std + 1e-6)``, and a group of one member
  has mean 0 and std 1. The token-level result is the response's value on each of its tokens.
- ``masked_whiten`` (``verl/utils/torch_functional.py``): mean over the masked tokens, variance
  the masked mean of squared deviations times ``T / (T - 1)`` (ValueError when ``T`` is 1),
  ``(value - mean) * rsqrt(var + 1e-8)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def grpo_outcome(scores: np.ndarray, index: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``[N]`` verl's GRPO advantage of one score per response, one group at a time."""
    members: dict[int, list[int]] = {}
    for i, group in enumerate(index):
        members.setdefault(int(group), []).append(i)
    out = np.zeros(len(scores))
    for rows in members.values():
        values = [float(scores[i]) for i in rows]
        if len(values) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i in rows:
            out[i] = (float(scores[i]) - mean) / (std + eps)
    return out


def token_matrix(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[N, T]`` each response's value on each of its ``lengths[i]`` tokens, and the mask."""
    width = max(1, int(max(lengths)))
    tokens = np.zeros((len(values), width))
    mask = np.zeros((len(values), width))
    for i, (value, length) in enumerate(zip(values, lengths)):
        for t in range(int(length)):
            tokens[i, t] = value
            mask[i, t] = 1.0
    return tokens, mask


def masked_whiten(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """verl's ``masked_whiten`` of a token matrix, one token at a time."""
    count = mean = 0.0
    for value, m in zip(tokens.ravel(), mask.ravel()):
        count += m
        mean += value * m
    if count == 1:
        raise ValueError("verl's masked_var: the sum of the mask is one")
    mean /= count
    squares = sum((value - mean) ** 2 * m for value, m in zip(tokens.ravel(), mask.ravel()))
    var = squares / count * (count / (count - 1))
    return (tokens - mean) / math.sqrt(var + 1e-8)


def per_response(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``[N]`` the value on each response's first token (0 for a response without tokens)."""
    return np.array([tokens[i, 0] if lengths[i] > 0 else 0.0 for i in range(len(lengths))])


@dataclass(frozen=True)
class Batch:
    """Rewards ``[N, K]``, group ids ``[N]``, reward weights ``[K]`` and trained tokens ``[N]``."""

    name: str
    rewards: np.ndarray
    index: np.ndarray
    weights: np.ndarray
    lengths: np.ndarray


def batches() -> list[Batch]:
    """The shared inputs: random, ties, a reward constant within a group, a whole group
    constant, groups of one and two, weights of 0 and below 0, rows not sorted by group."""
    rng = np.random.default_rng(48)
    out = []

    def add(name, rewards, index, weights=None):
        rewards = np.asarray(rewards, dtype=np.float64)
        weights = np.ones(rewards.shape[1]) if weights is None else np.asarray(weights, dtype=np.float64)
        lengths = rng.integers(2, 40, size=len(index)).astype(np.float64)
        out.append(Batch(name, rewards, np.asarray(index), weights, lengths))

    add("random", rng.normal(size=(24, 2)) * [3.0, 0.5] + [1.0, 0.2], np.repeat(np.arange(6), 4))
    add("random_three_rewards", rng.normal(size=(20, 3)) * [1.0, 10.0, 0.1], np.repeat(np.arange(5), 4))
    add("ties", rng.integers(0, 2, size=(32, 2)), np.repeat(np.arange(8), 4))
    constant_reward = rng.integers(-3, 4, size=(16, 2)).astype(np.float64)
    constant_reward[:4, 0] = 2.0  # reward 0 constant within group 0
    constant_reward[4:8, 1] = -1.0  # reward 1 constant within group 1
    add("reward_constant_in_a_group", constant_reward, np.repeat(np.arange(4), 4))
    whole = rng.normal(size=(16, 2))
    whole[8:12] = [0.5, 1.5]  # group 2: every reward constant
    add("group_constant", whole, np.repeat(np.arange(4), 4))
    sizes = [1, 2, 1, 2, 4, 2]
    add("groups_of_one_and_two", rng.integers(-2, 3, size=(sum(sizes), 2)), np.repeat(np.arange(6), sizes))
    add("weights_zero_and_negative", rng.normal(size=(20, 3)), np.repeat(np.arange(5), 4), [0.0, -1.5, 2.0])
    order = rng.permutation(24)
    ids = np.repeat(np.array([17, 3, 42, 8, 5, 11]), 4)[order]
    add("unsorted_ids", rng.integers(0, 4, size=(24, 2)).astype(np.float64) * [1.0, 0.25], ids)
    return out


def random_batch(seed: int, with_lengths: bool) -> Batch:
    """A random batch of small integer rewards (many ties), groups of 1 to 5 members in random
    order, weights among -1, 0, 0.5 and 2, and 1 to 6 tokens per response (or 1 each)."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    sizes = rng.integers(1, 6, size=int(rng.integers(1, 7)))
    index = rng.permutation(np.repeat(rng.choice(1000, size=len(sizes), replace=False), sizes))
    rewards = rng.integers(-2, 3, size=(len(index), k)).astype(np.float64) * rng.choice([0.5, 1.0, 7.0], k)
    weights = rng.choice([-1.0, 0.0, 0.5, 2.0], size=k)
    lengths = rng.integers(1, 7, size=len(index)).astype(np.float64) if with_lengths else np.ones(len(index))
    return Batch(f"random_{seed}", rewards, index, weights, lengths)
