"""Overlapped generation (``rollout.overlap``): staleness, correction, learning, determinism, resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from corrgrpo.trainer.config import ConfigError, config_from_dict
from corrgrpo.trainer.run_logger import read_metrics
from corrgrpo.trainer.trainer import Trainer

#: per-step values that must agree between two runs of the same seed (timings excluded)
SAME_KEYS = ("reward/weighted/mean", "reward/digits/mean", "loss/ratio_mean", "grad_norm", "lr",
             "mismatch/abs_mean", "tis/weight_mean", "overlap/staleness", "completion_length/mean")


def _cfg(tmp_path: Path, **sections) -> object:
    data = {
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 32},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4, "tis_cap": 2.0},
        "rollout": {"max_new_tokens": 12, "torch_threads": 1, "overlap": True},  # the cores are shared
        "optim": {"lr": 1e-2},
        "train": {
            "steps": 3, "seed": 0, "split": "all", "progress": False, "tensorboard": False,
            "output_dir": str(tmp_path / "run"), "save_final": False, "log_samples": 0,
        },
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


def _assert_same_records(want: list[dict], have: list[dict]) -> None:
    assert [r["step"] for r in want] == [r["step"] for r in have]
    for a, b in zip(want, have):
        for key in SAME_KEYS:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)


def test_overlap_needs_the_importance_correction(tmp_path):
    with pytest.raises(ConfigError, match=r"algorithm\.tis_cap: null is not allowed with rollout\.overlap"):
        _cfg(tmp_path, algorithm={"tis_cap": None})


def test_staleness_is_one_after_the_first_step_and_the_sampler_is_corrected(tmp_path):
    trainer = Trainer(_cfg(tmp_path))
    assert trainer.policy.model is not trainer.unwrapped  # the rollout side has its own copy
    trainer.train()
    records = read_metrics(tmp_path / "run")
    assert [r["overlap/staleness"] for r in records] == [0.0, 1.0, 1.0]
    # step 1 samples from the trainer's own weights; later batches from the previous step's
    assert records[0]["mismatch/abs_mean"] < 1e-5
    for r in records[1:]:
        assert r["mismatch/abs_mean"] > 1e-3, r["mismatch/abs_mean"]
        assert r["tis/weight_mean"] != pytest.approx(1.0, abs=1e-6)
        assert 0.0 <= r["tis/capped_fraction"] <= 1.0
        assert r["time/wait_rollouts"] >= 0.0
    # after the last update the rollout copy holds the final weights
    for name, p in trainer.unwrapped.state_dict().items():
        torch.testing.assert_close(trainer.policy.model.state_dict()[name], p, rtol=0, atol=0)


def test_overlapped_runs_are_reproducible(tmp_path):
    Trainer(_cfg(tmp_path / "a")).train()
    Trainer(_cfg(tmp_path / "b")).train()
    _assert_same_records(read_metrics(tmp_path / "a" / "run"), read_metrics(tmp_path / "b" / "run"))


def test_resume_continues_with_the_saved_pending_batch(tmp_path):
    Trainer(_cfg(tmp_path / "a", train={"steps": 4})).train()
    expected = read_metrics(tmp_path / "a" / "run")

    first = Trainer(_cfg(tmp_path / "b", train={"steps": 4}))
    for step in range(2):
        first.train_step(step)
    ckpt = first.save(2)  # step 3's batch is in flight: saved beside the checkpoint
    first.overlap.close()
    first.venv.close()
    assert (ckpt / "pending-rollouts-rank0.json").exists()
    resumed = Trainer(_cfg(tmp_path / "b", train={"steps": 4, "resume": str(ckpt)}))
    assert resumed.start_step == 2
    resumed.train()
    got = read_metrics(tmp_path / "b" / "run")
    assert [r["overlap/staleness"] for r in got] == [0.0, 1.0, 1.0, 1.0]
    _assert_same_records(expected, got)


@pytest.mark.slow
def test_quickstart_shortened_reward_rises_with_overlap(tmp_path):
    """The README's main job, shortened and overlapped: the weighted reward must rise."""
    cfg = _cfg(
        tmp_path,
        algorithm={"group_size": 8, "prompts_per_step": 8},
        rollout={"max_new_tokens": 24},
        train={"steps": 12},
    )
    Trainer(cfg).train()
    records = read_metrics(tmp_path / "run")
    weighted = np.array([r["reward/weighted/mean"] for r in records])
    assert weighted[-3:].mean() > weighted[:3].mean() + 1.0, weighted
