"""``corrgrpo sft`` side by side with TRL's ``SFTTrainer``: same model, data and batch.

The data are the tool-calling domain's reference answers on its generated train split (the
tasks ``env_configs/sft_toolcall_tiny.yaml`` learns from), written once as JSON lines:
``{messages, tools}`` records for corrgrpo, the same conversations as TRL prompt-completion
records (prompt: system + user; completion: the assistant's answer; the tool schemas as a
``tools`` column) for TRL, so both render them with the model's chat template and train on the
answer only. Both load the same model folder and take ``--batch`` examples per optimizer step
(TRL in one forward pass padded to the longest example; corrgrpo in length-bucketed passes of at
most ``--micro-batch-tokens`` tokens with gradient accumulation over the whole batch, its
default on CPU), with AdamW at ``--lr``, linear decay to 0 over ``--steps`` steps, gradient clipping at 1.0,
float32, no evaluation and no checkpoints during the run. TRL runs in its own virtual
environment (``scripts/trl_venv.sh``) through this file's ``--child-trl`` mode.

Every run is a fresh process with ``--threads`` torch threads (set explicitly in both); the
two trainers alternate round by round so that drifting load hits them alike. Reported per
trainer (median and min-max over rounds): seconds per step (median over steps 3+ of each run:
corrgrpo's ``time/step``, TRL's interval between consecutive step ends), the peak RSS of the
process (``ru_maxrss``), and the training loss at each step (mean over rounds), then the ratios
corrgrpo / TRL.

    scripts/trl_venv.sh                                  # once: .venv-trl with trl 1.16.0
    .venv/bin/python -m bench.sft --rounds 3 --steps 20  # table + runs/bench_sft/results.json

The losses differ in one detail: TRL's completion is what the template writes after the
prompt, ``answer<|im_end|>\\n``, so it also trains on the newline after the end-of-turn token;
corrgrpo trains on ``answer<|im_end|>`` (the tokens a policy generates). Example order differs
(each trainer shuffles with its own sampler), so the curves agree in trend, not step by step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2  # step-time medians are over steps 3..N


# ---------------------------------------------------------------------------- the TRL child
def trl_child(args: argparse.Namespace) -> int:
    """One TRL SFT run (executed by the TRL virtual environment's python)."""
    import resource

    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    import trl
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    imports_s = time.perf_counter() - t_start
    rss_after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = load_dataset("json", data_files=str(args.data), split="train")

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.begin = 0.0

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.begin = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.ends.append(time.perf_counter())

    times = StepTimes()
    config = SFTConfig(
        output_dir=str(args.out / "trl_out"),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        dataloader_num_workers=0,
        max_length=args.max_length,
        completion_only_loss=True,
        disable_tqdm=True,
        bf16=False,
        fp16=False,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[times])
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    steps = [b - a for a, b in zip([times.begin, *times.ends[:-1]], times.ends)]
    (args.out / "result.json").write_text(json.dumps({
        "step_s": steps,
        "loss": losses,
        "imports_s": imports_s,
        "rss_after_imports_mib": rss_after_imports,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                     "torch": torch.__version__},
    }))
    return 0


# ------------------------------------------------------------------------------- the parent
def build_data(out: Path, tasks: int, model: str) -> tuple[Path, Path, Path, dict[str, Any]]:
    """The reference conversations as corrgrpo and TRL JSON lines, and the model folder."""
    import corrgrpo_envs
    from corrgrpo.agents.models import load_model

    env = corrgrpo_envs.make("corrgrpo/ToolCall-v0", dataset="generated", num_tasks=tasks, seed=0,
                             split="train").unwrapped
    ours, theirs = out / "data.jsonl", out / "data_trl.jsonl"
    with open(ours, "w", encoding="utf-8") as a, open(theirs, "w", encoding="utf-8") as b:
        for task_id in env.task_ids:
            obs, _ = env.reset(options={"task_id": task_id})
            reference = env.reference_action(task_id)
            answer = reference[0] if isinstance(reference, list) else reference
            reply = [{"role": "assistant", "content": answer}]
            a.write(json.dumps({"messages": obs["messages"] + reply, "tools": obs["tools"]}) + "\n")
            b.write(json.dumps({"prompt": obs["messages"], "completion": reply,
                                "tools": json.dumps(obs["tools"])}) + "\n")
    env.close()
    # one plain model folder both trainers load
    folder = out / "model"
    if not (folder / "config.json").exists():
        m, tok = load_model(model)
        m.save_pretrained(folder)
        tok.save_pretrained(folder)
    return ours, theirs, folder, {"examples": len(env.task_ids)}


def corrgrpo_command(python: str, data: Path, model: Path, args: argparse.Namespace, run: Path) -> list[str]:
    """The ``corrgrpo sft`` command of one run."""
    overrides = [
        f"model.name_or_path={model}",
        "data.source=file",
        f"data.files=[{data}]",
        "data.eval_fraction=0.0",
        f"data.max_length={args.max_length}",
        f"optim.lr={args.lr}",
        "optim.schedule=linear",
        "optim.warmup_steps=0",
        "optim.max_grad_norm=1.0",
        f"train.steps={args.steps}",
        f"train.batch_size={args.batch}",
        f"train.micro_batch_tokens={args.micro_batch_tokens}",
        f"train.torch_threads={args.threads}",
        f"train.output_dir={run}",
        "train.save_final=false",
        "train.progress=false",
        "train.tensorboard=false",
    ]
    return [python, "-m", "corrgrpo.trainer.cli", "sft", str(ROOT / "env_configs" / "sft_toolcall_tiny.yaml"), *overrides]


def trl_command(python: str, data: Path, model: Path, args: argparse.Namespace, run: Path) -> list[str]:
    return [python, "-m", "bench.sft", "--child-trl", "--data", str(data), "--model", str(model),
            "--out", str(run), "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
            "--threads", str(args.threads), "--max-length", str(args.max_length)]


def run_measured(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[int, float, float]:
    """``(exit code, wall seconds, peak RSS MiB)`` of one fresh process."""
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    return os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss / 1024.0


def parse_corrgrpo(run: Path) -> dict[str, Any]:
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    steps = [r for r in records if r["step"] > 0]
    return {"step_s": [r["time/step"] for r in steps], "loss": [r["loss"] for r in steps]}


def parse_trl(run: Path) -> dict[str, Any]:
    return json.loads((run / "result.json").read_text())


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per trainer")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="examples per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tasks", type=int, default=80, help="generated tool-calling tasks (80 %% train)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--micro-batch-tokens", type=int, default=4096,
                   help="corrgrpo's forward-pass budget (the batch is the same; TRL runs it in one pass)")
    p.add_argument("--model", default="tiny", help="a load_model name or a model folder")
    p.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_sft")
    p.add_argument("--python", default=sys.executable, help="python of the corrgrpo venv")
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    p.add_argument("--child-trl", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    if not args.child_trl:
        print(format_versions("versions", interpreter_versions()), flush=True)
        print(format_versions("TRL side", interpreter_versions(args.trl_python)), flush=True)
    if args.child_trl:
        args.model = Path(args.model)
        return trl_child(args)
    if not Path(args.trl_python).exists():
        print(f"{args.trl_python} not found: run scripts/trl_venv.sh first", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    ours, theirs, model, data_info = build_data(args.out, args.tasks, args.model)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    runs: dict[str, list[dict[str, Any]]] = {"corrgrpo": [], "trl": []}
    load: list[tuple[float, float, float]] = [os.getloadavg()]
    for rnd in range(args.rounds):
        order = ["corrgrpo", "trl"] if rnd % 2 == 0 else ["trl", "corrgrpo"]
        for name in order:
            run = args.out / f"{name}_r{rnd}"
            run.mkdir(parents=True, exist_ok=True)
            for f in ("metrics.jsonl", "result.json"):
                (run / f).unlink(missing_ok=True)
            if name == "corrgrpo":
                cmd = corrgrpo_command(args.python, ours, model, args, run)
            else:
                cmd = trl_command(args.trl_python, theirs, model, args, run)
            rc, wall, rss = run_measured(cmd, run / "log.txt", env)
            load.append(os.getloadavg())
            if rc != 0:
                print(f"[round {rnd}] {name}: exit {rc}, see {run / 'log.txt'}", flush=True)
                continue
            parsed = parse_corrgrpo(run) if name == "corrgrpo" else parse_trl(run)
            parsed.update(peak_rss_mib=rss, wall_s=wall, round=rnd,
                          median_step_s=statistics.median(parsed["step_s"][WARMUP:] or parsed["step_s"]))
            runs[name].append(parsed)
            print(f"[round {rnd}] {name:8s} {parsed['median_step_s']:.3f} s/step  peak RSS {rss:.0f} MiB  "
                  f"wall {wall:.0f} s  loss {parsed['loss'][0]:.3f} -> {parsed['loss'][-1]:.3f}  "
                  f"load {load[-1][0]:.1f}", flush=True)

    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        if not rs:
            continue
        n = min(len(r["loss"]) for r in rs)
        summary[name] = {
            "median_step_s": spread([r["median_step_s"] for r in rs]),
            "peak_rss_mib": spread([r["peak_rss_mib"] for r in rs]),
            "loss_mean_over_rounds": [statistics.mean(r["loss"][i] for r in rs) for i in range(n)],
        }
    ratios: dict[str, Any] = {}
    if "corrgrpo" in summary and "trl" in summary:
        a, b = summary["corrgrpo"], summary["trl"]
        ratios = {
            "step_s": a["median_step_s"]["median"] / b["median_step_s"]["median"],
            "peak_rss": a["peak_rss_mib"]["median"] / b["peak_rss_mib"]["median"],
            "step_s_same_round": [x["median_step_s"] / y["median_step_s"] for x in runs["corrgrpo"]
                                  for y in runs["trl"] if x["round"] == y["round"]],
        }

    print(f"\n{'trainer':10s} {'s/step median (min-max)':>28s} {'peak RSS MiB median (min-max)':>32s}")
    for name, s in summary.items():
        st, rss = s["median_step_s"], s["peak_rss_mib"]
        print(f"{name:10s} {st['median']:12.3f} ({st['min']:.3f}-{st['max']:.3f})       "
              f"{rss['median']:10.0f} ({rss['min']:.0f}-{rss['max']:.0f})")
    if ratios:
        same = ratios["step_s_same_round"]
        print(f"\ncorrgrpo / TRL: time per step {ratios['step_s']:.2f}x "
              f"(same-round {min(same):.2f}-{max(same):.2f}), peak RSS {ratios['peak_rss']:.2f}x")
    print("\ntraining loss, mean over rounds (steps 1, 2, 5, 10, 15, last):")
    for name, s in summary.items():
        ys = s["loss_mean_over_rounds"]
        picks = sorted({i for i in (0, 1, 4, 9, 14) if i < len(ys)} | {len(ys) - 1})
        print(f"  {name:10s} " + "  ".join(f"{i + 1}: {ys[i]:.3f}" for i in picks))
    versions = next((r.get("versions") for r in runs["trl"]), None)
    print(f"\nload average (1/5/15 min) before: {load[0]}, after: {load[-1]}")
    results = {
        "command": " ".join([sys.executable, *(argv if argv is not None else sys.argv)]),
        "setting": {"steps": args.steps, "batch": args.batch, "lr": args.lr, "threads": args.threads,
                    "micro_batch_tokens": args.micro_batch_tokens,
                    "model": args.model, "max_length": args.max_length, **data_info},
        "trl_side_versions": versions,
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
