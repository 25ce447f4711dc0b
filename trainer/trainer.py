"""The training loop: grouped rollouts -> vector rewards -> advantages -> policy update.

Read top to bottom, one step is:

1. pick the step's P tasks (a pure function of seed and step, see ``sampler``);
   each process takes its contiguous share;
2. run G rollouts of each task through ``GroupedVectorEnv`` and the policy;
   optional dynamic sampling drops groups whose raw reward vectors are all equal
   and samples more;
3. gather every process's reward vectors, turn them into advantages with
   ``compute_advantages`` on the WHOLE batch (so they do not depend on the number
   of processes) and keep this process's slice;
4. update the policy with the chosen loss over mini-batches and micro-batches,
   the loss normalised by whole-batch denominators so that gradient accumulation
   and data parallelism reproduce the single-process gradient;
5. log the reward diagnostics, time split and losses; checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

import corrgrpo_envs
from agents.hf_policy import HFPolicy
from agents.models import load_model
from agents.policy import SamplingParams
from corrgrpo_envs.vector import GroupedVectorEnv
from trainer.advantages import compute_advantages
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.config import Config, config_to_dict
from trainer.losses import default_config, get_loss
from trainer.policy_forward import pack_episodes, token_logprobs
from trainer.progress import TrainProgress
from trainer.reward_metrics import reward_metrics
from trainer.rollout import RolloutBatch, collect_groups, overlong_penalty
from trainer.run_logger import RunLogger
from trainer.sampler import TaskSampler

__all__ = ["Trainer", "train"]


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _mix(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    return int(np.random.default_rng(list(parts)).integers(0, 2**63 - 1))


def _lr_lambda(schedule: str, warmup: int, total: int):
    def fn(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return fn


class Trainer:
    """Owns the model, optimizer, environments and run folder of one training run.

    ``Trainer(cfg).train()`` runs ``cfg.train.steps`` steps (or the remaining
    ones when resuming) and returns the run folder.
    """

    def __init__(self, cfg: Config, accelerator: Accelerator | None = None):
        self.cfg = cfg
        use_cpu = cfg.train.cpu or not torch.cuda.is_available()
        self.accelerator = accelerator or Accelerator(cpu=use_cpu)
        acc = self.accelerator
        self.rank, self.world = acc.process_index, acc.num_processes
        a, r = cfg.algorithm, cfg.rollout
        if a.prompts_per_step % self.world:
            raise ValueError(
                f"algorithm.prompts_per_step={a.prompts_per_step} must be divisible by the "
                f"number of processes ({self.world})"
            )
        self.groups_per_process = a.prompts_per_step // self.world
        self.output_dir = Path(
            cfg.train.output_dir or Path("runs") / f"{cfg.name}-{a.estimator}-s{cfg.train.seed}"
        )
        _seed_everything(cfg.train.seed)

        # --- environment ------------------------------------------------------
        env_kwargs = {k: v for k, v in cfg.env.items() if k != "id"}
        env_kwargs.setdefault("split", cfg.train.split)
        probe = corrgrpo_envs.make(cfg.env["id"], **env_kwargs).unwrapped
        self.reward_names = list(probe.reward_names)
        weights = a.reward_weights if a.reward_weights is not None else probe.reward_weights
        if len(weights) != len(self.reward_names):
            raise ValueError(
                f"algorithm.reward_weights has {len(weights)} entries for "
                f"{len(self.reward_names)} rewards {self.reward_names}"
            )
        self.weights = np.asarray(weights, dtype=np.float64)
        if a.overlong_buffer is not None:
            self.reward_names.append("overlong")
            self.weights = np.append(self.weights, a.overlong_weight)
        self.sampler = TaskSampler(probe.task_ids, a.prompts_per_step, cfg.train.seed)
        probe.close()  # only read for its rewards and tasks; the rollouts use self.venv
        self.venv = GroupedVectorEnv(
            cfg.env["id"],
            num_groups=self.groups_per_process,
            group_size=a.group_size,
            workers=r.reward_workers,
            executor=r.reward_executor,
            **env_kwargs,
        )

        # --- model, reference, optimizer -------------------------------------
        dtype = getattr(torch, cfg.model.dtype)
        model_kwargs: dict[str, Any] = {"dtype": dtype}
        if cfg.model.tokenizer_file:
            model_kwargs["tokenizer_file"] = cfg.model.tokenizer_file
        model, self.tokenizer = load_model(cfg.model.name_or_path, **model_kwargs)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.ref_model = None
        if a.kl_beta > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            self.ref_model.to(acc.device)
        o = cfg.optim
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, _lr_lambda(o.schedule, o.warmup_steps, cfg.train.steps)
        )
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.unwrapped = acc.unwrap_model(self.model)

        # --- loss ---------------------------------------------------------------
        self.loss_fn = get_loss(a.loss)
        lc = default_config(a.loss)
        overrides = {
            "clip_low": a.clip_low,
            "clip_high": a.clip_high,
            "dual_clip": a.dual_clip,
            "kl_beta": a.kl_beta,
            "max_completion_length": r.max_new_tokens * r.max_turns,
        }
        self.loss_cfg = dataclasses.replace(
            lc, **{k: v for k, v in overrides.items() if v is not None}
        )
        self.dynamic_sampling = (
            a.dynamic_sampling if a.dynamic_sampling is not None else a.loss == "dapo"
        )

        # --- rollout policy ----------------------------------------------------
        self.sampling = SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            stop=tuple(r.stop),
        )
        if r.backend == "vllm":
            self.policy = self._start_vllm()
        else:
            self.policy = HFPolicy(self.unwrapped, self.tokenizer)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id or 0
        )
        self.start_step = 0
        self.logger = RunLogger(
            self.output_dir, tensorboard=cfg.train.tensorboard, enabled=acc.is_main_process
        )
        if cfg.train.resume:
            self._resume(cfg.train.resume)
            if r.backend == "vllm":
                self.policy.update_weights(self.unwrapped.state_dict())
        if acc.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.output_dir / "config.json", "w", encoding="utf-8") as f:
                json.dump(config_to_dict(cfg), f, indent=2)

    def _start_vllm(self):
        """A colocated in-process vLLM engine serving a copy of the initial weights."""
        import tempfile

        from agents.vllm_policy import VLLMPolicy

        folder = Path(tempfile.mkdtemp(prefix="corrgrpo-vllm-"))
        self.unwrapped.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        kwargs = {"dtype": self.cfg.model.dtype, **self.cfg.rollout.vllm_kwargs}
        return VLLMPolicy(folder, self.tokenizer, **kwargs)

    # ------------------------------------------------------------------ resume
    def _resume(self, where: str) -> None:
        path = latest_checkpoint(self.output_dir) if where == "auto" else Path(where)
        if path is None:
            return  # nothing saved yet: start from scratch
        state = load_checkpoint(
            path, self.unwrapped, self.optimizer, self.scheduler, rank=self.rank
        )
        self.start_step = int(state["step"])
        self.logger.truncate_after(self.start_step)

    # ----------------------------------------------------------------- rollout
    def _seed_for(self, step: int, salt: int):
        seed = self.cfg.train.seed
        return lambda group: _mix(seed, step, salt, group)

    def _collect(self, step: int) -> RolloutBatch:
        """This process's share of the step's groups (after dynamic sampling)."""
        cfg, a = self.cfg, self.cfg.algorithm
        per, P = self.groups_per_process, a.prompts_per_step
        tasks = self.sampler.tasks_for_step(step)[self.rank * per : (self.rank + 1) * per]
        self.unwrapped.eval()
        with torch.no_grad():
            batch = collect_groups(
                self.venv,
                self.policy,
                tasks,
                first_group_id=self.rank * per,
                sampling=self.sampling,
                max_turns=cfg.rollout.max_turns,
                groups_per_generate=cfg.rollout.groups_per_generate,
                seed_for=self._seed_for(step, 0),
            )
            if not self.dynamic_sampling:
                return batch
            kept = [self._informative(batch)]
            have = len(np.unique(kept[0].group_ids))
            for round_ in range(1, a.max_resample_rounds + 1):
                if have >= per:
                    break
                extra = collect_groups(
                    self.venv,
                    self.policy,
                    self.sampler.extra_tasks(step, round_ * self.world + self.rank, per),
                    first_group_id=round_ * P + self.rank * per,
                    sampling=self.sampling,
                    max_turns=cfg.rollout.max_turns,
                    groups_per_generate=cfg.rollout.groups_per_generate,
                    seed_for=self._seed_for(step, round_),
                )
                extra = self._informative(extra)
                ids = np.unique(extra.group_ids)[: per - have]
                kept.append(extra.select_groups(ids))
                have += len(ids)
            if have == 0:  # nothing informative: train on the plain batch (zero advantages)
                return batch
            return RolloutBatch.concat(kept)

    @staticmethod
    def _informative(batch: RolloutBatch) -> RolloutBatch:
        """Groups whose RAW reward vectors are not all equal (DAPO's dynamic sampling)."""
        keep = []
        for g in np.unique(batch.group_ids):
            r = batch.rewards[batch.group_ids == g]
            if not np.all(np.isclose(r, r[:1], equal_nan=True)):
                keep.append(g)
        return batch.select_groups(np.asarray(keep, dtype=np.int64))

    # -------------------------------------------------------------- advantages
    def _advantages(self, batch: RolloutBatch):
        """Advantages of this process's rows, computed on the whole gathered batch."""
        rewards = batch.rewards
        if self.cfg.algorithm.overlong_buffer is not None:
            lengths = np.array([e.completion_length for e in batch.episodes])
            pen = overlong_penalty(
                lengths, self.cfg.rollout.max_new_tokens, self.cfg.algorithm.overlong_buffer
            )
            rewards = np.concatenate([rewards, pen[:, None]], axis=1)
        if self.world > 1:
            parts = gather_object([(rewards, batch.group_ids)])
        else:
            parts = [(rewards, batch.group_ids)]
        all_rewards = np.concatenate([p[0] for p in parts])
        all_groups = np.concatenate([p[1] for p in parts])
        offset = sum(len(p[0]) for p in parts[: self.rank])
        result = compute_advantages(
            torch.from_numpy(all_rewards.astype(np.float64)),
            torch.from_numpy(all_groups),
            estimator=self.cfg.algorithm.estimator,
            weights=torch.from_numpy(self.weights),
            **self.cfg.algorithm.estimator_options,
        )
        local = result.advantages[offset : offset + len(rewards)]
        return local, result, all_rewards

    # ------------------------------------------------------------------ update
    def _update(self, batch: RolloutBatch, advantages: torch.Tensor, step: int) -> dict[str, float]:
        cfg, acc = self.cfg, self.accelerator
        o = cfg.optim
        device = acc.device
        packed = pack_episodes(batch.episodes, self.pad_id, device)
        adv = advantages.to(device=device, dtype=torch.float32)
        n = len(packed)
        total = int(acc.reduce(torch.tensor(n, device=device), "sum").item())
        mini_global = o.mini_batch_size or total
        num_mini = max(1, math.ceil(total / mini_global))
        mini_local = math.ceil(n / num_mini)
        micro = o.micro_batch_size or mini_local
        need_old = o.epochs > 1 or num_mini > 1 or cfg.rollout.backend != "hf"
        self.unwrapped.train()
        if self.ref_model is None and bool(self.last_advantages.abs().max() == 0):
            return self._zero_gradient_step(o.epochs * num_mini)

        def chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
            return [idx[i : i + size] for i in range(0, len(idx), size)] or [idx]

        old_logp = ref_logp = None
        if need_old or self.ref_model is not None:
            with torch.no_grad():
                olds, refs = [], []
                for c in chunks(torch.arange(n), micro):
                    sub = packed.index(c)
                    L = packed.loss_mask.shape[1]
                    if need_old:
                        lp, _ = token_logprobs(self.model, sub)
                        olds.append(torch.nn.functional.pad(lp, (0, L - lp.shape[1])))
                    if self.ref_model is not None:
                        lp, _ = token_logprobs(self.ref_model, sub)
                        refs.append(torch.nn.functional.pad(lp, (0, L - lp.shape[1])))
                old_logp = torch.cat(olds) if olds else None
                ref_logp = torch.cat(refs) if refs else None

        sums: dict[str, float] = {}
        count = 0
        entropy_sum = torch.zeros((), device=device)
        entropy_tokens = torch.zeros((), device=device)
        grad_norm = torch.zeros(())
        order_gen = torch.Generator().manual_seed(_mix(cfg.train.seed, step, 77))
        for epoch in range(o.epochs):
            order = torch.arange(n) if epoch == 0 else torch.randperm(n, generator=order_gen)
            for mb in chunks(order, mini_local):
                seqs = acc.reduce(torch.tensor(float(len(mb)), device=device), "sum")
                toks = acc.reduce(packed.loss_mask[mb.to(device)].sum(), "sum")
                # DDP averages gradients over processes: scale denominators by 1/world
                seq_den = float(seqs.item()) / self.world
                tok_den = max(float(toks.item()), 1.0) / self.world
                micro_chunks = chunks(mb, micro)
                for j, c in enumerate(micro_chunks):
                    sub = packed.index(c)
                    L = sub.loss_mask.shape[1]
                    ctx = acc.no_sync(self.model) if j < len(micro_chunks) - 1 else nullcontext()
                    with ctx:
                        logp, ent = token_logprobs(self.model, sub, with_entropy=(epoch == 0))
                        old = old_logp[c.to(device)][:, :L] if old_logp is not None else logp.detach()
                        ref = ref_logp[c.to(device)][:, :L] if ref_logp is not None else None
                        out = self.loss_fn(
                            logp,
                            old,
                            adv[c.to(device)],
                            sub.loss_mask,
                            self.loss_cfg,
                            ref_logp=ref,
                            seq_denominator=seq_den,
                            token_denominator=tok_den,
                        )
                        acc.backward(out.loss)
                    if ent is not None:
                        entropy_sum += (ent * sub.loss_mask).sum()
                        entropy_tokens += sub.loss_mask.sum()
                    for k, v in out.metrics.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
                    count += 1
                if o.max_grad_norm > 0:
                    grad_norm = acc.clip_grad_norm_(self.model.parameters(), o.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        stats = torch.tensor(
            [entropy_sum.item(), entropy_tokens.item()], device=device, dtype=torch.float64
        )
        stats = acc.reduce(stats, "sum")
        metrics = {f"loss/{k}": v / max(count, 1) for k, v in sums.items()}
        metrics["entropy"] = float(stats[0] / max(stats[1].item(), 1.0))
        metrics["grad_norm"] = float(grad_norm)
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        return metrics

    def _zero_gradient_step(self, optimizer_steps: int) -> dict[str, float]:
        """Every advantage is 0 and there is no KL term: the loss gradient is exactly 0.

        Skip the forward and backward passes (the bulk of a step) but step the
        optimizer on zero gradients, so momentum, weight decay and the schedule
        advance exactly as they would have.
        """
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        for _ in range(optimizer_steps):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return {
            "grad_norm": 0.0,
            "lr": float(self.scheduler.get_last_lr()[0]),
            "skipped_update": 1.0,
        }

    # -------------------------------------------------------------------- loop
    def train(self) -> Path:
        """Run the remaining steps; returns the run folder."""
        cfg, acc = self.cfg, self.accelerator
        steps = cfg.train.steps
        progress = TrainProgress(
            steps, enabled=cfg.train.progress and acc.is_main_process, start=self.start_step
        )
        with progress:
            for step in range(self.start_step, steps):
                record = self.train_step(step)
                progress.update(step + 1, record)
                last = step + 1 == steps
                if (cfg.train.save_every and (step + 1) % cfg.train.save_every == 0) or (
                    last and cfg.train.save_final
                ):
                    self.save(step + 1)
        self.logger.close()
        self.venv.close()
        acc.wait_for_everyone()
        return self.output_dir

    def train_step(self, step: int) -> dict[str, Any]:
        """One step: collect, score, compute advantages, update; returns the logged record."""
        t0 = time.perf_counter()
        batch = self._collect(step)
        t1 = time.perf_counter()
        advantages, result, all_rewards = self._advantages(batch)
        self.last_advantages = result.advantages  # whole batch, identical on every process
        t2 = time.perf_counter()
        update_metrics = self._update(batch, advantages, step)
        if self.cfg.rollout.backend == "vllm":
            self.policy.update_weights(self.unwrapped.state_dict())
        t3 = time.perf_counter()

        lengths = np.array([e.completion_length for e in batch.episodes], dtype=np.float64)
        gen_tokens = float(lengths.sum())
        if self.world > 1:
            gathered = gather_object([(lengths.tolist(), batch.generate_seconds)])
            lengths = np.array([x for g in gathered for x in g[0]])
            gen_tokens = float(lengths.sum())
        record: dict[str, Any] = {"step": step + 1}
        record.update(
            reward_metrics(all_rewards, self.weights, self.reward_names, result.stats.to_dict())
        )
        record.update(update_metrics)
        record["reward_names"] = list(self.reward_names)
        record["advantage/abs_mean"] = float(result.advantages.abs().mean())
        record["completion_length/mean"] = float(lengths.mean()) if lengths.size else 0.0
        record["completion_length/max"] = float(lengths.max()) if lengths.size else 0.0
        record["episodes"] = int(len(all_rewards))
        record["time/generate"] = batch.generate_seconds
        record["time/reward"] = batch.reward_seconds + (t2 - t1)
        record["time/update"] = t3 - t2
        record["time/step"] = t3 - t0
        record["tokens_per_s"] = gen_tokens / max(batch.generate_seconds, 1e-9)
        if self.accelerator.is_main_process:
            self.logger.log(record)
            if self.cfg.train.log_samples:
                samples = [
                    {
                        "task_id": batch.task_ids[i],
                        "text": batch.texts[i],
                        "reward": batch.rewards[i].tolist(),
                    }
                    for i in range(min(self.cfg.train.log_samples, len(batch)))
                ]
                self.logger.log_samples(step + 1, samples)
        return record

    def save(self, step: int) -> Path:
        """Write a checkpoint of the state after ``step`` steps."""
        self.accelerator.wait_for_everyone()
        path = self.output_dir / f"checkpoint-{step}"
        save_checkpoint(
            path,
            step=step,
            model=self.unwrapped,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            rank=self.rank,
            is_main=self.accelerator.is_main_process,
            config=config_to_dict(self.cfg),
        )
        self.accelerator.wait_for_everyone()
        return path


def train(cfg: Config) -> Path:
    """Train with ``cfg``; returns the run folder (see :class:`Trainer`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return Trainer(cfg).train()


_ = broadcast_object_list  # re-exported for users who extend the loop
