"""What the fuzz tests of every domain check about one ``env.step`` (imported by them)."""

from __future__ import annotations

import numpy as np
from cpu_budget import CpuBudget, least_cpu_seconds

#: The most CPU time one step may take on any string action (parse + reject included), in units
#: of reference work (:mod:`cpu_budget`; about 0.1 s on a 2-core x86-64 machine).
STEP_BUDGET_UNITS = 10


#: CPU one verdict through the judge pool may cost this process, besides the worker's (about
#: 0.5 s here: the worker may take the other half of the step's 1 s); the judge probes' steps too.
VERDICT_HOST_UNITS = 45


def step_budget(what: str = "one step", steps: int = 1) -> CpuBudget:
    """The CPU budget of ``steps`` steps, its unit measured now."""
    return CpuBudget(STEP_BUDGET_UNITS * steps, what)


def timed_step(env, task_id: str, action: str, enough: float = 0.0):
    """Reset to ``task_id`` and step; the least CPU time of up to 3 tries (fewer once one takes
    at most ``enough`` seconds)."""
    return least_cpu_seconds(lambda: env.reset(options={"task_id": task_id}), lambda: env.step(action),
                             enough=enough)


def check_reward(env, reward) -> None:
    """A float32 vector of the reward space's shape, finite and within its bounds."""
    space = env.unwrapped.reward_space
    assert reward.dtype == np.float32 and reward.shape == space.shape
    assert np.all(np.isfinite(reward))
    assert np.all(reward >= space.low) and np.all(reward <= space.high)
