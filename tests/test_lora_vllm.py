"""A LoRA run with the vLLM backend: the engine serves the merged weights after each update.

Runs in the vLLM environment (``scripts/vllm_venv.sh``, with ``peft`` added)::

    .venv-vllm/bin/python -m pytest tests/test_lora_vllm.py -q

Skips, with the reason, where vLLM or peft is not importable.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from corrgrpo.agents.vllm_policy import vllm_available  # noqa: E402

AVAILABLE, WHY = vllm_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)
pytest.importorskip("peft", reason="LoRA needs the 'peft' package (extra 'lora')")

import torch  # noqa: E402

from corrgrpo.agents import SamplingParams  # noqa: E402
from corrgrpo.trainer.config import config_from_dict  # noqa: E402
from corrgrpo.trainer.policy_forward import pack_episodes, token_logprobs  # noqa: E402
from corrgrpo.trainer.trainer import Trainer  # noqa: E402

ENGINE = {"max_model_len": 1024, "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}


def test_vllm_serves_merged_lora_weights(tmp_path):
    cfg = config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny", "lora": {"r": 8, "alpha": 16}},
            "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4},
            "rollout": {"max_new_tokens": 12, "backend": "vllm", "vllm_kwargs": ENGINE},
            "optim": {"lr": 1e-2},
            "train": {"steps": 2, "split": "all", "progress": False, "tensorboard": False,
                      "save_final": False, "output_dir": str(tmp_path / "run")},
        }
    )
    trainer = Trainer(cfg)
    trainer.train()
    # after the updates, the engine's logprobs are those of the LoRA model (base + adapters)
    obs = [{"messages": [{"role": "user", "content": "Write a word with the letter a."}], "tools": []}]
    from corrgrpo.agents import Episode

    episodes = [Episode()]
    trainer.policy.act(obs, SamplingParams(temperature=0.0, max_new_tokens=8, seed=0), episodes)
    packed = pack_episodes(episodes, trainer.pad_id, torch.device("cpu"))
    with torch.no_grad():
        hf, _ = token_logprobs(trainer.unwrapped, packed)
    mask = packed.loss_mask.bool()
    assert torch.allclose(hf[mask], packed.sampler_logprobs[mask], atol=1e-3)
