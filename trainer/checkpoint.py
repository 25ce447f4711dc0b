"""Checkpoints: a plain-transformers model folder plus the trainer's state, written atomically.

Layout of ``checkpoint-<step>/``::

    model/            save_pretrained + tokenizer: loadable by plain transformers
    trainer_state.pt  optimizer, scheduler, step, config
    rng_<rank>.pt     python, numpy and torch RNG states of each process (as tensors and lists)
    sharded/          FSDP runs only: each process's shards of the model and optimizer
                      (torch.distributed.checkpoint); trainer_state.pt then holds no optimizer
    checkpoint.json   written last: the step and every file's size

Under FSDP every process calls :func:`save_checkpoint` and :func:`load_checkpoint`
(they gather the full weights for ``model/`` and write or read the shards).

Crash safety: a checkpoint is written into ``.checkpoint-<step>.partial/`` beside its
final place, every file and folder is fsynced, and the folder is renamed into place,
so ``checkpoint-<step>/`` either is complete or does not exist. :func:`latest_checkpoint`
still checks what it picks (the manifest's sizes, the zip directory of the ``.pt`` files,
the safetensors headers) and skips, with a warning naming it, a folder that is incomplete
or corrupt (written by an older version, or damaged on disk), falling back to the
previous one.

Loading never runs pickled code: ``.pt`` files are read with ``torch.load(...,
weights_only=True)``, which only rebuilds tensors and plain containers; the RNG states
are stored as tensors, lists and numbers for that reason (RNG files of the earlier
layout, with numpy arrays, load with numpy's array types allowed and nothing else).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corrgrpo.trainer.fsdp import (
    full_state_dict,
    is_sharded,
    load_sharded_state,
    save_sharded_state,
)

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "prune_checkpoints",
    "checkpoint_problem",
    "MANIFEST",
    "CheckpointError",
]

log = logging.getLogger(__name__)

#: The file written last into a checkpoint: its step and the size of every other file.
MANIFEST = "checkpoint.json"
_NAME = re.compile(r"checkpoint-(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint folder that cannot be resumed from (the message says which file and why)."""


# ------------------------------------------------------------------ RNG states
def _rng_state() -> dict[str, Any]:
    """Every RNG state as tensors, lists and numbers (what ``weights_only`` loading accepts)."""
    version, mt_state, gauss = random.getstate()
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "python": {"version": int(version), "state": [int(x) for x in mt_state], "gauss": gauss},
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _legacy_rng_state(path: Path) -> dict[str, Any]:
    """An RNG file of the earlier layout (``random.getstate()`` and ``np.random.get_state()`` tuples),
    loaded with ``weights_only`` and numpy's array types allowed, in the current layout."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    allowed = [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with torch.serialization.safe_globals(allowed):
            old = torch.load(path, map_location="cpu", weights_only=True)
        version, mt_state, gauss = old["python"]
        bit_generator, key, pos, has_gauss, cached_gaussian = old["numpy"]
    except Exception as exc:
        raise CheckpointError(
            f"{path}: cannot be loaded with torch.load(weights_only=True): {type(exc).__name__}: {exc}"
        ) from exc
    return {
        "python": {"version": version, "state": list(mt_state), "gauss": gauss},
        "numpy": {"bit_generator": bit_generator, "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
                  "pos": pos, "has_gauss": has_gauss, "cached_gaussian": cached_gaussian},
        "torch": old["torch"],
        "cuda": old.get("cuda"),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["bit_generator"],
            npy["key"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------ durability
def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _fsync_tree(folder: Path) -> None:
    """fsync every file and every folder under ``folder`` (folders after their entries)."""
    for path in _files(folder):
        _fsync_file(path)
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync_dir(sub)
    _fsync_dir(folder)


def _partial_path(final: Path) -> Path:
    return final.parent / f".{final.name}.partial"


def _jsonable(config: dict[str, Any] | None) -> dict[str, Any] | None:
    # Paths, enums and the like become strings, so the state loads with weights_only.
    return None if config is None else json.loads(json.dumps(config, default=str))


def _write_manifest(folder: Path, step: int) -> None:
    files = {str(p.relative_to(folder)): p.stat().st_size for p in _files(folder) if p.name != MANIFEST}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"step": step, "files": files}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)


def _move_into_place(partial: Path, final: Path) -> None:
    """Rename the finished folder to its final name (replacing an older save of the same step)."""
    old = final.parent / f".{final.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(partial, final)
    _fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)


def save_run_checkpoint(
    output_dir: str | Path,
    step: int,
    *,
    accelerator: Any,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config: dict[str, Any] | None = None,
) -> Path:
    """``output_dir/checkpoint-{step}`` written by every process of ``accelerator`` together.

    The one way `corrgrpo train` and `corrgrpo sft` save: all processes meet before the
    save (so none is still updating) and after it (so none reads a folder that is not
    renamed into place yet). Returns the checkpoint's path.
    """
    accelerator.wait_for_everyone()
    path = save_checkpoint(
        Path(output_dir) / f"checkpoint-{step}",
        step=step,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scheduler=scheduler,
        rank=accelerator.process_index,
        is_main=accelerator.is_main_process,
        barrier=accelerator.wait_for_everyone,
        config=config,
    )
    accelerator.wait_for_everyone()
    return path


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
    barrier: Callable[[], Any] | None = None,
) -> Path:
    """Save the state after ``step`` steps at ``path``, atomically; each process writes its RNG state.

    With several processes every one calls this with the same ``path`` and a
    ``barrier`` (e.g. ``accelerator.wait_for_everyone``): the main process creates
    the temporary folder, all write into it, and the main process renames it into
    place once all are done. Returns ``path``.
    """
    if barrier is None and not is_main:
        raise ValueError("several processes save one checkpoint: pass barrier= (e.g. accelerator.wait_for_everyone)")
    sync = barrier or (lambda: None)
    final = Path(path)
    partial = _partial_path(final)
    if is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        if partial.exists():  # left by a save that was killed
            shutil.rmtree(partial)
        partial.mkdir()
    sync()
    sharded = is_sharded(model)
    # FSDP: the full weights are gathered (a collective) to rank 0 for the plain model folder
    weights = full_state_dict(model, rank0_only=True) if sharded else None
    if is_main:
        model.save_pretrained(partial / "model", safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(partial / "model")
        torch.save(
            {
                "step": step,
                "optimizer": None if sharded else optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "config": _jsonable(config),
            },
            partial / "trainer_state.pt",
        )
    if sharded:
        save_sharded_state(partial, model, optimizer)
    rng = partial / f"rng_{rank}.pt"
    torch.save(_rng_state(), rng)
    _fsync_file(rng)
    sync()
    if is_main:
        _write_manifest(partial, step)
        _fsync_tree(partial)
        _move_into_place(partial, final)
    sync()
    return final


# ------------------------------------------------------------------ checking
def _zip_problem(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:  # reads the central directory at the end: torn files fail
            z.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{path.name} is not a complete torch file ({exc})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Whether the header parses and the file is as long as the header says."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size:
                return f"{path.name}: header longer than the file"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{path.name}: unreadable safetensors header ({exc})"
    if size != 8 + n + end:
        return f"{path.name}: {size} bytes, the header describes {8 + n + end}"
    return None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None when it is.

    Checks, without loading the state: the manifest (when there is one: every
    listed file present with its size), ``trainer_state.pt`` and the ``rng_*.pt``
    files (complete zip archives), and the safetensors files of ``model/``
    (header and length).
    """
    path = Path(path)
    if not path.is_dir():
        return "not a folder"
    manifest = path / MANIFEST
    if manifest.exists():
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8"))["files"]
            for rel, size in listed.items():
                f = path / rel
                if not f.is_file():
                    return f"{rel} is missing"
                if f.stat().st_size != int(size):
                    return f"{rel} has {f.stat().st_size} bytes, the manifest says {size}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{MANIFEST} is unreadable ({exc})"
    if not (path / "trainer_state.pt").is_file():
        return "no trainer_state.pt"
    for f in [path / "trainer_state.pt", *sorted(path.glob("rng_*.pt"))]:
        problem = _zip_problem(f)
        if problem:
            return problem
    weights = sorted((path / "model").glob("*.safetensors"))
    if not weights:
        return "no model/*.safetensors"
    for f in weights:
        problem = _safetensors_problem(f)
        if problem:
            return f"model/{problem}"
    return None


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` highest-step ``checkpoint-<step>`` folders of ``run_dir``
    (``keep`` >= 1); returns the deleted folders."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    found = sorted(((int(m.group(1)), p) for p in Path(run_dir).glob("checkpoint-*")
                    if (m := _NAME.fullmatch(p.name)) and p.is_dir()), reverse=True)
    old = [p for _, p in found[keep:]]
    for p in old:
        shutil.rmtree(p)
    return old


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-<step>`` folder with the highest step, or None.

    Incomplete or corrupt folders (see :func:`checkpoint_problem`) are skipped
    with a warning that names them, so a run resumes from the previous one.
    """
    found = []
    for p in Path(run_dir).glob("checkpoint-*"):
        m = _NAME.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    for _, p in sorted(found, reverse=True):
        problem = checkpoint_problem(p)
        if problem is None:
            return p
        log.warning("skipping checkpoint %s: %s", p, problem)
    return None


# ------------------------------------------------------------------ loading
def _load_pt(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torn, corrupt, or holding objects weights_only refuses to build
        raise CheckpointError(
            f"{path}: cannot be loaded with torch.load(weights_only=True): {type(exc).__name__}: {exc}"
        ) from exc


def load_checkpoint(
    path: str | Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rank: int = 0,
) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler and RNG states; returns the trainer state.

    Raises:
        FileNotFoundError: ``path`` is not a checkpoint folder.
        CheckpointError: the checkpoint is incomplete or corrupt, or a file holds
            anything but tensors and plain containers.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no trainer_state.pt)")
    problem = checkpoint_problem(path)
    if problem:
        raise CheckpointError(f"checkpoint {path} is incomplete or corrupt: {problem}")
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
    state = _load_pt(path / "trainer_state.pt")
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
        state = _load_pt(path / "trainer_state.pt")
    scheduler.load_state_dict(state["scheduler"])
    rng = path / f"rng_{rank}.pt"
    if rng.exists():
        try:
            rng_state = _load_pt(rng)
        except CheckpointError:
            rng_state = _legacy_rng_state(rng)  # numpy arrays: written before the tensor layout
        try:
            _set_rng_state(rng_state)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{rng}: not an RNG state of this version ({exc!r})") from exc
    return state
