"""Generation throughput of the policies: tokens per second at batch 8 x 64 new tokens.

    python bench/generation.py                       # HFPolicy: tiny and SmolLM2-135M
    .venv-vllm/bin/python bench/generation.py        # also VLLMPolicy (vLLM CPU) and the vLLM/HF ratio

Each measurement is the median of ``--repeats`` timed batches after one warm-up
batch; models run side by side in the same process so ratios share the machine's
state. Tokens counted are the completion tokens actually generated (EOS included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from agents import HFPolicy, SamplingParams, load_model  # noqa: E402
from agents.models import TINY_VERSION, cache_dir  # noqa: E402
from agents.vllm_policy import vllm_available  # noqa: E402

PROMPTS = [
    "Write a short story about a robot.",
    "List five fruits.",
    "What is the capital of France?",
    "Explain recursion in one paragraph.",
    "Translate 'good morning' into Spanish.",
    "Give me a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Name three planets.",
]


def measure(policy, batch: int, new_tokens: int, repeats: int) -> dict:
    observations = [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]} for i in range(batch)]
    rates, tokens = [], []
    for r in range(repeats + 1):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=r)
        start = time.perf_counter()
        actions = policy.act(observations, sampling)
        elapsed = time.perf_counter() - start
        n = sum(len(a.completion_ids) for a in actions)
        if r:  # the first batch warms caches and kernels
            rates.append(n / elapsed)
            tokens.append(n)
    return {"tokens_per_s": statistics.median(rates), "tokens": statistics.median(tokens), "rates": rates}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM even where it is importable")
    args = parser.parse_args()

    has_vllm, why = (False, "disabled") if args.no_vllm else vllm_available()
    print(f"batch {args.batch} x {args.new_tokens} new tokens, median of {args.repeats}; vLLM: {'yes' if has_vllm else why}")
    print(f"{'model':<16} {'backend':<6} {'tokens/s':>10} {'vLLM/HF':>8}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        try:
            model, tokenizer = load_model(name)
        except ImportError as exc:
            print(f"{name:<16} skipped: {exc}")
            continue
        hf = measure(HFPolicy(model, tokenizer), args.batch, args.new_tokens, args.repeats)
        print(f"{name:<16} {'hf':<6} {hf['tokens_per_s']:>10.1f} {'':>8}", flush=True)
        if has_vllm:
            from agents import VLLMPolicy

            folder = cache_dir() / "models"
            path = folder / (f"tiny-v{TINY_VERSION}-seed0" if name == "tiny" else "smollm2-135m-instruct")
            vllm_policy = VLLMPolicy(
                str(path), tokenizer=tokenizer, dtype="float32", max_model_len=2048, enforce_eager=True,
                gpu_memory_utilization=0.15,
            )
            vl = measure(vllm_policy, args.batch, args.new_tokens, args.repeats)
            print(f"{name:<16} {'vllm':<6} {vl['tokens_per_s']:>10.1f} {vl['tokens_per_s'] / hf['tokens_per_s']:>8.2f}", flush=True)
            vllm_policy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
