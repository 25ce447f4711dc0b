"""The training loop: grouped rollouts -> vector rewards -> advantages -> policy update.

Read top to bottom, one step (:meth:`Trainer.train_step`) is:

1. collect: the step's P tasks (a pure function of seed and step, see ``sampler``),
   each process its contiguous share, G rollouts each through the rollout engine
   (``corrgrpo.trainer.engines``) and ``GroupedVectorEnv``; optional dynamic sampling drops
   groups whose raw reward vectors are all equal and samples more;
   Reward gates (``algorithm.reward_gates``) apply to each batch's raw vectors as it is
   played, so dynamic sampling and the advantages see the gated vectors;
2. shape rewards: optional DAPO overlong component; the reward weights in force at this
   step (constants or schedules, ``algorithm.reward_weights``);
3. advantages: every process's reward vectors (and trained-token counts) gathered,
   ``compute_advantages`` on the WHOLE batch (so they do not depend on the number of
   processes), this process's slice of the advantages and of the estimator's loss weight kept;
4. update: ``corrgrpo.trainer.update.PolicyUpdater`` (whole-batch denominators and metrics),
   then the engine follows the new weights;
5. log: reward diagnostics, time split, losses; checkpoint; a warning line when every
   reward has been 0 for a few steps in a row (``corrgrpo.trainer.zero_rewards``).

The parts are built by the small functions of ``corrgrpo.trainer.setup``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from corrgrpo.trainer import setup
from corrgrpo.trainer.config import Config, config_to_dict
from corrgrpo.trainer.engines import make_engine
from corrgrpo.trainer.estimators import AdvantageResult, compute_advantages
from corrgrpo.trainer.estimators.attribution import attribute, attribution_metrics
from corrgrpo.trainer.estimators.reward_gates import RewardGates
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics, reward_metrics
from corrgrpo.trainer.overlap import OverlappedRollouts, overlap_threads
from corrgrpo.trainer.policy_forward import pack_episodes
from corrgrpo.trainer.rollout import (
    RolloutBatch,
    informative_groups,
    longest_turn,
    overlong_penalty,
    play_episodes,
)
from corrgrpo.trainer.run_context import RunContext
from corrgrpo.trainer.sampler import TaskSampler, mix_seed
from corrgrpo.trainer.threads import apply_threads
from corrgrpo.trainer.update import PolicyUpdater
from corrgrpo.trainer.zero_rewards import ZeroRewardWatch

__all__ = ["Trainer", "train"]


class Trainer:
    """Owns the model, optimizer, environments and run folder of one training run.

    ``Trainer(cfg).train()`` runs ``cfg.train.steps`` steps (or the remaining
    ones when resuming) and returns the run folder. ``last_advantages`` holds the
    whole batch's advantages of the last step (the same on every process).
    """

    def __init__(self, cfg: Config, accelerator: Accelerator | None = None):
        self.cfg = cfg
        a = cfg.algorithm
        self.context = run = RunContext(
            model=cfg.model, optim=cfg.optim, run=cfg.train, config=config_to_dict(cfg), accelerator=accelerator,
            output_dir=Path(cfg.train.output_dir or Path("runs") / f"{cfg.name}-{a.estimator}-s{cfg.train.seed}"),
        )
        self.accelerator, self.rank, self.world, self.output_dir = run.accelerator, run.rank, run.world, run.output_dir
        self.groups_per_process = run.per_process("algorithm.prompts_per_step", a.prompts_per_step)

        r = cfg.rollout  # threads first: reward worker processes inherit their OMP/MKL settings
        self.torch_threads, self.torch_threads_source = apply_threads(
            r.torch_threads, r.reward_workers, r.reward_executor)
        if r.overlap:  # set before the rollout engine exists: vLLM fixes its count when it starts
            side_threads, worker_threads = overlap_threads(self.torch_threads, r.backend)
            torch.set_num_threads(side_threads)
        self.venv = setup.build_vector_env(cfg, self.groups_per_process, a.group_size)
        self.reward_names, self.reward_weights = setup.reward_setup(cfg, self.venv)
        self.weights = self.reward_weights.at(0)  # the weights in force, set at each step
        space = self.venv.reward_space
        self.gates = RewardGates(a.reward_gates, self.venv.reward_names, space.low, space.high)
        self.sampler = TaskSampler(self.venv.task_ids, a.prompts_per_step, cfg.train.seed)

        model, self.tokenizer = run.build_model()
        ref_model = setup.build_reference(model, cfg, self.accelerator.device)
        self.model, self.optimizer, self.scheduler = run.prepare(model)
        self.unwrapped = run.unwrapped
        self.engine = make_engine(cfg.rollout.backend, self.unwrapped, self.tokenizer, cfg)
        loss_fn, loss_cfg = setup.build_loss(cfg)
        self.updater = PolicyUpdater(
            self.model, self.optimizer, self.scheduler, self.accelerator, loss_fn, loss_cfg, cfg.optim,
            ref_model=ref_model, tis_cap=a.tis_cap, seed=cfg.train.seed,
        )
        self.sampling = setup.sampling_params(cfg)
        self.dynamic_sampling = a.dynamic_sampling if a.dynamic_sampling is not None else a.loss == "dapo"
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0
        self.last_advantages: torch.Tensor | None = None
        self.zero_rewards = ZeroRewardWatch()
        self.overlap: OverlappedRollouts | None = None  # rollout.overlap: the next step's batch in a worker
        if r.overlap:
            self.overlap = OverlappedRollouts(
                self._collect, lambda: self.engine.sync_weights(self.unwrapped), cfg.train.steps,
                threads=worker_threads,
            )

        resumed, self.start_step = run.start()
        self.logger = run.logger
        if resumed is not None:  # the engine and the overlapped batch follow the restored state
            self.engine.sync_weights(self.unwrapped)
            if self.overlap is not None:
                self.overlap.load(resumed, self.rank)

    @property
    def policy(self) -> Any:
        """The rollout engine's policy (e.g. to sample from the current weights)."""
        return self.engine.policy

    # ------------------------------------------------------------------ collect
    def _play(self, step: int, round_: int, tasks: list[str], first_group_id: int) -> RolloutBatch:
        seed = self.cfg.train.seed
        with torch.no_grad():
            batch = play_episodes(
                self.venv, self.engine.generate, tasks, self.sampling, self.cfg.rollout.max_turns,
                first_group_id=first_group_id,
                groups_per_generate=self.cfg.rollout.groups_per_generate,
                seed_for=lambda group: mix_seed(seed, step, round_, group),
            )
        if self.gates:  # on the raw vectors, before dynamic sampling looks at them
            batch.raw_rewards, batch.rewards = batch.rewards, self.gates.apply(batch.rewards)
        return batch

    def _collect(self, step: int) -> RolloutBatch:
        """This process's share of the step's groups (after dynamic sampling)."""
        per, P = self.groups_per_process, self.cfg.algorithm.prompts_per_step
        tasks = self.sampler.tasks_for_step(step)[self.rank * per : (self.rank + 1) * per]
        if self.overlap is None:  # overlapped: the engine samples from its own copy
            self.unwrapped.eval()
        batch = self._play(step, 0, tasks, self.rank * per)
        if not self.dynamic_sampling:
            return batch
        kept = [informative_groups(batch)]
        have = len(np.unique(kept[0].group_ids))
        for round_ in range(1, self.cfg.algorithm.max_resample_rounds + 1):
            if have >= per:
                break
            extra_tasks = self.sampler.extra_tasks(step, round_ * self.world + self.rank, per)
            extra = informative_groups(self._play(step, round_, extra_tasks, round_ * P + self.rank * per))
            ids = np.unique(extra.group_ids)[: per - have]
            kept.append(extra.select_groups(ids))
            have += len(ids)
        # nothing informative: train on the plain batch (zero advantages)
        return RolloutBatch.concat(kept) if have else batch

    # ------------------------------------------------------------- rewards
    def _shape_rewards(self, batch: RolloutBatch) -> np.ndarray:
        """``[n, K']`` rewards, with DAPO's overlong component appended when configured.

        The budget is per turn: each episode's longest turn against ``max_new_tokens``.
        """
        buffer = self.cfg.algorithm.overlong_buffer
        if buffer is None:
            return batch.rewards
        lengths = np.array([longest_turn(e) for e in batch.episodes])
        penalty = overlong_penalty(lengths, self.cfg.rollout.max_new_tokens, buffer)
        return np.concatenate([batch.rewards, penalty[:, None]], axis=1)

    def _gather(self, local: Any) -> list[Any]:
        """Every process's ``local`` value, in rank order."""
        return gather_object([local]) if self.world > 1 else [local]

    def _advantages(
        self, rewards: np.ndarray, batch: RolloutBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None, AdvantageResult, np.ndarray]:
        """This process's advantages and loss weights (None: 1 each), the whole-batch result and
        the whole batch's rewards."""
        tokens = np.array([e.completion_length for e in batch.episodes], dtype=np.float64)
        parts = self._gather((rewards, batch.group_ids, tokens))
        all_rewards = np.concatenate([p[0] for p in parts])
        offset = sum(len(p[0]) for p in parts[: self.rank])
        result = compute_advantages(
            torch.from_numpy(all_rewards.astype(np.float64)),
            torch.from_numpy(np.concatenate([p[1] for p in parts])),
            estimator=self.cfg.algorithm.estimator,
            weights=torch.from_numpy(self.weights),
            token_counts=torch.from_numpy(np.concatenate([p[2] for p in parts])),
            **self.cfg.algorithm.estimator_options,
        )
        mine = slice(offset, offset + len(rewards))
        loss_weight = result.loss_weight
        return result.advantages[mine], None if loss_weight is None else loss_weight[mine], result, all_rewards

    # -------------------------------------------------------------------- loop
    def train(self) -> Path:
        """Run the remaining steps; returns the run folder."""
        self.context.run_steps(self.start_step, self.train_step, self.save)
        if self.overlap is not None:
            self.overlap.close()
        self.venv.close()
        self.context.close()
        return self.output_dir

    def train_step(self, step: int) -> dict[str, Any]:
        """One step: collect, shape rewards, advantages, update, log; returns the logged record."""
        t0 = time.perf_counter()
        overlap_metrics: dict[str, float] = {}
        if self.overlap is None:
            batch = self._collect(step)
        else:
            batch, overlap_metrics = self.overlap.next_batch(step)
        t1 = time.perf_counter()
        self.weights = self.reward_weights.at(step)
        rewards = self._shape_rewards(batch)
        advantages, loss_weight, result, all_rewards = self._advantages(rewards, batch)
        self.last_advantages = result.advantages
        t2 = time.perf_counter()
        packed = pack_episodes(batch.episodes, self.pad_id, self.accelerator.device)
        update_metrics = self.updater.update(
            packed, advantages, any_signal=bool(result.advantages.abs().max() > 0), step=step,
            sequence_weights=loss_weight,
        )
        if self.overlap is None:
            self.engine.sync_weights(self.unwrapped)
        else:
            self.overlap.after_update()  # the copy follows at the next step, once the worker is idle
        t3 = time.perf_counter()
        record = self._record(step, batch, result, all_rewards, update_metrics)
        record.update({
            "time/generate": batch.generate_seconds,
            "time/reward": batch.reward_seconds + (t2 - t1),
            "time/update": t3 - t2,
            "time/step": t3 - t0,
            **overlap_metrics,
        })
        self.context.log(record)
        # the env's own components (not the overlong one the trainer adds), whole batch
        warning = self.zero_rewards.observe(step + 1, all_rewards[:, : len(self.venv.reward_names)],
                                            env=self.cfg.env.id)
        if self.accelerator.is_main_process:
            self._log_samples(step, batch)
            if warning:  # stderr: the progress bar prints it above itself
                print(warning, file=sys.stderr, flush=True)
        return record

    def _record(
        self, step: int, batch: RolloutBatch, result: AdvantageResult, all_rewards: np.ndarray,
        update_metrics: dict[str, float],
    ) -> dict[str, Any]:
        """The step's logged numbers (the same on every process)."""
        lengths = np.array([x for part in self._gather([e.completion_length for e in batch.episodes])
                            for x in part], dtype=np.float64)
        record: dict[str, Any] = {"step": step + 1}
        record.update(reward_metrics(all_rewards, self.weights, self.reward_names, result.stats.to_dict()))
        a = self.cfg.algorithm
        attribution = attribute(result.groups, a.estimator, a.estimator_options, result.advantages,
                                result.decomposition)
        record.update(attribution_metrics(attribution, self.reward_names))
        record.update(estimator_metrics(result.metrics, self.reward_names))
        for name, weight in zip(self.reward_names, self.weights):
            record[f"reward_weight/{name}"] = float(weight)
        if self.gates:
            raw = batch.rewards if batch.raw_rewards is None else batch.raw_rewards
            record.update(self.gates.metrics(np.concatenate(self._gather(raw))))
        record.update(update_metrics)
        record["reward_names"] = list(self.reward_names)
        record["advantage/abs_mean"] = float(result.advantages.abs().mean())
        record["completion_length/mean"] = float(lengths.mean()) if lengths.size else 0.0
        record["completion_length/max"] = float(lengths.max()) if lengths.size else 0.0
        record["episodes"] = int(len(all_rewards))
        record["tokens_per_s"] = float(lengths.sum()) / max(batch.generate_seconds, 1e-9)
        return record

    def _log_samples(self, step: int, batch: RolloutBatch) -> None:
        count = min(self.cfg.train.log_samples, len(batch))
        samples = [
            {"task_id": batch.task_ids[i], "text": batch.texts[i], "reward": batch.rewards[i].tolist()}
            for i in range(count)
        ]
        self.logger.log_samples(step + 1, samples)

    def save(self, step: int) -> Path:
        """Write a checkpoint of the state after ``step`` steps."""
        path = self.context.save(step)
        if self.overlap is not None:  # the next step's batch, sampled from weights not saved
            self.overlap.save(path, self.rank)
            self.accelerator.wait_for_everyone()
        return path


def train(cfg: Config) -> Path:
    """Train with ``cfg``; returns the run folder (see :class:`Trainer`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Trainer(cfg).train()
