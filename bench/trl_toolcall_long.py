"""TRL's ``GRPOTrainer`` on the long-prompt setting of ``bench.vs_trl`` (run in ``.venv-trl``).

The numbers of ``studies/configs/toolcall_long_grpo.yaml`` on TRL's side: SmolLM2-135M-Instruct
(float32, the folder ``corrgrpo.agents.models`` converted from the GGUF file), the 23 tasks of
``bench/toolcall_long.py`` with the ToolCall env's four rewards as four TRL reward functions
(``corrgrpo_envs.integrations.trl.for_trl``), 8 completions of one prompt per step, up to 64 new
tokens, temperature 1, lr 1e-5 constant, clip 0.2, KL 0.04, no activation checkpointing.

    .venv-trl/bin/python -m bench.trl_toolcall_long --model DIR --steps 6 --output-dir OUT --result-json OUT/result.json

It writes the result in the anchor script's layout (``timing.step_interval_s``,
``timing.generate_and_score_s``, ``per_step``), which ``bench.vs_trl`` reads for both settings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

WARMUP = 2  # step-time medians are over steps 3..N, as in the anchor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (SmolLM2-135M-Instruct as safetensors)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--loss-type", default="grpo")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--result-json", required=True)
    args = p.parse_args(argv)
    t_start = time.perf_counter()

    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import bench.toolcall_long  # noqa: F401  (registers the generated_long data set)
    from corrgrpo_envs.integrations.trl import for_trl

    imports_s = time.perf_counter() - t_start
    rss_after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    setup = for_trl("corrgrpo/ToolCall-v0", split="all", dataset="generated_long", prompt_format="house")
    prompt_tokens = [len(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"])
                     for m in setup.dataset["prompt"]]
    config = GRPOConfig(
        output_dir=args.output_dir, num_generations=8, per_device_train_batch_size=8,
        gradient_accumulation_steps=1, max_completion_length=64, temperature=1.0, top_p=1.0,
        learning_rate=1e-5, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        beta=0.04, epsilon=0.2, num_iterations=1, loss_type=args.loss_type, use_vllm=False,
        logging_steps=1, report_to="none", bf16=False, fp16=False, use_cpu=True, seed=0,
        max_steps=args.steps, save_strategy="no", dataloader_num_workers=0,
        reward_weights=setup.reward_weights, activation_checkpointing=False, disable_tqdm=True,
    )

    class StepTimer(TrainerCallback):
        """Seconds between step ends (the first from the start of training)."""

        def __init__(self) -> None:
            self.intervals: list[float] = []
            self._last = 0.0

        def on_train_begin(self, *a, **kw):
            self._last = time.perf_counter()

        def on_step_end(self, *a, **kw):
            now = time.perf_counter()
            self.intervals.append(now - self._last)
            self._last = now

    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=setup.reward_funcs, args=config, train_dataset=setup.dataset,
                          processing_class=tokenizer, callbacks=[timer])
    generate_and_score: list[float] = []
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):  # TRL generates, scores and computes advantages in this one call
        t = time.perf_counter()
        out = inner(*a, **kw)
        generate_and_score.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    names = [f.__name__ for f in setup.reward_funcs]
    per_step = [h for h in trainer.state.log_history if f"rewards/{names[0]}/mean" in h]
    steady = timer.intervals[WARMUP:]
    result = {
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__},
        "torch_num_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "prompt_tokens": {"min": min(prompt_tokens), "mean": statistics.mean(prompt_tokens),
                          "max": max(prompt_tokens)},
        "reward_names": names,
        "peak_rss_after_imports_mib": rss_after_imports,
        "timing": {
            "imports_s": imports_s,
            "step_interval_s": timer.intervals,
            "generate_and_score_s": generate_and_score,
            "median_step_interval_s_steps3plus": statistics.median(steady) if steady else None,
        },
        "per_step": per_step,
    }
    with open(args.result_json, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
