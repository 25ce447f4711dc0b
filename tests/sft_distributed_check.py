"""Run a few SFT steps and dump the losses and parameters (for the 2-process SFT test).

Usage: ``[accelerate launch --multi_gpu --num_processes 2] python tests/sft_distributed_check.py OUT.pt DATA.jsonl``
(or ``accelerate launch --config_file env_configs/accelerate/fsdp_cpu.yaml ...`` for FSDP2: the
run then also writes its checkpoint and final model, which are compared with the one-process run's).
"""

from __future__ import annotations

import json
import sys

import torch

from corrgrpo.trainer.cli import close_process_group
from corrgrpo.trainer.fsdp import full_state_dict, is_sharded
from corrgrpo.trainer.sft import SFTTrainer, sft_config_from_dict
from tests.launched import arm_hang_report


def main(out: str, data: str) -> None:
    torch.set_num_threads(1)
    cfg = sft_config_from_dict(
        {
            "model": {"name_or_path": "tiny"},
            "data": {"source": "file", "files": [data], "eval_fraction": 0.25},
            "optim": {"lr": 1e-3},
            "train": {
                # 8 examples per step, 4 per process; a 64-token budget packs them into several
                # micro-batches, so gradient accumulation is exercised too
                "steps": 3, "batch_size": 8, "micro_batch_tokens": 64, "seed": 5,
                "progress": False, "tensorboard": False, "save_final": False, "cpu": True,
                "output_dir": out + ".run",
            },
        }
    )
    trainer = SFTTrainer(cfg)
    records = [trainer.train_step(step) for step in range(cfg.train.steps)]
    evaluation = trainer.evaluate()
    params = full_state_dict(trainer.unwrapped)  # a collective under FSDP
    trainer.save(cfg.train.steps)
    trainer.context.save_model(trainer.output_dir / "model")
    if trainer.accelerator.is_main_process:
        params = {k: v.detach().clone() for k, v in params.items()}
        torch.save({"records": json.dumps(records), "eval": evaluation, "params": params,
                    "world": trainer.world, "sharded": is_sharded(trainer.unwrapped),
                    "run": str(trainer.output_dir)}, out)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    arm_hang_report()
    main(sys.argv[1], sys.argv[2])
    close_process_group()  # an exit with the gloo group alive can abort the process
