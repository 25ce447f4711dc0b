"""A warning while training when the environment scores nothing: every reward is 0.

An env (or an OpenEnv server) that never scores, because of a broken reward, a server that
answers every step with zeros, or a parser that rejects every completion, gives every group
zero variance, so nothing trains; without a warning the run goes on quietly to its last step.

The rule: the trainer hands :meth:`ZeroRewardWatch.observe` the whole batch's reward vectors
of every step (the env's components, before the trainer's own overlong component). When every
reward of every episode has been exactly 0 for :data:`STREAK` steps in a row (the run's first
steps, or any later run of steps), it returns one warning line; it says nothing more until a
step with a non-zero reward ends that run of steps, so a run that never scores warns once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STREAK", "ZeroRewardWatch"]

#: consecutive all-zero steps before the warning: one such step happens by chance on a hard task
STREAK = 3


class ZeroRewardWatch:
    """Counts consecutive steps whose rewards are all 0; :meth:`observe` says when to warn."""

    def __init__(self, streak: int = STREAK):
        if streak < 1:
            raise ValueError(f"streak must be >= 1, got {streak}")
        self.streak = streak
        self._first: int | None = None  # first step of the current all-zero run
        self._count = 0
        self._warned = False

    def observe(self, step: int, rewards: np.ndarray, env: str = "the env") -> str | None:
        """Record ``step``'s ``[n, K]`` rewards; the warning line when this step makes a run of
        ``streak`` all-zero steps, else None. An empty batch neither counts nor ends a run."""
        rewards = np.asarray(rewards)
        if rewards.size == 0:
            return None
        if np.any(rewards != 0):  # NaN counts as a reward that is not 0: it is not silence
            self._first, self._count, self._warned = None, 0, False
            return None
        if self._first is None:
            self._first = step
        self._count += 1
        if self._warned or self._count < self.streak:
            return None
        self._warned = True
        n, k = rewards.shape if rewards.ndim == 2 else (rewards.size, 1)
        return (
            f"warning: every reward is 0 at steps {self._first}-{step} ({n} episodes x {k} "
            f"components each step): {env} is scoring nothing, so there is nothing to learn; "
            "check the env or server (corrgrpo envs check, corrgrpo eval) before training on"
        )
