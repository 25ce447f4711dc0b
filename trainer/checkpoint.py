"""Checkpoints: a plain-transformers model folder plus the trainer's state.

Layout of ``checkpoint-<step>/``::

    model/            save_pretrained + tokenizer: loadable by plain transformers
    trainer_state.pt  optimizer, scheduler, step, config
    rng_<rank>.pt     python, numpy and torch RNG states of each process
    sharded/          FSDP runs only: each process's shards of the model and optimizer
                      (torch.distributed.checkpoint); trainer_state.pt then holds no optimizer

Under FSDP every process calls :func:`save_checkpoint` and :func:`load_checkpoint`
(they gather the full weights for ``model/`` and write or read the shards).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.fsdp import full_state_dict, is_sharded, load_sharded_state, save_sharded_state

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint"]


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | Path,
    *,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
    is_main: bool = True,
    config: dict[str, Any] | None = None,
) -> Path:
    """Save the state after ``step`` steps; each process writes its own RNG state."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sharded = is_sharded(model)
    # FSDP: the full weights are gathered (a collective) to rank 0 for the plain model folder
    weights = full_state_dict(model, rank0_only=True) if sharded else None
    if is_main:
        model.save_pretrained(path / "model", safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(path / "model")
        torch.save(
            {
                "step": step,
                "optimizer": None if sharded else optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "config": config,
            },
            path / "trainer_state.pt",
        )
    if sharded:
        save_sharded_state(path, model, optimizer)
    torch.save(_rng_state(), path / f"rng_{rank}.pt")
    return path


def load_checkpoint(
    path: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler and RNG states; returns the trainer state."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no trainer_state.pt)")
    if is_sharded(model):
        load_sharded_state(path, model, optimizer)
        return _load_rest(path, scheduler, rank)
    weights: dict[str, torch.Tensor] = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied weights are stored once; anything else missing is an error
    missing = [m for m in missing if "lm_head" not in m]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: {missing or unexpected}")
    state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    if state["optimizer"] is None:
        raise RuntimeError(
            f"checkpoint {path} was saved by an FSDP run (its optimizer state is in {path / 'sharded'}): "
            "resume it under the same FSDP launch"
        )
    optimizer.load_state_dict(state["optimizer"])
    return _load_rest(path, scheduler, rank, state)


def _load_rest(path: Path, scheduler: Any, rank: int, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore the scheduler and this process's RNG states; returns the trainer state."""
    if state is None:
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    scheduler.load_state_dict(state["scheduler"])
    rng = path / f"rng_{rank}.pt"
    if rng.exists():
        _set_rng_state(torch.load(rng, weights_only=False))
    return state


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The ``checkpoint-<step>`` folder with the highest step, or None."""
    found = []
    for p in Path(run_dir).glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / "trainer_state.pt").exists():
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None
