"""Two steps of CorrGRPOTrainer under ``accelerate launch`` (run by tests/test_trl_estimators.py).

Usage: ``accelerate launch --multi_gpu --num_processes 2 tests/trl_distributed_check.py OUT_DIR``;
each process writes ``OUT_DIR/rank<r>.json``: per batch the gathered reward matrix, the weights,
the advantages and the trained tokens of this process's part of the batch. The estimator is DARA,
whose token whitening reads every process's token counts (gathered in rank order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from trl import GRPOConfig

from corrgrpo.trainer.cli import close_process_group
from corrgrpo.trainer.integrations.trl import CorrGRPOTrainer, trained_tokens
from corrgrpo_envs.integrations.trl import for_trl
from tests.launched import arm_hang_report
from tests.test_trl_adapter import _tiny_model_and_tokenizer


class Recording(CorrGRPOTrainer):
    batches: list[dict] = []

    def _calculate_rewards(self, *args):
        rewards = super()._calculate_rewards(*args)
        self.batches.append({"rewards": rewards.tolist()})
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.batches[-1].update(weights=self.reward_weights.tolist(), batch=out["advantages"].tolist(),
                                tokens=trained_tokens(out).tolist())
        return out


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    model, tokenizer = _tiny_model_and_tokenizer()
    setup = for_trl("corrgrpo/ScaleDominance-v0", split="all", num_tasks=8, reward_weights=[0.1, 1.0, 1.0])
    args = GRPOConfig(
        output_dir=f"{out_dir}/run", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
        learning_rate=1e-3, beta=0.0, max_steps=2, use_cpu=True, seed=0, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, reward_weights=setup.reward_weights,
        generation_kwargs={"sequence_bias": [[[tokenizer.eos_token_id], 4.0]]},  # completions of many lengths
    )
    trainer = Recording(model=model, reward_funcs=setup.reward_funcs, args=args, train_dataset=setup.dataset,
                        processing_class=tokenizer, estimator="dara")
    trainer.train()
    rank = trainer.accelerator.process_index
    record = {"world": trainer.accelerator.num_processes, "batches": Recording.batches}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    arm_hang_report()
    main(sys.argv[1])
    close_process_group()  # after main: the trainer's DDP reducer must not outlive the group
