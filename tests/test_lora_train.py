"""LoRA in ``corrgrpo train``: only adapters change, checkpoints are merged plain folders, resume
is exact, and the rollout engine's weights are the merged ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.run_logger import read_metrics
from corrgrpo.trainer.trainer import Trainer

pytest.importorskip("peft", reason="LoRA needs the 'peft' package (extra 'lora')")

LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def _cfg(tmp_path: Path, **train):
    return config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny", "lora": LORA},
            "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4},
            "rollout": {"max_new_tokens": 10},
            "optim": {"lr": 1e-2},
            "train": {"steps": 3, "seed": 0, "split": "all", "progress": False, "tensorboard": False,
                      "output_dir": str(tmp_path / "run"), "save_final": False, **train},
        }
    )


@pytest.mark.slow
def test_train_updates_only_adapters_and_saves_merged(tmp_path):
    from transformers import AutoModelForCausalLM

    from corrgrpo.trainer.fsdp import full_state_dict
    from corrgrpo.trainer.lora import is_lora_model, merged_state_dict

    trainer = Trainer(_cfg(tmp_path, save_final=True))
    assert is_lora_model(trainer.unwrapped)
    before = {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}
    trainer.train()
    after = trainer.unwrapped.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no weight changed (every advantage 0?)"
    assert all(".lora_A." in k or ".lora_B." in k for k in changed), sorted(changed)[:5]
    # what a rollout engine is sent: merged weights under the plain model's names
    synced = full_state_dict(trainer.unwrapped)
    assert not any("lora" in k or "base_layer" in k or k.startswith("base_model.") for k in synced)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-3" / "model")
    assert set(plain.state_dict()) == set(synced)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, synced[k], rtol=0, atol=1e-6)
    merged = merged_state_dict(trainer.unwrapped)
    ids = torch.arange(4, 30)[None]
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, trainer.unwrapped(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    assert set(merged) == set(synced)


@pytest.mark.slow
def test_lora_resume_reproduces_uninterrupted_run(tmp_path):
    Trainer(_cfg(tmp_path / "a", steps=3)).train()
    expected = read_metrics(tmp_path / "a" / "run")
    first = Trainer(_cfg(tmp_path / "b", steps=3))
    first.train_step(0)
    ckpt = first.save(1)
    first.venv.close()
    resumed = Trainer(_cfg(tmp_path / "b", steps=3, resume=str(ckpt)))
    assert resumed.start_step == 1
    resumed.train()
    got = read_metrics(tmp_path / "b" / "run")
    assert [r["step"] for r in got] == [1, 2, 3]
    for want, have in zip(expected[1:], got[1:]):
        for key in ("reward/weighted/mean", "grad_norm", "lr"):
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
