"""Generation throughput: HFPolicy's static-cache decode loop against transformers ``generate``.

    python -m bench.generation                          # anchor setting: tiny-anchor, 8 x 8 rollouts, 64 tokens
    python -m bench.generation --models tiny-anchor,tiny,smollm2-135m --batch 64
    .venv-vllm/bin/python -m bench.generation --vllm    # also VLLMPolicy (vLLM CPU)

Each round is a fresh process with an explicit torch thread count (``--threads``)
that builds the model once and times the contenders batch by batch in alternation
(the order flips every batch), so the machine's drifting load hits them alike; after
one warm-up batch each, ``--repeats`` batches per contender give a median, and the
ratio ``static / generate`` of those medians is the round's. The median (and range)
over rounds is printed. Tokens counted are the completion tokens generated (EOS
included). Both HF contenders draw the same tokens for the same seed (checked here:
their token counts must match batch for batch).

The anchor setting is the TRL comparison's (``bench/vs_trl.py``): the anchor's
random-init Qwen2 (558,208 parameters) and tokenizer, a batch of G x P = 8 x 8
rollouts of its prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTENDERS = ("generate", "static")


def _prompts(batch: int, group: int) -> list[dict]:
    """``batch // group`` anchor-style prompts, each repeated ``group`` times (one group each)."""
    tasks = max(1, batch // group)
    return [
        {"messages": [{"role": "user", "content": f"write a short string: {k}"}]}
        for k in range(tasks)
        for _ in range(group)
    ][:batch]


def _policy(contender: str, model, tokenizer):
    from agents import HFPolicy

    if contender != "vllm":
        return HFPolicy(model, tokenizer, decoder=contender)
    from agents import VLLMPolicy

    folder = Path(tempfile.mkdtemp(prefix="bench-gen-"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return VLLMPolicy(str(folder), tokenizer=tokenizer, dtype="float32", max_model_len=2048,
                      enforce_eager=True, gpu_memory_utilization=0.15)


def child(contenders: list[str], model_name: str, batch: int, group: int, new_tokens: int, repeats: int,
          threads: int, out: str) -> None:
    import torch

    torch.set_num_threads(threads)
    from agents import SamplingParams, load_model

    model, tokenizer = load_model(model_name)
    policies = {c: _policy(c, model, tokenizer) for c in contenders}
    observations = _prompts(batch, group)
    rates: dict[str, list[float]] = {c: [] for c in contenders}
    tokens: dict[str, list[int]] = {c: [] for c in contenders}
    seconds: dict[str, list[float]] = {c: [] for c in contenders}
    for r in range(repeats + 1):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=r)
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            start = time.perf_counter()
            actions = policies[c].act(observations, sampling)
            elapsed = time.perf_counter() - start
            n = sum(len(a.completion_ids) for a in actions)
            if r:  # the first batch warms caches
                rates[c].append(n / elapsed)
                tokens[c].append(n)
                seconds[c].append(elapsed)
    Path(out).write_text(json.dumps({
        c: {"tokens_per_s": statistics.median(rates[c]), "seconds": statistics.median(seconds[c]),
            "tokens": tokens[c]} for c in contenders
    }))


def _run_round(contenders: list[str], model: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads),
               "MKL_NUM_THREADS": str(args.threads), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        cmd = [sys.executable, "-m", "bench.generation", "--child", ",".join(contenders), "--models", model,
               "--batch", str(args.batch), "--group", str(args.group), "--new-tokens", str(args.new_tokens),
               "--repeats", str(args.repeats), "--threads", str(args.threads), "--out", str(out)]
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=1800)
        return json.loads(out.read_text())


def versions() -> dict[str, str]:
    import importlib.metadata as md

    found = {}
    for name in ("torch", "transformers", "accelerate", "vllm"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-anchor")
    parser.add_argument("--batch", type=int, default=64, help="rollouts per call (G x P)")
    parser.add_argument("--group", type=int, default=8, help="G: rollouts per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    parser.add_argument("--vllm", action="store_true", help="also VLLMPolicy (needs vLLM)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    if not args.child:
        print(format_versions("versions", interpreter_versions()), flush=True)
    if args.child:
        child(args.child.split(","), args.models, args.batch, args.group, args.new_tokens, args.repeats,
              args.threads, args.out)
        return 0

    contenders = list(CONTENDERS) + (["vllm"] if args.vllm else [])
    load_before = os.getloadavg()
    print(f"batch {args.batch} (G={args.group}) x {args.new_tokens} new tokens, {args.threads} torch thread(s), "
          f"median of {args.repeats} batches per contender and process, {args.rounds} rounds; load average "
          f"{load_before[0]:.1f}; {versions()}", flush=True)
    report: dict[str, dict] = {}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        runs: dict[str, list[dict]] = {c: [] for c in contenders}
        for _ in range(args.rounds):
            result = _run_round(contenders, model, args)
            for contender in contenders:
                runs[contender].append(result[contender])
        for g, s in zip(runs["generate"], runs["static"]):
            if g["tokens"] != s["tokens"]:
                print(f"warning: {model}: generate and static drew different token counts {g['tokens']} / {s['tokens']}")
        ratios = [s["tokens_per_s"] / g["tokens_per_s"] for g, s in zip(runs["generate"], runs["static"])]
        row = {c: {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                   "seconds_per_batch": statistics.median(r["seconds"] for r in rs),
                   "rounds": [r["tokens_per_s"] for r in rs]} for c, rs in runs.items()}
        row["static_over_generate"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        if "vllm" in runs:
            row["vllm_over_generate"] = statistics.median(
                v["tokens_per_s"] / g["tokens_per_s"] for g, v in zip(runs["generate"], runs["vllm"]))
        report[model] = row
        for c in contenders:
            print(f"{model:<14} {c:<9} {row[c]['tokens_per_s']:>9.1f} tokens/s  {row[c]['seconds_per_batch']:.3f} s/batch")
        r = row["static_over_generate"]
        print(f"{model:<14} static / generate: {r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f})", flush=True)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": report, "load_average": [load_before[0], load_after[0]],
                                               "versions": versions(), "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
