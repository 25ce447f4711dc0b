"""One GPU: a random-init ~0.5B Qwen2 in bf16 on the toy domain through the trainer's HF path.

    python -m bench.gpu --out runs/gpu_bench            # one GPU (about 2-4 minutes on an H200)
    python -m bench.gpu --smoke --out /tmp/gpu_smoke    # tiny sizes on CPU, a few seconds

Nothing is downloaded: the tokenizer is the built-in byte-level BPE trained on the fly
(``corrgrpo.agents.models.build_tiny_model``'s, 2048 tokens) and the model a random-init
``Qwen2ForCausalLM`` (hidden 1024, 32 layers, 16 heads, 4 KV heads, MLP 4096: about
0.49B parameters) written to a temporary folder that ``model.name_or_path`` points at.
Each decoder (``--decoders``: the static-KV-cache loop and transformers ``generate``)
gets its own ``Trainer`` for ``--steps`` steps; steps after ``--warmup`` are summarised
(medians):

* the step time split: ``time/generate``, ``time/reward`` (rewards and advantages),
  ``time/update``;
* generation tokens/s (completion tokens per second of generation);
* update MFU: 6 x parameters x tokens in the update (prompt and completion, forward
  and backward) / update seconds / the bf16 dense peak (``--peak-tflops``, default the
  H200's 989);
* peak GPU memory (``torch.cuda.max_memory_allocated``; peak RSS on CPU).

Prints a table and writes ``gpu_bench.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: NVIDIA H200 SXM bf16 dense tensor-core peak, TFLOP/s.
H200_BF16_TFLOPS = 989.0

FULL = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 16, "num_key_value_heads": 4}
SMOKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}


def build_model_folder(folder: Path, sizes: dict[str, int], dtype: Any, device: str) -> int:
    """Write a random-init Qwen2 and the built-in tokenizer to ``folder``; returns the parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from corrgrpo.agents.models import build_tiny_model

    _, tokenizer = build_tiny_model(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        **sizes,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return params


def run_trainer(folder: Path, decoder: str, args: argparse.Namespace, out: Path, dtype: str) -> dict[str, Any]:
    """``args.steps`` steps with one decoder; per-step records plus update token counts."""
    import torch

    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo.trainer.trainer import Trainer

    cfg = config_from_dict({
        "env": {"id": "corrgrpo/ScaleDominance-v0", "num_tasks": 64},
        "model": {"name_or_path": str(folder), "dtype": dtype},
        "algorithm": {"estimator": "corrgrpo", "group_size": args.group_size,
                      "prompts_per_step": args.prompts_per_step},
        "rollout": {"max_new_tokens": args.max_new_tokens, "hf_decoder": decoder},
        "optim": {"lr": 1e-5},
        "train": {"steps": args.steps, "seed": 0, "progress": False, "tensorboard": False,
                  "save_final": False, "log_samples": 0, "split": "all", "cpu": args.smoke,
                  "output_dir": str(out / f"run-{decoder}")},
    })
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg)
    update_tokens: list[int] = []
    update = trainer.updater.update

    def counting_update(packed, *a, **k):  # tokens through the update's forward and backward
        update_tokens.append(int(packed.attention_mask.sum()))
        return update(packed, *a, **k)

    trainer.updater.update = counting_update
    records = []
    start = time.perf_counter()
    for step in range(args.steps):
        records.append(trainer.train_step(step))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    trainer.venv.close()
    peak = (torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available()
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    del trainer
    return {"records": records, "update_tokens": update_tokens, "wall_s": wall, "peak_memory_gib": peak}


def summarise(run: dict[str, Any], params: int, warmup: int, peak_tflops: float) -> dict[str, float]:
    rows = run["records"][warmup:] or run["records"]
    tokens = run["update_tokens"][warmup:] or run["update_tokens"]

    def med(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    update_s = [float(r["time/update"]) for r in rows]
    mfu = [6.0 * params * t / max(u, 1e-9) / (peak_tflops * 1e12) for t, u in zip(tokens, update_s)]
    return {
        "step_s": med("time/step"), "generate_s": med("time/generate"), "reward_s": med("time/reward"),
        "update_s": med("time/update"), "generate_tokens_per_s": med("tokens_per_s"),
        "update_tokens": statistics.median(tokens), "update_mfu": statistics.median(mfu),
        "completion_length": med("completion_length/mean"), "peak_memory_gib": run["peak_memory_gib"],
        "wall_s": run["wall_s"],
    }


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    for name in ("torch", "transformers", "accelerate"):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for gpu_bench.json (and the runs)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (for tests)")
    parser.add_argument("--decoders", default="static,generate")
    parser.add_argument("--steps", type=int, default=None, help="default 6 (smoke: 2)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out of the medians (default 2; smoke 1)")
    parser.add_argument("--group-size", type=int, default=None, help="G (default 8; smoke 2)")
    parser.add_argument("--prompts-per-step", type=int, default=None, help="P (default 16; smoke 2)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (smoke 8)")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    args = parser.parse_args()
    defaults = {"steps": 2, "warmup": 1, "group_size": 2, "prompts_per_step": 2, "max_new_tokens": 8} if args.smoke \
        else {"steps": 6, "warmup": 2, "group_size": 8, "prompts_per_step": 16, "max_new_tokens": 128}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch

    if not args.smoke and not torch.cuda.is_available():
        parser.error("no GPU visible; use --smoke to check the script on CPU")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.smoke:
        torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "float32" if args.smoke else "bfloat16"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-model-") as tmp:
        folder = Path(tmp)
        params = build_model_folder(folder, SMOKE if args.smoke else FULL, getattr(torch, dtype),
                                    "cpu" if args.smoke else "cuda")
        build_s = time.perf_counter() - t0
        print(f"model: {params / 1e6:.1f}M parameters, {dtype}, built in {build_s:.1f} s; "
              f"G={args.group_size} P={args.prompts_per_step} max_new_tokens={args.max_new_tokens} "
              f"steps={args.steps} (first {args.warmup} left out); {environment()}", flush=True)
        results = {}
        for decoder in [d.strip() for d in args.decoders.split(",") if d.strip()]:
            run = run_trainer(folder, decoder, args, out, dtype)
            results[decoder] = summarise(run, params, args.warmup, args.peak_tflops)
            print(f"  {decoder}: {results[decoder]['step_s']:.3f} s/step", flush=True)
    header = (f"{'decoder':<9} {'step s':>7} {'generate':>9} {'reward':>7} {'update':>7} {'gen tok/s':>10} "
              f"{'upd tokens':>10} {'MFU':>6} {'peak GiB':>9}")
    print(header)
    for decoder, r in results.items():
        print(f"{decoder:<9} {r['step_s']:7.3f} {r['generate_s']:9.3f} {r['reward_s']:7.3f} {r['update_s']:7.3f} "
              f"{r['generate_tokens_per_s']:10.1f} {r['update_tokens']:10.0f} {100 * r['update_mfu']:5.1f}% "
              f"{r['peak_memory_gib']:9.2f}")
    report = {
        "parameters": params, "dtype": dtype, "smoke": args.smoke, "peak_tflops": args.peak_tflops,
        "settings": {k: getattr(args, k) for k in ("steps", "warmup", "group_size", "prompts_per_step",
                                                    "max_new_tokens")},
        "model_build_s": build_s, "total_s": time.perf_counter() - t0, "environment": environment(),
        "results": results,
    }
    (out / "gpu_bench.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'gpu_bench.json'} ({report['total_s']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
