"""Logged step metrics do not depend on how the batch is split; the sampler/trainer
log-prob mismatch is logged and truncated importance sampling runs (HF backend: mismatch ~ 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import config_from_dict
from trainer.trainer import Trainer

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
