"""Run a few SFT steps and dump the losses and parameters (for the 2-process SFT test).

Usage: ``[accelerate launch --multi_gpu --num_processes 2] python tests/sft_distributed_check.py OUT.pt DATA.jsonl``
"""

from __future__ import annotations

import json
import sys

import torch

from trainer.sft import SFTTrainer, sft_config_from_dict


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
    if trainer.accelerator.is_main_process:
        params = {k: v.detach().clone() for k, v in trainer.unwrapped.state_dict().items()}
        torch.save({"records": json.dumps(records), "eval": evaluation, "params": params,
                    "world": trainer.world}, out)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
