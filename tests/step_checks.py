"""What the fuzz tests of every domain check about one ``env.step`` (imported by them)."""

from __future__ import annotations

import time

import numpy as np

#: The most CPU time one step may take on any string action (parse + reject included).
STEP_BUDGET_S = 0.1


def timed_step(env, task_id: str, action: str):
    """Reset to ``task_id`` and step; the least CPU time of up to 3 tries (the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        env.reset(options={"task_id": task_id})
        start = time.process_time()
        out = env.step(action)
        best = min(best, time.process_time() - start)
        if best <= STEP_BUDGET_S:
            break
    return out, best


def check_reward(env, reward) -> None:
    """A float32 vector of the reward space's shape, finite and within its bounds."""
    space = env.unwrapped.reward_space
    assert reward.dtype == np.float32 and reward.shape == space.shape
    assert np.all(np.isfinite(reward))
    assert np.all(reward >= space.low) and np.all(reward <= space.high)
