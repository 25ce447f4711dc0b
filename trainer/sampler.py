"""Deterministic task order: which tasks a training step uses.

Tasks are visited epoch by epoch, each epoch a fresh permutation seeded by
``(seed, epoch)``. The tasks of step ``s`` are a pure function of ``(seed, s)``,
so a resumed run continues exactly where it stopped without saving a cursor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["TaskSampler", "mix_seed"]


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    return int(np.random.default_rng(list(parts)).integers(0, 2**63 - 1))


class TaskSampler:
    """Yields ``prompts_per_step`` task ids per step, epoch-permuted, resumable by step."""

    def __init__(self, task_ids: Sequence[str], prompts_per_step: int, seed: int = 0):
        if len(task_ids) == 0:
            raise ValueError("no tasks to train on")
        self.task_ids = list(task_ids)
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self._perm_cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perm_cache:
            rng = np.random.default_rng([self.seed, epoch, 0x7A5C])
            self._perm_cache = {epoch: rng.permutation(len(self.task_ids))}
        return self._perm_cache[epoch]

    def tasks_for_step(self, step: int) -> list[str]:
        """The task ids of ``step`` (0-based)."""
        n = len(self.task_ids)
        out = []
        for pos in range(step * self.prompts_per_step, (step + 1) * self.prompts_per_step):
            epoch, idx = divmod(pos, n)
            out.append(self.task_ids[int(self._perm(epoch)[idx])])
        return out

    def extra_tasks(self, step: int, round_: int, count: int) -> list[str]:
        """``count`` more task ids for dynamic sampling's round ``round_`` of ``step``."""
        rng = np.random.default_rng([self.seed, step, round_, 0xD5])
        return [self.task_ids[int(i)] for i in rng.integers(0, len(self.task_ids), size=count)]
