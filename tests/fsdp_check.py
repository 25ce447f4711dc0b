"""Three training steps with a checkpoint after step 2 and a resumed step 3 (for tests/test_fsdp.py).

Usage::

    python tests/fsdp_check.py OUT.pt
    accelerate launch --config_file env_configs/accelerate/fsdp.yaml --cpu --num_processes 2 \\
        --mixed_precision no tests/fsdp_check.py OUT.pt

Writes, from the main process: the full parameters after 2 and 3 steps, those after a
fresh trainer resumed from the step-2 checkpoint ran step 3, the advantages, the world
size, whether the model was sharded and each step's logged update and gradient norms. Every process checks that the full state dict it
gathers (the vLLM weight sync's input) has every parameter at its full shape.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from corrgrpo.trainer.cli import close_process_group
from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.fsdp import full_state_dict, is_sharded
from corrgrpo.trainer.trainer import Trainer
from tests.launched import arm_hang_report


def _config(out: str, resume: str | None = None):
    return config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny"},
            "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4},
            "rollout": {"max_new_tokens": 8, "groups_per_generate": 1},
            "optim": {"lr": 1e-3},
            "train": {
                "steps": 3, "seed": 5, "progress": False, "tensorboard": False, "split": "all",
                "save_final": False, "cpu": True, "output_dir": out + ".run", "log_samples": 0,
                "resume": resume,
            },
        }
    )


def _full_params(trainer: Trainer) -> dict[str, torch.Tensor]:
    state = full_state_dict(trainer.unwrapped)
    reference = {k: v.shape for k, v in trainer.unwrapped.named_parameters()}
    for name, tensor in state.items():
        if name in reference:
            assert type(tensor) is torch.Tensor, (name, type(tensor))
            assert tensor.shape == reference[name], (name, tensor.shape, reference[name])
    return {k: v.detach().clone().cpu() for k, v in state.items()}


def main(out: str) -> None:
    torch.set_num_threads(1)
    trainer = Trainer(_config(out))
    advantages, records = [], []
    for step in range(2):
        records.append(trainer.train_step(step))
        advantages.append(trainer.last_advantages.clone())
    after_2 = _full_params(trainer)
    checkpoint = trainer.save(2)
    records.append(trainer.train_step(2))
    advantages.append(trainer.last_advantages.clone())
    after_3 = _full_params(trainer)
    sharded = is_sharded(trainer.unwrapped)
    trainer.venv.close()

    resumed = Trainer(_config(out, resume=str(checkpoint)))
    assert resumed.start_step == 2, resumed.start_step
    resumed.train_step(2)
    after_resume = _full_params(resumed)
    resumed.venv.close()
    if resumed.accelerator.is_main_process:
        torch.save(
            {
                "advantages": advantages, "after_2": after_2, "params": after_3, "resumed": after_resume,
                "world": trainer.world,
                "norms": [{k: r[k] for k in ("update_norm", "param_norm", "grad_norm")} for r in records], "sharded": sharded, "checkpoint": str(checkpoint),
                "files": sorted(str(p.relative_to(checkpoint)) for p in Path(checkpoint).rglob("*")),
            },
            out,
        )
    resumed.accelerator.wait_for_everyone()


if __name__ == "__main__":
    arm_hang_report()
    main(sys.argv[1])
    close_process_group()  # an exit with the gloo group alive can abort the process
