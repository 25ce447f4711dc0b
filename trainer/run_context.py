"""What every training command shares: one :class:`RunContext` per run.

``corrgrpo train`` (:mod:`corrgrpo.trainer.trainer`) and ``corrgrpo sft`` (:mod:`corrgrpo.trainer.sft`)
differ in what a step does; everything around the step is built here, once, from the
shared config sections (``model``, ``optim`` and the common part of ``train``):

* the ``Accelerator`` (:func:`corrgrpo.trainer.fsdp.build_accelerator`: an FSDP launch config
  shards either command's model, on CPU processes too) and the seeding of every RNG;
* the model and tokenizer, with gradient checkpointing and LoRA adapters;
* AdamW over the trainable parameters and THE learning-rate schedule (:func:`lr_factor`);
* the run folder (locked against a second run, :mod:`corrgrpo.trainer.run_lock`), its ``config.json``,
  the metrics logger, the progress bar;
* checkpoints and resuming (``train.resume``), and the step loop with its save points.

A command builds its own parts (environments, data, loss) between
:meth:`RunContext.build_model` and :meth:`RunContext.prepare`, in the order it needs.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corrgrpo.trainer.config import ModelConfig, OptimizerConfig, RunConfig
from corrgrpo.trainer.run_logger import METRICS, TENSORBOARD, TrackerStartError

__all__ = ["RunContext", "lr_factor", "lr_schedule", "missing_trackers_line", "seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs (every device's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_factor(step: int, schedule: str, warmup: int, total: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a share of ``optim.lr``.

    Linear warmup over ``warmup`` steps that starts at ``1/warmup`` and reaches the
    peak at step ``warmup - 1`` (no step is spent at a learning rate of 0), then
    ``constant``, or ``linear`` / ``cosine`` decay towards 0 at step ``total``.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def lr_schedule(optimizer: torch.optim.Optimizer, optim: OptimizerConfig, steps: int) -> Any:
    """``optimizer``'s scheduler: :func:`lr_factor` of ``optim.schedule`` and ``optim.warmup_steps``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, optim.schedule, optim.warmup_steps, steps)
    )


class RunContext:
    """The accelerator, model, optimizer, run folder, logger and checkpoints of one run.

    Args:
        model: the ``model`` section.
        optim: the ``optim`` section (the optimizer and schedule part of it).
        run: the ``train`` section (the part every command shares).
        output_dir: the run folder.
        config: the whole config as plain data (``config.json`` and every checkpoint).
        accelerator: an ``Accelerator`` to use (default: :func:`corrgrpo.trainer.fsdp.build_accelerator`).
    """

    def __init__(
        self,
        *,
        model: ModelConfig,
        optim: OptimizerConfig,
        run: RunConfig,
        output_dir: Path,
        config: dict[str, Any],
        accelerator: Any = None,
    ):
        from corrgrpo.trainer.fsdp import build_accelerator

        self.model_cfg, self.optim_cfg, self.run_cfg = model, optim, run
        self.config = config
        self.output_dir = Path(output_dir)
        self.trackers, missing = _available_trackers(run.trackers())
        # Accelerate's trackers are named when the Accelerator is made; TensorBoard writes
        # under the run folder's tensorboard/ (moved aside with the metrics on a fresh start)
        self.accelerator = accelerator or build_accelerator(
            cpu=run.cpu or not torch.cuda.is_available(),
            log_with=self.trackers or None, project_dir=str(self.output_dir / TENSORBOARD),
        )
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        if missing and self.is_main:  # one line on stderr, not a warning's file and line
            print(missing_trackers_line(missing), file=sys.stderr, flush=True)
        self.model: Any = None  # after prepare(): the wrapped model, optimizer and scheduler
        self.unwrapped: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.tokenizer: Any = None
        self.logger: Any = None
        self._lock: Any = None  # the run folder's lock (trainer.run_lock), held from start() to close()
        seed_everything(run.seed)

    def per_process(self, key: str, value: int) -> int:
        """``value`` split evenly over the processes (``key`` names the setting in the error)."""
        if value % self.world:
            raise ValueError(f"{key}={value} must be divisible by the number of processes ({self.world})")
        return value // self.world

    # ------------------------------------------------------------------- model
    def build_model(self) -> tuple[torch.nn.Module, Any]:
        """The model and tokenizer of ``model``: dtype, gradient checkpointing, LoRA adapters."""
        from corrgrpo.agents.models import load_model
        from corrgrpo.trainer.lora import apply_lora

        m = self.model_cfg
        kwargs: dict[str, Any] = {"dtype": getattr(torch, m.dtype)}
        if m.tokenizer_file:
            kwargs["tokenizer_file"] = m.tokenizer_file
        model, self.tokenizer = load_model(m.name_or_path, **kwargs)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # adapters wrap the model here, before the optimizer sees its parameters
        return apply_lora(model, m.lora), self.tokenizer

    def prepare(self, model: torch.nn.Module) -> tuple[Any, torch.optim.Optimizer, Any]:
        """AdamW over ``model``'s trainable parameters, its schedule, both through ``accelerator.prepare``."""
        o = self.optim_cfg
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=o.lr,
            betas=(o.betas[0], o.betas[1]),
            eps=o.adam_eps,
            weight_decay=o.weight_decay,
        )
        self.scheduler = lr_schedule(optimizer, o, self.run_cfg.steps)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        return self.model, self.optimizer, self.scheduler

    # ---------------------------------------------------------------- run folder
    def start(self) -> tuple[Path | None, int]:
        """Decide how the run continues its folder, then start the trackers, then write ``config.json``.

        A resumed run keeps its folder's records up to the checkpoint's step; a fresh start moves an
        earlier run's logs aside. Both happen before any tracker opens a file there: TensorBoard's
        writer holds its event file under ``tensorboard/`` by path, and moving that folder under an
        open writer ends the run at its first flush. Returns the checkpoint resumed from (None: a
        fresh start) and its step.
        """
        from corrgrpo.trainer.run_lock import lock_run_folder
        from corrgrpo.trainer.run_logger import RunLogger

        run = self.run_cfg
        if self.is_main:  # before anything in the folder is read or moved
            self._lock = lock_run_folder(self.output_dir)
        self.logger = RunLogger(self.output_dir, enabled=self.is_main)
        path, step = self._resume(run.resume) if run.resume else (None, 0)
        if path is None:
            self.logger.start_fresh()
        if self.trackers and self.accelerator.log_with:
            self.logger.send = self._start_trackers(step)
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.output_dir / "config.json", "w", encoding="utf-8") as f:
                json.dump(self.config, f, indent=2)
        return path, step

    def _start_trackers(self, resumed_step: int) -> Callable[[dict[str, float], int], None]:
        """Start Accelerate's trackers with the config as their hyper-parameters; return the
        function that sends a step's scalars to them.

        A run resumed after step ``resumed_step`` has TensorBoard hide the earlier run's events
        from step ``resumed_step + 1`` on (SummaryWriter's ``purge_step``), as the resume dropped
        those records from ``metrics.jsonl``. A tracker that fails to start (a server that does not
        answer, a store it refuses) raises :class:`TrackerStartError` naming it.
        """
        run = self.run_cfg
        name = self.output_dir.name
        init_kwargs: dict[str, dict[str, Any]] = {
            "wandb": {"name": name, "dir": str(self.output_dir)},
            "mlflow": {"run_name": name}, "trackio": {"name": name},
        }
        if resumed_step:
            init_kwargs["tensorboard"] = {"purge_step": resumed_step + 1}
        try:
            self.accelerator.init_trackers(run.project, config=_flat_hparams(self.config), init_kwargs=init_kwargs)
        except Exception as exc:  # any tracker's own error: its first line is what the user needs
            with contextlib.suppress(Exception):  # those that did start end their runs
                self.accelerator.end_training()
            raise TrackerStartError.of(exc, self.trackers) from exc

        def send(values: dict[str, float], step: int) -> None:
            self.accelerator.log(values, step=step)

        return send

    def _resume(self, where: str) -> tuple[Path | None, int]:
        from corrgrpo.trainer.checkpoint import latest_checkpoint, load_checkpoint
        from corrgrpo.trainer.lora import restore_adapter

        path = latest_checkpoint(self.output_dir) if where == "auto" else Path(where)
        if path is None:
            return None, 0  # nothing saved yet: start from scratch
        state = load_checkpoint(path, self.unwrapped, self.optimizer, self.scheduler, rank=self.rank)
        restore_adapter(self.unwrapped, path)  # LoRA: model/ holds merged weights, the adapter beside
        step = int(state["step"])
        self.logger.truncate_after(step)
        return path, step

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the run's metrics (the main process writes)."""
        if self.is_main:
            self.logger.log(record)

    def save(self, step: int) -> Path:
        """Write ``checkpoint-<step>`` of the state after ``step`` steps (every process calls it)."""
        from corrgrpo.trainer.checkpoint import prune_checkpoints, save_run_checkpoint

        path = save_run_checkpoint(
            self.output_dir,
            step,
            accelerator=self.accelerator,
            model=self.unwrapped,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            config=self.config,
        )
        if self.run_cfg.keep_checkpoints and self.is_main:
            prune_checkpoints(self.output_dir, self.run_cfg.keep_checkpoints)
        return path

    def save_model(self, folder: Path) -> None:
        """The model as a plain transformers folder (merged for LoRA, gathered under FSDP);
        every process calls it."""
        from corrgrpo.trainer.fsdp import full_state_dict, is_sharded
        from corrgrpo.trainer.lora import save_merged

        self.accelerator.wait_for_everyone()
        # FSDP: the full weights are gathered (a collective) to the main process
        weights = full_state_dict(self.unwrapped, rank0_only=True) if is_sharded(self.unwrapped) else None
        if self.is_main:
            save_merged(self.unwrapped, folder, self.tokenizer, state_dict=weights)
        self.accelerator.wait_for_everyone()

    # ---------------------------------------------------------------------- loop
    def run_steps(
        self,
        start: int,
        step_fn: Callable[[int], dict[str, Any]],
        save_fn: Callable[[int], Any],
        progress_cls: type | None = None,
    ) -> None:
        """Steps ``start .. train.steps - 1``: ``step_fn(step)`` returns the step's record;
        ``save_fn(step + 1)`` runs every ``train.save_every`` steps and after the last one
        (``train.save_final``); a progress bar shows each record."""
        from corrgrpo.trainer.progress import TrainProgress

        run = self.run_cfg
        progress = (progress_cls or TrainProgress)(run.steps, enabled=run.progress and self.is_main, start=start)
        with progress:
            for step in range(start, run.steps):
                record = step_fn(step)
                progress.update(step + 1, record)
                periodic = run.save_every and (step + 1) % run.save_every == 0
                if periodic or (step + 1 == run.steps and run.save_final):
                    save_fn(step + 1)

    def close(self) -> None:
        """Close the logger, wait for every process and release the run folder."""
        if self.logger is not None:
            self.logger.close()
        if self.trackers and self.accelerator.trackers:
            self.accelerator.end_training()  # flushes and closes every tracker (main process)
        self.accelerator.wait_for_everyone()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _available_trackers(chosen: list[str]) -> tuple[list[str], list[str]]:
    """``chosen`` split into the trackers whose package imports here and those whose does not."""
    if not chosen:
        return [], []
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    return [t for t in chosen if t in available], [t for t in chosen if t not in available]


def missing_trackers_line(missing: list[str]) -> str:
    """The one line a run prints for the trackers of ``train.report_to`` that are not installed."""
    names = ", ".join(missing)
    return (
        f"warning: train.report_to: {names} not installed, so this run is not logged to "
        f"{'it' if len(missing) == 1 else 'them'}: pip install {' '.join(missing)} "
        f"(or drop {'it' if len(missing) == 1 else 'them'} from train.report_to); "
        f"{METRICS} is written as always"
    )


def _flat_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The config as flat ``section/key`` hyper-parameters of plain types (what every tracker takes)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat_hparams(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)  # None, lists and the rest: their text (TensorBoard takes no None)
    return flat
