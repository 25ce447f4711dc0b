"""Train-then-evaluate runs in worker processes, resumable: what ``sweep`` and ``arena`` share.

A :class:`QueuedRun` is one training run (``corrgrpo.trainer.trainer.train``, with periodic checkpoints
and ``train.resume=auto``) followed by one evaluation of its final checkpoint on the eval split
(``corrgrpo.trainer.evaluate.evaluate``), both in one worker process (``python -m corrgrpo.trainer.run_queue``),
so a run pays for one interpreter start. The evaluation is written under a temporary name and renamed when complete:
a run whose ``eval.json`` exists is finished and skipped; one without is resumed from its latest
checkpoint (or only evaluated, when training had finished). :func:`run_all` runs a list of them
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

__all__ = ["EVAL_FILE", "QueuedRun", "RunFailed", "run_all", "run_one", "threads_per_run"]

EVAL_FILE = "eval.json"


@dataclass(frozen=True)
class QueuedRun:
    """One run: training with ``CONFIG OVERRIDES``, then the evaluation of its last checkpoint.

    Attributes:
        label: how progress lines and errors name the run.
        folder: the run folder (``train.output_dir``); ``eval.json`` in it marks it finished.
        config: the training config (a path, or a name in ``env_configs/``).
        overrides: ``KEY=VALUE`` settings of this run, after the config's.
        steps: ``train.steps`` of the run.
        eval_limit: evaluate on the first N tasks of the eval split only (None: all).
        keep_checkpoints: keep the model folders once evaluated (else they are removed).
        seed: ``train.seed`` of the run (the evaluation's too).
        eval_options: more ``corrgrpo eval`` options (e.g. ``--sample``).
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

    @property
    def finished(self) -> bool:
        return (self.folder / EVAL_FILE).exists()

    def job(self, save_every: int, threads: int) -> dict[str, Any]:
        """What the worker does: the training overrides (None when the final checkpoint exists,
        so only the evaluation is left) and the evaluation's settings."""
        final = self.folder / f"checkpoint-{self.steps}"
        train = None
        if not (final / "checkpoint.json").exists():
            train = [*self.overrides, f"train.seed={self.seed}", f"train.output_dir={self.folder}",
                     "train.resume=auto", f"train.save_every={save_every}", "train.save_final=true",
                     "train.progress=false", f"train.steps={self.steps}", f"rollout.torch_threads={threads}"]
        return {"config": self.config, "train": train,
                "eval": {"overrides": [*self.overrides, f"train.seed={self.seed}",
                                       f"rollout.torch_threads={threads}"],
                         "checkpoint": str(final), "limit": self.eval_limit,
                         "greedy": "--sample" not in self.eval_options,
                         "out": str(self.folder / (EVAL_FILE + ".partial"))}}


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
    os.replace(run.folder / (EVAL_FILE + ".partial"), run.folder / EVAL_FILE)  # finished from now on
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
    failed: list[tuple[QueuedRun, subprocess.CalledProcessError]] = []
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        futures = {pool.submit(run_one, r, save_every(r), threads): r for r in todo}
        for done, future in enumerate(as_completed(futures), 1):
            try:
                result = future.result()
            except subprocess.CalledProcessError as error:  # the others go on; reported at the end
                failed.append((futures[future], error))
                result = {"run": futures[future].label, "status": "failed"}
            results.append(result)
            elapsed = time.perf_counter() - t0
            left = elapsed / done * (len(todo) - done)
            log(f"[{done}/{len(todo)}] {result['run']}: {result['status']} in "
                f"{result.get('seconds', 0):.0f} s (elapsed {_clock(elapsed)}, about {_clock(left)} left)")
    if failed:
        run, error = failed[0]
        raise RunFailed(f"{len(failed)} of {len(todo)} runs failed, first {run.label} "
                        f"(exit {error.returncode}); see run.log in {run.folder}")
    return results


class RunFailed(RuntimeError):
    """Some runs of a queue failed (the others ran to their end)."""


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
    spec = job["eval"]
    cfg = load_config(job["config"], spec["overrides"])
    apply_threads(cfg.rollout.torch_threads)
    result = evaluate(cfg, checkpoint=spec["checkpoint"], split="eval", limit=spec["limit"],
                      greedy=spec["greedy"], progress=False)
    write_evaluation(result, spec["out"])
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(json.loads(sys.argv[1])))
