"""Train-then-evaluate runs in worker processes, resumable: what ``sweep`` and ``arena`` share.

A :class:`QueuedRun` is one training run (``corrgrpo.trainer.trainer.train``, with periodic checkpoints
and ``train.resume=auto``) followed by the evaluation of its final checkpoint on the eval split
(``corrgrpo.trainer.evaluate.evaluate``), and on each of its extra held-out sets (:class:`EvalSet`),
all in one worker process (``python -m corrgrpo.trainer.run_queue``), so a run pays for one
interpreter start. Each evaluation is written under a temporary name and renamed when complete
(``eval.json``, ``eval-<set>.json``): a run whose evaluation files all exist is finished and
skipped; one without them is resumed from its latest checkpoint (or only evaluated, on the sets
still missing, when training had finished). :func:`run_all` runs a list of them
``parallel`` at a time and reports each as it ends, with the time left at the pace so far; a
failed run does not stop the others (:class:`RunFailed` names the failures at the end).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EVAL_FILE", "EvalSet", "ModelRemoved", "QueuedRun", "RunFailed", "run_all", "run_one", "threads_per_run"]

EVAL_FILE = "eval.json"


@dataclass(frozen=True)
class EvalSet:
    """An extra held-out set on which a run's final checkpoint is evaluated too.

    Attributes:
        name: names the set and its file in the run folder, ``eval-<name>.json``.
        overrides: ``KEY=VALUE`` settings of this evaluation, after the run's own (e.g.
            ``env.dataset=...`` for another data set, ``rollout.max_new_tokens=256``).
        split: the env's split to evaluate on.
        limit: the first N tasks of the split only (None: all).
    """

    name: str
    overrides: tuple[str, ...] = ()
    split: str = "eval"
    limit: int | None = None

    @property
    def file(self) -> str:
        return f"eval-{self.name}.json"


@dataclass(frozen=True)
class QueuedRun:
    """One run: training with ``CONFIG OVERRIDES``, then the evaluation of its last checkpoint.

    Attributes:
        label: how progress lines and errors name the run.
        folder: the run folder (``train.output_dir``); ``eval.json`` in it marks it finished.
        config: the training config (a path, or a name in ``env_configs/``).
        overrides: ``KEY=VALUE`` settings of this run, after the config's.
        steps: ``train.steps`` of the run; 0: no training, the config's model is evaluated as it is.
        eval_limit: evaluate on the first N tasks of the eval split only (None: all).
        keep_checkpoints: keep the model folders once evaluated (else they are removed).
        seed: ``train.seed`` of the run (the evaluation's too).
        eval_options: more ``corrgrpo eval`` options (e.g. ``--sample``).
        eval_sets: the extra held-out sets, each evaluated like the eval split (same sampling).
    """

    label: str
    folder: Path
    config: str
    overrides: tuple[str, ...]
    steps: int
    eval_limit: int | None = None
    keep_checkpoints: bool = True
    seed: int = 0
    eval_options: tuple[str, ...] = ()
    eval_sets: tuple[EvalSet, ...] = ()

    @property
    def eval_files(self) -> list[str]:
        """The evaluation files a finished run has: ``eval.json`` and one per extra set."""
        return [EVAL_FILE, *(s.file for s in self.eval_sets)]

    @property
    def finished(self) -> bool:
        return all((self.folder / name).exists() for name in self.eval_files)

    def job(self, save_every: int, threads: int) -> dict[str, Any]:
        """What the worker does: the training overrides (None when the final checkpoint exists,
        so only the evaluation is left) and the evaluation's settings."""
        final: Path | None = self.folder / f"checkpoint-{self.steps}"
        train = None
        if self.steps == 0:  # the starting model: nothing to train, the config's model is evaluated
            final = None
        elif not (final / "checkpoint.json").exists():
            if any((self.folder / name).exists() for name in self.eval_files):
                # evaluated on some sets, its model since removed: only retraining could evaluate
                # the others, and it would replace the logs the report reads
                raise ModelRemoved(
                    f"{self.label}: {', '.join(self.missing_files())} missing but its model was removed "
                    f"after its other evaluations (--keep-checkpoints keeps it); remove its {EVAL_FILE} "
                    "to train it again")
            train = [*self.overrides, f"train.seed={self.seed}", f"train.output_dir={self.folder}",
                     "train.resume=auto", f"train.save_every={save_every}", "train.save_final=true",
                     "train.progress=false", f"train.steps={self.steps}", f"rollout.torch_threads={threads}"]
        sets = [EvalSet("", (), "eval", self.eval_limit), *self.eval_sets]
        evals = [{"name": s.name, "split": s.split, "limit": s.limit,
                  "overrides": [*self.overrides, *s.overrides, f"train.seed={self.seed}",
                                f"rollout.torch_threads={threads}"],
                  "out": str(self.folder / name)}
                 for s, name in zip(sets, self.eval_files) if not (self.folder / name).exists()]
        return {"config": self.config, "train": train, "checkpoint": final and str(final),
                "greedy": "--sample" not in self.eval_options, "evals": evals}

    def missing_files(self) -> list[str]:
        return [name for name in self.eval_files if not (self.folder / name).exists()]


def threads_per_run(parallel: int) -> int:
    """Torch threads for each of ``parallel`` runs sharing this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, parallel))


def run_one(run: QueuedRun, save_every: int, threads: int) -> dict[str, Any]:
    """Train (or resume) and evaluate ``run`` unless it has finished; returns what was done.

    Raises ``subprocess.CalledProcessError`` when a command fails; its output is in the run
    folder's ``run.log``.
    """
    if run.finished:
        return {"run": run.label, "status": "skipped"}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_DISABLE_PROGRESS_BARS": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "1")}
    run.folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    job = run.job(save_every, threads)
    status = "evaluated"
    if job["train"] is not None:
        status = "resumed" if any(run.folder.glob("checkpoint-*")) else "trained"
    with open(run.folder / "run.log", "a", encoding="utf-8") as out:
        subprocess.run([sys.executable, "-m", "corrgrpo.trainer.run_queue", json.dumps(job)],
                       check=True, env=env, stdout=out, stderr=subprocess.STDOUT)
    if not run.finished:  # the worker renames each file once written: a missing one is a bug
        raise RuntimeError(f"{run.label}: the worker ended without {', '.join(run.missing_files())}")
    if not run.keep_checkpoints:
        for path in run.folder.glob("checkpoint-*"):
            shutil.rmtree(path, ignore_errors=True)
    return {"run": run.label, "status": status, "seconds": time.perf_counter() - t0}


def run_all(runs: Sequence[QueuedRun], parallel: int, save_every: Callable[[QueuedRun], int],
            log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """Run every unfinished run, ``parallel`` at a time; one progress line per run that ends.

    Raises :class:`RunFailed` after the last run when any failed (its output is in its ``run.log``).
    """
    threads = threads_per_run(parallel)
    todo = [r for r in runs if not r.finished]
    results = [{"run": r.label, "status": "skipped"} for r in runs if r.finished]
    if not todo:
        return results
    t0 = time.perf_counter()
    failed: list[tuple[QueuedRun, subprocess.CalledProcessError | ModelRemoved]] = []
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        futures = {pool.submit(run_one, r, save_every(r), threads): r for r in todo}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                result = future.result()
            except (subprocess.CalledProcessError, ModelRemoved) as error:  # the others go on; reported at the end
                failed.append((futures[future], error))
                result = {"run": futures[future].label, "status": "failed"}
            results.append(result)
            elapsed = time.perf_counter() - t0
            left = elapsed / done * (len(todo) - done)
            log(f"[{done}/{len(todo)}] {result['run']}: {result['status']} in "
                f"{result.get('seconds', 0):.0f} s (elapsed {_clock(elapsed)}, about {_clock(left)} left)")
    if failed:
        run, error = failed[0]
        why = (f"exit {error.returncode}; see run.log in {run.folder}"
               if isinstance(error, subprocess.CalledProcessError) else str(error))
        raise RunFailed(f"{len(failed)} of {len(todo)} runs failed, first {run.label} ({why})")
    return results


class RunFailed(RuntimeError):
    """Some runs of a queue failed (the others ran to their end)."""


class ModelRemoved(RuntimeError):
    """A run lacks an evaluation but its model, evaluated on the other sets, was removed."""


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _worker(job: dict[str, Any]) -> int:
    """Train (unless only the evaluation is left), then evaluate the final checkpoint: one job."""
    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.evaluate import evaluate, write_evaluation
    from corrgrpo.trainer.threads import apply_threads
    from corrgrpo.trainer.trainer import train

    if job["train"] is not None:
        train(load_config(job["config"], job["train"]))
    for spec in job["evals"]:
        cfg = load_config(job["config"], spec["overrides"])
        apply_threads(cfg.rollout.torch_threads)
        t0 = time.perf_counter()
        result = evaluate(cfg, checkpoint=job["checkpoint"], split=spec["split"], limit=spec["limit"],
                          greedy=job["greedy"], progress=False)
        if spec["name"]:
            result["eval_set"] = spec["name"]
        partial = spec["out"] + ".partial"
        write_evaluation(result, partial)
        os.replace(partial, spec["out"])  # complete from now on: a resumed run skips this set
        print(f"evaluated {Path(spec['out']).name}: {result['tasks']} tasks of split {spec['split']} "
              f"in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(json.loads(sys.argv[1])))
