"""The quickstart, the tool-calling SFT config and one RL config give the numbers they gave before.

A few steps of each shipped config (shortened by overrides, seconds each) are run through the
same path as ``corrgrpo train`` / ``corrgrpo sft`` (config file + overrides -> trainer ->
``metrics.jsonl``), and every logged number is compared with ``tests/parity_record.json``,
written once by ``python tests/test_parity.py --record`` before the trainers were reshaped.
Timings are left out; everything else (rewards, advantages, losses, learning rates, norms,
held-out loss) must agree to float tolerance. The SFT run uses no warmup: the warmup
convention is the one intended difference between the old SFT schedule and the shared one
(docs/trainer.md, "Learning-rate schedule").
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("parity_record.json")

_COMMON_TRAIN = ["train.progress=false", "train.tensorboard=false", "train.save_final=false", "train.cpu=true"]

#: name -> (command, config file, overrides)
RUNS: dict[str, tuple[str, str, list[str]]] = {
    "quickstart": (
        "train",
        "env_configs/quickstart.yaml",
        ["train.steps=3", "algorithm.prompts_per_step=4", "algorithm.group_size=4", "env.num_tasks=16",
         "rollout.max_new_tokens=12", "rollout.torch_threads=1", *_COMMON_TRAIN],
    ),
    "toolcall_tiny": (
        "train",
        "env_configs/toolcall_tiny.yaml",
        ["train.steps=2", "algorithm.prompts_per_step=2", "algorithm.group_size=2", "env.num_tasks=16",
         "rollout.max_new_tokens=24", "rollout.torch_threads=1", *_COMMON_TRAIN],
    ),
    "sft_toolcall_tiny": (
        "sft",
        "env_configs/sft_toolcall_tiny.yaml",
        ["train.steps=3", "train.batch_size=4", "train.eval_every=2", "train.save_every=0",
         "env.num_tasks=24", "data.max_eval_examples=4", "optim.warmup_steps=0",
         "train.torch_threads=1", *_COMMON_TRAIN],
    ),
}

#: Keys that measure the machine, not the run.
_MACHINE = ("time/", "tokens_per_s", "overlap/")


def run_config(name: str, output_dir: Path) -> list[dict[str, Any]]:
    """Run one entry of :data:`RUNS` into ``output_dir``; its ``metrics.jsonl`` records, timings removed."""
    from corrgrpo.trainer.run_logger import read_metrics

    command, path, overrides = RUNS[name]
    overrides = [*overrides, f"train.output_dir={output_dir}"]
    if command == "train":
        from corrgrpo.trainer.config import load_config
        from corrgrpo.trainer.trainer import Trainer

        Trainer(load_config(ROOT / path, overrides)).train()
    else:
        from corrgrpo.trainer.sft import SFTTrainer, load_sft_config

        SFTTrainer(load_sft_config(ROOT / path, overrides)).train()
    return [
        {k: v for k, v in record.items() if not k.startswith(_MACHINE)} for record in read_metrics(output_dir)
    ]


def _compare(path: str, got: Any, want: Any) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        problems = [f"{path}: keys {sorted(set(got) ^ set(want))} differ"] if set(got) != set(want) else []
        for key in sorted(set(got) & set(want)):
            problems += _compare(f"{path}.{key}", got[key], want[key])
        return problems
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} entries, recorded {len(want)}"]
        return [p for i, (g, w) in enumerate(zip(got, want)) for p in _compare(f"{path}[{i}]", g, w)]
    if isinstance(want, float) or isinstance(got, float):
        if want is None or got is None or not math.isclose(float(got), float(want), rel_tol=1e-4, abs_tol=1e-6):
            return [f"{path}: {got!r}, recorded {want!r}"]
        return []
    return [] if got == want else [f"{path}: {got!r}, recorded {want!r}"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_metrics_match_the_record(name, tmp_path):
    torch.set_num_threads(1)
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))[name]
    got = run_config(name, tmp_path / "run")
    problems = _compare(name, got, recorded)
    assert not problems, "\n".join(problems[:20])


def _record() -> None:
    import tempfile

    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            out[name] = run_config(name, Path(tmp) / name)
    RECORD.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {RECORD}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python tests/test_parity.py --record")
    _record()
