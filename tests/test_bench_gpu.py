"""bench/gpu.py runs end to end on CPU (--smoke) and its full model is ~0.5B parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_the_report(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-m", "bench.gpu", "--smoke", "--out", str(tmp_path)],
                   check=True, env=env, cwd=ROOT, timeout=300)
    report = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert report["smoke"] and report["parameters"] > 0
    static, generate = report["results"]["static"], report["results"]["generate"]
    for r in (static, generate):
        assert r["step_s"] > 0 and r["generate_s"] > 0 and r["update_s"] > 0
        assert r["update_tokens"] > 0 and r["generate_tokens_per_s"] > 0 and r["peak_memory_gib"] > 0
        assert 0 <= r["update_mfu"] < 1
    # the two decoders draw the same tokens, so the runs see the same completions
    assert static["completion_length"] == generate["completion_length"]
    assert static["update_tokens"] == generate["update_tokens"]


def test_full_model_is_half_a_billion_parameters():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench import gpu

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=2048, tie_word_embeddings=False, **gpu.FULL))
    params = sum(p.numel() for p in model.parameters())
    assert 0.45e9 < params < 0.55e9, params
