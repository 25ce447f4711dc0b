"""Run a few training steps and dump advantages, logged records and parameters (2-process test).

Usage: ``[accelerate launch --multi_gpu --num_processes 2] python tests/distributed_check.py OUT.pt``
"""

from __future__ import annotations

import sys

import torch

from corrgrpo.trainer.cli import close_process_group
from corrgrpo.trainer.config import config_from_dict
from corrgrpo.trainer.trainer import Trainer
from tests.launched import arm_hang_report


def main(out: str) -> None:
    torch.set_num_threads(1)
    cfg = config_from_dict(
        {
            "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 16},
            "model": {"name_or_path": "tiny"},
            "algorithm": {"estimator": "corrgrpo", "group_size": 4, "prompts_per_step": 4},
            "rollout": {"max_new_tokens": 8, "groups_per_generate": 1, "torch_threads": 1},
            "optim": {"lr": 1e-3, "epochs": 2, "micro_batch_size": 3},
            "train": {
                "steps": 3, "seed": 5, "split": "all", "progress": False, "tensorboard": False,
                "save_final": False, "cpu": True, "output_dir": out + ".run", "log_samples": 0,
            },
        }
    )
    trainer = Trainer(cfg)
    advantages, records = [], []
    for step in range(cfg.train.steps):
        records.append(trainer.train_step(step))
        advantages.append(trainer.last_advantages.clone())
    if trainer.accelerator.is_main_process:
        params = {k: v.detach().clone() for k, v in trainer.unwrapped.state_dict().items()}
        torch.save(
            {"advantages": advantages, "records": records, "params": params, "world": trainer.world}, out
        )
    trainer.accelerator.wait_for_everyone()
    trainer.venv.close()


if __name__ == "__main__":
    arm_hang_report()
    main(sys.argv[1])
    close_process_group()  # an exit with the gloo group alive can abort the process
