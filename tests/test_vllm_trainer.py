"""The trainer with a colocated vLLM engine: rollouts from vLLM, weights synced every step.

Runs in the vLLM environment (``scripts/vllm_venv.sh``)::

    .venv-vllm/bin/python -m pytest tests/test_vllm_trainer.py -q

Skips, with the reason, where vLLM is not importable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from corrgrpo.agents.vllm_policy import vllm_available  # noqa: E402

AVAILABLE, WHY = vllm_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

import torch  # noqa: E402
from engine_checks import assert_engine_samples_trainer_weights  # noqa: E402

from corrgrpo.trainer.config import config_from_dict  # noqa: E402
from corrgrpo.trainer.run_logger import read_metrics  # noqa: E402
from corrgrpo.trainer.trainer import Trainer  # noqa: E402

# an explicit KV-cache size: the CPU backend otherwise budgets a share of host memory minus
# what this process already holds, which other engines of the same test session can exhaust
ENGINE = {"max_model_len": 1024, "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}


def test_vllm_rollouts_and_weight_sync(tmp_path):
    cfg = config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny"},
            "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4,
                          "tis_cap": 2.0},
            "rollout": {"max_new_tokens": 12, "backend": "vllm", "vllm_kwargs": ENGINE},
            "optim": {"lr": 1e-2},
            "train": {"steps": 2, "split": "all", "progress": False, "tensorboard": False,
                      "save_final": False, "output_dir": str(tmp_path / "run")},
        }
    )
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}
    trainer.train()
    records = read_metrics(tmp_path / "run")
    assert len(records) == 2 and all(r["episodes"] == 16 for r in records)
    for r in records:  # the sampler's logprobs are compared with the trainer's every step
        print("mismatch", r["mismatch/abs_mean"], r["mismatch/max"], "tis", r["tis/weight_mean"])
        assert 0 <= r["mismatch/abs_mean"] <= r["mismatch/max"] < 1e-2
        assert r["tis/weight_mean"] == pytest.approx(1.0, abs=1e-2)
    assert any(not torch.equal(before[k], v) for k, v in trainer.unwrapped.state_dict().items())

    # the engine now samples from the trained weights: its logprobs match the HF forward pass
    assert_engine_samples_trainer_weights(trainer)


_OVERLAP_SCRIPT = """
import sys
from engine_checks import assert_engine_samples_trainer_weights  # the tests folder is on PYTHONPATH
from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.run_logger import read_metrics
from corrgrpo.trainer.trainer import Trainer

out = sys.argv[1]
engine = {"max_model_len": 1024, "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}
cfg = config_from_dict({
    "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
    "model": {"name_or_path": "tiny"},
    "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4, "tis_cap": 2.0},
    "rollout": {"max_new_tokens": 12, "backend": "vllm", "vllm_kwargs": engine, "overlap": True},
    "optim": {"lr": 1e-2},
    "train": {"steps": 3, "split": "all", "progress": False, "tensorboard": False,
              "save_final": False, "output_dir": out},
})
trainer = Trainer(cfg)
trainer.train()
records = read_metrics(out)
assert [r["overlap/staleness"] for r in records] == [0.0, 1.0, 1.0], records
assert records[0]["mismatch/abs_mean"] < 1e-4, records[0]  # step 1 samples the trainer's weights
for r in records[1:]:  # later batches come from the weights one update older
    assert r["mismatch/abs_mean"] > 1e-4, r["mismatch/abs_mean"]
    assert 0 < r["tis/weight_mean"] <= 2.0
assert_engine_samples_trainer_weights(trainer)
print("OVERLAP OK")
"""


def test_vllm_engine_with_overlapped_generation(tmp_path):
    """rollout.overlap with the vLLM engine: one step stale after the first, TIS-corrected, and
    the engine ends on the trainer's final weights.

    In a fresh process, as a run has it: an in-process vLLM CPU engine binds the process's
    OpenMP threads and disables ``torch.set_num_threads`` for good, so a second engine in the
    same process (this module's first test) would run with the first one's thread binding.
    """
    import subprocess
    import sys

    script = tmp_path / "overlap_run.py"
    script.write_text(_OVERLAP_SCRIPT)
    tests = Path(__file__).resolve().parent
    path = os.pathsep.join(filter(None, [str(tests), str(tests.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True,
                          text=True, env=env, timeout=600, cwd=tests.parent)
    assert proc.returncode == 0 and "OVERLAP OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
