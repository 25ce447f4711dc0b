"""Seconds per step and peak memory of the trainer on the quickstart setting, by phase.

Each contender runs in a fresh child process (so peak RSS is its own), and the
contenders alternate over several rounds (this machine's noise is 10-15 %):

* ``corrgrpo``: ``Trainer`` on ``env_configs/quickstart.yaml``;
* ``bare``: the least a GRPO step can cost with the same model and batch: one
  ``model.generate`` call for all rollouts, the rewards, one forward/backward
  and an optimizer step, written inline with no framework.

The ratio corrgrpo/bare is the trainer's overhead.

``--overlap`` compares the trainer with and without ``rollout.overlap`` instead (contenders
``corrgrpo`` and ``overlap``, the same thread budget ``--threads`` each: overlap splits it
between its two sides) on ``--setting`` quickstart, anchor (``studies/configs/anchor_grpo.yaml``)
or smollm2 (``studies/configs/toolcall_smollm2.yaml``, ``--max-new-tokens`` shortens it); the
machine's load average is printed with each process's result.

    python -m bench.train_step --steps 12 --rounds 2
    python -m bench.train_step --overlap --setting anchor --steps 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


SETTINGS = {
    "quickstart": "env_configs/quickstart.yaml",
    "anchor": "studies/configs/anchor_grpo.yaml",
    "smollm2": "studies/configs/toolcall_smollm2.yaml",
}


def child_corrgrpo(steps: int, out: str, setting: str = "quickstart", overlap: bool = False,
                   threads: int = 2, max_new_tokens: int | None = None, seed: int | None = None) -> dict:
    import torch

    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.trainer import Trainer

    torch.set_num_threads(threads)
    overrides = [f"train.steps={steps}", f"train.output_dir={out}", "train.progress=false",
                 "train.tensorboard=false", "train.save_final=false", "train.log_samples=0",
                 f"rollout.torch_threads={threads}"]
    if overlap:
        overrides += ["rollout.overlap=true", "algorithm.tis_cap=2.0"]
    if max_new_tokens is not None:
        overrides.append(f"rollout.max_new_tokens={max_new_tokens}")
    if seed is not None:
        overrides.append(f"train.seed={seed}")
    cfg = load_config(ROOT / SETTINGS[setting], overrides)
    Trainer(cfg).train()
    rows = [json.loads(x) for x in open(Path(out) / "metrics.jsonl")]
    keys = ["time/step", "time/generate", "time/reward", "time/update", "reward/weighted/mean"]
    return {k: [r[k] for r in rows] for k in keys}


def child_bare(steps: int, out: str) -> dict:
    import torch

    from corrgrpo.agents.models import load_model
    from corrgrpo_envs.toy.env import score_text

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prompts = [f"write a short string: {k}" for k in range(64)]
    times: dict[str, list[float]] = {"time/step": [], "time/generate": [], "time/reward": [], "time/update": []}
    for step in range(steps):
        batch = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                 for p in prompts[(step * 8) % 64 : (step * 8) % 64 + 8] for _ in range(8)]
        t0 = time.perf_counter()
        tok.padding_side = "left"
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            seqs = model.generate(**enc, do_sample=True, max_new_tokens=32, top_k=0, pad_token_id=tok.pad_token_id)
        t1 = time.perf_counter()
        texts = tok.batch_decode(seqs[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        r = torch.tensor([sum(score_text(t)) for t in texts])
        r = r.view(8, 8)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        t2 = time.perf_counter()
        attn = (seqs != tok.pad_token_id).long()
        logits = model(input_ids=seqs, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
        mask = torch.zeros_like(logp)
        mask[:, enc["input_ids"].shape[1] - 1 :] = 1
        loss = -((logp * mask).sum(1) / mask.sum(1) * adv).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        t3 = time.perf_counter()
        for k, v in zip(times, (t3 - t0, t1 - t0, t2 - t1, t3 - t2)):
            times[k].append(v)
    return times


def run_child(kind: str, steps: int, extra: list[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        load_before = os.getloadavg()[0]
        subprocess.run(
            [sys.executable, "-m", "bench.train_step", "--child", kind, "--steps", str(steps), "--out", str(out), *(extra or [])],
            check=True, cwd=ROOT,
        )
        result = json.loads(out.read_text())
        result["load_average"] = [load_before, os.getloadavg()[0]]
        return result


def compare_overlap(args: argparse.Namespace) -> None:
    """Synchronous vs overlapped trainer on one setting, fresh interleaved processes."""
    extra = ["--setting", args.setting, "--threads", str(args.threads)]
    if args.max_new_tokens is not None:
        extra += ["--max-new-tokens", str(args.max_new_tokens)]
    results: dict[str, list[dict]] = {"corrgrpo": [], "overlap": []}
    for round_ in range(args.rounds):
        seed = args.seeds[round_ % len(args.seeds)]
        for kind in results:
            run = run_child(kind, args.steps, [*extra, "--seed", str(seed)])
            run["seed"] = seed
            results[kind].append(run)
            print(f"{kind:9s} seed {seed} step s (steps 3+): {statistics.median(run['time/step'][2:]):.3f}  "
                  f"reward last 5 steps {statistics.mean(run['reward/weighted/mean'][-5:]):.3f}  "
                  f"load average {run['load_average'][0]:.1f} -> {run['load_average'][1]:.1f}", flush=True)
    print(f"setting {args.setting}, {args.steps} steps, {args.threads} torch threads per process, "
          f"median over steps 3+, median over {args.rounds} processes (seeds {args.seeds})")
    summary = {}
    print(f"{'':10s} {'step s':>8s} {'generate':>9s} {'update':>8s} {'reward (last)':>14s}")
    for kind, runs in results.items():
        row = {key: statistics.median(statistics.median(r[key][2:]) for r in runs)
               for key in ("time/step", "time/generate", "time/update")}
        row["reward"] = statistics.median(r["reward/weighted/mean"][-1] for r in runs)
        summary[kind] = row
        print(f"{kind:10s} {row['time/step']:8.3f} {row['time/generate']:9.3f} {row['time/update']:8.3f} "
              f"{row['reward']:14.3f}")
    c, o = summary["corrgrpo"], summary["overlap"]
    print(f"speed-up per step, synchronous/overlapped: {c['time/step'] / o['time/step']:.2f}x")
    curves = {k: [sum(col) / len(col) for col in zip(*(r["reward/weighted/mean"] for r in v))]
              for k, v in results.items()}
    for kind, curve in curves.items():
        print(f"mean reward curve {kind:9s}: " + " ".join(f"{x:.2f}" for x in curve))
    print(json.dumps({k: [{"seed": r["seed"], "time/step": r["time/step"], "reward": r["reward/weighted/mean"],
                           "load_average": r["load_average"]} for r in v] for k, v in results.items()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--overlap", action="store_true", help="compare rollout.overlap against the synchronous loop")
    p.add_argument("--setting", choices=sorted(SETTINGS), default="quickstart", help="with --overlap")
    p.add_argument("--threads", type=int, default=2, help="torch threads per process, with --overlap")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override rollout.max_new_tokens")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="train.seed of round i: seeds[i %% len]")
    p.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    if not args.child:
        print(format_versions("versions", interpreter_versions()), flush=True)
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            run = str(Path(tmp) / "run")
            if args.child == "bare":
                times = child_bare(args.steps, run)
            else:
                times = child_corrgrpo(args.steps, run, args.setting, args.child == "overlap",
                                       args.threads, args.max_new_tokens, args.seed)
        times["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(args.out).write_text(json.dumps(times))
        return
    if args.overlap:
        compare_overlap(args)
        return
    results: dict[str, list[dict]] = {"corrgrpo": [], "bare": []}
    for _ in range(args.rounds):
        for kind in results:
            results[kind].append(run_child(kind, args.steps))
    print(f"quickstart setting, 8 x 8 rollouts, 32 new tokens, {args.steps} steps, median over steps 3+, "
          f"median over {args.rounds} processes")
    summary = {}
    for kind, runs in results.items():
        row = {}
        for key in ("time/step", "time/generate", "time/reward", "time/update"):
            row[key] = statistics.median(statistics.median(r[key][2:]) for r in runs)
        row["peak_rss_mib"] = statistics.median(r["peak_rss_mib"] for r in runs)
        summary[kind] = row
    print(f"{'':10s} {'step s':>8s} {'generate':>9s} {'reward':>8s} {'update':>8s} {'peak RSS':>9s}")
    for kind, row in summary.items():
        print(f"{kind:10s} {row['time/step']:8.3f} {row['time/generate']:9.3f} {row['time/reward']:8.4f} "
              f"{row['time/update']:8.3f} {row['peak_rss_mib']:7.0f} MiB")
    c, b = summary["corrgrpo"], summary["bare"]
    print(f"ratio corrgrpo/bare: step {c['time/step'] / b['time/step']:.2f}x, "
          f"peak RSS {c['peak_rss_mib'] / b['peak_rss_mib']:.2f}x")


if __name__ == "__main__":
    main()
