"""The toy study's task trained through TRL with its two aggregations and with CorrGRPO, and through
``corrgrpo train``: per-component reward curves over seeds, and the cost of our part of TRL's step.

The setting is ``studies/configs/study_toy.yaml`` (ScaleDominance, 64 prompts, the anchor's tokenizer
and random-init Qwen2 of 558,208 parameters, 8 prompts x 8 completions, 32 new tokens,
temperature 1, AdamW lr 1e-3 with linear decay, grad norm 1.0, clip 0.2, no KL, GRPO's loss).
TRL (``.venv-trl``, ``bash scripts/trl_venv.sh``) runs it with ``CorrGRPOTrainer``:
``estimator=None`` for TRL's ``sum_then_normalize`` and ``normalize_then_sum`` (TRL's own
advantages, our diagnostics logged) and ``estimator="corrgrpo"``; ``corrgrpo train`` runs the
YAML with ``algorithm.estimator=corrgrpo``. Each run is a fresh process.

Cost: ``corrgrpo/time/overhead`` (the time our hooks add: schedule, gates, estimator,
diagnostics, attribution) over TRL's ``step_time`` (the whole step, generation included), summed
over a run's steps.

    bash scripts/trl_venv.sh
    .venv/bin/python -m bench.trl_estimators --seeds 3 --steps 20   # runs/trl_estimators + the figure
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
CONFIG = ROOT / "studies" / "configs" / "study_toy.yaml"
FIGURE = ROOT / "docs" / "figures" / "trl_estimators.png"
NAMES = ("digits", "has_a", "word_with_a")
#: label -> (trainer, TRL estimator or None, TRL multi_objective_aggregation)
CONFIGS: dict[str, tuple[str, str | None, str]] = {
    "TRL sum_then_normalize": ("trl", None, "sum_then_normalize"),
    "TRL normalize_then_sum": ("trl", None, "normalize_then_sum"),
    "TRL + CorrGRPOTrainer corrgrpo": ("trl", "corrgrpo", "sum_then_normalize"),
    "corrgrpo train corrgrpo": ("corrgrpo", "corrgrpo", ""),
}


def trl_child(out: Path, estimator: str | None, aggregation: str, seed: int, steps: int) -> None:
    """One TRL run (in the TRL venv): writes ``out/history.json``, TRL's log history."""
    import torch
    import yaml
    from trl import GRPOConfig

    from corrgrpo.agents.models import load_model
    from corrgrpo.trainer.integrations.trl import CorrGRPOTrainer
    from corrgrpo_envs.integrations.trl import for_trl

    cfg = yaml.safe_load(CONFIG.read_text())
    torch.set_num_threads(1)
    model, tokenizer = load_model(cfg["model"]["name_or_path"])
    setup = for_trl(cfg["env"]["id"], split=cfg["train"]["split"], num_tasks=cfg["env"]["num_tasks"])
    a, r, o = cfg["algorithm"], cfg["rollout"], cfg["optim"]
    args = GRPOConfig(
        output_dir=str(out), num_generations=a["group_size"],
        per_device_train_batch_size=a["group_size"] * a["prompts_per_step"],
        max_completion_length=r["max_new_tokens"], temperature=r["temperature"], learning_rate=o["lr"],
        lr_scheduler_type=o["schedule"], max_grad_norm=o["max_grad_norm"], beta=0.0, loss_type="grpo",
        max_steps=steps, seed=seed, use_cpu=True, bf16=False, fp16=False, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, reward_weights=setup.reward_weights,
        multi_objective_aggregation=aggregation,
    )
    trainer = CorrGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=setup.reward_funcs,
                              train_dataset=setup.dataset, args=args, estimator=estimator)
    trainer.train()
    (out / "history.json").write_text(json.dumps(trainer.state.log_history))


def _check(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(proc.args[:4])} ... exited {proc.returncode}:\n{proc.stderr[-3000:]}")


def _run_trl(out: Path, estimator: str | None, aggregation: str, seed: int, steps: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(TRL_PYTHON), "-m", "bench.trl_estimators", "--child", str(out), "--estimator", str(estimator),
           "--aggregation", aggregation, "--seed", str(seed), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    _check(subprocess.run(cmd, cwd=ROOT, env=env, timeout=1800, capture_output=True, text=True))
    history = [h for h in json.loads((out / "history.json").read_text()) if "loss" in h]
    curves = {n: [h[f"rewards/{n}/mean"] for h in history] for n in NAMES}
    overhead = sum(h.get("corrgrpo/time/overhead", 0.0) for h in history)
    step_time = sum(h["step_time"] for h in history)
    return {"curves": curves, "overhead_s": overhead, "step_time_s": step_time}


def _run_corrgrpo(out: Path, seed: int, steps: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "corrgrpo.trainer.cli", "train", str(CONFIG), "algorithm.estimator=corrgrpo",
           f"train.seed={seed}", f"train.steps={steps}", f"train.output_dir={out}", "rollout.torch_threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    _check(subprocess.run(cmd, cwd=ROOT, env=env, timeout=1800, capture_output=True, text=True))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curves = {n: [r[f"reward/{n}/mean"] for r in records] for n in NAMES}
    return {"curves": curves, "step_time_s": sum(r["time/step"] for r in records)}


def plot(results: dict[str, list[dict[str, Any]]], path: Path, steps: int, seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(NAMES), figsize=(4.2 * len(NAMES), 3.4))
    for label, runs in results.items():
        for ax, name in zip(axes, NAMES):
            curves = np.array([r["curves"][name] for r in runs], dtype=float)
            x = np.arange(1, curves.shape[1] + 1)
            mean = curves.mean(axis=0)
            (line,) = ax.plot(x, mean, label=label, lw=1.5)
            ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.12)
            ax.set_title(name)
            ax.set_xlabel("step")
    axes[0].set_ylabel(f"mean reward ({seeds} seeds; band: min-max)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"ScaleDominance (study_toy.yaml), {steps} steps: TRL's aggregations, CorrGRPO in TRL, corrgrpo train",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "trl_estimators")
    p.add_argument("--figure", type=Path, default=FIGURE)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--estimator", default="None", help=argparse.SUPPRESS)
    p.add_argument("--aggregation", default="sum_then_normalize", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        trl_child(args.child, None if args.estimator == "None" else args.estimator, args.aggregation,
                  args.seed, args.steps)
        return 0
    if not TRL_PYTHON.exists():
        print("error: .venv-trl is missing (bash scripts/trl_venv.sh builds it)")
        return 2
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in CONFIGS}
    for seed in range(args.seeds):  # round-robin: the machine's drifting load hits every configuration alike
        for k, (label, (trainer, estimator, aggregation)) in enumerate(CONFIGS.items()):
            out = args.out / f"c{k}-s{seed}"
            started = time.perf_counter()
            if trainer == "trl":
                run = _run_trl(out, estimator, aggregation, seed, args.steps)
            else:
                run = _run_corrgrpo(out, seed, args.steps)
            run["wall_s"] = time.perf_counter() - started
            results[label].append(run)
            print(f"{label} seed {seed}: {run['wall_s']:.0f} s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results))
    plot(results, args.figure, args.steps, args.seeds)
    last = max(1, args.steps // 4)
    print(f"\nmean reward over the last {last} steps (mean over {args.seeds} seeds; min-max over seeds)")
    print(f"{'configuration':34s}" + "".join(f"{n:>22s}" for n in NAMES))
    for label, runs in results.items():
        cells = []
        for name in NAMES:
            finals = [float(np.mean(r["curves"][name][-last:])) for r in runs]
            cells.append(f"{np.mean(finals):7.3f} [{min(finals):.2f}, {max(finals):.2f}]")
        print(f"{label:34s}" + "".join(f"{c:>22s}" for c in cells))
    print("\nour hooks' time / TRL's step time (sum over the run's steps), per seed:")
    for label, runs in results.items():
        if CONFIGS[label][0] == "trl":
            shares = [r["overhead_s"] / r["step_time_s"] for r in runs]
            per_step = [r["overhead_s"] / args.steps * 1e3 for r in runs]
            print(f"  {label:34s} " + ", ".join(f"{s:.2%}" for s in shares)
                  + f"  ({np.median(per_step):.1f} ms per step, median)")
    print(f"\nfigure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
