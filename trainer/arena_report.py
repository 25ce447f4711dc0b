"""The arena's report: per regime, each estimator's rewards, held-out score, paired test against
GRPO, tier and cost, from the run folders :mod:`corrgrpo.trainer.arena` wrote.

Measures (the same for every regime):

- *final* value of a reward: the mean of its batch means over the last :data:`LAST` training
  steps of a run; ``weighted`` is the weighted total the run trained on;
- *held-out*: the evaluation of the final model on the regime's eval split (sampled, or greedy)
  (``eval.json``): each reward's mean and the *score*, the mean over rewards of each reward's
  mean in percent of its range (0 = every reward at its low end, 100 = every one at its high
  end), so that every reward has an equal say whatever its scale;
- *env metrics*: the env's own headline metrics (:func:`headline_metrics`) of that evaluation
  and of each extra held-out set's (``eval-<set>.json``), e.g. ToolCall's ``all_exact_accuracy``
  (on BFCL's Python categories, BFCL's own verdict);
- each number is a mean over seeds with the half-width of its 95 % t-interval; an estimator is
  compared with GRPO seed by seed (paired t-test) on the held-out score, on each reward's
  final value and on each env metric of each evaluation, and the p-values are Holm-corrected
  over every test of the arena;
- *tiers* rank estimators by held-out score: the best one left opens a tier, and every
  estimator whose interval overlaps its interval joins it (indistinguishable at this number of
  seeds);
- *cost*: the mean training seconds per step of the runs, and the estimator's own time per
  call on a batch of the regime's shape;
- *start*: the same evaluations of the starting model (before any training); each estimator's
  change from it (held-out score, env metrics) is its mean over seeds less the start's, with a
  95 % interval over seeds (paired by seed when the start was evaluated per seed, i.e. sampled),
  Holm-corrected as a family of its own. One greedy evaluation of the start has no interval over
  seeds: its row shows the evaluation's own interval over tasks where the env reports one
  (``*_ci95_low``/``_high``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.trainer.arena import BASELINE, LAST, START, ArenaPlan
from corrgrpo.trainer.arena_markdown import report_markdown
from corrgrpo.trainer.arena_plot import plot_pareto
from corrgrpo.trainer.paired_stats import holm, interval, paired_difference, tiers
from corrgrpo.trainer.run_queue import EVAL_FILE, EvalSet

__all__ = ["LAST", "analyze", "check_advice", "estimator_seconds", "headline_metrics", "report_markdown", "versions",
           "write_report"]



def _records(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def headline_metrics(metrics: dict[str, Any]) -> list[str]:
    """The env metrics the report tabulates, in the env's order: the overall ones (a key with
    ``/`` is a per-data-set breakdown, left in the file), numeric, less counts (``num_*``)
    and the evaluation's own interval bounds (``*_ci95_low``/``_high``: the report's interval
    is over seeds)."""
    return [k for k, v in metrics.items()
            if "/" not in k and not k.startswith("num_") and not k.endswith(("_ci95_low", "_ci95_high"))
            and isinstance(v, (int, float)) and not isinstance(v, bool)]


def _eval_file(name: str) -> str:
    """A run's file of the evaluation ``name``: ``eval.json`` for the eval split, else the extra set's."""
    return EVAL_FILE if name == "eval" else EvalSet(name).file


def _env_metrics(folder: Path, sets: list[str]) -> dict[str, dict[str, float]]:
    """``{set: {metric: value}}`` of a run's evaluations that exist (``eval`` is ``eval.json``)."""
    out = {}
    for name in sets:
        path = folder / _eval_file(name)
        if path.exists():
            metrics = json.loads(path.read_text()).get("metrics", {})
            out[name] = {k: float(metrics[k]) for k in headline_metrics(metrics)}
    return out


def _task_intervals(folder: Path, sets: list[str]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{set: {metric: (low, high)}}``: the evaluations' own 95 % intervals over tasks, where the
    env reports one (``<prefix>_ci95_low``/``_high`` for a metric named ``<prefix>`` or ``<prefix>_*``)."""
    out = {}
    for name in sets:
        path = folder / _eval_file(name)
        if not path.exists():
            continue
        metrics = json.loads(path.read_text()).get("metrics", {})
        bounds = {}
        for k in headline_metrics(metrics):
            for key in metrics:
                prefix = key.removesuffix("_ci95_low")
                if key.endswith("_ci95_low") and (k == prefix or k.startswith(prefix + "_")) \
                        and f"{prefix}_ci95_high" in metrics:
                    bounds[k] = (float(metrics[key]), float(metrics[f"{prefix}_ci95_high"]))
        out[name] = bounds
    return out


def _held_out(evaluation: dict[str, Any], names: list[str], low: np.ndarray,
              high: np.ndarray) -> tuple[dict[str, float], float]:
    """Each reward's mean over an evaluation's records, and their score (mean % of range)."""
    rows = np.array([[rec["reward_components"][n] for n in names] for rec in evaluation["records"]],
                    dtype=np.float64)
    held_out = dict(zip(names, np.nanmean(rows, axis=0).tolist()))
    span = np.where(high > low, high - low, 1.0)
    return held_out, float(np.mean(100.0 * (np.array([held_out[n] for n in names]) - low) / span))


def _run_numbers(folder: Path, names: list[str], low: np.ndarray, high: np.ndarray,
                 sets: tuple[str, ...] | list[str] = ("eval",)) -> dict[str, Any] | None:
    """One finished run's final values, held-out means and score, env metrics, and seconds per step."""
    records, eval_path = _records(folder), folder / EVAL_FILE
    if not records or not eval_path.exists():
        return None
    last = records[-LAST:]
    final = {n: statistics.fmean(r[f"reward/{n}/mean"] for r in last) for n in [*names, "weighted"]}
    evaluation = json.loads(eval_path.read_text())
    held_out, score = _held_out(evaluation, names, low, high)
    return {"final": final, "held_out": held_out, "score": score,
            "held_out_total": evaluation.get("metrics", {}).get("total"),
            "env_metrics": _env_metrics(folder, list(sets)),
            "seconds_per_step": statistics.fmean(r["time/step"] for r in records),
            "steps": len(records)}


def _start_numbers(folder: Path, names: list[str], low: np.ndarray, high: np.ndarray,
                   sets: list[str]) -> dict[str, Any] | None:
    """The starting model's evaluation with one seed: held-out means, score, env metrics (and
    their intervals over tasks); None until its ``eval.json`` exists."""
    eval_path = folder / EVAL_FILE
    if not eval_path.exists():
        return None
    held_out, score = _held_out(json.loads(eval_path.read_text()), names, low, high)
    return {"held_out": held_out, "score": score, "env_metrics": _env_metrics(folder, sets),
            "task_intervals": _task_intervals(folder, sets)}


def _exact_tasks(path: Path) -> dict[str, bool]:
    """``{task_id: verdict}`` of an evaluation's records that carry the env's own 0/1 verdict
    (``info["exact"]``; a task that expects no answer to judge, ``expects_calls`` false, is left
    out, as the env's accuracy leaves it out)."""
    if not path.exists():
        return {}
    out = {}
    for rec in json.loads(path.read_text()).get("records", []):
        info = rec.get("info") or {}
        if isinstance(info.get("exact"), bool) and info.get("expects_calls", True) is not False:
            out[str(rec["task_id"])] = info["exact"]
    return out


def _tasks_versus_start(folder: Path, estimator: str, seeds: list[int], start_seeds: list[int],
                        sets: list[str]) -> dict[str, dict[str, Any]]:
    """Task by task against the start, per seed and evaluation whose records carry a 0/1 verdict:
    the tasks gained and lost, and the exact McNemar p-value on the tasks that changed
    (``tasks/<set>/s<seed>``). The start of the same seed, or its one evaluation."""
    from corrgrpo_envs.metrics import mcnemar_exact

    out = {}
    for name in sets:
        file = _eval_file(name)
        for seed in seeds:
            start_seed = seed if seed in start_seeds else start_seeds[0]
            before = _exact_tasks(folder / START / f"s{start_seed}" / file)
            after = _exact_tasks(folder / estimator / f"s{seed}" / file)
            common = sorted(set(before) & set(after))
            if not common:
                continue
            gained = sum(after[t] and not before[t] for t in common)
            lost = sum(before[t] and not after[t] for t in common)
            out[f"tasks/{name}/s{seed}"] = {"gained": gained, "lost": lost, "n": len(common),
                                            "p": mcnemar_exact(gained, lost)}
    return out


def _start_row(starts: dict[int, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The start's row of the report: means and intervals over its seeds (one greedy evaluation:
    no interval over seeds, its intervals over tasks beside)."""
    mine = list(starts.values())
    row: dict[str, Any] = {"seeds": sorted(starts), "score": _mean_ci([m["score"] for m in mine]),
                           "held_out": {n: _mean_ci([m["held_out"][n] for m in mine]) for n in names},
                           "env_metrics": _env_rows(mine)}
    if len(mine) == 1:
        row["task_intervals"] = mine[0]["task_intervals"]
    return row


def _measures(env_metrics: list[dict[str, dict[str, Any]]], final: list[str] = ()) -> dict[str, Any]:
    """Each measure two sets of runs are compared on, by key, with how to read it from a run's
    numbers: the held-out score, the final value of each of ``final``, and every env metric of
    every evaluation that one of ``env_metrics`` (``{set: {metric: ...}}``) names."""
    out: dict[str, Any] = {"score": lambda m: m["score"]}
    out.update({f"final/{n}": (lambda m, n=n: m["final"][n]) for n in final})
    for sets in env_metrics:
        for name, metrics in sets.items():
            out.update({f"env/{name}/{k}": (lambda m, name=name, k=k: m["env_metrics"].get(name, {}).get(k))
                        for k in metrics})
    return out


def _compared(pairs: list[tuple[Any, Any]], least: int) -> dict[str, Any] | None:
    """The paired difference of ``(ours, theirs)`` values, leaving out the pairs that lack one
    (an evaluation some runs lack, e.g. a set still being evaluated); None under ``least`` pairs."""
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(pairs) < least:
        return None
    diff, half, p = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
    return {"diff": diff, "ci95": half, "p": p, "n": len(pairs)}


def _versus_start(runs: dict[int, dict[str, Any]], starts: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each measure's change from the start: paired by seed when the start has every seed, else
    against its one evaluation (an interval over the estimator's seeds)."""
    measures = _measures([m["env_metrics"] for m in [*runs.values(), *starts.values()]])
    only = next(iter(starts.values()))
    out = {}
    for key, get in measures.items():
        pairs = [(get(m), get(starts[s] if s in starts else only))
                 for s, m in runs.items() if len(starts) == 1 or s in starts]
        if (compared := _compared(pairs, least=1)) is not None:
            out[key] = compared
    return out


def _bounds(config: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The regime's reward names and ranges, from its env."""
    import corrgrpo_envs
    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.setup import env_kwargs

    cfg = load_config(config)
    env = corrgrpo_envs.make(cfg.env.id, **env_kwargs(cfg, "eval"))
    try:
        u = env.unwrapped
        return list(u.reward_names), u.reward_space.low.astype(np.float64), u.reward_space.high.astype(np.float64)
    finally:
        env.close()


def estimator_seconds(estimator: str, shape: tuple[int, int], group_size: int, repeats: int = 20) -> float:
    """Seconds of one ``compute_advantages`` call on random rewards of ``shape``: the fastest of
    ``repeats`` (as timeit advises: the slower ones measure the machine's load, not the estimator)."""
    import torch

    from corrgrpo.trainer.estimators import compute_advantages

    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(shape, generator=generator, dtype=torch.float64)
    groups = torch.arange(shape[0]) // group_size
    times = []
    # one thread, as a batch this small is computed in training: on a busy machine a second
    # thread's wait for a core, not the estimator, would set the time
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            compute_advantages(rewards, groups, estimator=estimator)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return min(times)


def _mean_ci(values: list[float]) -> dict[str, Any]:
    mean, half = interval(values)
    return {"mean": mean, "ci95": half, "values": values}


def analyze(plan: ArenaPlan) -> dict[str, Any]:
    """Every number of the report, from the finished runs of ``plan``."""
    from corrgrpo.trainer.config import load_config

    result: dict[str, Any] = {"regimes": {}}
    tests: dict[str, float] = {}
    start_tests: dict[str, float] = {}  # before/after: a family of its own
    for regime, config in plan.regimes.items():
        names, low, high = _bounds(config)
        cfg = load_config(config, plan.overrides)
        shape = (cfg.algorithm.prompts_per_step * cfg.algorithm.group_size, len(names))
        sets = ["eval", *(s.name for s in plan.eval_sets)]
        runs = {(e, s): n for e in plan.estimators for s in range(plan.seeds)
                if (n := _run_numbers(plan.out / regime / e / f"s{s}", names, low, high, sets)) is not None}
        starts = {s: n for s in plan.start_seeds
                  if (n := _start_numbers(plan.out / regime / START / f"s{s}", names, low, high, sets)) is not None}
        entry: dict[str, Any] = {"config": str(config), "rewards": names, "low": low.tolist(),
                                 "high": high.tolist(), "goal": _goal(cfg), "estimators": {},
                                 "start": _start_row(starts, names) if starts else None}
        for e in plan.estimators:
            seeds = [s for s in range(plan.seeds) if (e, s) in runs]
            if not seeds:
                continue
            mine = [runs[(e, s)] for s in seeds]
            row: dict[str, Any] = {
                "seeds": seeds,
                "final": {n: _mean_ci([m["final"][n] for m in mine]) for n in [*names, "weighted"]},
                "held_out": {n: _mean_ci([m["held_out"][n] for m in mine]) for n in names},
                "score": _mean_ci([m["score"] for m in mine]),
                "seconds_per_step": _mean_ci([m["seconds_per_step"] for m in mine]),
                "estimator_seconds": estimator_seconds(e, shape, cfg.algorithm.group_size),
                "env_metrics": _env_rows(mine),
                "vs_baseline": {},
            }
            paired = [s for s in seeds if (BASELINE, s) in runs]
            if e != BASELINE and len(paired) >= 2:
                for key, get in _measures([row["env_metrics"]], [*names, "weighted"]).items():
                    compared = _compared([(get(runs[(e, s)]), get(runs[(BASELINE, s)])) for s in paired], least=2)
                    if compared is not None:
                        row["vs_baseline"][key] = compared
                        tests[f"{regime}|{e}|{key}"] = compared["p"]
            if starts:
                row["vs_start"] = _versus_start({s: runs[(e, s)] for s in seeds}, starts)
                row["vs_start"].update(_tasks_versus_start(plan.out / regime, e, seeds, sorted(starts), sets))
                start_tests.update({f"{regime}|{e}|{k}": v["p"] for k, v in row["vs_start"].items()})
            entry["estimators"][e] = row
        scores = {e: (r["score"]["mean"], r["score"]["ci95"]) for e, r in entry["estimators"].items()}
        for e, tier in tiers(scores).items():
            entry["estimators"][e]["tier"] = tier
        result["regimes"][regime] = entry
    for key, p in holm(tests).items():
        regime, e, measure = key.split("|")
        result["regimes"][regime]["estimators"][e]["vs_baseline"][measure]["p_holm"] = p
    for key, p in holm(start_tests).items():
        regime, e, measure = key.split("|")
        result["regimes"][regime]["estimators"][e]["vs_start"][measure]["p_holm"] = p
    result["num_tests"] = len(tests)
    result["num_start_tests"] = len(start_tests)
    return result


def _env_rows(mine: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{set: {metric: mean and interval over the runs that have it}}``, in the evaluations' order."""
    out: dict[str, dict[str, Any]] = {}
    for m in mine:
        for name, metrics in m["env_metrics"].items():
            keys = out.setdefault(name, {})
            for k in metrics:
                keys.setdefault(k, None)
    return {name: {k: _mean_ci([m["env_metrics"][name][k] for m in mine if k in m["env_metrics"].get(name, {})])
                   for k in keys}
            for name, keys in out.items()}


def check_advice(plan: ArenaPlan, result: dict[str, Any]) -> dict[str, Any]:
    """What ``corrgrpo advise`` recommends on each regime's GRPO runs, checked against the arena.

    For each finding on a GRPO run whose advice names estimators to try, and each such estimator
    the arena trained, the verdict of its paired difference to GRPO on the held-out score: a
    *hit* where the 95 % interval lies above 0, a *miss* where it lies below, *unresolved* where
    it contains 0. The hit rate is hits over all checked recommendations.
    """
    from corrgrpo.trainer.advice.findings import advise

    checks = []
    for regime, entry in result["regimes"].items():
        runs = [plan.out / regime / BASELINE / f"s{s}" for s in range(plan.seeds)]
        runs = [r for r in runs if (r / "metrics.jsonl").exists()]
        if not runs:
            continue
        fired: dict[tuple[str, str], set[str]] = {}  # the runs with the finding (one may hold it twice)
        for finding in advise([str(r) for r in runs]):
            for estimator in finding.recommendation.estimators:
                key = (finding.advice_key or finding.condition, estimator)
                fired.setdefault(key, set()).update([finding.run] if finding.run != "all" else [])
        for (advice, estimator), with_finding in sorted(fired.items()):
            count = len(with_finding)
            versus = entry["estimators"].get(estimator, {}).get("vs_baseline", {}).get("score")
            if versus is None:
                continue
            low = versus["diff"] - (versus["ci95"] or math.inf)
            high = versus["diff"] + (versus["ci95"] or math.inf)
            verdict = "hit" if low > 0 else "miss" if high < 0 else "unresolved"
            checks.append({"regime": regime, "advice": advice, "estimator": estimator,
                           "grpo_runs_with_finding": count, "of_runs": len(runs),
                           "score_diff": versus["diff"], "ci95": versus["ci95"], "verdict": verdict})
    hits = sum(c["verdict"] == "hit" for c in checks)
    misses = sum(c["verdict"] == "miss" for c in checks)
    return {"checks": checks, "hits": hits, "misses": misses,
            "unresolved": len(checks) - hits - misses,
            "hit_rate": hits / len(checks) if checks else None}


def _goal(cfg: Any) -> str:
    """What a good estimator should do in the regime, when its env says (Regime-v0 does)."""
    regime = getattr(cfg.env, "regime", None)
    if regime is None:
        return ""
    from corrgrpo_envs.toy.regimes import REGIMES

    return REGIMES[regime].goal if regime in REGIMES else ""


def versions() -> dict[str, str]:
    """The versions and machine a report's numbers come from."""
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": str(os.cpu_count()),
            "commit": commit or "unknown"}


def write_report(plan: ArenaPlan, command: str, wall_seconds: float | None = None) -> dict[str, Any]:
    """``results.json``, ``report.md`` and ``pareto.png`` in the arena folder; returns the results."""
    result = analyze(plan)
    meta = {"command": command, "estimators": len(plan.estimators), "seeds": plan.seeds,
            "versions": versions(), "wall_seconds": wall_seconds, "plan": plan.to_json(),
            "run_commands": {r.label: ["corrgrpo", "train", r.config, *r.overrides, f"train.seed={r.seed}"]
                             for r in plan.runs() if r.steps}}
    result["meta"] = meta
    result["advice"] = check_advice(plan, result)
    (plan.out / "results.json").write_text(json.dumps(result, indent=1))
    (plan.out / "report.md").write_text(report_markdown(result, meta))
    if any(entry["estimators"] for entry in result["regimes"].values()):
        plot_pareto({"regimes": {r: e for r, e in result["regimes"].items() if e["estimators"]}},
                    plan.out / "pareto.png")
    return result
