"""What the estimator changes under AdamW: SmolLM2-135M tool-calling RL over seeds.

The tool-calling RL of docs/learning.md (stage 2: 30 steps of 2 tasks x 8 rollouts from the
SFT warm start, ``studies/configs/toolcall_smollm2_rl_grpo.yaml``) run for each estimator and
seed; only ``algorithm.estimator`` and ``train.seed`` change between runs. Each final model
is evaluated greedily on the generator's 200-task eval split with ``studies.learning_toolcall``
(the code of ``corrgrpo eval``), and so is the warm start.

Why: AdamW divides each coordinate's step by the running RMS of its gradient, so a uniform
scale of the advantages (CorrGRPO's ``c_q`` below 1 in every group) cancels; what can change
is the relative weight of groups within a step and of steps within the run. This study
measures the update itself (``update_norm``, ``||delta theta||`` per step, logged by the
trainer) next to the gradient norm and the advantages' scale.

Reported (``tables.md`` and ``results.json`` under ``--out``):

* per run: greedy all-exact accuracy on the eval split's call tasks and each reward component
  in percent, tasks gained and lost against the warm start (McNemar's exact p);
* per estimator: the mean over seeds with its 95 % t-interval;
* paired on the seed against the baseline (``grpo``): the mean difference, its 95 % t-interval
  and the paired t-test's p; and the call tasks gained and lost summed over the seeds;
* the optimizer's step: mean ``update_norm`` and ``grad_norm`` over the steps that updated,
  the mean |advantage|, and the ratio to the baseline's at the same (seed, step);
* the weights: each component's absolute share of the advantages and the median effective
  group weight (CorrGRPO's ``1/sqrt(S_corr)``, GRPO's ``1/std``, GDPO's per component).

    python -m studies.adamw_toolcall --run --workers 2      # train + evaluate what is missing
    python -m studies.adamw_toolcall                        # tables from what is there

Runs go to ``OUT/<estimator>-s<seed>/`` (``train.resume=auto``: an interrupted run continues
from its last checkpoint), evaluations to ``OUT/eval/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from studies.learning_toolcall import COMPONENTS, answer_exact, paired_change
from studies.study import _holm, _mean_ci, _paired

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "studies" / "configs" / "toolcall_smollm2_rl_grpo.yaml"
ESTIMATORS = ("grpo", "corrgrpo", "gdpo")
BASELINE = "grpo"
START = "sft60"
STEPS = 30
METRICS = ("all_exact_accuracy", *COMPONENTS)


def stage(estimator: str, seed: int) -> str:
    """The evaluation's stage name of a run."""
    return f"{estimator}_s{seed}"


def run_dir(out: Path, estimator: str, seed: int) -> Path:
    return out / f"{estimator}-s{seed}"


# ------------------------------------------------------------------------------------------ runs
def _python(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def train_command(out: Path, estimator: str, seed: int, threads: int, start: Path) -> list[str]:
    return _python("corrgrpo.trainer.cli") + [
        "train", str(CONFIG), f"algorithm.estimator={estimator}", f"train.seed={seed}",
        f"train.output_dir={run_dir(out, estimator, seed)}", f"model.name_or_path={start}",
        f"rollout.torch_threads={threads}", "train.resume=auto", "train.progress=false",
    ]


def eval_command(out: Path, name: str, model: Path, threads: int) -> list[str]:
    return _python("studies.learning_toolcall") + [
        "--stage", f"{name}={model}", "--data", "generated=200", "--batch-size", "64",
        "--threads", str(threads), "--out", str(out / "eval"), "--compare", f"{name}:{START}",
    ]


def _run(cmd: list[str], log: Path, threads: int) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    with open(log, "a", encoding="utf-8") as f:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode


def run_one(out: Path, estimator: str, seed: int, threads: int, start: Path) -> dict[str, Any]:
    """Train one run (resuming) and evaluate its final model; skips what is done. Wall times."""
    d = run_dir(out, estimator, seed)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"checkpoint-{STEPS}" / "model"
    walls: dict[str, Any] = {"estimator": estimator, "seed": seed}
    if not final.exists():
        t0 = time.perf_counter()
        rc = _run(train_command(out, estimator, seed, threads, start), d / "train.log", threads)
        walls["train_s"] = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"training {d} failed (exit {rc}); see {d / 'train.log'}")
    if not (out / "eval" / f"{stage(estimator, seed)}-generated.json").exists():
        t0 = time.perf_counter()
        rc = _run(eval_command(out, stage(estimator, seed), final, threads), d / "eval.log", threads)
        walls["eval_s"] = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"evaluating {final} failed (exit {rc}); see {d / 'eval.log'}")
    with open(d / "wall.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(walls) + "\n")
    return walls


def run_all(out: Path, estimators: list[str], seeds: list[int], workers: int, start: Path) -> None:
    """Every missing (estimator, seed) run, seed-major, ``workers`` at a time (one thread each),
    then the warm start's evaluation."""
    jobs = [(e, s) for s in seeds for e in estimators]
    with ThreadPoolExecutor(workers) as pool:
        for walls in pool.map(lambda job: run_one(out, *job, 1, start), jobs):
            print(json.dumps(walls), flush=True)
    if not (out / "eval" / f"{START}-generated.json").exists():
        _run(eval_command(out, START, start, workers), out / "sft_eval.log", workers)


# -------------------------------------------------------------------------------------- analysis
def load_eval(out: Path, name: str) -> dict[str, Any] | None:
    path = out / "eval" / f"{name}-generated.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def call_task_exact(result: dict[str, Any]) -> dict[str, bool]:
    """Task id -> all-exact, over the tasks that expect calls."""
    return {a["task_id"]: answer_exact(a) for a in result["answers"] if a.get("expects_calls", True)}


def read_metrics(d: Path) -> list[dict[str, Any]]:
    """A run's records (``corrgrpo.trainer.run_logger.read_metrics``); none for a run not started yet."""
    from corrgrpo.trainer.run_logger import read_metrics as read_run_metrics

    return read_run_metrics(d) if (d / "metrics.jsonl").exists() else []


def step_summary(records: list[dict[str, Any]]) -> dict[str, float]:
    """Means over a run's steps. The optimizer's figures (update and gradient norms, |A|) are over
    the steps that had a gradient; ``update_norm_skipped`` is the mean over the steps without one
    (AdamW still moves the weights there, by its momentum)."""
    updated = [r for r in records if not r.get("skipped_update")]
    skipped = [r for r in records if r.get("skipped_update")]

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        return statistics.fmean(vals) if vals else float("nan")

    out = {
        "steps": len(records), "steps_updated": len(updated),
        "update_norm": mean(updated, "update_norm"), "update_norm_skipped": mean(skipped, "update_norm"),
        "grad_norm": mean(updated, "grad_norm"), "advantage_abs_mean": mean(updated, "advantage/abs_mean"),
        "group_weight_median": mean(updated, "group_weight/median"),
        "c_q_median": mean(updated, "c_q/median"),
        "zero_variance_fraction": mean(records, "zero_variance_fraction"),
        "first_update_norm": float(updated[0]["update_norm"]) if updated and "update_norm" in updated[0] else float("nan"),
    }
    for name in COMPONENTS:
        out[f"share/{name}"] = mean(updated, f"advantage_share_abs/{name}")
        out[f"group_weight/{name}"] = mean(updated, f"group_weight/{name}/median")
    return out


def step_ratios(run: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> list[float]:
    """``run[key] / base[key]`` at each step both runs updated (same seed, same step)."""
    by_step = {r["step"]: r for r in base if not r.get("skipped_update") and r.get(key)}
    return [float(r[key]) / float(by_step[r["step"]][key]) for r in run
            if not r.get("skipped_update") and r.get(key) and r["step"] in by_step]


def paired_step_ratio(run: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> float:
    """Median over the steps both runs updated of ``run[key] / base[key]`` (same seed, same step)."""
    ratios = step_ratios(run, base, key)
    return statistics.median(ratios) if ratios else float("nan")


def _mean_ci_finite(xs: list[float]) -> tuple[float, float]:
    """:func:`studies.study._mean_ci` over the finite values (a metric a run does not log is NaN)."""
    finite = [x for x in xs if x == x]
    return _mean_ci(finite) if finite else (float("nan"), float("nan"))


def _metric(result: dict[str, Any], name: str) -> float:
    return float(result["metrics"][name])


def analyze(out: Path, estimators: list[str], seeds: list[int], baseline: str = BASELINE) -> dict[str, Any]:
    """Every number of the tables from the finished runs and evaluations under ``out``."""
    start = load_eval(out, START)
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for e in estimators:
        for s in seeds:
            result, records = load_eval(out, stage(e, s)), read_metrics(run_dir(out, e, s))
            if result is None or len(records) < STEPS:
                continue
            row: dict[str, Any] = {m: _metric(result, m) for m in METRICS}
            row.update(step_summary(records))
            if start is not None:
                row["vs_start"] = paired_change(call_task_exact(start), call_task_exact(result))
            runs.setdefault(e, {})[s] = row
    res: dict[str, Any] = {"runs": runs, "estimators": {}, "paired": {}}
    if start is not None:
        res["start"] = {m: _metric(start, m) for m in METRICS}
    for e, by_seed in runs.items():
        keys = [k for k in next(iter(by_seed.values())) if k != "vs_start"]
        res["estimators"][e] = {"seeds": sorted(by_seed), **{
            k: _mean_ci_finite([by_seed[s][k] for s in sorted(by_seed)]) for k in keys}}
    base = runs.get(baseline, {})
    pvalues = {}
    for e, by_seed in runs.items():
        if e == baseline:
            continue
        common = sorted(set(by_seed) & set(base))
        if len(common) < 2:
            continue
        entry: dict[str, Any] = {"seeds": common}
        for m in METRICS + ("update_norm", "grad_norm", "advantage_abs_mean"):
            entry[m] = _paired([by_seed[s][m] for s in common], [base[s][m] for s in common])
        gained = lost = 0
        for s in common:
            change = paired_change(call_task_exact(load_eval(out, stage(baseline, s))),
                                   call_task_exact(load_eval(out, stage(e, s))))
            gained, lost = gained + change["gained"], lost + change["lost"]
        entry["tasks"] = {"gained": gained, "lost": lost}
        for key in ("update_norm", "grad_norm", "advantage/abs_mean"):
            per_seed = [step_ratios(read_metrics(run_dir(out, e, s)), read_metrics(run_dir(out, baseline, s)), key)
                        for s in common]
            entry[f"step_ratio/{key}"] = [statistics.median(r) if r else float("nan") for r in per_seed]
            pooled = [x for r in per_seed for x in r]
            entry[f"step_ratio_range/{key}"] = [min(pooled), max(pooled)] if pooled else [float("nan")] * 2
        for m in METRICS:
            pvalues[f"{e}/{m}"] = entry[m][2]
        res["paired"][e] = entry
    res["holm"] = _holm(pvalues) if pvalues else {}
    res["per_step"] = {e: per_step_means(out, e, sorted(by_seed)) for e, by_seed in runs.items()}
    return res


def per_step_means(out: Path, estimator: str, seeds: list[int]) -> dict[str, list[float]]:
    """Per step, the mean over seeds of the update and gradient norms, and the share of the seeds
    whose step had no gradient (every group constant)."""
    runs = [read_metrics(run_dir(out, estimator, s))[:STEPS] for s in seeds]
    return {
        key: [statistics.fmean(float(r[i].get(key) or 0.0) for r in runs) for i in range(STEPS)]
        for key in ("update_norm", "grad_norm", "skipped_update")
    }


def per_step_markdown(res: dict[str, Any], key: str = "update_norm", block: int = 10) -> str:
    """``key`` per step and estimator (mean over seeds), in blocks of ``block`` steps."""
    lines = []
    for start in range(0, STEPS, block):
        steps = range(start, min(start + block, STEPS))
        lines += ["| step | " + " | ".join(str(i + 1) for i in steps) + " |", "|---|" + "---|" * len(steps)]
        for e, per in res["per_step"].items():
            lines.append(f"| {e} | " + " | ".join(f"{per[key][i]:.3f}" for i in steps) + " |")
        lines.append("")
    return "\n".join(lines)


def _pm(pair: tuple[float, float], digits: int = 1) -> str:
    m, half = pair
    return f"{m:.{digits}f} ± {half:.{digits}f}" if half == half else f"{m:.{digits}f}"


def tables_markdown(res: dict[str, Any]) -> str:
    """The study's tables (Markdown)."""
    lines = ["#### greedy evaluation on the eval split (137 call tasks), mean ± 95 % t half-width over seeds", "",
             "| estimator | seeds | all-exact % | " + " | ".join(COMPONENTS) + " |",
             "|---|---|---|" + "---|" * len(COMPONENTS)]
    if "start" in res:
        lines.append(f"| (warm start, {START}) | | {res['start']['all_exact_accuracy']:.1f} | "
                     + " | ".join(f"{res['start'][c]:.1f}" for c in COMPONENTS) + " |")
    for e, st in res["estimators"].items():
        lines.append(f"| {e} | {len(st['seeds'])} | {_pm(st['all_exact_accuracy'])} | "
                     + " | ".join(_pm(st[c]) for c in COMPONENTS) + " |")
    lines += ["", "#### per run", "",
              "| run | all-exact % | gained / lost vs warm start (p) | steps updated | mean update norm "
              "| mean grad norm | mean abs(A) | first update norm |",
              "|---|---|---|---|---|---|---|---|"]
    for e, by_seed in res["runs"].items():
        for s, r in sorted(by_seed.items()):
            vs = r.get("vs_start")
            change = f"{vs['gained']} / {vs['lost']} ({vs['p']:.2g})" if vs else ""
            lines.append(f"| {e} seed {s} | {r['all_exact_accuracy']:.1f} | {change} | {r['steps_updated']} "
                         f"| {r['update_norm']:.4f} | {r['grad_norm']:.3f} | {r['advantage_abs_mean']:.3f} "
                         f"| {r['first_update_norm']:.4f} |")
    if res["paired"]:
        lines += ["", f"#### paired on the seed, difference to {BASELINE}: mean [95 % CI], p (Holm over the "
                  "evaluation metrics)", "",
                  "| estimator | all-exact (points) | call tasks gained / lost (summed over seeds) | "
                  + " | ".join(COMPONENTS) + " |", "|---|---|---|" + "---|" * len(COMPONENTS)]
        for e, p in res["paired"].items():
            cells = []
            for m in METRICS:
                d, half, pv = p[m]
                cells.append(f"{d:+.1f} [±{half:.1f}], p={pv:.2g} ({res['holm'].get(f'{e}/{m}', float('nan')):.2g})")
            lines.append(f"| {e} | {cells[0]} | {p['tasks']['gained']} / {p['tasks']['lost']} | "
                         + " | ".join(cells[1:]) + " |")
        lines += ["", "#### the optimizer's step, against the same seed's " + BASELINE, "",
                  "| estimator | mean update norm | ratio (median over shared steps, per seed; all steps' range) | mean grad norm "
                  "| ratio | mean abs(A) | ratio |", "|---|---|---|---|---|---|---|"]
        base = res["estimators"].get(BASELINE)
        if base:
            lines.append(f"| {BASELINE} | {_pm(base['update_norm'], 4)} | 1 | {_pm(base['grad_norm'], 3)} | 1 "
                         f"| {_pm(base['advantage_abs_mean'], 3)} | 1 |")
        for e, p in res["paired"].items():
            st = res["estimators"][e]

            def ratios(key: str, p: dict[str, Any] = p) -> str:
                low, high = p[f"step_ratio_range/{key}"]
                return ", ".join(f"{x:.2f}" for x in p[f"step_ratio/{key}"]) + f" (steps: {low:.2f}-{high:.2f})"
            lines.append(f"| {e} | {_pm(st['update_norm'], 4)} | {ratios('update_norm')} | {_pm(st['grad_norm'], 3)} "
                         f"| {ratios('grad_norm')} | {_pm(st['advantage_abs_mean'], 3)} | {ratios('advantage/abs_mean')} |")
    lines += ["", "#### the weights: absolute share of the advantages per component, median group weight "
              "(means over updating steps and seeds)", "",
              "| estimator | " + " | ".join(f"share {c}" for c in COMPONENTS)
              + " | group weight | zero-variance groups | update norm on steps without a gradient |",
              "|---|" + "---|" * (len(COMPONENTS) + 3)]
    for e, st in res["estimators"].items():
        gw = st["group_weight_median"][0]
        if gw != gw:  # per-component weights (gdpo): list them
            gw_text = ", ".join(f"{c} {st[f'group_weight/{c}'][0]:.2f}" for c in COMPONENTS)
        else:
            gw_text = f"{gw:.2f}"
        lines.append(f"| {e} | " + " | ".join(f"{st[f'share/{c}'][0]:.2f}" for c in COMPONENTS)
                     + f" | {gw_text} | {st['zero_variance_fraction'][0]:.2f} | {st['update_norm_skipped'][0]:.4f} |")
    if res.get("per_step"):
        lines += ["", "#### update norm per step (mean over seeds)", "", per_step_markdown(res)]
    return "\n".join(lines) + "\n"


def write_mean_runs(out: Path, estimators: list[str], seeds: list[int]) -> list[Path]:
    """``OUT/mean-<estimator>/metrics.jsonl``: the per-step mean over seeds of the curves
    ``corrgrpo plot`` draws (rewards, advantage shares, group weights, grad and update norms)."""
    keep = ("reward/", "advantage_share/", "advantage_share_abs/", "group_weight/", "grad_norm", "update_norm")
    dirs = []
    for e in estimators:
        runs = [r for s in seeds if len(r := read_metrics(run_dir(out, e, s))) >= STEPS]
        if not runs:
            continue
        d = out / f"mean-{e}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "metrics.jsonl", "w", encoding="utf-8") as f:
            for i in range(STEPS):
                rec: dict[str, Any] = {"step": i + 1}
                for key in runs[0][i]:
                    vals = [r[i].get(key) for r in runs]
                    if key.startswith(keep) and all(isinstance(v, (int, float)) for v in vals):
                        rec[key] = statistics.fmean(vals)
                mats = [r[i]["reward_correlation"] for r in runs if r[i].get("reward_correlation")]
                if mats:  # entry by entry, over the seeds that have it
                    k = len(mats[0])
                    rec["reward_correlation"] = [
                        [statistics.fmean(v) if (v := [m[a][b] for m in mats if m[a][b] is not None]) else None
                         for b in range(k)] for a in range(k)]
                f.write(json.dumps(rec) + "\n")
        dirs.append(d)
    return dirs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--start", type=Path, default=ROOT / "runs" / "sft_toolcall_smollm2" / "model",
                   help="the SFT warm start (studies/configs/sft_toolcall_smollm2.yaml's final model)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "adamw_toolcall")
    p.add_argument("--run", action="store_true", help="train and evaluate the missing runs first")
    p.add_argument("--figure", type=Path, default=None, help="PNG of the per-step means over seeds (corrgrpo plot)")
    args = p.parse_args(argv)
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    seeds = list(range(args.seeds))
    if BASELINE not in estimators:
        raise SystemExit(f"--estimators must include {BASELINE} (the paired baseline)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.run:
        if not args.start.exists():
            raise SystemExit(f"--start {args.start}: no such model folder (run corrgrpo sft "
                             "studies/configs/sft_toolcall_smollm2.yaml first)")
        run_all(args.out, estimators, seeds, args.workers, args.start)
    res = analyze(args.out, estimators, seeds)
    (args.out / "results.json").write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    md = tables_markdown(res)
    (args.out / "tables.md").write_text(md, encoding="utf-8")
    print(md)
    if args.figure:
        dirs = write_mean_runs(args.out, estimators, seeds)
        cmd = _python("corrgrpo.trainer.cli") + ["plot", *map(str, dirs), "--out", str(args.figure),
                                        "--labels", *[d.name[len("mean-"):] for d in dirs], "--smooth", "3"]
        subprocess.run(cmd, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
