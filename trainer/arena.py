"""``corrgrpo arena``: every estimator x seed on the same regimes, budget and seeds, and one report.

A *regime* is a training config (``env_configs/arena/`` ships five: :mod:`corrgrpo_envs.toy.regimes`);
the arena trains each of them once per estimator and seed, changing nothing else
(``algorithm.estimator`` and ``train.seed``), evaluates each final model on the regime's
held-out split (sampling as in training, or greedily) and on each extra held-out set given
(:func:`parse_eval_set`: ``--eval-set NAME [split=S] [limit=N] KEY=VALUE ...``), and writes one folder::

    OUT/arena.json                      the plan: configs, overrides, estimators, seeds, steps, sets
    OUT/<regime>/<estimator>/s<seed>/   each run: metrics.jsonl, eval.json, eval-<set>.json, run.log
    OUT/<regime>/start/s<seed>/         the starting model's evaluations (before any training)
    OUT/results.json, OUT/report.md     every number of the report, and its tables
    OUT/pareto.png                      each regime's rewards, one point per estimator

Runs go ``parallel`` at a time in worker processes and resume after an interruption
(:mod:`corrgrpo.trainer.run_queue`). Past one machine the arena hands its runs to a scheduler instead:
``--commands`` prints one command line per unfinished run (each runs exactly that run, e.g. as a
Slurm array task or an ``accelerate launch`` job), and ``--report`` merges the run folders into
the report once they are done. The analysis is :mod:`corrgrpo.trainer.arena_report`.

The starting model (the config's ``model.name_or_path``, before any training) is evaluated on
the same sets too, as the run ``<regime>/start/s<seed>`` (once when evaluating greedily: its
answers do not depend on the seed; once per seed when sampling), so the report says what
training changed, not only how the estimators differ.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corrgrpo.trainer.config import load_config, resolve_config_path
from corrgrpo.trainer.run_queue import EvalSet, QueuedRun, run_all, run_one, threads_per_run

__all__ = ["ArenaPlan", "BASELINE", "LAST", "START", "EvalSet", "eval_set_words", "parse_eval_set", "plan_arena", "regime_configs",
           "run_arena", "scheduler_commands"]

#: The estimator every other one is compared with, seed by seed.
BASELINE = "grpo"

#: A run's final value of a reward is the mean of its last LAST steps' batch means.
LAST = 5

#: The label of the starting model's evaluations in a regime's folder and the report.
START = "start"


#: An extra set's name: it names a file (``eval-<name>.json``) and a column of the report.
_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def parse_eval_set(words: Sequence[str], default_limit: int | None = None) -> EvalSet:
    """An extra held-out set from ``NAME [split=SPLIT] [limit=N] [KEY=VALUE ...]``.

    ``split`` (default ``eval``, the env's eval split) and ``limit`` (default ``default_limit``,
    the arena's ``--eval-limit``; 0: every task) are the set's own; every other word is a config
    setting of its evaluation, applied after the run's (dotted, as on the command line, e.g.
    ``env.dataset=data/bfcl``; a value may hold commas and ``=``). ValueError for a bad word.
    """
    if not words:
        raise ValueError("--eval-set needs a NAME, e.g. --eval-set bfcl env.dataset=data/bfcl")
    name, *rest = words
    if not _SET_NAME.fullmatch(name) or name == "eval":
        raise ValueError(f"--eval-set: {name!r} is not a set name (letters, digits, _ and -; not 'eval', "
                         "the name of the default held-out evaluation)")
    split, limit, overrides = "eval", default_limit, []
    for word in rest:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"--eval-set {name}: {word!r} is not KEY=VALUE")
        if key == "split":
            split = value
        elif key == "limit":
            if not value.isdigit():
                raise ValueError(f"--eval-set {name}: limit={value} is not a number of tasks (0: all)")
            limit = int(value) or None
        elif "." in key:
            overrides.append(word)
        else:
            raise ValueError(f"--eval-set {name}: {word!r}: a set takes split=, limit= and dotted config "
                             "settings (e.g. env.dataset=...)")
    if not split:
        raise ValueError(f"--eval-set {name}: split= needs a split name")
    return EvalSet(name, tuple(overrides), split, limit)


def eval_set_words(eval_set: EvalSet) -> list[str]:
    """The words :func:`parse_eval_set` reads back into ``eval_set`` (its limit always written)."""
    return [eval_set.name, f"split={eval_set.split}", f"limit={eval_set.limit or 0}", *eval_set.overrides]


def regime_configs(items: Sequence[str]) -> dict[str, Path]:
    """``{regime: config}`` from config files and folders (every ``*.yaml`` in a folder).

    A regime is named by its file's stem; a name, file or folder is also looked for in the
    shipped ``env_configs/``. ValueError for a folder without configs or two configs of one name.
    """
    found: dict[str, Path] = {}
    for item in items:
        path = resolve_config_path(item)
        paths = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        if not paths:
            raise ValueError(f"{path}: a folder without *.yaml configs")
        for p in paths:
            if p.stem in found and found[p.stem] != p:
                raise ValueError(f"two configs are named {p.stem!r}: {found[p.stem]} and {p}")
            found[p.stem] = p
    return found


@dataclass(frozen=True)
class ArenaPlan:
    """What the arena trains: every regime x estimator x seed, with the same settings."""

    out: Path
    regimes: dict[str, Path]
    estimators: list[str]
    seeds: int
    overrides: list[str]
    steps: dict[str, int]
    eval_limit: int | None
    keep_checkpoints: bool = False
    eval_sample: bool = True
    eval_sets: tuple[EvalSet, ...] = ()
    eval_start: bool = True

    @property
    def start_seeds(self) -> list[int]:
        """The seeds the starting model is evaluated with: every one when sampling, else one."""
        if not self.eval_start:
            return []
        return list(range(self.seeds)) if self.eval_sample else [0]

    def runs(self) -> list[QueuedRun]:
        """Every run, seed-major (an interrupted arena still has whole seeds); the starting
        model's evaluation (no training, ``steps=0``) first in each seed it has."""
        runs = []
        for seed in range(self.seeds):
            for regime, config in self.regimes.items():
                if seed in self.start_seeds:
                    runs.append(self._run(regime, config, START, seed, 0, tuple(self.overrides)))
                runs += [self._run(regime, config, e, seed, self.steps[regime],
                                   (*self.overrides, f"algorithm.estimator={e}"))
                         for e in self.estimators]
        return runs

    def _run(self, regime: str, config: Path, name: str, seed: int, steps: int,
             overrides: tuple[str, ...]) -> QueuedRun:
        return QueuedRun(
            label=f"{regime}/{name}/s{seed}", folder=self.out / regime / name / f"s{seed}",
            config=str(config), seed=seed, steps=steps, overrides=overrides,
            eval_limit=self.eval_limit, keep_checkpoints=self.keep_checkpoints,
            eval_options=("--sample",) if self.eval_sample else (), eval_sets=self.eval_sets,
        )

    def to_json(self) -> dict[str, Any]:
        return {"regimes": {r: str(p) for r, p in self.regimes.items()}, "estimators": self.estimators,
                "seeds": self.seeds, "overrides": self.overrides, "steps": self.steps,
                "eval_limit": self.eval_limit, "eval": "sample" if self.eval_sample else "greedy",
                "eval_sets": [{"name": s.name, "split": s.split, "limit": s.limit, "overrides": list(s.overrides)}
                              for s in self.eval_sets],
                "eval_start": self.eval_start}


def plan_arena(items: Sequence[str], overrides: Sequence[str], estimators: Sequence[str] | None,
               seeds: int, out: str | Path, eval_limit: int | None = None,
               keep_checkpoints: bool = False, eval_sample: bool = True,
               eval_sets: Sequence[EvalSet] = (), eval_start: bool = True) -> ArenaPlan:
    """Check every regime x estimator config now, and each extra set's config and split on
    every regime (a bad one fails before any run), and plan. ``eval_start``: evaluate the
    starting model too (:data:`START`)."""
    from corrgrpo.trainer.estimators import available_estimators

    regimes = regime_configs(items)
    names = list(estimators) if estimators else available_estimators()
    if BASELINE not in names:
        names.insert(0, BASELINE)  # the paired baseline of every comparison
    if START in names:
        raise ValueError(f"{START!r} names the starting model's evaluations, not an estimator")
    seen = [s.name for s in eval_sets]
    if len(set(seen)) < len(seen):
        raise ValueError(f"--eval-set: two sets of one name ({', '.join(sorted({n for n in seen if seen.count(n) > 1}))})")
    steps = {}
    for regime, config in regimes.items():
        for name in names:
            cfg = load_config(config, [*overrides, f"algorithm.estimator={name}"])
        steps[regime] = cfg.train.steps
        for eval_set in eval_sets:
            _check_eval_set(config, [*overrides, *eval_set.overrides], eval_set)
    return ArenaPlan(Path(out), regimes, names, seeds, list(overrides), steps, eval_limit, keep_checkpoints,
                     eval_sample, tuple(eval_sets), eval_start)


def _check_eval_set(config: Path, overrides: list[str], eval_set: EvalSet) -> None:
    """The set's env, made once now: a bad setting, split or data path fails before any run."""
    import corrgrpo_envs
    from corrgrpo.trainer.setup import env_kwargs

    cfg = load_config(config, overrides)
    try:
        env = corrgrpo_envs.make(cfg.env.id, **env_kwargs(cfg, eval_set.split))
    except Exception as exc:  # noqa: BLE001 - any env's own error, named with the set it came from
        raise ValueError(f"--eval-set {eval_set.name}: {type(exc).__name__}: {exc}") from exc
    try:
        if not env.unwrapped.task_ids:
            raise ValueError(f"--eval-set {eval_set.name}: split {eval_set.split!r} holds no task")
    finally:
        env.close()


def scheduler_commands(plan: ArenaPlan, argv_prefix: Sequence[str]) -> list[str]:
    """One shell command per unfinished run, each running exactly that run (``--only LABEL``)."""
    return [shlex.join([*argv_prefix, "--only", run.label]) for run in plan.runs() if not run.finished]


def run_arena(plan: ArenaPlan, parallel: int, only: str | None = None,
              log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Train and evaluate every unfinished run of ``plan`` (or only the run labelled ``only``)."""
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "arena.json").write_text(json.dumps(plan.to_json(), indent=2))
    runs = plan.runs()
    save_every = lambda run: max(1, run.steps // 4)  # noqa: E731
    t0 = time.perf_counter()
    if only is not None:
        chosen = [r for r in runs if r.label == only]
        if not chosen:
            raise ValueError(f"no run {only!r} in this arena; its runs are named like {runs[0].label}")
        results = [run_one(chosen[0], save_every(chosen[0]), threads_per_run(1))]
    else:
        starts = len(plan.regimes) * len(plan.start_seeds)
        log(f"{len(runs)} runs ({len(plan.regimes)} regimes x {len(plan.estimators)} estimators x "
            f"{plan.seeds} seeds" + (f", and {starts} evaluations of the starting model" if starts else "")
            + f") into {plan.out}, {parallel} at a time; "
            f"{sum(r.finished for r in runs)} already finished")
        results = run_all(runs, parallel, save_every, log=log)
    return {"wall_seconds": time.perf_counter() - t0,
            "runs_done": {s: sum(r["status"] == s for r in results)
                          for s in ("trained", "resumed", "evaluated", "skipped")}}
