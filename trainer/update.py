"""One update loop for every loss: epochs x mini-batches x micro-batches over a step's rollouts
(:meth:`PolicyUpdater.update`), or one optimizer step over micro-batches a caller built
(:meth:`PolicyUpdater.update_batches`: ``corrgrpo sft``'s token-budget batches and its
cross-entropy, the ``sft`` loss).

The loss of every micro-batch is normalised by whole-mini-batch denominators
(sequences and tokens summed over processes), so gradient accumulation and data
parallelism reproduce the single-process gradient. Diagnostics are accumulated as
exact means and maxima (:mod:`corrgrpo.trainer.loss_metrics`) over the whole step and
reduced over processes, so a logged value does not depend on how the batch was
split. Besides the loss's own metrics it logs the entropy, the mismatch between
the sampler's log-probabilities and the trainer's (``mismatch/abs_mean|max``), the
gradient norm before clipping (``grad_norm``, clipping or not) and the norm of the
step's whole parameter change ``||delta theta||`` (``update_norm``, with
``param_norm``; under FSDP over the full parameters, each process summing its
shards), and can weight each token by a truncated importance ratio against the
sampler (``tis_cap``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from corrgrpo.trainer.config import OptimConfig
from corrgrpo.trainer.loss_metrics import Max, Mean, MetricAccumulator
from corrgrpo.trainer.losses import LossConfig, LossFn, LossInputs
from corrgrpo.trainer.policy_forward import PackedBatch, token_logprobs, token_scores
from corrgrpo.trainer.sampler import mix_seed

__all__ = ["PolicyUpdater"]


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local data: its shard for an FSDP2 DTensor, else the tensor itself."""
    to_local = getattr(p, "to_local", None)
    return to_local() if callable(to_local) else p


def _chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [idx[i : i + size] for i in range(0, len(idx), size)] or [idx]


#: builds the loss inputs of micro-batch ``j`` (``sub``) from its log-probabilities ``[B, L-1]``
InputsFor = Callable[[int, PackedBatch, torch.Tensor], LossInputs]


class PolicyUpdater:
    """Updates ``model`` with ``loss_fn``: on packed rollouts and their advantages
    (:meth:`update`), or on supervised micro-batches (:meth:`update_batches`).

    Args:
        model, optimizer, scheduler: as prepared by Accelerate.
        accelerator: the run's ``Accelerator``.
        loss_fn, loss_cfg: the loss and its hyper-parameters.
        optim: the ``optim`` config section (epochs, mini- and micro-batch sizes, clipping;
            :meth:`update_batches` reads only the clipping).
        ref_model: frozen reference for the KL term, or None.
        tis_cap: truncated importance sampling cap, or None.
        seed: seed of the shuffling of later epochs.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        accelerator: Any,
        loss_fn: LossFn,
        loss_cfg: LossConfig,
        optim: OptimConfig,
        *,
        ref_model: torch.nn.Module | None = None,
        tis_cap: float | None = None,
        seed: int = 0,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.accelerator = accelerator
        self.loss_fn, self.loss_cfg, self.optim = loss_fn, loss_cfg, optim
        self.ref_model, self.tis_cap = ref_model, tis_cap
        self.seed = seed
        if optim.share_prefix and accelerator.num_processes > 1:
            # DDP and FSDP expect one forward pass of the wrapped model per backward
            raise ValueError(f"optim.share_prefix: runs on one process only ({accelerator.num_processes} here)")

    # ------------------------------------------------------------------ helpers
    def _trainable(self) -> list[torch.Tensor]:
        """The optimizer's parameters: under FSDP2 its sharded DTensors, even while the module
        holds gathered full parameters (as the root does after a forward pass)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _snapshot(self) -> list[torch.Tensor]:
        """This process's part of the trainable parameters (its shards under FSDP), copied."""
        return [_local(p).detach().clone() for p in self._trainable()]

    def _update_norms(self, before: list[torch.Tensor]) -> dict[str, float]:
        """``||theta_after - theta_before||`` and ``||theta_after||`` over the full parameters."""
        delta = params = 0.0
        sharded = False
        with torch.no_grad():
            for p, old in zip(self._trainable(), before):
                sharded = sharded or _local(p) is not p
                now = _local(p).detach()
                delta += float((now.double() - old.double()).square().sum())
                params += float(now.double().square().sum())
        if sharded:  # each process holds different shards: sum them
            delta, params = self._global(delta), self._global(params)
        return {"update_norm": math.sqrt(delta), "param_norm": math.sqrt(params)}

    def _global(self, value: float | torch.Tensor) -> float:
        """Sum over processes."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.reduce(t, "sum").item())

    def _logprobs(self, model: torch.nn.Module, packed: PackedBatch, micro: int) -> torch.Tensor:
        """``[B, L-1]`` log-probabilities of ``packed`` under ``model``, without gradients."""
        width = packed.loss_mask.shape[1]
        parts = []
        with torch.no_grad():
            for c in _chunks(torch.arange(len(packed)), micro):
                lp, _ = token_logprobs(model, packed.index(c), share_prefix=self.optim.share_prefix)
                parts.append(torch.nn.functional.pad(lp, (0, width - lp.shape[1])))
        return torch.cat(parts)

    def _sampler_terms(
        self, old: torch.Tensor, sub: PackedBatch, metrics: MetricAccumulator, first_epoch: bool
    ) -> torch.Tensor | None:
        """Log the sampler/trainer mismatch (first epoch); return the TIS weights, if on."""
        mask = sub.loss_mask
        delta = old - sub.sampler_logprobs
        if first_epoch:
            gap = (delta.abs() * mask).detach()
            metrics.add({
                "mismatch/abs_mean": Mean(float(gap.sum()), float(mask.sum())),
                "mismatch/max": Max(float(gap.max()) if gap.numel() else -math.inf),
            })
        if self.tis_cap is None:
            return None
        ratio = torch.exp(delta.clamp(max=math.log(self.tis_cap) + 1.0)) * mask
        if first_epoch:
            metrics.add({
                "tis/capped_fraction": Mean(float(((ratio > self.tis_cap) * mask).sum()),
                                            float(mask.sum())),
                "tis/weight_mean": Mean(float(ratio.clamp(max=self.tis_cap).sum()), float(mask.sum())),
            })
        return ratio.clamp(max=self.tis_cap)

    # ------------------------------------------------------------------- passes
    def _loss_pass(
        self,
        model: torch.nn.Module,
        j: int,
        sub: PackedBatch,
        inputs_for: InputsFor,
        metrics: MetricAccumulator,
        *,
        with_entropy: bool = False,
        supervised: bool = False,
    ) -> torch.Tensor:
        """Forward micro-batch ``j`` (``sub``), its loss and diagnostics (added to ``metrics``);
        returns the loss.

        ``supervised``: logits only at the trained positions (packed rows hold other examples'
        prompts between them) and the token accuracy logged.
        """
        scores = token_scores(model, sub, with_entropy=with_entropy, with_accuracy=supervised,
                              share_prefix=self.optim.share_prefix, only_trained=supervised)
        out = self.loss_fn(inputs_for(j, sub, scores.logp))
        metrics.add(out.metrics, prefix="loss/")
        mask = sub.loss_mask
        tokens = float(mask.sum())
        if scores.entropy is not None:
            metrics.add({"entropy": Mean(float((scores.entropy * mask).sum()), tokens)})
        if scores.correct is not None:
            metrics.add({"token_accuracy": Mean(float((scores.correct * mask).sum()), tokens)})
        return out.loss

    def _accumulate(
        self, passes: Sequence[PackedBatch], inputs_for: InputsFor, metrics: MetricAccumulator, **options: bool
    ) -> None:
        """Forward and backward passes of one optimizer step; gradients sync on the last one."""
        acc = self.accelerator
        for j, sub in enumerate(passes):
            last = j == len(passes) - 1
            with nullcontext() if last else acc.no_sync(self.model):
                acc.backward(self._loss_pass(self.model, j, sub, inputs_for, metrics, **options))

    def _optimizer_step(self, metrics: MetricAccumulator) -> None:
        """Clip (``optim.max_grad_norm``), log the gradient norm and step the optimizer."""
        acc = self.accelerator
        world = acc.num_processes
        # the norm before clipping; without clipping an infinite bound only measures it
        bound = self.optim.max_grad_norm if self.optim.max_grad_norm > 0 else math.inf
        grad_norm = float(acc.clip_grad_norm_(self.model.parameters(), bound))
        # the same on every process (gradients are all-reduced): weight 1 / world each
        metrics.add({"grad_norm": Mean(grad_norm / world, 1.0 / world)})
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _finish(self, metrics: MetricAccumulator, before: list[torch.Tensor]) -> dict[str, float]:
        """Advance the schedule; the step's reduced metrics, learning rate and update norms."""
        self.scheduler.step()
        result = metrics.reduce(self.accelerator)
        result["lr"] = float(self.scheduler.get_last_lr()[0])
        result.update(self._update_norms(before))
        return result

    # ------------------------------------------------------------------- update
    def update(
        self, packed: PackedBatch, advantages: torch.Tensor, *, any_signal: bool, step: int,
        sequence_weights: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Run the update on this process's rows; returns the step's reduced metrics.

        ``advantages``: ``[B]`` of this process's rows; ``any_signal``: some advantage of the
        WHOLE batch (all processes) is non-zero (without it and without a KL term the
        gradient is exactly 0 and the passes are skipped); ``sequence_weights``: ``[B]`` the
        estimator's loss weight of these rows (``LossInputs.sequence_weights``), or None.
        """
        acc, o = self.accelerator, self.optim
        device = acc.device
        adv = advantages.to(device=device, dtype=torch.float32)
        seq_w = None if sequence_weights is None else sequence_weights.to(device=device, dtype=torch.float32)
        n = len(packed)
        total = int(self._global(n))
        num_mini = max(1, math.ceil(total / (o.mini_batch_size or total)))
        mini_local = math.ceil(n / num_mini)
        micro = o.micro_batch_size or mini_local
        self.model.train()
        metrics = MetricAccumulator()
        before = self._snapshot()
        if self.ref_model is None and not any_signal:
            return {**self._zero_gradient_step(o.epochs * num_mini, metrics), **self._update_norms(before)}

        # PPO's proximal ("old") log-probabilities are those of the weights before this
        # step's first optimizer step. With one epoch and one mini-batch every forward pass
        # runs on exactly those weights, so ``logp.detach()`` is them and a separate no-grad
        # pass would compute the same numbers again; that holds whoever sampled the batch
        # (the sampler's own log-probabilities enter only through the TIS weights).
        need_old = o.epochs > 1 or num_mini > 1
        old_logp = self._logprobs(self.model, packed, micro) if need_old else None
        ref_logp = self._logprobs(self.ref_model, packed, micro) if self.ref_model is not None else None
        order_gen = torch.Generator().manual_seed(mix_seed(self.seed, step, 77))
        for epoch in range(o.epochs):
            order = torch.arange(n) if epoch == 0 else torch.randperm(n, generator=order_gen)
            for mb in _chunks(order, mini_local):
                # DDP averages gradients over processes: scale denominators by 1/world
                world = acc.num_processes
                seq_den = self._global(len(mb)) / world
                tok_den = max(self._global(packed.loss_mask[mb.to(device)].sum()), 1.0) / world
                chunks = _chunks(mb, micro)
                inputs_for = self._rollout_inputs([c.to(device) for c in chunks], adv, seq_w, old_logp,
                                                  ref_logp, seq_den, tok_den, metrics, epoch == 0)
                self._accumulate([packed.index(c) for c in chunks], inputs_for, metrics,
                                 with_entropy=epoch == 0)
                self._optimizer_step(metrics)
        return self._finish(metrics, before)

    def _rollout_inputs(
        self,
        rows: list[torch.Tensor],
        adv: torch.Tensor,
        seq_w: torch.Tensor | None,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        seq_den: float,
        tok_den: float,
        metrics: MetricAccumulator,
        first_epoch: bool,
    ) -> InputsFor:
        """The loss inputs of the micro-batches of ``rows`` (each micro-batch's row indices):
        advantages, sequence weights, old and reference log-probabilities, TIS weights,
        whole-mini-batch denominators."""

        def inputs_for(j: int, sub: PackedBatch, logp: torch.Tensor) -> LossInputs:
            width = sub.loss_mask.shape[1]
            old = old_logp[rows[j]][:, :width] if old_logp is not None else logp.detach()
            ref = ref_logp[rows[j]][:, :width] if ref_logp is not None else None
            weights = self._sampler_terms(old, sub, metrics, first_epoch)
            return LossInputs(
                logp=logp, old_logp=old, advantages=adv[rows[j]], mask=sub.loss_mask,
                options=self.loss_cfg, ref_logp=ref, token_weights=weights,
                sequence_weights=None if seq_w is None else seq_w[rows[j]],
                seq_denominator=seq_den, token_denominator=tok_den,
            )

        return inputs_for

    def update_batches(self, batches: Sequence[PackedBatch]) -> dict[str, float]:
        """One optimizer step over this process's micro-batches, as the caller built them
        (``corrgrpo sft``: token-budget packed or length-bucketed rows); returns the step's
        reduced metrics.

        The loss gets the trained tokens' log-probabilities and the whole step's denominators
        (trained tokens and rows summed over processes), no advantages and no old
        log-probabilities. Logits are computed only at the trained positions, and the token
        accuracy is logged with the loss's metrics. A micro-batch without trained tokens (a
        stand-in pass under FSDP) adds nothing to the loss or the metrics. Every process calls
        this once per step (the denominators are a collective).
        """
        acc = self.accelerator
        world = acc.num_processes
        self.model.train()
        metrics = MetricAccumulator()
        before = self._snapshot()
        # DDP averages gradients over processes: scale denominators by 1/world
        seq_den = max(self._global(sum(len(b) for b in batches)), 1.0) / world
        tokens = sum(float(b.loss_mask.sum()) for b in batches)
        tok_den = max(self._global(tokens), 1.0) / world

        def inputs_for(j: int, sub: PackedBatch, logp: torch.Tensor) -> LossInputs:
            return LossInputs(logp=logp, mask=sub.loss_mask, options=self.loss_cfg,
                              seq_denominator=seq_den, token_denominator=tok_den)

        self._accumulate(batches, inputs_for, metrics, supervised=True)
        self._optimizer_step(metrics)
        return self._finish(metrics, before)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, batches: Sequence[PackedBatch]) -> dict[str, float]:
        """The loss's metrics and the token accuracy of ``batches`` under ``model`` (no update),
        reduced over processes as a step's are. ``model``: the unwrapped model, so that
        processes may make different numbers of passes (DDP's forward is a collective)."""
        metrics = MetricAccumulator()
        was_training = model.training
        model.eval()

        def inputs_for(j: int, sub: PackedBatch, logp: torch.Tensor) -> LossInputs:
            return LossInputs(logp=logp, mask=sub.loss_mask, options=self.loss_cfg)

        for j, sub in enumerate(batches):
            self._loss_pass(model, j, sub, inputs_for, metrics, supervised=True)
        model.train(was_training)
        return metrics.reduce(self.accelerator)

    def _zero_gradient_step(self, optimizer_steps: int, metrics: MetricAccumulator) -> dict[str, float]:
        """Every advantage is 0 and there is no KL term: the loss gradient is exactly 0.

        Skip the forward and backward passes (the bulk of a step) but step the
        optimizer on zero gradients, so momentum, weight decay and the schedule
        advance exactly as they would have. The sampler/trainer mismatch is not logged
        on such steps: measuring it would cost a forward pass of the whole batch, which is
        what skipping saves (with overlap or a separate sampler it would run beside
        generation and cost more than it hides).
        """
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        for _ in range(optimizer_steps):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        result = metrics.reduce(self.accelerator)
        result.update(grad_norm=0.0, lr=float(self.scheduler.get_last_lr()[0]), skipped_update=1.0)
        return result
