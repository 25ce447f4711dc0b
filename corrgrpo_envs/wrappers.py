"""Wrappers for multi-reward envs.

* :class:`LinearReward`: scalarise the vector reward with weights. Same contract
  as MO-Gymnasium's ``mo_gymnasium.wrappers.LinearReward``: ``step`` returns
  ``weights . reward`` and keeps the vector in ``info["vector_reward"]`` (and the
  weights in ``info["reward_weights"]``). The only difference: with no weights
  given it uses the domain's ``reward_weights`` rather than all ones.
* :class:`RecordEpisodeComponents`: per-component episode statistics, the vector
  counterpart of Gymnasium's ``RecordEpisodeStatistics``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["LinearReward", "RecordEpisodeComponents"]


class LinearReward(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Make the env return the scalar reward ``weight . reward_vector``.

    Args:
        env: an env whose ``unwrapped.reward_space`` is a ``(K,)`` Box.
        weight: K weights; default ``env.unwrapped.reward_weights`` (or ones
            when the env has none).
    """

    def __init__(self, env: gym.Env, weight: np.ndarray | None = None):
        gym.utils.RecordConstructorArgs.__init__(self, weight=weight)
        gym.Wrapper.__init__(self, env)
        if weight is None:
            default = getattr(env.unwrapped, "reward_weights", None)
            weight = default if default is not None else np.ones(self._reward_shape())
        self.set_weight(weight)

    def _reward_shape(self) -> tuple[int, ...]:
        space = getattr(self.env.unwrapped, "reward_space", None)
        if space is None:
            raise ValueError("LinearReward needs an env with a reward_space (a multi-reward env)")
        return tuple(space.shape)

    def set_weight(self, weight: np.ndarray) -> None:
        """Replace the weights (same shape as the reward vector)."""
        w = np.asarray(weight, dtype=np.float32)
        if w.shape != self._reward_shape():
            raise ValueError(
                f"weight has shape {w.shape}, the reward vector has {self._reward_shape()}"
            )
        if not np.all(np.isfinite(w)):
            raise ValueError(f"weights must be finite, got {w}")
        self.w = w

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        vector = np.asarray(reward, dtype=np.float32)
        info["vector_reward"] = vector
        info["reward_weights"] = self.w
        return obs, float(np.dot(vector, self.w)), terminated, truncated, info


class RecordEpisodeComponents(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Record each episode's return per reward component.

    At the end of an episode ``info["episode"]`` holds ``"r"`` (float32 vector
    return), ``"components"`` (name -> return), ``"l"`` (length in steps) and
    ``"t"`` (seconds since reset). Works under or over :class:`LinearReward`
    (it reads ``info["vector_reward"]`` when the reward is already scalar).
    The last ``buffer_length`` episodes stay in ``return_queue`` / ``length_queue``.
    """

    def __init__(self, env: gym.Env, buffer_length: int = 100):
        gym.utils.RecordConstructorArgs.__init__(self, buffer_length=buffer_length)
        gym.Wrapper.__init__(self, env)
        names = getattr(env.unwrapped, "reward_names", None)
        if names is None:
            raise ValueError("RecordEpisodeComponents needs an env with reward_names")
        self.reward_names: tuple[str, ...] = tuple(names)
        self.return_queue: deque[np.ndarray] = deque(maxlen=buffer_length)
        self.length_queue: deque[int] = deque(maxlen=buffer_length)
        self._returns = np.zeros(len(self.reward_names), dtype=np.float32)
        self._length = 0
        self._start = time.perf_counter()

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._returns = np.zeros(len(self.reward_names), dtype=np.float32)
        self._length = 0
        self._start = time.perf_counter()
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        vector = info.get("vector_reward", reward)
        self._returns += np.asarray(vector, dtype=np.float32)
        self._length += 1
        if terminated or truncated:
            r = self._returns.copy()
            info["episode"] = {
                "r": r,
                "components": {n: float(v) for n, v in zip(self.reward_names, r)},
                "l": self._length,
                "t": round(time.perf_counter() - self._start, 6),
            }
            self.return_queue.append(r)
            self.length_queue.append(self._length)
        return obs, reward, terminated, truncated, info

    def mean_returns(self) -> dict[str, float]:
        """Mean return per component over the buffered episodes (empty when none)."""
        if not self.return_queue:
            return {}
        mean = np.mean(np.stack(self.return_queue), axis=0)
        return {n: float(v) for n, v in zip(self.reward_names, mean)}
