"""The arena report's Markdown: per regime, the estimators' table, their paired differences to
GRPO, the starting model and each estimator's change from it, the env metrics of every
evaluation, the costs, and the advice checked (the numbers are :mod:`corrgrpo.trainer.arena_report`'s)."""

from __future__ import annotations

import math
from typing import Any

from corrgrpo.trainer.arena import BASELINE, LAST, START

__all__ = ["report_markdown"]


def _cell(value: dict[str, Any], digits: int) -> str:
    mean, half = value["mean"], value["ci95"]
    return f"{mean:.{digits}f}" + ("" if half is None or not math.isfinite(half) else f" ± {half:.{digits}f}")


def _digits(high: float) -> int:
    return 1 if high >= 10 else 3


def report_markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report's tables as Markdown."""
    lines = [f"# Arena: {len(result['regimes'])} regimes, {meta['estimators']} estimators, "
             f"{meta['seeds']} seeds", "",
             f"Command: `{meta['command']}`", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    if meta.get("wall_seconds") is not None:
        lines += [f"Training and evaluation wall time of this invocation: {meta['wall_seconds'] / 60:.1f} min", ""]
    lines += [f"Final = mean of the last {LAST} training steps' batch means; held-out = "
              f"evaluation on the eval split ({meta['plan'].get('eval', 'greedy')}, first "
              f"{meta['plan'].get('eval_limit') or 'all'} tasks); score = mean over rewards of the held-out mean in % of "
              "its range; ± = half-width of the 95 % t-interval over seeds; tier 1 = best by score and "
              "every estimator whose interval overlaps it (indistinguishable). Paired differences to "
              f"GRPO: same seed, two-sided paired t-test, p Holm-corrected over all {result['num_tests']} "
              "tests of the arena.", ""]
    for regime, entry in result["regimes"].items():
        names, highs = entry["rewards"], entry["high"]
        lines += [f"## {regime}", ""]
        if entry["goal"]:
            lines += [f"A good estimator should {entry['goal']}.", ""]
        lines += [f"Config: `{entry['config']}`; rewards: "
                  + ", ".join(f"`{n}` [{lo:g}, {hi:g}]" for n, lo, hi in zip(names, entry["low"], highs)), ""]
        order = sorted(entry["estimators"], key=lambda e: (entry["estimators"][e]["tier"],
                                                           -entry["estimators"][e]["score"]["mean"]))
        head = ["tier", "estimator", "held-out score (%)", *[f"{n} (final)" for n in names], "weighted (final)",
                *[f"{n} (held-out)" for n in names]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for e in order:
            row = entry["estimators"][e]
            cells = [str(row["tier"]), e, _cell(row["score"], 1),
                     *[_cell(row["final"][n], _digits(h)) for n, h in zip(names, highs)],
                     _cell(row["final"]["weighted"], _digits(sum(highs))),
                     *[_cell(row["held_out"][n], _digits(h)) for n, h in zip(names, highs)]]
            lines.append("| " + " | ".join(cells) + " |")
        lines += _start_lines(entry, order, result.get("num_start_tests", 0))
        lines += ["", f"Paired difference to {BASELINE} (mean [95 % interval], Holm-corrected p):", ""]
        head = ["estimator", "held-out score", *[f"{n} (final)" for n in names]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for e in order:
            versus = entry["estimators"][e]["vs_baseline"]
            if not versus:
                continue
            cells = [e] + [_versus(versus[k], 1 if k == "score" else _digits(h))
                           for k, h in [("score", 100.0), *[(f"final/{n}", h) for n, h in zip(names, highs)]]]
            lines.append("| " + " | ".join(cells) + " |")
        lines += _env_metric_tables(entry, order, meta["plan"])
        lines += ["", "Cost: training seconds per step (mean over runs) and the estimator's own time per call:", "",
                  "| estimator | s/step | estimator (ms/call) |", "|---|---|---|"]
        for e in order:
            row = entry["estimators"][e]
            lines.append(f"| {e} | {_cell(row['seconds_per_step'], 2)} | {row['estimator_seconds'] * 1e3:.3f} |")
        lines.append("")
    advice = result.get("advice")
    if advice and advice["checks"]:
        rate = advice["hit_rate"]
        lines += ["## Advice checked against the arena", "",
                  f"`corrgrpo advise` on each regime's GRPO runs, and whether the estimator it recommends beat "
                  f"GRPO on the held-out score (hit: the paired 95 % interval above 0; miss: below 0; else "
                  f"unresolved). Hit rate {advice['hits']}/{len(advice['checks'])}"
                  + (f" ({100 * rate:.0f} %)" if rate is not None else "")
                  + f", misses {advice['misses']}.", "",
                  "| regime | advice | recommends | GRPO runs with the finding | score vs GRPO | verdict |",
                  "|---|---|---|---|---|---|"]
        for c in advice["checks"]:
            half = "" if c["ci95"] is None else f" [±{c['ci95']:.1f}]"
            lines.append(f"| {c['regime']} | {c['advice']} | {c['estimator']} | {c['grpo_runs_with_finding']} of "
                         f"{c['of_runs']} | {c['score_diff']:+.1f}{half} | {c['verdict']} |")
        lines.append("")
    return "\n".join(lines)


def _start_lines(entry: dict[str, Any], order: list[str], num_tests: int) -> list[str]:
    """The starting model's held-out score, and each estimator's change from it."""
    start = entry.get("start")
    if not start:
        return []
    how = (f"one evaluation per seed ({len(start['seeds'])})" if len(start["seeds"]) > 1
           else "one evaluation: no interval over seeds")
    lines = ["", f"Before training, the starting model scores {_cell(start['score'], 1)} held-out ({how}). "
             "Change from it (the estimator's mean over seeds less the start's [95 % interval over seeds], "
             f"Holm-corrected p over the {num_tests} before/after tests):", "",
             "| estimator | held-out score vs start |", "|---|---|"]
    lines += [f"| {e} | {_versus(entry['estimators'][e]['vs_start']['score'], 1)} |"
              for e in order if "score" in entry["estimators"][e].get("vs_start", {})]
    return lines


def _start_cell(start: dict[str, Any], name: str, k: str) -> str:
    value = start["env_metrics"].get(name, {}).get(k)
    if value is None:
        return ""
    bounds = start.get("task_intervals", {}).get(name, {}).get(k)
    if bounds is None:
        return _cell(value, 2)
    return f"{value['mean']:.2f} [{bounds[0]:.2f}, {bounds[1]:.2f}]"


def _env_metric_tables(entry: dict[str, Any], order: list[str], plan: dict[str, Any]) -> list[str]:
    """Per evaluation (the eval split, then each extra set): each estimator's env metrics and
    their paired difference to the baseline; with a start, its row and each estimator's change
    from it."""
    described = {"eval": f"the eval split ({plan.get('eval', 'greedy')}, first {plan.get('eval_limit') or 'all'} tasks)"}
    for s in plan.get("eval_sets", []):
        settings = ", ".join(f"`{o}`" for o in s["overrides"]) or "none"
        described[s["name"]] = (f"extra set `{s['name']}`: split `{s['split']}`, first {s['limit'] or 'all'} tasks, "
                                f"settings {settings}")
    lines: list[str] = []
    for name, what in described.items():
        metrics: list[str] = []
        for e in order:
            metrics += [k for k in entry["estimators"][e]["env_metrics"].get(name, {}) if k not in metrics]
        if not metrics:
            continue
        lines += ["", f"Env metrics on {what}: mean ± 95 % interval over seeds, then the paired difference "
                  f"to {BASELINE} [95 % interval], Holm-corrected p:", ""]
        head = ["estimator", *metrics, *[f"{k} vs {BASELINE}" for k in metrics]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        start = entry.get("start")
        if start and name in start["env_metrics"]:
            lines.append("| " + " | ".join([f"{START} (before training)", *[_start_cell(start, name, k) for k in metrics],
                                            *[""] * len(metrics)]) + " |")
        for e in order:
            row = entry["estimators"][e]
            values = row["env_metrics"].get(name, {})
            versus = row["vs_baseline"]
            cells = [e, *[_cell(values[k], 2) if k in values else "" for k in metrics],
                     *[_versus(versus[f"env/{name}/{k}"], 2) if f"env/{name}/{k}" in versus
                       else ("(baseline)" if e == BASELINE else "") for k in metrics]]
            lines.append("| " + " | ".join(cells) + " |")
        if start and name in start["env_metrics"]:
            one = len(start["seeds"]) == 1
            lines += ["", f"Change from the starting model on {what} (mean over seeds less the start's [95 % interval "
                      "over seeds], Holm-corrected p over the before/after tests"
                      + ("; the start's row above gives its own interval over tasks" if one and start.get("task_intervals", {}).get(name) else "")
                      + "):", "",
                      "| " + " | ".join(["estimator", *[f"{k} vs {START}" for k in metrics]]) + " |",
                      "|" + "---|" * (len(metrics) + 1)]
            for e in order:
                versus = entry["estimators"][e].get("vs_start", {})
                cells = [_versus(versus[f"env/{name}/{k}"], 2) if f"env/{name}/{k}" in versus else "" for k in metrics]
                if any(cells):
                    lines.append("| " + " | ".join([e, *cells]) + " |")
            lines += _task_lines(entry, order, name)
    return lines


def _task_lines(entry: dict[str, Any], order: list[str], name: str) -> list[str]:
    """Each seed's tasks gained and lost against the start on one evaluation, where its records
    carry the env's 0/1 verdict."""
    per = {e: {k.rsplit("/", 1)[1]: v for k, v in entry["estimators"][e].get("vs_start", {}).items()
               if k.startswith(f"tasks/{name}/")} for e in order}
    seeds = sorted({s for cells in per.values() for s in cells}, key=lambda s: int(s[1:]))
    if not seeds:
        return []
    lines = ["", "Task by task against the start (the env's own verdict, `exact`): tasks gained / lost per "
             "seed, exact McNemar test on the tasks that changed, Holm-corrected with the before/after tests:",
             "", "| " + " | ".join(["estimator", *seeds]) + " |", "|" + "---|" * (len(seeds) + 1)]
    for e, cells in per.items():
        if cells:
            lines.append("| " + " | ".join([e, *[_gained_lost(cells[s]) if s in cells else "" for s in seeds]]) + " |")
    return lines


def _gained_lost(v: dict[str, Any]) -> str:
    p = v.get("p_holm", v["p"])
    return f"+{v['gained']} / -{v['lost']} of {v['n']}, p={'<0.001' if p < 0.001 else f'{p:.3f}'}"


def _versus(v: dict[str, Any], digits: int) -> str:
    half = v["ci95"]
    p = v.get("p_holm", v["p"])
    p_text = "n/a" if p is None or not math.isfinite(p) else ("<0.001" if p < 0.001 else f"{p:.3f}")
    spread = "" if half is None or not math.isfinite(half) else f" [±{half:.{digits}f}]"
    return f"{v['diff']:+.{digits}f}{spread}, p={p_text}"
