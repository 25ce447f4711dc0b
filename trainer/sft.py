"""Supervised fine-tuning (``corrgrpo sft``): a warm start for RL on the same tokens.

Read top to bottom, a run is:

1. build the examples as token-exact episodes (:mod:`corrgrpo.trainer.sft_data`): an
   env's reference answers played through the env, or conversations from files;
   hold out an evaluation set (the env's eval split, eval files, or a slice);
2. each step takes ``train.batch_size`` examples (an epoch-wise permutation that
   is a pure function of the seed and the step, so a resumed run continues
   exactly); each process takes its contiguous share and splits it into
   micro-batches of at most ``train.micro_batch_tokens`` tokens: length-bucketed
   padded rows, or (under FlashAttention) one padding-free row with position ids
   restarting at each example, so attention stays within it;
3. the update is RL's (:class:`corrgrpo.trainer.update.PolicyUpdater`, its ``update_batches``) with
   the ``sft`` loss of :mod:`corrgrpo.trainer.losses`: the summed cross-entropy of the assistant
   tokens (loss mask 1) divided by the number of such tokens in the WHOLE batch, so gradient
   accumulation and data parallelism reproduce the single-process gradient; the same
   forward pass (:func:`corrgrpo.trainer.policy_forward.token_scores`), with logits only at the
   positions that predict a trained token; the same clipping and gradient norm;
4. log loss, token accuracy, the held-out loss and accuracy; checkpoint. The
   run folder's ``model/`` is a plain ``save_pretrained`` folder (merged when
   LoRA is on) that ``corrgrpo train`` takes as ``model.name_or_path``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corrgrpo.agents.episode import Episode
from corrgrpo.trainer.config import OptimConfig
from corrgrpo.trainer.losses import default_config, get_loss
from corrgrpo.trainer.policy_forward import PackedBatch, pack_episodes, pack_in_one_row
from corrgrpo.trainer.progress import TrainProgress
from corrgrpo.trainer.sft_config import (  # the config lives apart from torch; re-exported here
    SFTConfig,
    SFTDataConfig,
    SFTTrainConfig,
    load_sft_config,
    sft_config_from_dict,
)
from corrgrpo.trainer.update import PolicyUpdater

__all__ = [
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainConfig",
    "SFTTrainer",
    "load_sft_config",
    "sft_config_from_dict",
    "pack_examples",
    "bucket_examples",
    "sft",
]


# ----------------------------------------------------------------------------- batches
def trained_tokens(example: Episode) -> int:
    """How many of the example's tokens are loss targets."""
    return int(sum(example.loss_mask[1:]))


def bucket_examples(examples: list[Episode], budget: int) -> list[list[Episode]]:
    """Length-bucketed groups for padded rows: longest first, each group's rows x its longest
    example at most ``budget`` tokens (an example longer than the budget is a group of its own)."""
    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i].token_ids), i))
    groups: list[list[Episode]] = []
    current: list[Episode] = []
    for i in order:
        e = examples[i]
        width = len(current[0].token_ids) if current else len(e.token_ids)
        if current and (len(current) + 1) * width > budget:
            groups.append(current)
            current = []
        current.append(e)
    if current:
        groups.append(current)
    return groups


def pack_examples(examples: list[Episode], budget: int) -> list[list[Episode]]:
    """Greedy, order-keeping packing into groups of at most ``budget`` tokens (an example
    longer than the budget is a group of its own)."""
    groups: list[list[Episode]] = []
    current: list[Episode] = []
    size = 0
    for e in examples:
        n = len(e.token_ids)
        if current and size + n > budget:
            groups.append(current)
            current, size = [], 0
        current.append(e)
        size += n
    if current:
        groups.append(current)
    return groups


class _SFTProgress(TrainProgress):
    """The training progress bar, showing the loss instead of rewards."""

    def numbers(self, record: dict[str, Any]) -> str:
        parts = [f"loss={record.get('loss', float('nan')):.4f}"]
        if "token_accuracy" in record:
            parts.append(f"acc={record['token_accuracy']:.3f}")
        if "eval/loss" in record:
            parts.append(f"eval={record['eval/loss']:.4f}")
        parts.append(f"{self.seconds_per_step:.2f}s/step")
        return " ".join(parts)


# ----------------------------------------------------------------------------- trainer
class SFTTrainer:
    """Owns the model, optimizer, examples and run folder of one supervised run.

    ``SFTTrainer(cfg).train()`` runs ``cfg.train.steps`` steps (or the remaining
    ones when resuming) and returns the run folder, whose ``model/`` is the final
    model as a plain ``save_pretrained`` folder.
    """

    def __init__(self, cfg: SFTConfig, accelerator: Any = None):
        from corrgrpo.trainer.lora import trainable_parameters
        from corrgrpo.trainer.run_context import RunContext
        from corrgrpo.trainer.sampler import TaskSampler
        from corrgrpo.trainer.threads import apply_threads

        self.cfg = cfg
        t = cfg.train
        self.context = run = RunContext(
            model=cfg.model, optim=cfg.optim, run=t, config={**dataclasses.asdict(cfg), "env": cfg.env.section() if cfg.env else {}}, accelerator=accelerator,
            output_dir=Path(t.output_dir or Path("runs") / f"{cfg.name}-sft-s{t.seed}"),
        )
        self.accelerator, self.rank, self.world, self.output_dir = run.accelerator, run.rank, run.world, run.output_dir
        run.per_process("train.batch_size", t.batch_size)
        self.torch_threads, self.torch_threads_source = apply_threads(t.torch_threads)

        model, self.tokenizer = run.build_model()
        self.trainable, self.total_params = trainable_parameters(model)

        self.train_examples, self.eval_examples, self.data_stats = self._load_data()
        self.sampler = TaskSampler([str(i) for i in range(len(self.train_examples))], t.batch_size, t.seed)

        self.model, self.optimizer, self.scheduler = run.prepare(model)
        self.unwrapped = run.unwrapped
        self.updater = self._updater()
        attn = str(getattr(getattr(self.unwrapped, "config", None), "_attn_implementation", "") or "")
        self.packed = t.packing == "packed" or (t.packing == "auto" and attn.startswith("flash"))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id or 0)
        _, self.start_step = run.start()
        self.logger = run.logger

    # -------------------------------------------------------------------- data
    def _load_data(self) -> tuple[list[Episode], list[Episode], dict[str, Any]]:
        from corrgrpo.trainer.sft_data import (
            DataStats,
            SFTDataError,
            env_examples,
            file_examples,
            summarize,
            truncate,
        )

        cfg, d = self.cfg, self.cfg.data
        eval_examples: list[Episode] | None = None
        if d.source == "env":
            env_id = cfg.env.id
            kwargs = cfg.env.kwargs()
            train, stats = env_examples(
                env_id, {**kwargs, "split": d.train_split}, self.tokenizer, d.max_turns, d.max_examples
            )
            eval_stats = DataStats()
            if d.eval_split is not None:
                eval_examples, eval_stats = env_examples(
                    env_id, {**kwargs, "split": d.eval_split}, self.tokenizer, d.max_turns, d.max_eval_examples
                )
        else:
            train, stats = file_examples(d.files, self.tokenizer)
            train = train[: d.max_examples or None]
            eval_stats = DataStats()
            if d.eval_files:
                eval_examples, eval_stats = file_examples(d.eval_files, self.tokenizer)
        if eval_examples is None:
            # a held-out slice of the training examples, the same for every seed
            order = np.random.default_rng(0x5F7).permutation(len(train))
            n_eval = int(round(d.eval_fraction * len(train)))
            if d.max_eval_examples is not None:
                n_eval = min(n_eval, d.max_eval_examples)
            held = set(order[:n_eval].tolist())
            eval_examples = [train[i] for i in sorted(held)]
            train = [e for i, e in enumerate(train) if i not in held]
        eval_examples = eval_examples[: d.max_eval_examples or None]
        stats.truncated = truncate(train, d.max_length)
        eval_stats.truncated = truncate(eval_examples, d.max_length)
        # an example cut before its first assistant token teaches nothing: leave it out
        kept = [e for e in train if trained_tokens(e) > 0]
        stats.dropped, train = len(train) - len(kept), kept
        kept = [e for e in eval_examples if trained_tokens(e) > 0]
        eval_stats.dropped, eval_examples = len(eval_examples) - len(kept), kept
        if not train:
            raise SFTDataError(
                f"no training example has an assistant token within data.max_length={d.max_length} "
                f"({stats.dropped} cut before their first one); raise data.max_length"
            )
        record = summarize(train, stats).to_dict("data/train")
        record.update(summarize(eval_examples, eval_stats).to_dict("data/eval"))
        return train, eval_examples, record

    # -------------------------------------------------------------------- step
    def _groups(self, examples: list[Episode]) -> list[list[Episode]]:
        budget = self.cfg.train.micro_batch_tokens
        return pack_examples(examples, budget) if self.packed else bucket_examples(examples, budget)

    def _micro_batches(self, groups: list[list[Episode]]) -> list[PackedBatch]:
        """One forward pass's tensors per group: a padding-free row or padded rows.

        Under FSDP each pass gathers the weights from every process, so all must make as many:
        stand-in passes are added up to the most any process makes. A process without a group
        (fewer held-out examples than processes) makes one, so every process reports the same
        metrics. A stand-in repeats the first training example with no trained token: it adds
        nothing to the loss, its gradient or the metrics.
        """
        from corrgrpo.trainer.fsdp import is_sharded

        device = self.accelerator.device
        count = len(groups)
        if is_sharded(self.unwrapped):
            counts = self.accelerator.gather(torch.tensor([count], device=device))
            count = int(counts.max())
        batches = [pack_in_one_row(g, device) if self.packed else pack_episodes(g, self.pad_id, device)
                   for g in groups]
        for _ in range(max(count, 1) - len(groups)):
            stand_in = pack_episodes([self.train_examples[0]], self.pad_id, device)
            stand_in.loss_mask = torch.zeros_like(stand_in.loss_mask)
            batches.append(stand_in)
        return batches

    def _updater(self) -> PolicyUpdater:
        """RL's update loop with the ``sft`` loss; SFT has one epoch and one optimizer step per
        batch (the ``optim`` section's defaults for ``corrgrpo train``'s batching keys)."""
        optim = OptimConfig(**dataclasses.asdict(self.cfg.optim))
        return PolicyUpdater(self.model, self.optimizer, self.scheduler, self.accelerator,
                             get_loss("sft"), default_config("sft"), optim, seed=self.cfg.train.seed)

    def train_step(self, step: int) -> dict[str, Any]:
        """One optimizer step over the step's batch; returns the logged record."""
        t0 = time.perf_counter()
        batch = [self.train_examples[int(i)] for i in self.sampler.tasks_for_step(step)]
        per = len(batch) // self.world
        groups = self._groups(batch[self.rank * per : (self.rank + 1) * per])
        result = self.updater.update_batches(self._micro_batches(groups))
        seconds = time.perf_counter() - t0
        # every process knows the whole batch: its counts need no communication
        tokens = sum(len(e.token_ids) for e in batch)
        return {
            "step": step + 1,
            "loss": result.pop("loss/cross_entropy"),
            "token_accuracy": result.pop("token_accuracy"),
            "trained_tokens": sum(trained_tokens(e) for e in batch),
            "tokens": tokens,
            "examples": len(batch),
            "micro_batches": len(groups),
            **result,  # grad_norm, lr, update_norm, param_norm
            "time/step": seconds,
            "tokens_per_s": tokens / max(seconds, 1e-9),
        }

    def evaluate(self) -> dict[str, float]:
        """Held-out loss and token accuracy (token means over the whole eval set)."""
        if not self.eval_examples:
            return {}
        mine = self.eval_examples[self.rank :: self.world]
        result = self.updater.evaluate(self.unwrapped, self._micro_batches(self._groups(mine)))
        loss = result.get("loss/cross_entropy", math.nan)
        if math.isnan(loss):  # no held-out token
            return {}
        return {"eval/loss": loss, "eval/token_accuracy": result["token_accuracy"]}

    # -------------------------------------------------------------------- loop
    def train(self) -> Path:
        """Run the remaining steps; returns the run folder."""
        run = self.context
        if self.start_step == 0:
            run.log({"step": 0, **self.data_stats, "parameters/trainable": self.trainable,
                     "parameters/total": self.total_params, **self.evaluate()})
        run.run_steps(self.start_step, self._step_and_log, self.save, _SFTProgress)
        run.save_model(self.output_dir / "model")
        run.close()
        return self.output_dir

    def _step_and_log(self, step: int) -> dict[str, Any]:
        """A step, the held-out numbers when due (``train.eval_every``, the last step), logged."""
        record = self.train_step(step)
        every = self.cfg.train.eval_every
        if step + 1 == self.cfg.train.steps or (every and (step + 1) % every == 0):
            record.update(self.evaluate())
        self.context.log(record)
        return record

    def save(self, step: int) -> Path:
        """Write a checkpoint of the state after ``step`` steps."""
        return self.context.save(step)


def sft(cfg: SFTConfig) -> Path:
    """Fine-tune with ``cfg``; returns the run folder (see :class:`SFTTrainer`)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return SFTTrainer(cfg).train()
