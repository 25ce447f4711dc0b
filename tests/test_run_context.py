"""The run context `corrgrpo train` and `corrgrpo sft` share: one learning-rate schedule."""

from __future__ import annotations

import math

import pytest
import torch

from corrgrpo.trainer.run_context import lr_factor
from tests.test_sft import write_chat_data

OPTIM = {"lr": 0.01, "schedule": "linear", "warmup_steps": 2}
STEPS = 5


def test_warmup_starts_at_lr_over_n_and_reaches_the_peak_at_step_n():
    assert [lr_factor(s, "linear", 4, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert [lr_factor(s, "constant", 0, 3) for s in range(3)] == [1.0, 1.0, 1.0]
    # decay after warmup: linear (10 - s) / 6 and cosine, both towards 0 at step 10
    assert lr_factor(7, "linear", 4, 10) == pytest.approx(0.5)
    assert lr_factor(7, "cosine", 4, 10) == pytest.approx(0.5)
    assert lr_factor(10, "linear", 4, 10) == 0.0
    assert lr_factor(12, "cosine", 4, 10) == pytest.approx(0.0)


def test_train_and_sft_follow_the_same_learning_rates(tmp_path):
    """The same ``optim`` section gives the same logged learning rate at every step in both commands."""
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.run_logger import read_metrics
    from corrgrpo.trainer.sft import SFTTrainer, sft_config_from_dict
    from corrgrpo.trainer.trainer import Trainer

    torch.set_num_threads(1)
    run = {"steps": STEPS, "progress": False, "tensorboard": False, "save_final": False, "cpu": True}
    Trainer(config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 4},
        "algorithm": {"group_size": 2, "prompts_per_step": 1},
        "rollout": {"max_new_tokens": 2, "torch_threads": 1},
        "optim": OPTIM,
        "train": {**run, "split": "all", "output_dir": str(tmp_path / "rl")},
    })).train()
    data = write_chat_data(tmp_path / "chat.jsonl", n=8)
    SFTTrainer(sft_config_from_dict({
        "data": {"source": "file", "files": [str(data)], "eval_fraction": 0.25},
        "optim": OPTIM,
        "train": {**run, "batch_size": 2, "torch_threads": 1, "output_dir": str(tmp_path / "sft")},
    })).train()
    rl = [r["lr"] for r in read_metrics(tmp_path / "rl")]
    sft = [r["lr"] for r in read_metrics(tmp_path / "sft") if r["step"] > 0]
    # each record holds the rate after its step's scheduler step: that of the next step
    expected = [OPTIM["lr"] * lr_factor(s + 1, "linear", 2, STEPS) for s in range(STEPS)]
    assert rl == sft
    assert all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(rl, expected)), (rl, expected)
