"""Supervised fine-tuning (``corrgrpo sft``): a warm start for RL on the same tokens.

Read top to bottom, a run is:

1. build the examples as token-exact episodes (:mod:`trainer.sft_data`): an
   env's reference answers played through the env, or conversations from files;
   hold out an evaluation set (the env's eval split, eval files, or a slice);
2. each step takes ``train.batch_size`` examples (an epoch-wise permutation that
   is a pure function of the seed and the step, so a resumed run continues
   exactly); each process takes its contiguous share and splits it into
   micro-batches of at most ``train.micro_batch_tokens`` tokens: length-bucketed
   padded rows, or (under FlashAttention) one padding-free row with position ids
   restarting at each example, so attention stays within it;
3. the loss is the summed cross-entropy of the assistant tokens (loss mask 1)
   divided by the number of such tokens in the WHOLE batch, so gradient
   accumulation and data parallelism reproduce the single-process gradient;
   logits are computed only at the positions that predict a trained token;
4. log loss, token accuracy, the held-out loss and accuracy; checkpoint. The
   run folder's ``model/`` is a plain ``save_pretrained`` folder (merged when
   LoRA is on) that ``corrgrpo train`` takes as ``model.name_or_path``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.episode import Episode
from trainer.config import env_constructor_kwargs
from trainer.progress import TrainProgress
from trainer.sft_config import (  # the config lives apart from torch; re-exported here
    SFTConfig,
    SFTDataConfig,
    SFTTrainConfig,
    load_sft_config,
    sft_config_from_dict,
)

__all__ = [
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainConfig",
    "SFTTrainer",
    "load_sft_config",
    "sft_config_from_dict",
    "pack_examples",
    "bucket_examples",
    "padded_loss",
    "sft",
]


# ----------------------------------------------------------------------------- batches
def _targets(example: Episode) -> np.ndarray:
    """Positions t whose next token (t + 1) is trained."""
    mask = np.asarray(example.loss_mask, dtype=bool)
    return np.flatnonzero(mask[1:])


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


def packed_inputs(examples: list[Episode]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids [1, T], position_ids [1, T], predict_at [K])`` of examples packed in one row.

    ``predict_at`` holds the positions whose next token is a loss target.
    """
    ids, pos, keep = [], [], []
    offset = 0
    for e in examples:
        n = len(e.token_ids)
        ids.append(np.asarray(e.token_ids, dtype=np.int64))
        pos.append(np.arange(n, dtype=np.int64))
        keep.append(_targets(e) + offset)
        offset += n
    return (
        torch.from_numpy(np.concatenate(ids))[None],
        torch.from_numpy(np.concatenate(pos))[None],
        torch.from_numpy(np.concatenate(keep)),
    )


def padded_loss(
    model: Any, examples: list[Episode], device: torch.device, pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`token_loss` of examples in right-padded rows (one per example)."""
    width = max(len(e.token_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    predicts = torch.zeros((len(examples), width), dtype=torch.bool)  # position t predicts a target
    for row, e in enumerate(examples):
        n = len(e.token_ids)
        ids[row, :n] = torch.as_tensor(e.token_ids, dtype=torch.long)
        attention[row, :n] = 1
        predicts[row, : n - 1] = torch.as_tensor(e.loss_mask[1:], dtype=torch.bool)
    keep = predicts.any(dim=0).nonzero().squeeze(1)  # positions any row needs logits at
    ids, attention, predicts, keep = ids.to(device), attention.to(device), predicts.to(device), keep.to(device)
    kwargs = {"input_ids": ids, "attention_mask": attention, "use_cache": False}
    try:
        logits = model(**kwargs, logits_to_keep=keep).logits
    except TypeError:  # a model without logits_to_keep
        logits = model(**kwargs).logits
    if logits.shape[1] != keep.shape[0]:
        logits = logits[:, keep]
    chosen = predicts[:, keep]
    logits, targets = logits[chosen], ids[:, keep + 1][chosen]
    if targets.numel() == 0:
        return logits.sum() * 0.0, torch.zeros((), device=device), 0
    ce = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    correct = (logits.detach().argmax(-1) == targets).sum()
    return ce, correct, int(targets.numel())


def token_loss(model: Any, examples: list[Episode], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(summed cross-entropy, correct argmax predictions, target count)`` of packed examples.

    Only the positions that predict a trained token get logits (``logits_to_keep``
    with their indices): the vocabulary projection is a large part of the cost.
    """
    ids, pos, keep = packed_inputs(examples)
    ids, pos, keep = ids.to(device), pos.to(device), keep.to(device)
    kwargs = {"input_ids": ids, "position_ids": pos, "use_cache": False}
    try:
        logits = model(**kwargs, logits_to_keep=keep).logits[0]
    except TypeError:  # a model without logits_to_keep
        logits = model(**kwargs).logits[0]
    if logits.shape[0] != keep.shape[0]:
        logits = logits[keep]
    targets = ids[0, keep + 1]
    if targets.numel() == 0:  # nothing trained here: a zero loss that still reaches every weight
        return logits.sum() * 0.0, torch.zeros((), device=device), 0
    ce = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    correct = (logits.detach().argmax(-1) == targets).sum()
    return ce, correct, int(targets.numel())


class _SFTProgress(TrainProgress):
    """The training progress bar, showing the loss instead of rewards."""

    def update(self, step: int, record: dict[str, Any]) -> None:
        parts = [f"loss={record.get('loss', float('nan')):.4f}"]
        if "token_accuracy" in record:
            parts.append(f"acc={record['token_accuracy']:.3f}")
        if "eval/loss" in record:
            parts.append(f"eval={record['eval/loss']:.4f}")
        parts.append(f"{record.get('time/step', 0.0):.2f}s/step")
        self._progress.update(self._task, completed=step, info=" ".join(parts))


# ----------------------------------------------------------------------------- trainer
class SFTTrainer:
    """Owns the model, optimizer, examples and run folder of one supervised run.

    ``SFTTrainer(cfg).train()`` runs ``cfg.train.steps`` steps (or the remaining
    ones when resuming) and returns the run folder, whose ``model/`` is the final
    model as a plain ``save_pretrained`` folder.
    """

    def __init__(self, cfg: SFTConfig, accelerator: Any = None):
        from trainer.lora import trainable_parameters
        from trainer.run_context import RunContext
        from trainer.sampler import TaskSampler
        from trainer.threads import choose_threads, configure_threads

        self.cfg = cfg
        t = cfg.train
        self.context = run = RunContext(
            model=cfg.model, optim=cfg.optim, run=t, config=dataclasses.asdict(cfg), accelerator=accelerator,
            output_dir=Path(t.output_dir or Path("runs") / f"{cfg.name}-sft-s{t.seed}"),
        )
        self.accelerator, self.rank, self.world, self.output_dir = run.accelerator, run.rank, run.world, run.output_dir
        run.per_process("train.batch_size", t.batch_size)
        self.torch_threads = configure_threads(t.torch_threads)
        self.torch_threads_source = choose_threads(t.torch_threads)[1]

        model, self.tokenizer = run.build_model()
        self.trainable, self.total_params = trainable_parameters(model)

        self.train_examples, self.eval_examples, self.data_stats = self._load_data()
        self.sampler = TaskSampler([str(i) for i in range(len(self.train_examples))], t.batch_size, t.seed)

        self.model, self.optimizer, self.scheduler = run.prepare(model)
        self.unwrapped = run.unwrapped
        attn = str(getattr(getattr(self.unwrapped, "config", None), "_attn_implementation", "") or "")
        self.packed = t.packing == "packed" or (t.packing == "auto" and attn.startswith("flash"))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id or 0)
        _, self.start_step = run.start()
        self.logger = run.logger

    # -------------------------------------------------------------------- data
    def _load_data(self) -> tuple[list[Episode], list[Episode], dict[str, Any]]:
        from trainer.sft_data import (
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
            env_id = cfg.env["id"]
            kwargs = env_constructor_kwargs(cfg.env)
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

    def _passes(self, groups: list[list[Episode]]) -> list[list[Episode]]:
        """``groups``, and under FSDP stand-in passes up to the most any process makes: there
        each forward pass gathers the weights from every process, so all must make as many.
        The stand-ins repeat the first training example; callers give them no weight."""
        from trainer.fsdp import is_sharded

        if not is_sharded(self.unwrapped):
            return groups
        count = torch.tensor([len(groups)], device=self.accelerator.device)
        most = int(self.accelerator.gather(count).max())
        return groups + [[self.train_examples[0]]] * (most - len(groups))

    def _loss(self, model: Any, group: list[Episode]) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self.packed:
            return token_loss(model, group, self.accelerator.device)
        return padded_loss(model, group, self.accelerator.device, self.pad_id)

    def train_step(self, step: int) -> dict[str, Any]:
        """One optimizer step over the step's batch; returns the logged record."""
        acc, cfg = self.accelerator, self.cfg
        t0 = time.perf_counter()
        batch = [self.train_examples[int(i)] for i in self.sampler.tasks_for_step(step)]
        per = len(batch) // self.world
        mine = batch[self.rank * per : (self.rank + 1) * per]
        # every process knows the whole batch: the token denominator needs no communication
        denominator = max(sum(trained_tokens(e) for e in batch), 1)
        # DDP averages gradients over processes, so each process scales its sum by world
        scale = self.world / denominator
        groups = self._groups(mine)
        passes = self._passes(groups)
        self.model.train()
        sums = torch.zeros(3, dtype=torch.float64, device=acc.device)
        for j, group in enumerate(passes):
            sync = j == len(passes) - 1
            with nullcontext() if sync else acc.no_sync(self.model):
                ce, correct, n = self._loss(self.model, group)
                if j >= len(groups):  # a stand-in pass (FSDP): its gradient is zero
                    ce, correct, n = ce * 0.0, correct * 0, 0
                acc.backward(ce * scale)
            sums += torch.stack([ce.detach().double(), correct.double(), torch.tensor(float(n), device=acc.device, dtype=torch.float64)])
        grad_norm = torch.zeros(())
        if cfg.optim.max_grad_norm > 0:
            grad_norm = acc.clip_grad_norm_(
                [p for p in self.model.parameters() if p.requires_grad], cfg.optim.max_grad_norm
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        tokens = torch.tensor(float(sum(len(e.token_ids) for e in mine)), device=acc.device, dtype=torch.float64)
        totals = acc.reduce(torch.cat([sums, tokens[None]]), "sum") if self.world > 1 else torch.cat([sums, tokens[None]])
        seconds = time.perf_counter() - t0
        count = max(float(totals[2]), 1.0)
        return {
            "step": step + 1,
            "loss": float(totals[0]) / count,
            "token_accuracy": float(totals[1]) / count,
            "trained_tokens": int(totals[2]),
            "tokens": int(totals[3]),
            "examples": len(batch),
            "micro_batches": len(groups),
            "grad_norm": float(grad_norm),
            "lr": float(self.scheduler.get_last_lr()[0]),
            "time/step": seconds,
            "tokens_per_s": float(totals[3]) / max(seconds, 1e-9),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out loss and token accuracy (token means over the whole eval set)."""
        acc = self.accelerator
        mine = self.eval_examples[self.rank :: self.world]
        was_training = self.unwrapped.training
        self.unwrapped.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=acc.device)
        groups = self._groups(mine)
        for j, group in enumerate(self._passes(groups)):
            ce, correct, n = self._loss(self.unwrapped, group)
            if j >= len(groups):  # a stand-in pass (FSDP)
                continue
            sums += torch.tensor([float(ce), float(correct), float(n)], dtype=torch.float64, device=acc.device)
        self.unwrapped.train(was_training)
        if self.world > 1:
            sums = acc.reduce(sums, "sum")
        count = float(sums[2])
        if count == 0:
            return {}
        return {"eval/loss": float(sums[0]) / count, "eval/token_accuracy": float(sums[1]) / count}

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
