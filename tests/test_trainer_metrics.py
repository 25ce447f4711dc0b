"""Logged step metrics do not depend on how the batch is split; the sampler/trainer
log-prob mismatch is logged and truncated importance sampling runs (HF backend: mismatch ~ 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.trainer import Trainer

METRICS = ["loss/clip_fraction", "loss/ratio_mean", "loss/ratio_max", "loss/kl", "entropy",
           "mismatch/abs_mean", "mismatch/max", "grad_norm"]


def _trainer(tmp_path: Path, name: str, **sections) -> Trainer:
    data = {
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 8},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "grpo", "group_size": 4, "prompts_per_step": 2, "kl_beta": 0.01},
        "rollout": {"max_new_tokens": 8, "torch_threads": 1},
        "optim": {"lr": 1e-3, "epochs": 2, "mini_batch_size": 4},
        "train": {"steps": 1, "seed": 1, "split": "all", "progress": False, "tensorboard": False,
                  "save_final": False, "log_samples": 0, "output_dir": str(tmp_path / name)},
    }
    for section, values in sections.items():
        data[section].update(values)
    return Trainer(config_from_dict(data))


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    """One step with the whole batch in one forward pass per mini-batch."""
    return _trainer(tmp_path_factory.mktemp("whole"), "whole").train_step(0)


def test_micro_batches_log_the_whole_batch_metrics(tmp_path, whole):
    # A small step: AdamW's first update is about lr * sign(grad), so at a large lr the rounding
    # of a near-zero gradient entry (which differs with the micro-batch split) flips whole
    # weights and the later mini-batches diverge; metrics averaged per micro-batch instead of
    # over the batch would still be off by far more than the tolerance.
    split = _trainer(tmp_path, "split", optim={"micro_batch_size": 3}).train_step(0)
    assert whole["loss/ratio_max"] > 1.0  # the later mini-batches see updated weights
    for key in METRICS:
        assert split[key] == pytest.approx(whole[key], rel=5e-3, abs=1e-6), key


def test_hf_sampler_matches_the_trainer_and_tis_runs(tmp_path, whole):
    plain = whole
    assert 0.0 <= plain["mismatch/abs_mean"] <= plain["mismatch/max"] < 1e-4
    tis = _trainer(tmp_path, "tis", algorithm={"tis_cap": 2.0}).train_step(0)
    assert tis["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tis["tis/capped_fraction"] == 0.0
    for key in METRICS:  # weights of ~1 change nothing measurable
        assert tis[key] == pytest.approx(plain[key], rel=5e-3, abs=1e-5), key


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.05])
def test_rl_and_sft_updates_log_the_same_gradient_norm(max_grad_norm):
    """``grad_norm`` is the L2 norm of the whole gradient before clipping in both updates,
    clipping on or off, and clipping scales the step alike: with SGD the step's norm
    (``update_norm``) is lr x the clipped gradient's. Each gradient is computed here with plain
    torch (a full forward pass, log-softmax, the loss written out) on a copy of the model."""
    import copy
    import math

    import torch

    from corrgrpo.agents import Episode, load_model
    from corrgrpo.trainer.config import OptimConfig
    from corrgrpo.trainer.fsdp import build_accelerator
    from corrgrpo.trainer.losses import default_config, get_loss
    from corrgrpo.trainer.policy_forward import pack_episodes
    from corrgrpo.trainer.update import PolicyUpdater

    torch.manual_seed(0)
    base, tok = load_model("tiny")
    g = torch.Generator().manual_seed(1)
    episodes = [Episode(token_ids=torch.randint(0, 2000, (n,), generator=g).tolist(),
                        loss_mask=[0] * p + [1] * (n - p), logprobs=[0.0] * n)
                for n, p in ((9, 4), (12, 7), (6, 2))]
    advantages = torch.tensor([1.0, -0.5, 2.0])
    acc = build_accelerator(cpu=True)
    lr = 0.1
    for kind in ("rl", "sft"):
        model, reference = copy.deepcopy(base), copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        model, optimizer = acc.prepare(model, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        name = "grpo" if kind == "rl" else "sft"
        updater = PolicyUpdater(model, optimizer, scheduler, acc, get_loss(name), default_config(name),
                                OptimConfig(lr=lr, max_grad_norm=max_grad_norm))
        batch = pack_episodes(episodes, tok.pad_token_id, torch.device("cpu"))
        logits = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        mask = batch.loss_mask
        if kind == "rl":
            # GRPO at ratio 1: -A logp, mean over each sequence's tokens, then over sequences
            loss = (-(advantages[:, None] * logp * mask).sum(-1) / mask.sum(-1)).mean()
            result = updater.update(batch, advantages, any_signal=True, step=0)
        else:
            loss = -(logp * mask).sum() / mask.sum()
            result = updater.update_batches([batch])
        loss.backward()
        norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in reference.parameters()))
        clipped = min(norm, max_grad_norm) if max_grad_norm > 0 else norm
        assert max_grad_norm < norm  # so clipping acts when on
        assert result["grad_norm"] == pytest.approx(norm, rel=1e-4), kind
        assert result["update_norm"] == pytest.approx(lr * clipped, rel=1e-4), kind
