"""``corrgrpo sweep CONFIG --weights simplex:N|FILE --seeds S``: a grid of runs and its Pareto front."""

from __future__ import annotations

import argparse
import json
from typing import Any

from corrgrpo.trainer.commands import add_config_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train.steps=10 rollout.max_new_tokens=16")
    parser.add_argument("--weights", required=True,
                        help="simplex:N (every weighting with steps of 1/N, per unit of each component's range) "
                             "or a JSON/YAML file with a list of algorithm.reward_weights values")
    parser.add_argument("--seeds", type=int, required=True, help="seeds 0..S-1 per weighting")
    parser.add_argument("--estimators", default=None, help="comma-separated (default: the config's)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (each its own process)")
    parser.add_argument("--out", default=None, help="sweep folder (default: runs/sweep-<config name>)")
    parser.add_argument("--save-every", type=int, default=None,
                        help="checkpoint every N steps so a torn run resumes (default: steps / 4)")
    parser.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N eval tasks only")


def run(args: argparse.Namespace) -> int:
    import subprocess

    from corrgrpo.trainer.config import ConfigError
    from corrgrpo.trainer.run_queue import RunFailed
    from corrgrpo.trainer.sweep import run_sweep
    from corrgrpo_envs.integrations.openenv_client import RemoteEnvError

    if args.seeds < 1 or args.parallel < 1:
        print("error: --seeds and --parallel must be >= 1")
        return 2
    estimators = [e for e in args.estimators.split(",") if e] if args.estimators else None
    try:
        front = run_sweep(args.config, args.overrides, args.weights, args.seeds, estimators,
                          parallel=args.parallel, out=args.out, save_every=args.save_every,
                          eval_limit=args.eval_limit)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    except RemoteEnvError as exc:  # the env's servers, asked for its reward bounds before any run
        print(f"error: {exc}")
        return 1
    except RunFailed as exc:
        print(f"error: {exc}; run the same command again to resume")
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: the run failed ({exc}); see run.log in its folder; run the same command again to resume")
        return 1
    for line in front_table(front, args.weights):
        print(line)
    print(f"hypervolume (percent^{len(front['names'])}, reference 0 %): {front['hypervolume']:.1f}; "
          + ", ".join(f"{e} {v:.1f}" for e, v in front["hypervolume_by_estimator"].items()))
    print(f"wall time {front['wall_seconds']:.0f} s; runs {front['runs_done']}")
    return 0


def _weights_text(given: Any) -> str:
    """A weighting as given: numbers as ``0.5 0 0.5``, anything else (a mapping, a schedule) as JSON."""
    if isinstance(given, (list, tuple)) and all(isinstance(w, (int, float)) for w in given):
        return " ".join(f"{w:.3g}" for w in given)
    return json.dumps(given, separators=(",", ":"))


def front_table(front: dict[str, Any], weights_spec: str) -> list[str]:
    """The lines of the sweep's table: a header saying what the numbers are, then one row per
    point (estimator, weighting index with its weights, each component's mean and interval in
    percent of its range, ``*`` on the Pareto front)."""
    names, points = front["names"], front["points"]
    seeds = sorted({len(p["seeds"]) for p in points}) or [0]
    counted = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    per = ("per unit of each component's range" if weights_spec.startswith("simplex:")
           else "algorithm.reward_weights as given")
    lines = [
        f"each component: the greedy eval mean over {counted} seed(s) ± the half-width of its 95 % "
        "t-interval,",
        "  in percent of the component's range (0 = its low bound, 100 = its high bound)",
        f"weights: {per}, in the order {', '.join(names)}; * = on the Pareto front",
    ]
    labels = [f"w{p['weighting']} ({_weights_text(p['weights'])})" for p in points]
    width = max([len("weighting"), *map(len, labels)])
    lines.append(f"{'estimator':<12} {'weighting':<{width}}  " + "  ".join(f"{name[:14]:>14}" for name in names)
                 + "  front")
    for p, label in zip(points, labels):
        cells = []
        for name in names:
            c = p["percent"][name]
            cells.append(f"{c['mean']:.1f} ± {c['ci95']:.1f} %" if c["ci95"] is not None else f"{c['mean']:.1f} %")
        lines.append(f"{p['estimator']:<12} {label:<{width}}  " + "  ".join(f"{c:>14}" for c in cells)
                     + ("  *" if p["non_dominated"] else ""))
    return lines
