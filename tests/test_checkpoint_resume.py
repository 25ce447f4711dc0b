"""``train.resume=auto`` through the trainer: a damaged latest checkpoint, and a fresh start in an old folder."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.run_logger import read_metrics
from corrgrpo.trainer.trainer import Trainer


def _cfg(run: Path, **train) -> object:
    return config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny"},
            "algorithm": {"estimator": "corrgrpo", "group_size": 2, "prompts_per_step": 2},
            "rollout": {"max_new_tokens": 6},
            "optim": {"lr": 1e-3},
            "train": {"steps": 2, "seed": 0, "split": "all", "progress": False, "tensorboard": False,
                      "output_dir": str(run), "save_final": False, **train},
        }
    )


def test_resume_auto_falls_back_past_a_torn_checkpoint_and_a_fresh_start_keeps_metrics_apart(tmp_path, caplog):
    run = tmp_path / "run"
    Trainer(_cfg(run, save_every=1)).train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    # checkpoint-2 torn as a kill during a non-atomic write would leave it
    state = run / "checkpoint-2" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])

    with caplog.at_level(logging.WARNING):
        resumed = Trainer(_cfg(run, steps=3, resume="auto"))
    assert resumed.start_step == 1
    assert f"skipping checkpoint {run / 'checkpoint-2'}" in caplog.text
    resumed.train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]

    # no checkpoint left: resume=auto is a fresh start, and the old metrics are moved aside
    for ckpt in run.glob("checkpoint-*"):
        shutil.rmtree(ckpt)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fresh = Trainer(_cfg(run, steps=1, resume="auto"))
        assert fresh.start_step == 0
        fresh.train()
    assert [r["step"] for r in read_metrics(run)] == [1]
    old = list(run.glob("metrics.jsonl.old-*"))
    assert len(old) == 1 and old[0].read_text().count("\n") == 3
    assert "moved them aside" in caplog.text


def test_keep_checkpoints_deletes_the_older_folders_and_resume_uses_the_newest(tmp_path):
    run = tmp_path / "run"
    Trainer(_cfg(run, steps=3, save_every=1, keep_checkpoints=2)).train()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    resumed = Trainer(_cfg(run, steps=4, save_every=1, keep_checkpoints=2, resume="auto"))
    assert resumed.start_step == 3
    resumed.train()
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]


def test_prune_checkpoints_keeps_the_highest_steps_and_other_files(tmp_path):
    import pytest

    from corrgrpo.trainer.checkpoint import prune_checkpoints

    for step in (5, 10, 40, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-notes").mkdir()
    (tmp_path / "model").mkdir()
    deleted = prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["checkpoint-10", "checkpoint-5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-100", "checkpoint-40", "checkpoint-notes", "model"]
    with pytest.raises(ValueError, match="keep"):
        prune_checkpoints(tmp_path, 0)
