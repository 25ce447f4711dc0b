"""The estimator study: GRPO, CorrGRPO, GDPO, MO-GRPO and Dr. GRPO over seeds, same budget.

Settings (each a config in ``env_configs/``, trained as it is; only the estimator and the seed
change between runs of a setting):

* ``toy``: ``study_toy.yaml``, the toy domain's default scales (a large-range digit count weakly
  correlated with two 0/1 letter rewards that nearly coincide);
* ``toy_unit``: ``study_toy_unit.yaml``, the same rewards with ``scales: unit`` (shared range);
* ``anchor``: ``anchor_grpo.yaml``, the TRL anchor setting (uncapped digits, has 'a', has 'b').

Runs go two at a time (one torch thread each) in worker processes that build a
``corrgrpo.trainer.trainer.Trainer`` per run. For every setting, component and estimator the study reports
the final mean (mean of the last 5 steps' batch means) with a 95 % t-interval over seeds; the
paired difference to GRPO (same seed: same task order and, at step 1, the same samples) with a
paired t-test and Holm's correction over all the study's tests; and the estimator diagnostics
logged in ``metrics.jsonl`` (c_q median, covariance shares, K_eff, zero-variance groups, mean
|advantage|, grad norm). Figures: mean-over-seeds curves drawn by ``corrgrpo plot``.

    .venv/bin/python -m studies.study                       # runs/study/: results.json, tables.md, figures
    .venv/bin/python -m studies.study --seeds 5 --workers 2 --figures docs/figures
    .venv/bin/python -m studies.study --analyze-only        # re-read finished runs
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from corrgrpo.trainer.paired_stats import holm, interval, paired_difference

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "toy": ROOT / "studies" / "configs" / "study_toy.yaml",
    "toy_unit": ROOT / "studies" / "configs" / "study_toy_unit.yaml",
    "anchor": ROOT / "studies" / "configs" / "anchor_grpo.yaml",
}
ESTIMATORS = ["grpo", "corrgrpo", "gdpo", "mo_grpo", "dr_grpo"]
LAST = 5  # final mean = mean of the last LAST steps
DIAGNOSTICS = ["c_q/median", "k_eff/mean", "zero_variance_fraction", "advantage/abs_mean", "grad_norm"]


# ------------------------------------------------------------------------------------------ runs
def _run_dir(out: Path, setting: str, estimator: str, seed: int) -> Path:
    return out / setting / f"{estimator}-s{seed}"


def _complete(run_dir: Path, steps: int) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.exists() and sum(1 for ln in path.read_text().splitlines() if ln.strip()) >= steps


def _config_steps(setting: str) -> int:
    import yaml

    return int(yaml.safe_load(SETTINGS[setting].read_text())["train"]["steps"])


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def _train_one(job: tuple[str, str, int, str, int | None, tuple[str, ...]]) -> tuple[str, str, int, float]:
    """Train one (setting, estimator, seed) run into its folder; returns its wall seconds."""
    setting, estimator, seed, run_dir, steps, overrides = job
    import shutil
    import warnings

    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.trainer import Trainer

    warnings.filterwarnings("ignore")
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(
        SETTINGS[setting],
        [
            f"algorithm.estimator={estimator}",
            f"train.seed={seed}",
            f"train.output_dir={run_dir}",
            "train.tensorboard=false",
            "train.progress=false",
            "train.save_final=false",
            "train.log_samples=0",
        ]
        + ([f"train.steps={steps}"] if steps else [])
        + list(overrides),
    )
    t0 = time.perf_counter()
    Trainer(cfg).train()
    return setting, estimator, seed, time.perf_counter() - t0


def run_all(
    out: Path,
    settings: list[str],
    estimators: list[str],
    seeds: list[int],
    workers: int,
    steps: int | None,
    overrides: list[str] | tuple[str, ...] = (),
) -> float:
    """Train every missing run, ``workers`` at a time; returns the wall seconds.

    ``overrides`` (``key=value``) apply to every run after the study's own."""
    jobs = []
    for setting in settings:
        need = steps or _config_steps(setting)
        for seed in seeds:  # seed-major: an interrupted study still has complete seeds
            for est in estimators:
                d = _run_dir(out, setting, est, seed)
                if not _complete(d, need):
                    jobs.append((setting, est, seed, str(d), steps, tuple(overrides)))
    print(f"{len(jobs)} runs to train, {workers} at a time", flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the workers before torch loads
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers, initializer=_worker_init) as pool:
        for i, (setting, est, seed, wall) in enumerate(pool.imap_unordered(_train_one, jobs), 1):
            print(f"[{i}/{len(jobs)}] {setting} {est} seed {seed}: {wall:.1f} s "
                  f"(elapsed {time.perf_counter() - t0:.0f} s)", flush=True)
    return time.perf_counter() - t0


# -------------------------------------------------------------------------------------- analysis
def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _components(records: list[dict[str, Any]]) -> list[str]:
    return [k[len("reward/") : -len("/mean")] for k in records[-1] if k.startswith("reward/") and k.endswith("/mean")]


def _mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval (NaN for one value): the arena's interval."""
    mean, half = interval(xs)
    return mean, float("nan") if half is None else half


def _paired(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Mean of x - y, its 95 % half-width and the paired t-test's p-value: the arena's test."""
    mean, half, p = paired_difference(xs, ys)
    return mean, float("nan") if half is None else half, p


_holm = holm  # Holm's step-down correction, the arena's


def analyze(out: Path, settings: list[str], estimators: list[str], seeds: list[int]) -> dict[str, Any]:
    """Final means, paired differences to GRPO and diagnostics of every finished run."""
    result: dict[str, Any] = {}
    tests: dict[str, float] = {}
    for setting in settings:
        runs = {
            (e, s): _records(_run_dir(out, setting, e, s))
            for e in estimators
            for s in seeds
            if (_run_dir(out, setting, e, s) / "metrics.jsonl").exists()
        }
        if not runs:
            continue
        comps = _components(next(iter(runs.values())))
        final = {
            (e, s, c): statistics.fmean(r[f"reward/{c}/mean"] for r in recs[-LAST:])
            for (e, s), recs in runs.items()
            for c in comps
        }
        first = {
            (e, s, c): recs[0][f"reward/{c}/mean"] for (e, s), recs in runs.items() for c in comps
        }
        setting_out: dict[str, Any] = {"components": comps, "estimators": {}}
        for e in estimators:
            have = [s for s in seeds if (e, s) in runs]
            if not have:
                continue
            entry: dict[str, Any] = {"seeds": have, "final": {}, "first": {}, "vs_grpo": {}, "diagnostics": {}}
            for c in comps:
                xs = [final[(e, s, c)] for s in have]
                m, half = _mean_ci(xs)
                entry["final"][c] = {"mean": m, "ci95": half, "values": xs}
                entry["first"][c] = statistics.fmean(first[(e, s, c)] for s in have)
                paired = [s for s in have if ("grpo", s) in runs]
                if e != "grpo" and len(paired) >= 2:
                    d, dh, p = _paired([final[(e, s, c)] for s in paired], [final[("grpo", s, c)] for s in paired])
                    entry["vs_grpo"][c] = {"diff": d, "ci95": dh, "p": p, "n": len(paired)}
                    if math.isfinite(p):
                        tests[f"{setting}|{e}|{c}"] = p
            diag: dict[str, float] = {}
            for key in DIAGNOSTICS:
                vals = [
                    statistics.fmean(r[key] for r in runs[(e, s)] if r.get(key) is not None)
                    for s in have
                    if any(r.get(key) is not None for r in runs[(e, s)])
                ]
                if vals:
                    diag[key] = statistics.fmean(vals)
            for c in comps:
                key = f"cov_share/{c}"
                vals = [r[key] for s in have for r in runs[(e, s)] if r.get(key) is not None]
                if vals:
                    diag[key] = statistics.fmean(vals)
            corr = [r["reward_correlation"] for s in have for r in runs[(e, s)][:1] if r.get("reward_correlation")]
            if corr:
                diag["step1_correlation"] = [
                    [statistics.fmean(v) if (v := [m[i][j] for m in corr if m[i][j] is not None]) else None
                     for j in range(len(comps) - 1)]
                    for i in range(len(comps) - 1)
                ]
            diag["run_seconds"] = statistics.fmean(sum(r["time/step"] for r in runs[(e, s)]) for s in have)
            entry["diagnostics"] = diag
            setting_out["estimators"][e] = entry
        result[setting] = setting_out
    holm = _holm(tests)
    for key, p in holm.items():
        setting, e, c = key.split("|")
        result[setting]["estimators"][e]["vs_grpo"][c]["p_holm"] = p
    result["_num_tests"] = len(tests)
    return result


def _fmt(x: float, digits: int = 2) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def tables_markdown(res: dict[str, Any]) -> str:
    """The study's tables as Markdown."""
    lines = []
    for setting, s in res.items():
        if setting.startswith("_"):
            continue
        comps = s["components"]
        ests = list(s["estimators"])
        n = len(s["estimators"][ests[0]]["seeds"])
        lines += [f"### {setting}: final mean (last {LAST} steps), 95 % CI over {n} seeds", ""]
        lines += ["| estimator | " + " | ".join(comps) + " |", "|---" * (len(comps) + 1) + "|"]
        for e in ests:
            f = s["estimators"][e]["final"]
            d = 3 if setting == "toy_unit" else 2
            lines.append(
                f"| {e} | " + " | ".join(f"{_fmt(f[c]['mean'], d)} ± {_fmt(f[c]['ci95'], d)}" for c in comps) + " |"
            )
        first = s["estimators"]["grpo"]["first"] if "grpo" in s["estimators"] else None
        if first:
            lines.append("| (step 1, grpo) | " + " | ".join(_fmt(first[c], 3) for c in comps) + " |")
        lines += ["", f"### {setting}: paired difference to GRPO (same seed): mean [95 % CI], p (Holm-adjusted p)", ""]
        lines += ["| estimator | " + " | ".join(comps) + " |", "|---" * (len(comps) + 1) + "|"]
        for e in ests:
            v = s["estimators"][e]["vs_grpo"]
            if not v:
                continue
            d = 3 if setting == "toy_unit" else 2
            cells = [
                f"{v[c]['diff']:+.{d}f} [±{_fmt(v[c]['ci95'], d)}], p={v[c]['p']:.3f} ({v[c].get('p_holm', float('nan')):.2f})"
                for c in comps
            ]
            lines.append(f"| {e} | " + " | ".join(cells) + " |")
        lines += ["", f"### {setting}: diagnostics (mean over steps and seeds)", ""]
        share_cols = [c for c in comps if c != "weighted"]
        head = ["c_q median", "K_eff", "zero-var groups", "mean abs(A)", "grad norm"] + [
            f"cov share {c}" for c in share_cols
        ]
        lines += ["| estimator | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
        for e in ests:
            g = s["estimators"][e]["diagnostics"]
            cells = [
                _fmt(g.get("c_q/median")),
                _fmt(g.get("k_eff/mean")),
                _fmt(g.get("zero_variance_fraction"), 3),
                _fmt(g.get("advantage/abs_mean")),
                _fmt(g.get("grad_norm")),
            ] + [_fmt(g.get(f"cov_share/{c}"), 3) for c in share_cols]
            lines.append(f"| {e} | " + " | ".join(cells) + " |")
        corr = s["estimators"].get("grpo", {}).get("diagnostics", {}).get("step1_correlation")
        if corr:
            names = [c for c in comps if c != "weighted"]
            pairs = [
                f"{names[i]}~{names[j]} {corr[i][j]:.2f}" for i in range(len(names)) for j in range(i + 1, len(names))
                if corr[i][j] is not None  # undefined: no group where both varied
            ]
            lines += ["", "Within-group reward correlation at step 1 (GRPO runs, mean over seeds): " + ", ".join(pairs)]
        lines.append("")
    return "\n".join(lines)


def write_mean_runs(out: Path, setting: str, estimators: list[str], seeds: list[int]) -> list[Path]:
    """A ``metrics.jsonl`` per estimator holding the per-step mean over seeds (for ``corrgrpo plot``)."""
    dirs = []
    for e in estimators:
        runs = [
            _records(_run_dir(out, setting, e, s))
            for s in seeds
            if (_run_dir(out, setting, e, s) / "metrics.jsonl").exists()
        ]
        if not runs:
            continue
        n = min(len(r) for r in runs)
        d = out / setting / f"mean-{e}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "metrics.jsonl", "w") as f:
            for i in range(n):
                rec: dict[str, Any] = {"step": i + 1}
                for key in runs[0][i]:
                    if key.startswith("reward/") and key.endswith("/mean"):
                        rec[key] = statistics.fmean(r[i][key] for r in runs)
                mats = [r[i]["reward_correlation"] for r in runs if r[i].get("reward_correlation")]
                if mats:
                    k = len(mats[0])
                    rec["reward_correlation"] = [
                        [
                            statistics.fmean(vals) if (vals := [m[a][b] for m in mats if m[a][b] is not None]) else None
                            for b in range(k)
                        ]
                        for a in range(k)
                    ]
                f.write(json.dumps(rec) + "\n")
        dirs.append(d)
    return dirs


def draw_figures(
    out: Path, setting: str, estimators: list[str], seeds: list[int], figures: Path, name: str | None = None
) -> Path | None:
    """``figures/<name>.png`` (default ``study_<setting>``): ``corrgrpo plot`` of the per-step means over seeds."""
    dirs = write_mean_runs(out, setting, estimators, seeds)
    if not dirs:
        return None
    figures.mkdir(parents=True, exist_ok=True)
    png = figures / f"{name or f'study_{setting}'}.png"
    cmd = [sys.executable, "-m", "corrgrpo.trainer.cli", "plot", *map(str, dirs), "--out", str(png),
           "--labels", *[d.name[len("mean-"):] for d in dirs], "--smooth", "3"]
    rc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).returncode
    print(f"figure {png}" if rc == 0 else f"corrgrpo plot failed for {setting} (exit {rc})")
    return png if rc == 0 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma list of " + ", ".join(SETTINGS))
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--out", default=str(ROOT / "runs" / "study"))
    p.add_argument("--steps", type=int, default=None, help="override every setting's train.steps (smoke tests)")
    p.add_argument("--figures", default=None, help="folder for the PNG figures (default: the output folder)")
    p.add_argument("--analyze-only", action="store_true", help="do not train; analyze what is there")
    args = p.parse_args(argv)

    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        raise ValueError(f"unknown settings {bad}; known: {list(SETTINGS)}")
    if "grpo" not in estimators:
        raise ValueError("the estimators must include grpo (the paired baseline)")
    seeds = list(range(args.seeds))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wall = None
    if not args.analyze_only:
        wall = run_all(out, settings, estimators, seeds, args.workers, args.steps)
        print(f"training wall time: {wall:.0f} s", flush=True)

    res = analyze(out, settings, estimators, seeds)
    res["_meta"] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "seeds": seeds,
        "workers": args.workers,
        "train_wall_s": wall,
        "last_steps": LAST,
        "configs": {s: str(SETTINGS[s].relative_to(ROOT)) for s in settings},
    }
    (out / "results.json").write_text(json.dumps(res, indent=1))
    md = tables_markdown(res)
    (out / "tables.md").write_text(md)
    print(md)

    figures = Path(args.figures) if args.figures else out
    for setting in settings:
        draw_figures(out, setting, estimators, seeds, figures)
    print(f"results: {out / 'results.json'}  tables: {out / 'tables.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
