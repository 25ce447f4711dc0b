"""Overlapped generation: step t+1's rollouts are sampled while step t updates.

With ``rollout.overlap: true`` a rollout worker thread plays the next step's episodes
while the main thread computes advantages and updates the policy (torch releases the
GIL in its kernels). The rollout engine samples from a copy of the policy of its own
(the ``hf`` engine keeps a second model instance; ``vllm`` and ``server`` hold one
anyway), so the update never changes weights under a running generation. One step is:

1. wait for the worker's batch of step t (sampled from the weights after step t-2's
   update, i.e. the policy of version t-1);
2. sync the rollout copy to the trainer's current weights (version t) and hand the
   worker step t+1;
3. update on step t's batch (the trainer's weights become version t+1).

So every batch after the first is exactly one policy version stale (``overlap/staleness``
is 0 at the first step of a run, 1 after), and what a batch holds does not depend on
timing: the weights it is sampled from and its sampling seeds (``mix_seed(seed, step,
...)``, as in the synchronous loop) are fixed by the step alone. The loss corrects for the
staleness with the sampler's own log-probabilities: the trainer recomputes the
log-probabilities of the current weights as PPO's proximal policy and weights each token
by ``min(pi_current / pi_sampler, algorithm.tis_cap)``, which is why the config requires
``tis_cap`` with overlap; ``mismatch/abs_mean|max`` measure the sampler/trainer gap.

Both threads compute at once; :func:`overlap_threads` decides each side's torch threads per
engine (OpenMP keeps a count per thread, so the worker sets its own when it starts).

Checkpoints: the batch in flight at a save belongs to the next step and was sampled from
weights no longer held by the trainer, so :meth:`OverlappedRollouts.save` waits for it
and writes it as JSON beside the checkpoint (never pickled: loading runs no code);
resuming reads it back and the run continues exactly as an uninterrupted one. A
checkpoint without that file (a synchronous run's) resumes with a fresh synchronous batch.

Determinism needs the main thread to draw nothing from torch's global RNG during an
update (the HF sampler seeds and restores it around each generation call); the
trainer's update shuffles with its own generator and the bundled models have no dropout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action
from corrgrpo.trainer.rollout import RolloutBatch

__all__ = ["OverlappedRollouts", "batch_from_json", "batch_to_json", "overlap_threads", "pending_file"]


def overlap_threads(total: int, backend: str = "hf") -> tuple[int, int | None]:
    """Torch threads of the trainer's thread and of the rollout worker, when both compute at once.

    ``total``: the trainer process's thread budget (``rollout.torch_threads`` or the
    automatic count). Returns ``(trainer side, worker)``; the worker's is None where it must
    keep OpenMP's default for new threads.

    * ``hf``: each side gets half (at least 1), the worker setting its own when it starts.
    * ``vllm`` (in-process): vLLM's CPU attention checks that the thread preparing a step and
      the thread running it use the same OpenMP count, and its helper threads run on
      OpenMP's default for new threads (``OMP_NUM_THREADS``, else one per core). So both
      sides take that default; a warning says so when it differs from ``total``.
    * ``server``: generation runs elsewhere; the trainer keeps ``total``.
    """
    if backend == "hf":
        half = max(1, total // 2)
        return half, half
    if backend == "vllm":
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        default = int(env) if env.isdigit() and int(env) > 0 else os.cpu_count() or 1
        if default != total:
            warnings.warn(
                f"rollout.overlap with the vllm backend: torch threads set to {default} (OpenMP's "
                f"default for new threads) instead of {total}; vLLM's CPU attention needs the two to agree",
                stacklevel=3,
            )
        return default, None
    return total, None


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def pending_file(checkpoint: Path, rank: int) -> Path:
    """Where a checkpoint keeps process ``rank``'s batch of the next step."""
    return Path(checkpoint) / f"pending-rollouts-rank{rank}.json"


def batch_to_json(batch: RolloutBatch) -> dict[str, Any]:
    """A :class:`RolloutBatch` as plain JSON data (infos that are not JSON become strings)."""
    data = dataclasses.asdict(batch)
    data["rewards"] = batch.rewards.tolist()
    data["raw_rewards"] = None if batch.raw_rewards is None else batch.raw_rewards.tolist()
    data["group_ids"] = batch.group_ids.tolist()
    return json.loads(json.dumps(data, default=str))


def batch_from_json(data: dict[str, Any]) -> RolloutBatch:
    """The :class:`RolloutBatch` that :func:`batch_to_json` wrote."""
    episodes = []
    for e in data["episodes"]:
        turns = [Action(**t) for t in e["turns"]]
        episodes.append(Episode(**{**e, "turns": turns}))
    return RolloutBatch(
        **{
            **data,
            "episodes": episodes,
            "rewards": np.asarray(data["rewards"], dtype=np.float32).reshape(len(episodes), -1),
            "raw_rewards": None if data.get("raw_rewards") is None
            else np.asarray(data["raw_rewards"], dtype=np.float32).reshape(len(episodes), -1),
            "group_ids": np.asarray(data["group_ids"], dtype=np.int64),
        }
    )


@dataclass
class _Pending:
    step: int  #: the step the batch is for
    version: int  #: the policy version (updates applied) of the weights that sample it
    future: Future


class OverlappedRollouts:
    """Collects step t+1's batch in a worker thread while step t updates.

    Args:
        collect: ``collect(step)`` plays the step's batch through the rollout engine.
        sync_weights: makes the rollout engine's copy follow the trainer's current weights
            (called only while the worker is idle).
        steps: the run's last step + 1 (no batch is started beyond it).
        threads: torch threads of the worker thread (None: leave its default).
    """

    def __init__(
        self,
        collect: Callable[[int], RolloutBatch],
        sync_weights: Callable[[], None],
        steps: int,
        threads: int | None = None,
    ):
        self._collect = collect
        self._sync = sync_weights
        self._steps = steps
        init, args = (_set_torch_threads, (threads,)) if threads else (None, ())
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="corrgrpo-rollout", initializer=init, initargs=args
        )
        self._pending: _Pending | None = None

    def next_batch(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """Step ``step``'s batch (the worker's, or collected now) and its overlap metrics.

        Before returning, the rollout copy takes the current weights and the worker
        starts on step ``step + 1``. Metrics: ``overlap/staleness`` (policy versions
        between the sampler and the trainer) and ``time/wait_rollouts`` (seconds the
        trainer waited for the batch).
        """
        t0 = time.perf_counter()
        batch: RolloutBatch | None = None
        pending, self._pending = self._pending, None
        if pending is not None:
            result = pending.future.result()  # waited for even when unused: the worker must be idle
            if pending.step == step:
                batch, version = result, pending.version
        self._sync()  # the weights after step-1's update (version ``step``)
        if batch is None:  # the first step of a run (or a checkpoint without a pending batch)
            batch, version = self._collect(step), step
        if step + 1 < self._steps:
            self._pending = _Pending(step + 1, step, self._executor.submit(self._collect, step + 1))
        return batch, {"overlap/staleness": float(step - version), "time/wait_rollouts": time.perf_counter() - t0}

    def after_update(self) -> None:
        """With no batch in flight (the last step), the rollout copy takes the final weights now."""
        if self._pending is None:
            self._sync()

    def save(self, checkpoint: Path, rank: int) -> None:
        """Write the batch in flight (waiting for it) beside ``checkpoint``."""
        if self._pending is None:
            return
        batch = self._pending.future.result()
        data = {"step": self._pending.step, "version": self._pending.version, "batch": batch_to_json(batch)}
        path = pending_file(checkpoint, rank)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)

    def load(self, checkpoint: Path, rank: int) -> bool:
        """Take the batch a checkpoint saved as the one in flight; False when it has none."""
        path = pending_file(checkpoint, rank)
        if not path.exists():
            return False
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            batch = batch_from_json(data["batch"])
            step, version = int(data["step"]), int(data["version"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a pending rollout batch: {type(exc).__name__}: {exc}") from exc
        future: Future = Future()
        future.set_result(batch)
        self._pending = _Pending(step, version, future)
        return True

    def close(self) -> None:
        """Wait for the worker and stop it."""
        if self._pending is not None:
            self._pending.future.result()
            self._pending = None
        self._executor.shutdown(wait=True)
