"""``corrgrpo sweep``: train a grid of reward weightings x seeds x estimators, evaluate each final
model greedily and write the Pareto front.

Each run is ``corrgrpo train CONFIG`` with ``algorithm.reward_weights``, ``algorithm.estimator``
and ``train.seed`` set, into ``OUT/<estimator>/w<i>-s<seed>/``, then ``corrgrpo eval`` of its
last checkpoint on the eval split (greedy), in a worker process of its own (``--parallel`` at
once), resumable (:mod:`corrgrpo.trainer.run_queue`). ``front.json`` and ``front.png`` are then written from every ``eval.json``
(:mod:`corrgrpo.trainer.pareto`).

Weightings: ``simplex:N`` is every point of the simplex with steps of 1/N (``C(N+K-1, K-1)``
points); a point's entries weigh each component per unit of its range (the reward weight is
``w_k / (high_k - low_k)``), so equal entries give each component an equal say whatever its
scale. A FILE (JSON or YAML) is a list of ``algorithm.reward_weights`` values used as they are
(lists, mappings by name, schedules).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.trainer.config import Config, load_config
from corrgrpo.trainer.pareto import (
    hypervolume,
    interval,
    non_dominated,
    percent_of_range,
    plot_front,
)
from corrgrpo.trainer.run_queue import EVAL_FILE, QueuedRun, run_all
from corrgrpo_registry.yaml_files import load_json, load_yaml

__all__ = ["SweepRun", "parse_weights", "plan_runs", "read_weights_file", "run_sweep", "simplex", "write_front"]


def simplex(k: int, n: int) -> list[list[float]]:
    """Every ``[K]`` point with entries in ``{0, 1/n, ..., 1}`` summing to 1, lexicographic (descending)."""
    if k < 1 or n < 1:
        raise ValueError(f"simplex needs K >= 1 and N >= 1, got K={k}, N={n}")
    points = []
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        edges = (-1, *bars, n + k - 1)
        points.append([(edges[i + 1] - edges[i] - 1) / n for i in range(k)])
    return sorted(points, reverse=True)


@dataclass(frozen=True)
class Weighting:
    """One weighting of the grid: its label, what it was given as and the reward weights used."""

    index: int
    given: Any
    reward_weights: Any


def read_weights_file(spec: str) -> list[Any] | None:
    """The list of ``algorithm.reward_weights`` values in the JSON/YAML file ``spec`` (read under
    the config files' bounds), or None for ``simplex:N``."""
    if spec.startswith("simplex:"):
        return None
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"--weights {spec!r}: not simplex:N and no such file")
    data = load_json(path) if path.suffix == ".json" else load_yaml(path)
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of reward_weights values")
    return data


def parse_weights(spec: str, names: Sequence[str], low: Sequence[float], high: Sequence[float],
                  data: list[Any] | None = None) -> list[Weighting]:
    """``simplex:N`` or a JSON/YAML file of ``algorithm.reward_weights`` values (``data``: the
    file's list, read already by :func:`read_weights_file`)."""
    if spec.startswith("simplex:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"--weights {spec!r}: expected simplex:N with an integer N >= 1") from None
        span = [h - lo if h > lo else 1.0 for lo, h in zip(low, high)]
        return [Weighting(i, p, [w / s for w, s in zip(p, span)]) for i, p in enumerate(simplex(len(names), n))]
    data = read_weights_file(spec) if data is None else data
    from corrgrpo.trainer.estimators.reward_weights import resolve_reward_weights

    for i, entry in enumerate(data):  # check each against the env now, not after hours of training
        resolve_reward_weights(entry, names, [1.0] * len(names), key=f"{spec}[{i}]")
    return [Weighting(i, entry, entry) for i, entry in enumerate(data)]


@dataclass(frozen=True)
class SweepRun:
    """One training run of the grid."""

    estimator: str
    weighting: Weighting
    seed: int
    folder: Path

    @property
    def label(self) -> str:
        return f"{self.estimator}/w{self.weighting.index}-s{self.seed}"


def plan_runs(out: Path, estimators: Sequence[str], weightings: Sequence[Weighting], seeds: int) -> list[SweepRun]:
    return [SweepRun(e, w, s, out / e / f"w{w.index}-s{s}")
            for e in estimators for w in weightings for s in range(seeds)]


def _queued(run: SweepRun, config: str, overrides: Sequence[str], steps: int,
            eval_limit: int | None) -> QueuedRun:
    """The train-then-evaluate run of one point of the grid."""
    return QueuedRun(
        label=run.label, folder=run.folder, config=config, seed=run.seed, steps=steps,
        overrides=(*overrides, f"algorithm.estimator={run.estimator}",
                   f"algorithm.reward_weights={json.dumps(run.weighting.reward_weights)}"),
        eval_limit=eval_limit,
    )


def _env_bounds(cfg: Config) -> tuple[list[str], list[float], list[float]]:
    import corrgrpo_envs
    from corrgrpo.trainer.setup import env_kwargs

    env = corrgrpo_envs.make(cfg.env.id, **env_kwargs(cfg, "eval"))
    try:
        u = env.unwrapped
        return list(u.reward_names), u.reward_space.low.tolist(), u.reward_space.high.tolist()
    finally:
        env.close()


def run_sweep(
    config: str, overrides: Sequence[str], weights: str, seeds: int, estimators: Sequence[str] | None = None,
    parallel: int = 1, out: str | Path | None = None, save_every: int | None = None,
    eval_limit: int | None = None, log: Any = print,
) -> dict[str, Any]:
    """Run (or finish) the grid and write ``front.json`` and ``front.png``; returns the front."""
    listed = read_weights_file(weights)  # a bad file is one line, before torch is imported
    cfg = load_config(config, list(overrides))
    estimators = list(estimators or [cfg.algorithm.estimator])
    for e in estimators:
        load_config(config, [*overrides, f"algorithm.estimator={e}"])  # an unknown one fails now
    names, low, high = _env_bounds(cfg)
    weightings = parse_weights(weights, names, low, high, listed)
    out = Path(out or Path("runs") / f"sweep-{cfg.name}")
    out.mkdir(parents=True, exist_ok=True)
    steps = cfg.train.steps
    every = save_every or max(1, steps // 4)
    runs = plan_runs(out, estimators, weightings, seeds)
    grid = {"config": str(config), "overrides": list(overrides), "names": names, "low": low, "high": high,
            "weights": weights, "weightings": [{"index": w.index, "given": w.given, "reward_weights": w.reward_weights}
                                               for w in weightings],
            "estimators": estimators, "seeds": seeds, "steps": steps}
    (out / "grid.json").write_text(json.dumps(grid, indent=2))
    t0 = time.perf_counter()
    log(f"{len(runs)} runs ({len(estimators)} estimators x {len(weightings)} weightings x {seeds} seeds) "
        f"into {out}, {parallel} at a time")
    results = run_all([_queued(r, config, overrides, steps, eval_limit) for r in runs], parallel,
                      save_every=lambda _: every, log=log)
    front = write_front(out, runs, grid)
    front["wall_seconds"] = time.perf_counter() - t0
    front["runs_done"] = {s: sum(r["status"] == s for r in results)
                          for s in ("trained", "resumed", "evaluated", "skipped")}
    (out / "front.json").write_text(json.dumps(front, indent=2))
    return front


def _component_means(eval_path: Path, names: Sequence[str]) -> list[float]:
    records = json.loads(eval_path.read_text())["records"]
    return [float(np.nanmean([r["reward_components"][n] for r in records])) for n in names]


def write_front(out: Path, runs: Sequence[SweepRun], grid: dict[str, Any]) -> dict[str, Any]:
    """``front.json`` and ``front.png`` from the runs' ``eval.json`` files."""
    names, low, high = grid["names"], grid["low"], grid["high"]
    cells: dict[tuple[str, int], list[tuple[int, list[float]]]] = {}
    weight_of = {}
    for run in runs:
        path = run.folder / EVAL_FILE
        if path.exists():
            cells.setdefault((run.estimator, run.weighting.index), []).append(
                (run.seed, _component_means(path, names)))
            weight_of[run.weighting.index] = run.weighting
    points = []
    for (estimator, index), seeds in sorted(cells.items()):
        raw = np.array([m for _, m in seeds])
        pct = percent_of_range(raw, low, high)
        point = {"estimator": estimator, "weighting": index, "weights": weight_of[index].given,
                 "reward_weights": weight_of[index].reward_weights, "seeds": [s for s, _ in seeds],
                 "raw": {}, "percent": {}}
        for k, name in enumerate(names):
            mean, half = interval(raw[:, k])
            point["raw"][name] = {"mean": mean, "ci95": half, "per_seed": raw[:, k].tolist()}
            mean, half = interval(pct[:, k])
            point["percent"][name] = {"mean": mean, "ci95": half, "per_seed": pct[:, k].tolist()}
        points.append(point)
    front: dict[str, Any] = {
        "config": grid["config"], "names": names, "low": low, "high": high, "steps": grid["steps"],
        "units": "percent of each component's range [low, high] (0 = low, 100 = high), greedy eval split",
        "reference_point": {"percent": [0.0] * len(names), "raw": low,
                            "meaning": "every component at its lower bound"},
        "hypervolume_units": f"percent^{len(names)} (a fraction of 100^{len(names)})",
        "points": points, "non_dominated": [], "hypervolume": 0.0, "non_dominated_by_estimator": {},
        "hypervolume_by_estimator": {},
    }
    if points:
        means = np.array([[p["percent"][n]["mean"] for n in names] for p in points])
        keep = non_dominated(means)
        for p, flag in zip(points, keep):
            p["non_dominated"] = bool(flag)
        front["non_dominated"] = [i for i, flag in enumerate(keep) if flag]
        front["hypervolume"] = hypervolume(means[keep])
        for estimator in sorted({p["estimator"] for p in points}):
            mine = np.flatnonzero([p["estimator"] == estimator for p in points])
            own = non_dominated(means[mine])
            front["non_dominated_by_estimator"][estimator] = [int(i) for i in mine[own]]
            front["hypervolume_by_estimator"][estimator] = hypervolume(means[mine][own])
        plot_front(front, out / "front.png")
    (out / "front.json").write_text(json.dumps(front, indent=2))
    return front
